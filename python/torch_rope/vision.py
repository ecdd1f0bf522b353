# SPDX-License-Identifier: BSD-3-Clause
"""Multi-axis RoPE for images: the frequencies of axial (2-D, 3-D) RoPE and the positions of
image patches.

A vision encoder's 2-D RoPE is the ops' multi-axis form with one axis per image dimension: plane
``k`` turns by the row or the column of its patch, as ``mrope_section`` deals the planes::

    inv_freq, section = torch_rope.vision.axial_inv_freq(10000.0, head_dim, num_axes=2)
    cos, sin = torch_rope.rope_tables_from_inv_freq(inv_freq, max_side)
    positions = torch_rope.vision.patch_positions(grid_thw, spatial_merge_size=2)  # (N, 2)
    q, k = torch_rope.apply_qk(q, k, cos, sin, positions.unsqueeze(-2),           # (N, H, D)
                               interleaved=False, mrope_section=section)

Nothing here rotates: these are the two inputs the models build in Python before calling RoPE.
"""

from typing import List, Optional, Tuple

import torch
from torch import Tensor

__all__ = ["axial_inv_freq", "patch_positions"]


def axial_inv_freq(
    theta: float, rotary_dim: int, num_axes: int = 2, *, per_axis: str = "restart"
) -> Tuple[Tensor, List[int]]:
    """Float64 ``inv_freq`` of axial RoPE and the ``mrope_section`` that goes with it.

    The ``rotary_dim // 2`` planes are dealt to ``num_axes`` axes in equal contiguous runs of
    ``n = rotary_dim // (2 * num_axes)`` planes (``section = [n] * num_axes``). Within each run:

    * ``per_axis="restart"`` (Qwen2-VL, Qwen2.5-VL, Qwen3-VL and GLM-4V vision towers): every
      axis restarts the frequencies, ``inv_freq[a * n + j] = theta ** (-j / n)``;
    * ``per_axis="alternate"`` (Pixtral, Mistral-3's vision tower): the ``rotary_dim // 2``
      frequencies ``theta ** (-2 i / rotary_dim)`` of plain RoPE, axis ``a`` taking every
      ``num_axes``-th one from ``a`` on.

    Build tables from it with :func:`torch_rope.rope_tables_from_inv_freq`.
    """
    if not isinstance(rotary_dim, int) or not isinstance(num_axes, int):
        raise TypeError("rotary_dim and num_axes must be ints")
    if num_axes < 1 or rotary_dim <= 0 or rotary_dim % (2 * num_axes):
        raise ValueError(
            f"axial_inv_freq: rotary_dim must be a positive multiple of 2 * num_axes = "
            f"{2 * max(num_axes, 1)}, got rotary_dim={rotary_dim}, num_axes={num_axes}"
        )
    theta = float(theta)
    if not theta > 1.0:
        raise ValueError(f"axial_inv_freq: theta must be > 1, got {theta}")
    n = rotary_dim // (2 * num_axes)
    if per_axis == "restart":
        one_axis = theta ** (-torch.arange(n, dtype=torch.float64) / n)
        inv_freq = one_axis.repeat(num_axes)
    elif per_axis == "alternate":
        plain = theta ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
        inv_freq = torch.cat([plain[a::num_axes] for a in range(num_axes)])
    else:
        raise ValueError(
            f"axial_inv_freq: per_axis must be 'restart' or 'alternate', got {per_axis!r}"
        )
    return inv_freq, [n] * num_axes


def patch_positions(
    grid_thw: Tensor,
    spatial_merge_size: int = 1,
    *,
    temporal: bool = False,
    device: Optional[torch.device] = None,
) -> Tensor:
    """The (row, column) positions of every patch of a batch of images, as vision towers order
    their patches: int64 ``(N, 2)``, or ``(N, 3)`` (frame, row, column) with ``temporal=True``.

    ``grid_thw`` is ``(num_images, 3)``: frames, rows and columns of patches per image (what
    transformers' processors return as ``image_grid_thw``). Patches of one image run frame by
    frame; within a frame, ``spatial_merge_size`` x ``spatial_merge_size`` windows of patches
    (the patches a merger joins into one token) are contiguous, windows in row-major order, and
    patches row-major within a window. ``spatial_merge_size=1`` is plain row-major order. Images
    follow each other, each from position 0. Pass the result, with a heads dim
    (``positions.unsqueeze(-2)``), to the ops with ``mrope_section`` of 2 (or 3) axes.
    """
    if not isinstance(grid_thw, Tensor):
        raise TypeError(f"grid_thw must be a Tensor, got {type(grid_thw).__name__}")
    if grid_thw.dim() != 2 or grid_thw.size(1) != 3 or grid_thw.is_floating_point():
        raise ValueError(
            f"patch_positions: grid_thw must be an integer (num_images, 3) tensor of frames, rows "
            f"and columns, got {grid_thw.dtype} of shape {list(grid_thw.shape)}"
        )
    m = spatial_merge_size
    if not isinstance(m, int) or m < 1:
        raise ValueError(f"patch_positions: spatial_merge_size must be an int >= 1, got {m!r}")
    device = grid_thw.device if device is None else torch.device(device)
    pieces = []
    for i, (t, h, w) in enumerate(grid_thw.tolist()):
        if t < 0 or h % m or w % m or h < 0 or w < 0:
            raise ValueError(
                f"patch_positions: image {i} has grid (t, h, w) = ({t}, {h}, {w}); t, h and w must "
                f"be >= 0 and h, w multiples of spatial_merge_size = {m}"
            )
        # rows[r0, c0, r1, c1] = r0 * m + r1: window (r0, c0), patch (r1, c1) within it.
        rows = torch.arange(h, device=device).view(h // m, 1, m, 1).expand(h // m, w // m, m, m)
        cols = torch.arange(w, device=device).view(1, w // m, 1, m).expand(h // m, w // m, m, m)
        frame = torch.stack([rows.reshape(-1), cols.reshape(-1)], dim=-1)  # (h * w, 2)
        if temporal:
            times = torch.arange(t, device=device).repeat_interleave(h * w).unsqueeze(-1)
            pieces.append(torch.cat([times, frame.repeat(t, 1)], dim=-1))
        else:
            pieces.append(frame.repeat(t, 1))
    if not pieces:
        return torch.empty(0, 3 if temporal else 2, dtype=torch.long, device=device)
    return torch.cat(pieces)
