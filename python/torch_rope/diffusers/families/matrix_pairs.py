# SPDX-License-Identifier: BSD-3-Clause
"""RoPE as 2x2 rotation matrices on GPT-J pairs: HiDream-I1 and PRX.

The RoPE module (``HiDreamImageEmbedND``, ``PRXEmbedND``) takes integer ids ``(B, S, A)`` that
the model builds from the latent grid (HiDream: (0, row, column), text tokens at 0; PRX: (row,
column)) and computes, every forward, the matrices ``[[cos, -sin], [sin, cos]]`` of each axis'
share of the head (float64 angles, ``theta ** (-2 j / axes_dim[a])``), shaped for its layout:
HiDream ``(B, S, 1, D / 2, 2, 2)``, rotating ``(B, S, H, D)`` q and k together with
``apply_rope(q, k, freqs)`` (over the first half of the head when its RoPE is half as wide, which
its processor reads from ``freqs.shape[-3]``); PRX ``(B, 1, S, D / 2, 2, 2)``, rotating the
image part of ``(B, H, S, D)`` q and k with ``apply_rope(x, freqs)``.

Patched, on this model instance only: the RoPE module returns the ids' table rows, HiDream's
expanded (a view, no copy) to a tensor whose ``shape[-3]`` is still ``D / 2`` so that its
processor takes the same branch; the processors rotate with :func:`hidream_apply` (one
``rope::apply_qk``) and :func:`prx_apply`.
"""

import functools

import torch
from torch import Tensor, nn

from ..._patching.record import PatchRecord
from ..._patching.self_check import probe
from ...ops import apply, apply_qk
from ...vision import axes_inv_freq
from .. import self_check
from ..model_parts import attention_modules, device_of
from ..processors import ProcessorPatcher, Swap, library_function
from ..tables import Tables, integer_rows
from .install import install

CALLER = "torch_rope.diffusers.patch"
ROTARY_ARGUMENTS = ("image_rotary_emb",)
NAME = "apply_rope"


def _rows(tables: Tables, ids: Tensor) -> Tensor:
    rows = integer_rows(tables, ids)
    if rows is None:
        raise ValueError(
            f"{CALLER}: this model's RoPE ids must be integers (its own code builds them so)"
        )
    return rows


def hidream_forward(rope: nn.Module, ids: Tensor) -> Tensor:
    """Rows ``(B, S, A)`` as ``(B, S, 1, D / 2, 1, A)`` (expanded): the processor reads
    ``shape[-3]``."""
    rows = _rows(rope.torch_rope, ids)
    planes = rope.torch_rope.rotary_dim // 2
    return rows[:, :, None, None, None, :].expand(-1, -1, 1, planes, 1, -1)


def prx_forward(rope: nn.Module, ids: Tensor) -> Tensor:
    """Rows ``(B, S, A)`` as ``(B, 1, S, A)``, the layout of its ``(B, 1, S, D / 2, 2, 2)``."""
    return _rows(rope.torch_rope, ids).unsqueeze(1)


def hidream_apply(tables: Tables, xq: Tensor, xk: Tensor, freqs_cis: Tensor):
    """HiDream's ``apply_rope(q, k, freqs)``: q and k ``(B, S, H, D)`` in one op."""
    rows = freqs_cis[:, :, :, 0, 0, :]
    return apply_qk(
        xq, xk, tables.cos, tables.sin, rows, interleaved=True, mrope_section=tables.section
    )


def prx_apply(tables: Tables, xq: Tensor, freqs_cis: Tensor) -> Tensor:
    """PRX's ``apply_rope(x, freqs)``: x ``(B, H, S, D)``, rows ``(B, 1, S, A)``."""
    return apply(
        xq, tables.cos, tables.sin, freqs_cis, interleaved=True, mrope_section=tables.section
    )


def _unpatched(rope, original, q, ids, hidream):
    freqs = type(rope).forward(rope, ids)
    return torch.cat(original(q, q, freqs)) if hidream else original(q, freqs)


def _patched(rope, tables, q, ids, hidream):
    rows = integer_rows(tables, ids)
    if hidream:
        planes = tables.rotary_dim // 2
        rows = rows[:, :, None, None, None, :].expand(-1, -1, 1, planes, 1, -1)
        return torch.cat(hidream_apply(tables, q, q, rows))
    return prx_apply(tables, q, rows.unsqueeze(1))


def patch(model: nn.Module, row, record: PatchRecord, patcher: ProcessorPatcher, options) -> None:
    rope = getattr(model, row.rope[0])
    hidream = row.variant == "qk"
    dims = list(rope.axes_dim)
    inv_freq, section = axes_inv_freq(dims, float(rope.theta))
    tables = Tables(inv_freq, section, True, rows=options.rows, device=device_of(model))
    calls = [type(m.processor).__call__ for m in attention_modules(model)]
    original = next((f for c in calls if (f := library_function(c, NAME))), None)
    if original is None:
        raise NotImplementedError(f"{CALLER}: no processor of this model calls {NAME}")
    device = tables.cos.device
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 7, (1, 10, len(dims)), generator=generator).float().to(device)
    shape = (1, 10, 2, sum(dims)) if hidream else (1, 2, 10, sum(dims))
    q = probe(shape, device, torch.float32)
    self_check.check(
        rope,
        type(rope).__name__,
        functools.partial(_unpatched, rope, original, q, ids, hidream),
        functools.partial(_patched, rope, tables, q, ids, hidream),
    )
    apply_fn = hidream_apply if hidream else prx_apply
    swaps = {NAME: Swap(functools.partial(apply_fn, tables), original)}
    forward = hidream_forward if hidream else prx_forward
    install(model, [rope], tables, forward, swaps, ROTARY_ARGUMENTS, record, patcher)
