# SPDX-License-Identifier: BSD-3-Clause
"""FLUX-style RoPE: position ids in, one share of the head per axis, GPT-J pairs.

The model hands its RoPE module (``FluxPosEmbed`` and its copies: FLUX.1 and its controlnet,
Chroma, FLUX.2, FLUX.3, Bria, Bria FIBO, LongCat-Image, Ovis-Image, Krea 2) ids ``(S, A)``: text
tokens and image tokens, ``(frame, row, column[, index])``. The module computes, every forward,
``cos``/``sin`` ``(S, D)`` of axis ``a``'s ids over ``axes_dim[a]`` features with
``theta ** (-2 j / axes_dim[a])`` (float64 angles), and the processors call
``apply_rotary_emb(q, (cos, sin), sequence_dim=1)`` on ``(B, S, H, D)`` q and k: GPT-J pairs, the
axes' shares contiguous in axis order.

Patched, on this model instance only: the RoPE module holds :class:`..tables.Tables` (float64
frequencies from its ``theta`` and ``axes_dim``: :func:`torch_rope.vision.axes_inv_freq`) and its
forward returns the ids' table rows, int64 ``(S, A)``, as the pair ``(rows, rows)``; every
processor that calls ``apply_rotary_emb`` rotates with :func:`..rotate.embeddings_apply` instead,
one ``rope::apply`` for q and one for k, with the axes as ``mrope_section``.

The pipelines' ids are integers. Ids that are not (diffusers' own unit tests draw them at random)
take the token-table path: cos/sin built in float64 from the ids once per set of ids and kept
(:meth:`..tables.Tables.token_tables`), rotated by the same op one row per token.
"""

import functools

import torch
from torch import Tensor, nn

from ..._patching.record import PatchRecord
from ..._patching.self_check import probe
from ...vision import axes_inv_freq
from .. import self_check
from ..model_parts import device_of
from ..processors import ProcessorPatcher
from ..rotate import embeddings_apply
from ..tables import Tables, integer_rows
from .install import install_embeddings_apply


def ids_positions(tables: Tables, ids: Tensor):
    """The ids' table rows as the pair diffusers' cos/sin would be, computing no trig
    (fractional ids: their token tables, built once)."""
    rows = integer_rows(tables, ids)
    if rows is None:
        return tables.token_tables(ids)
    return rows, rows


def ids_forward(rope: nn.Module, ids: Tensor):
    """The patched RoPE module's forward."""
    return ids_positions(rope.torch_rope, ids)


def _check(rope: nn.Module, tables: Tables, original_apply, where: str) -> None:
    """Integer and fractional probe ids through diffusers' forward and apply, and ours."""
    axes = len(rope.axes_dim)
    generator = torch.Generator().manual_seed(0)
    integer = torch.randint(0, 7, (10, axes), generator=generator).float()
    fractional = integer + torch.rand(10, axes, generator=generator)
    device = tables.cos.device
    q = probe((1, 10, 2, sum(rope.axes_dim)), device, torch.float32)
    for ids in (integer.to(device), fractional.to(device)):
        self_check.check(
            rope,
            where,
            functools.partial(_unpatched, rope, original_apply, q, ids),
            functools.partial(_patched, tables, q, ids),
        )


def _unpatched(rope, original_apply, q, ids):
    return original_apply(q, type(rope).forward(rope, ids), sequence_dim=1)


def _patched(tables, q, ids):
    return embeddings_apply(tables, q, ids_positions(tables, ids), sequence_dim=1)


def patch(model: nn.Module, row, record: PatchRecord, patcher: ProcessorPatcher, options) -> None:
    from diffusers.models import embeddings

    ropes = [getattr(model, name) for name in row.rope]
    if len(ropes) != 1 or not hasattr(ropes[0], "axes_dim"):
        raise NotImplementedError(
            f"torch_rope.diffusers.patch: expected a FLUX-style RoPE module at "
            f"{row.rope} of this {type(model).__name__}; not patching"
        )
    rope = ropes[0]
    inv_freq, section = axes_inv_freq(list(rope.axes_dim), float(rope.theta))
    tables = Tables(inv_freq, section, True, rows=options.rows, device=device_of(model))
    _check(rope, tables, embeddings.apply_rotary_emb, type(rope).__name__)
    install_embeddings_apply(model, rope, tables, ids_forward, record, patcher)
