# SPDX-License-Identifier: BSD-3-Clause
"""OmniGen's RoPE: Phi-3's "su" scaling (LongRoPE), one axis, halves.

``OmniGenSuScaledRotaryEmbedding(hidden_states, position_ids)`` picks per call the
``short_factor`` or the ``long_factor`` frequencies (``1 / (factor_j * base ** (2 j / d))``) by
whether the largest position reaches ``original_max_position_embeddings`` (a host read), computes
cos/sin of the *first* sample's positions in float32 and multiplies both by ``sqrt(1 + log(s) /
log(original))``, ``s = max_position_embeddings / original``. Its processor calls diffusers'
``apply_rotary_emb(q, (cos, sin), use_real_unbind_dim=-2)`` on ``(B, H, S, D)`` q and k.

Patched, on this model instance only: the RoPE module switches its :class:`..tables.Tables`
between the two frequency sets (:meth:`..tables.Tables.frequency_rows`: built in float64 once
each, the factor folded into the table values) by the same rule, read on the host as diffusers
reads it, and returns the first sample's positions; the processors rotate with
:func:`..rotate.embeddings_apply`.
"""

import functools
import math

import torch
from torch import Tensor, nn

from ..._patching.record import PatchRecord
from ..._patching.self_check import probe
from .. import self_check
from ..model_parts import device_of
from ..processors import ProcessorPatcher
from ..rotate import embeddings_apply
from ..tables import Tables
from .install import install_embeddings_apply


def _frequencies(rope: nn.Module, long: bool) -> torch.Tensor:
    factors = torch.tensor(rope.long_factor if long else rope.short_factor, dtype=torch.float64)
    exponents = torch.arange(0, rope.dim, 2, dtype=torch.float64) / rope.dim
    return 1.0 / (factors * float(rope.base) ** exponents)


def _scaling(rope: nn.Module) -> float:
    scale = rope.max_position_embeddings / rope.original_max_position_embeddings
    if scale <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(scale) / math.log(rope.original_max_position_embeddings))


def rows(rope: nn.Module, tables: Tables, position_ids: Tensor) -> Tensor:
    """The first sample's positions, after making the tables those of the factors diffusers
    would pick for these ids."""
    length = int(position_ids.max()) + 1
    long = length > rope.original_max_position_embeddings
    needed = max(length, 1 + rope.original_max_position_embeddings if long else length)
    tables.frequency_rows(("su", long), _frequencies(rope, long), _scaling(rope), needed)
    return position_ids[0].long()


def forward(rope: nn.Module, hidden_states: Tensor, position_ids: Tensor):
    found = rows(rope, rope.torch_rope, position_ids)
    return found, found


def _unpatched(rope, original, q, ids):
    return original(q, type(rope).forward(rope, q, ids), use_real_unbind_dim=-2)


def _patched(rope, tables, q, ids):
    found = rows(rope, tables, ids)
    return embeddings_apply(tables, q, (found, found), True, -2)


def patch(model: nn.Module, row, record: PatchRecord, patcher: ProcessorPatcher, options) -> None:
    from diffusers.models import embeddings

    rope = getattr(model, row.rope[0])
    tables = Tables(_frequencies(rope, False), None, False, rows=1, device=device_of(model))
    device = tables.cos.device
    original_length = rope.original_max_position_embeddings
    for start in (0, original_length):  # the short factors, then the long ones
        ids = (start + torch.arange(7, device=device))[None]
        q = probe((1, 2, 7, rope.dim), device, torch.float32)
        self_check.check(
            rope,
            type(rope).__name__,
            functools.partial(_unpatched, rope, embeddings.apply_rotary_emb, q, ids),
            functools.partial(_patched, rope, tables, q, ids),
        )
    install_embeddings_apply(model, rope, tables, forward, record, patcher)
