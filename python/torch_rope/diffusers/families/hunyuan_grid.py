# SPDX-License-Identifier: BSD-3-Clause
"""HunyuanVideo-style RoPE: the latent grid's integer positions, one share of the head per axis,
GPT-J pairs, computed every forward.

The RoPE module (HunyuanVideo, HunyuanVideo 1.5, HunyuanImage 2.1, Motif-Video) takes the latents
``(B, C[, F], H, W)``, divides each dim by its patch size and computes, every forward, cos/sin
``(S, D)`` of the grid's ``(frame, row, column)`` (or ``(row, column)``) over ``rope_dim[a]``
features per axis, ``theta ** (-2 j / rope_dim[a])`` (float32 angles, float64 for Motif). The
processors call diffusers' ``apply_rotary_emb(q, (cos, sin), sequence_dim=1)`` (imported inside
``__call__``, or at the top of Motif's file) on ``(B, S, H, D)`` q and k, or on their image part
when the text tokens follow it.

Patched, on this model instance only: the RoPE module holds :class:`..tables.Tables` (float64
frequencies from ``theta`` and ``rope_dim``) and its forward returns the grid's positions, int64
``(S, A)``, as the pair; the processors rotate with :func:`..rotate.embeddings_apply`.
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


def _patch_sizes(rope: nn.Module, dims: int):
    """The patch size of each of the latents' last ``dims`` dims."""
    size = rope.patch_size
    if isinstance(size, (tuple, list)):
        if len(size) != dims:
            raise ValueError(
                f"torch_rope.diffusers: {type(rope).__name__} has patch sizes {tuple(size)} for "
                f"{dims}-D latents"
            )
        return list(size)
    return ([rope.patch_size_t] if dims == 3 else []) + [size, size]


def grid_positions(rope: nn.Module, hidden_states: Tensor) -> Tensor:
    """The grid's positions, int64 ``(S, A)``, frame-major then row-major."""
    dims = hidden_states.dim() - 2
    sizes = [n // p for n, p in zip(hidden_states.shape[2:], _patch_sizes(rope, dims))]
    device = hidden_states.device
    axes = [torch.arange(n, device=device) for n in sizes]
    return torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, dims)


def grid_forward(rope: nn.Module, hidden_states: Tensor):
    positions = integer_rows(rope.torch_rope, grid_positions(rope, hidden_states))
    return positions, positions


def _unpatched(rope, original_apply, q, hidden):
    return original_apply(q, type(rope).forward(rope, hidden), sequence_dim=1)


def _patched(tables, rope, q, hidden):
    positions = grid_positions(rope, hidden)
    return embeddings_apply(tables, q, (positions, positions), sequence_dim=1)


def patch(model: nn.Module, row, record: PatchRecord, patcher: ProcessorPatcher, options) -> None:
    from diffusers.models import embeddings

    rope = getattr(model, row.rope[0])
    dims = list(rope.rope_dim)
    inv_freq, section = axes_inv_freq(dims, float(rope.theta))
    tables = Tables(inv_freq, section, True, rows=options.rows, device=device_of(model))
    device = tables.cos.device
    grid = [3, 4, 2][-len(dims) :]
    patch_sizes = _patch_sizes(rope, len(dims))
    hidden = torch.zeros(1, 1, *[n * p for n, p in zip(grid, patch_sizes)], device=device)
    q = probe((1, grid_positions(rope, hidden).size(0), 2, sum(dims)), device, torch.float32)
    self_check.check(
        rope,
        type(rope).__name__,
        functools.partial(_unpatched, rope, embeddings.apply_rotary_emb, q, hidden),
        functools.partial(_patched, tables, rope, q, hidden),
    )
    install_embeddings_apply(model, rope, tables, grid_forward, record, patcher)
