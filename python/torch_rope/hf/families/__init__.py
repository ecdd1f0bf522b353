# SPDX-License-Identifier: BSD-3-Clause
"""The families of models patch knows, one module each: how a family finds its rotary modules
and attention layers, what it replaces, and how it checks the result.

Text RoPE: :mod:`.rotary_module` (most models), :mod:`.complex_form` (``freqs_cis``),
:mod:`.gptj` and :mod:`.roformer` (no rotary module). Vision RoPE: :mod:`.axial_vision`,
:mod:`.llama4_vision`.
"""

from typing import Any, Dict

from . import axial_vision, complex_form, llama4_vision, rotary_module

_WITH_REPLACEMENTS = (rotary_module, complex_form, axial_vision, llama4_vision)


def replacements(original_globals: Dict[str, Any]) -> Dict[str, Any]:
    """What each family replaces in the patched copy of a modeling module's globals."""
    found: Dict[str, Any] = {}
    for family in _WITH_REPLACEMENTS:
        found.update(family.replacements(original_globals))
    return found
