# SPDX-License-Identifier: BSD-3-Clause
"""Multi-axis RoPE for images and video: the frequencies of axial (2-D, 3-D) RoPE and the
positions of image patches and video tokens.

A vision encoder's 2-D RoPE is the ops' multi-axis form with one axis per image dimension: plane
``k`` turns by the row or the column of its patch, as ``mrope_section`` deals the planes::

    inv_freq, section = torch_rope.vision.axial_inv_freq(10000.0, head_dim, num_axes=2)
    cos, sin = torch_rope.rope_tables_from_inv_freq(inv_freq, max_side)
    positions = torch_rope.vision.patch_positions(grid_thw, spatial_merge_size=2)  # (N, 2)
    q, k = torch_rope.apply_qk(q, k, cos, sin, positions.unsqueeze(-2),           # (N, H, D)
                               interleaved=False, mrope_section=section)

A diffusion transformer (DiT) gives each axis a share of the head of its own (FLUX: 16, 56 and 56
of 128 features for frame, row and column; Wan: 44, 42, 42) and rotates GPT-J pairs::

    cos, sin, section = torch_rope.vision.axes_tables((16, 56, 56), 10000.0, max_position=512)
    ids = torch_rope.vision.flux_ids(text_len=512, rows=64, columns=64)     # (512 + 4096, 3)
    q = torch_rope.apply(q, cos, sin, ids.unsqueeze(-2),                    # q: (B, S, H, D)
                         interleaved=True, mrope_section=section)
    positions = torch_rope.vision.grid_positions(frames=21, rows=30, columns=52)  # (T*H*W, 3)

Nothing here rotates: these are the inputs the models build in Python before calling RoPE.
"""

from typing import List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from .ops.tables import rope_tables_from_inv_freq

__all__ = [
    "axes_inv_freq",
    "axes_tables",
    "axial_inv_freq",
    "flux_ids",
    "grid_positions",
    "patch_positions",
]


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


def _per_axis(name: str, value, axes: int) -> List[float]:
    values = list(value) if isinstance(value, (list, tuple)) else [value] * axes
    if len(values) != axes:
        raise ValueError(f"axes_inv_freq: {name} must be a number or {axes} numbers, got {value!r}")
    return [float(v) for v in values]


def axes_inv_freq(
    axes_dims: Sequence[int],
    theta: Union[float, Sequence[float]] = 10000.0,
    *,
    scales: Union[float, Sequence[float]] = 1.0,
) -> Tuple[Tensor, List[int]]:
    """Float64 ``inv_freq`` of a DiT's axial RoPE, where each position axis has a share of the
    head of its own, and the ``mrope_section`` that goes with it.

    ``axes_dims[a]`` features (an even number; 0 for an unused axis) rotate by axis ``a``, with the
    frequencies of plain RoPE over that share, ``theta_a ** (-2 j / axes_dims[a]) / scales[a]``
    for ``j < axes_dims[a] / 2``: FLUX's ``axes_dims_rope`` (16, 56, 56), HunyuanVideo's
    ``rope_axes_dim``, Wan's (44, 42, 42) for a 128 head. ``theta`` is one base or one per axis
    (Cosmos scales it per axis); ``scales`` divides an axis' frequencies, the same as dividing its
    positions (an interpolation scale, a frame rate ratio). Section ``a`` is ``axes_dims[a] / 2``
    planes, contiguous, in axis order.
    """
    dims = list(axes_dims)
    if not dims or any(not isinstance(d, int) or d < 0 or d % 2 for d in dims):
        raise ValueError(
            "axes_inv_freq: axes_dims must be even non-negative ints, one per axis, got "
            f"{axes_dims!r}"
        )
    thetas = _per_axis("theta", theta, len(dims))
    factors = _per_axis("scales", scales, len(dims))
    if any(not t > 1.0 for t in thetas) or any(not f > 0.0 for f in factors):
        raise ValueError(
            f"axes_inv_freq: theta must be > 1 and scales > 0, got theta={theta!r}, "
            f"scales={scales!r}"
        )
    parts = [
        t ** (-torch.arange(0, d, 2, dtype=torch.float64) / d) / f if d else torch.zeros(0)
        for d, t, f in zip(dims, thetas, factors)
    ]
    return torch.cat(parts).to(torch.float64), [d // 2 for d in dims]


def axes_tables(
    axes_dims: Sequence[int],
    theta: Union[float, Sequence[float]] = 10000.0,
    max_position: int = 4096,
    device: Optional[torch.device] = None,
    *,
    scales: Union[float, Sequence[float]] = 1.0,
) -> Tuple[Tensor, Tensor, List[int]]:
    """``(cos, sin, mrope_section)`` of a DiT's axial RoPE in one call: float32 tables of
    ``max_position`` rows (positions ``0 .. max_position - 1`` on every axis) built in float64
    from :func:`axes_inv_freq`, and the section to pass to the ops with positions
    ``(..., len(axes_dims))``."""
    inv_freq, section = axes_inv_freq(axes_dims, theta, scales=scales)
    cos, sin = rope_tables_from_inv_freq(inv_freq, max_position, device)
    return cos, sin, section


def grid_positions(
    frames: int,
    rows: int,
    columns: int,
    *,
    start: Sequence[int] = (0, 0, 0),
    device: Optional[torch.device] = None,
) -> Tensor:
    """The (frame, row, column) position of every token of a video latent grid, int64
    ``(frames * rows * columns, 3)``, frame-major then row-major: the order in which DiTs flatten
    their patches (Wan, HunyuanVideo, CogVideoX 1.5, Cosmos). ``start`` offsets each axis (a
    second clip after a first, a reference frame at another index)."""
    for name, n in (("frames", frames), ("rows", rows), ("columns", columns)):
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"grid_positions: {name} must be an int >= 0, got {n!r}")
    if len(start) != 3:
        raise ValueError(
            f"grid_positions: start must be 3 ints (frame, row, column), got {start!r}"
        )
    axes = [torch.arange(s, s + n, device=device) for s, n in zip(start, (frames, rows, columns))]
    grid = torch.meshgrid(*axes, indexing="ij")
    return torch.stack(grid, dim=-1).reshape(-1, 3)


def flux_ids(
    text_len: int,
    rows: int,
    columns: int,
    *,
    frame: int = 0,
    axes: int = 3,
    device: Optional[torch.device] = None,
) -> Tensor:
    """FLUX-style position ids of a joint text + image sequence, text first: int64
    ``(text_len + rows * columns, axes)``.

    ``axes=3`` (FLUX.1, Chroma, Bria, Ovis ...): text tokens at (0, 0, 0), image tokens at
    ``(frame, row, column)`` (FLUX.1 Kontext puts its reference image at ``frame=1``).
    ``axes=4`` (FLUX.2): (frame, row, column, index): text tokens at (0, 0, 0, i) for the i-th
    token, image tokens at ``(frame, row, column, 0)``. The diffusers pipelines hand these as
    float ``txt_ids``/``img_ids``; with :func:`axes_tables`, pass them to the ops as they are."""
    if axes not in (3, 4):
        raise ValueError(f"flux_ids: axes must be 3 (FLUX.1) or 4 (FLUX.2), got {axes!r}")
    if not isinstance(text_len, int) or text_len < 0:
        raise ValueError(f"flux_ids: text_len must be an int >= 0, got {text_len!r}")
    text = torch.zeros(text_len, axes, dtype=torch.long, device=device)
    if axes == 4:
        text[:, 3] = torch.arange(text_len, device=device)
    image = grid_positions(1, rows, columns, start=(frame, 0, 0), device=device)
    if axes == 4:
        image = torch.cat([image, torch.zeros_like(image[:, :1])], dim=-1)
    return torch.cat([text, image])
