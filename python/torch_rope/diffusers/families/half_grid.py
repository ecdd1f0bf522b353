# SPDX-License-Identifier: BSD-3-Clause
"""Grid RoPE over halves (``rotate_half``), computed every forward: Cosmos (2.0, its controlnet),
CogView4, GLM-Image.

The RoPE module takes the latents and computes, every forward, cos/sin of the patch grid's
positions in float32, the axes' shares of the head contiguous, each axis' cos/sin written twice
(halves):

* Cosmos (``base_fps``): (frame, row, column) over ``dim_t, dim_h, dim_w`` features, each axis
  with a base of its own (``10000 * rope_scale ** (d / (d - 2))``, NTK); for a video (``fps``
  given) the frame positions are scaled by ``base_fps / fps``;
* CogView4 (``rope_axes_dim``): (row, column) over ``dim / 2`` features each, the grid's index
  mapped onto a fixed ``rope_axes_dim`` grid, ``i * rope_axes_dim // size`` (integers);
* GLM-Image: (row, column), plain.

The processors call ``apply_rotary_emb(q, (cos, sin), use_real_unbind_dim=-2)`` (imported inside
``__call__``) on the image part of q and k, ``(B, H, S, D)`` (GLM: ``sequence_dim=1``).

Patched, on this model instance only: the RoPE module holds :class:`..tables.Tables` and its
forward returns the grid's positions, int64 ``(S, A)``; a Cosmos video's scaled frame positions
are not integers, so its frames take coordinate tables (:meth:`..tables.Tables.coordinate_rows`,
built once per grid and frame rate) and the positions are then grid indices. The processors
rotate with :func:`..rotate.embeddings_apply`.
"""

import functools
from typing import List, Optional, Tuple

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


def _frequencies(dim: int, theta: float) -> Tensor:
    """diffusers' per-axis frequencies ``theta ** (-2 j / dim)``, ``j < dim // 2`` (also for an
    odd ``dim``), in float64."""
    exponents = torch.arange(0, dim, 2, dtype=torch.float64)[: dim // 2] / dim
    return theta**-exponents


def _axes(rope: nn.Module) -> Tuple[List[int], List[float]]:
    """Each axis' share of the head (features) and base."""
    if hasattr(rope, "base_fps"):
        dims = [rope.dim_t, rope.dim_h, rope.dim_w]
        factors = [rope.t_ntk_factor, rope.h_ntk_factor, rope.w_ntk_factor]
        return dims, [10000.0 * f for f in factors]
    return [rope.dim // 2, rope.dim // 2], [float(rope.theta)] * 2


def _sizes(rope: nn.Module, hidden_states: Tensor) -> List[int]:
    patch = rope.patch_size
    patch = list(patch) if isinstance(patch, (tuple, list)) else [patch] * 2
    return [n // p for n, p in zip(hidden_states.shape[2:], patch)]


def _grid(sizes: List[int], device) -> Tensor:
    axes = [torch.arange(n, device=device) for n in sizes]
    return torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, len(sizes))


def positions(rope: nn.Module, tables: Tables, hidden_states: Tensor, fps=None) -> Tensor:
    """The grid's table rows, int64 ``(S, A)``."""
    sizes = _sizes(rope, hidden_states)
    device = hidden_states.device
    if hasattr(rope, "rope_axes_dim"):  # CogView4: the index on a fixed grid
        axes = [torch.arange(n, device=device) * m // n for n, m in zip(sizes, rope.rope_axes_dim)]
        grid = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, 2)
        return grid + tables.cover(0, max(rope.rope_axes_dim) - 1)
    grid = _grid(sizes, device)
    if hasattr(rope, "base_fps") and fps is not None:
        scale = float(rope.base_fps) / float(fps)
        coordinates = [torch.arange(n, dtype=torch.float64) for n in sizes]
        coordinates[0] = coordinates[0] * scale
        if not torch.compiler.is_compiling():
            tables.coordinate_rows(("fps", tuple(sizes), scale), coordinates)
        return grid
    return grid + tables.cover(0, max(sizes) - 1)


def forward(rope: nn.Module, hidden_states: Tensor, fps: Optional[float] = None):
    found = positions(rope, rope.torch_rope, hidden_states, fps)
    return found, found


def _unpatched(rope, original, q, hidden, fps, sequence_dim):
    freqs = type(rope).forward(rope, hidden, fps=fps) if fps else type(rope).forward(rope, hidden)
    return original(q, freqs, use_real_unbind_dim=-2, sequence_dim=sequence_dim)


def _patched(rope, tables, q, hidden, fps, sequence_dim):
    found = positions(rope, tables, hidden, fps)
    return embeddings_apply(tables, q, (found, found), True, -2, sequence_dim)


def patch(model: nn.Module, row, record: PatchRecord, patcher: ProcessorPatcher, options) -> None:
    from diffusers.models import embeddings

    rope = getattr(model, row.rope[0])
    dims, thetas = _axes(rope)
    inv_freq = torch.cat([_frequencies(d, t) for d, t in zip(dims, thetas)])
    section = [d // 2 for d in dims]
    tables = Tables(inv_freq, section, False, rows=options.rows, device=device_of(model))
    device = tables.cos.device
    cosmos = hasattr(rope, "base_fps")
    patch_size = rope.patch_size
    patch_size = list(patch_size) if isinstance(patch_size, (tuple, list)) else [patch_size] * 2
    grid = [3, 4, 5][-len(patch_size) :]
    hidden = torch.zeros(1, 1, *[n * p for n, p in zip(grid, patch_size)], device=device)
    size = grid[0] * grid[1] * (grid[2] if len(grid) == 3 else 1)
    head = 2 * sum(section)
    for fps in (None, 30) if cosmos else (None,):
        q = probe((1, 2, size, head), device, torch.float32)
        self_check.check(
            rope,
            type(rope).__name__,
            functools.partial(_unpatched, rope, embeddings.apply_rotary_emb, q, hidden, fps, 2),
            functools.partial(_patched, rope, tables, q, hidden, fps, 2),
        )
    install_embeddings_apply(model, rope, tables, forward, record, patcher)
