# SPDX-License-Identifier: BSD-3-Clause
"""The attention classes' forwards that patched layers run: each rebuilt over a copy of its
modeling module's globals in which transformers' rotation functions are torch_rope's (what each
family replaces: its ``replacements``). Registered as modules ``torch_rope_hf_patched__<module>``
so that torch.compile resolves them."""

from typing import Any, Dict

from .._patching.namespace import PatchedNamespaces


def _no_families(original_globals: Dict[str, Any]) -> Dict[str, Any]:
    raise RuntimeError("torch_rope.hf: FORWARDS used before torch_rope.hf.families was imported")


# What to replace is the families' to say: torch_rope.hf.families sets FORWARDS.replacements when
# it is imported (the families import this module for FORWARDS, so it imports none of them).
FORWARDS = PatchedNamespaces("torch_rope_hf_patched__", _no_families)
