# SPDX-License-Identifier: BSD-3-Clause
"""The attention classes' forwards that patched layers run: each rebuilt over a copy of its
modeling module's globals in which transformers' rotation functions are torch_rope's (what each
family replaces: its ``replacements``). Registered as modules ``torch_rope_hf_patched__<module>``
so that torch.compile resolves them."""

from typing import Any, Dict

from .._patching.namespace import PatchedNamespaces


def _replacements(original_globals: Dict[str, Any]) -> Dict[str, Any]:
    # Imported here, not at the top: the families import this module for FORWARDS.
    from .families import replacements

    return replacements(original_globals)


FORWARDS = PatchedNamespaces("torch_rope_hf_patched__", _replacements)
