# SPDX-License-Identifier: BSD-3-Clause
"""The families of models patch knows, one module each. A family finds the modules it patches in a
model, checks each patched layer against the unpatched one (the self-check), and records every
change it makes so that unpatch can undo it. Each has the same entry point::

    patch(model, model_type, row, record, options)

with the model type's registry row (:mod:`..registry`), the patch's record
(:class:`~torch_rope._patching.record.PatchRecord`) and :class:`Options`; and, when its layers
call a transformers function that patched layers must find as torch_rope's, ``replacements``
(:mod:`..forwards`).

Text RoPE: :mod:`.rotary_module` (most models), :mod:`.complex_form` (``freqs_cis``), :mod:`.gptj`
and :mod:`.roformer` (no rotary module). Vision RoPE: :mod:`.axial_vision`, :mod:`.llama4_vision`.
"""

from types import ModuleType
from typing import Any, Dict, List, NamedTuple, Optional

from ..forwards import FORWARDS
from . import axial_vision, complex_form, gptj, llama4_vision, roformer, rotary_module

#: The families by the name a registry row gives them.
FAMILIES: Dict[str, ModuleType] = {
    "rotary_module": rotary_module,
    "complex_form": complex_form,
    "gptj": gptj,
    "roformer": roformer,
    "axial_vision": axial_vision,
    "llama4_vision": llama4_vision,
}


class Options(NamedTuple):
    """patch's keyword arguments, as the families read them."""

    max_seq_len: Optional[int]  # text positions the tables cover at first (None: the config's)
    max_vision_positions: int  # rows and columns of a vision tower's tables
    tables: bool = True  # False: the text RoPE table-free (the ops' frequency form)


def for_row(row) -> List[ModuleType]:
    """The families that patch a model type of registry row ``row``: its text family, then its
    vision tower's (none for a vision tower without RoPE)."""
    names = [row.text, row.vision.family if row.vision is not None else None]
    return [FAMILIES[name] for name in names if name is not None]


def replacements(original_globals: Dict[str, Any]) -> Dict[str, Any]:
    """What the families replace in the patched copy of a modeling module's globals."""
    found: Dict[str, Any] = {}
    for family in FAMILIES.values():
        if hasattr(family, "replacements"):
            found.update(family.replacements(original_globals))
    return found


# The patched copies of the modeling modules replace what the families replace.
FORWARDS.replacements = replacements
