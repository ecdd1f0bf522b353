# SPDX-License-Identifier: BSD-3-Clause
"""The families of diffusers models patch knows, one module each (docs/diffusers.md describes
them). A family finds, in a model of one of its classes, the RoPE it computes and the attention
processors that rotate with it, checks ours against diffusers' on a probe (the self-check), and
makes every change through the patch's record, to be undone. Each has the same entry point::

    patch(model, row, record, patcher, options)

with the class's registry row (:mod:`..registry`), the patch's record
(:class:`~torch_rope._patching.record.PatchRecord`), its
:class:`~..processors.ProcessorPatcher` and :class:`Options`.
"""

from types import ModuleType
from typing import Dict, NamedTuple

from . import (
    axis_chunks,
    caller_tables,
    flux_ids,
    half_grid,
    hunyuan_grid,
    id_gather,
    ltx_coords,
    matrix_pairs,
    qwen_centered,
    rounded_pairs,
    sequence_1d,
    su_scaled,
    wan_grid,
    wrapper,
)

#: The families by the name a registry row gives them.
FAMILIES: Dict[str, ModuleType] = {
    "axis_chunks": axis_chunks,
    "caller_tables": caller_tables,
    "flux_ids": flux_ids,
    "half_grid": half_grid,
    "hunyuan_grid": hunyuan_grid,
    "id_gather": id_gather,
    "ltx_coords": ltx_coords,
    "matrix_pairs": matrix_pairs,
    "qwen_centered": qwen_centered,
    "rounded_pairs": rounded_pairs,
    "sequence_1d": sequence_1d,
    "su_scaled": su_scaled,
    "wan_grid": wan_grid,
    "wrapper": wrapper,
}


class Options(NamedTuple):
    """patch's keyword arguments, as the families read them."""

    rows: int  # integer positions the tables cover at first (they grow in eager mode)
