# SPDX-License-Identifier: BSD-3-Clause
"""LTX-Video's RoPE: fractional (frame, row, column) coordinates, the three axes interleaved
plane by plane, over the whole inner dim.

``LTXVideoRotaryPosEmbed`` computes, every forward, for each token's coordinates ``c`` (the
latent grid scaled by ``rope_interpolation_scale`` and the patch sizes, over a base of
``base_num_frames x base_height x base_width``; or ``video_coords / base`` from the caller) the
angles ``f_k * (2 c_a - 1)`` with ``f = theta ** linspace(0, 1, dim // 6) * pi / 2`` in float32;
plane ``p`` turns by axis ``(p - P) % 3`` at frequency ``f_((p - P) // 3)``, after ``P = (dim %
6) / 2`` leading planes that do not turn. Its attention rotates ``(B, S, C)`` q and k, one
frequency vector over all heads (``C = dim``), GPT-J pairs.

Patched, on this model instance only: the planes are the op's interleaved multi-axis rule
(``mrope_interleaved``: plane ``k`` reads axis ``k % 3``) with the axes handed to it in the
order that rule needs after the ``P`` still planes (whose frequency is 0), and the coordinates
are **coordinate tables** (:meth:`..tables.Tables.coordinate_rows`): each axis' distinct values
``2 c - 1`` in float64, built once per grid and scale (or per set of ``video_coords``) and kept;
the RoPE module returns each token's index into them, ``(B, S, 3)``, as the pair.
"""

import functools
import math

import torch
from torch import Tensor, nn

from ..._patching.record import PatchRecord
from ..._patching.self_check import probe
from ...ops import apply
from .. import self_check
from ..model_parts import attention_modules, device_of
from ..processors import ProcessorPatcher, Swap, library_function
from ..rotate import carries_positions, rotate_token_tables
from ..tables import Tables
from .install import install

ROTARY_ARGUMENTS = ("image_rotary_emb",)
NAME = "apply_rotary_emb"


def make_tables(rope: nn.Module, device) -> Tables:
    """One frequency per plane: ``P`` zeros, then each of ``dim // 6`` frequencies three times
    (frame, row, column); the axes in the op's order (see :func:`op_axes`)."""
    planes = rope.dim // 2
    count = rope.dim // 6
    still = planes - 3 * count
    exponents = torch.linspace(0.0, 1.0, count, dtype=torch.float64)
    frequencies = float(rope.theta) ** exponents * (math.pi / 2)
    inv_freq = torch.cat(
        [torch.zeros(still, dtype=torch.float64), frequencies.repeat_interleave(3)]
    )
    wide = -(-planes // 3)
    section = [planes - 2 * wide, wide, wide]
    return Tables(inv_freq, section, True, mrope_interleaved=True, rows=1, device=device)


def op_axes(rope: nn.Module):
    """The model's axis (0 frame, 1 row, 2 column) behind each of the op's three axes: plane
    ``k`` reads the op's axis ``k % 3``, and the model's ``(k - P) % 3``."""
    still = rope.dim // 2 - 3 * (rope.dim // 6)
    return [(j - still) % 3 for j in range(3)]


def _scales(rope, rope_interpolation_scale):
    if rope_interpolation_scale is None:
        return (1.0, 1.0, 1.0)
    t, h, w = (float(s) for s in rope_interpolation_scale)
    return (
        t * rope.patch_size_t / rope.base_num_frames,
        h * rope.patch_size / rope.base_height,
        w * rope.patch_size / rope.base_width,
    )


def positions(
    rope: nn.Module,
    tables: Tables,
    batch: int,
    num_frames,
    height,
    width,
    rope_interpolation_scale=None,
    video_coords=None,
    device=None,
) -> Tensor:
    """Every token's indices into the coordinate tables, in the op's axis order, ``(B, S, 3)``."""
    order = op_axes(rope)
    if video_coords is None:
        sizes = (int(num_frames), int(height), int(width))
        scales = _scales(rope, rope_interpolation_scale)
        coordinates = [
            2 * torch.arange(n, dtype=torch.float64) * s - 1 for n, s in zip(sizes, scales)
        ]
        if not torch.compiler.is_compiling():
            tables.coordinate_rows(("grid", sizes, scales), [coordinates[a] for a in order])
        axes = [torch.arange(n, device=device) for n in sizes]
        grid = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, 3)
        return grid[:, order].unsqueeze(0).expand(batch, -1, -1)
    bases = (rope.base_num_frames, rope.base_height, rope.base_width)
    host = video_coords.detach().to("cpu", torch.float64)  # divided in float64, not float32
    host = torch.stack([host[:, a] / b for a, b in enumerate(bases)], dim=-1)
    coordinates, indices = [], []
    for a in order:
        unique, inverse = torch.unique(host[..., a], sorted=True, return_inverse=True)
        coordinates.append(2 * unique - 1)
        indices.append(inverse)
    tables.coordinate_rows(("coords", host.numpy().tobytes(), tuple(host.shape)), coordinates)
    return torch.stack(indices, dim=-1).to(video_coords.device)


def forward(
    rope: nn.Module,
    hidden_states: Tensor,
    num_frames=None,
    height=None,
    width=None,
    rope_interpolation_scale=None,
    video_coords=None,
):
    """The patched ``LTXVideoRotaryPosEmbed.forward``."""
    rows = positions(
        rope,
        rope.torch_rope,
        hidden_states.size(0),
        num_frames,
        height,
        width,
        rope_interpolation_scale,
        video_coords,
        hidden_states.device,
    )
    return rows, rows


def ltx_apply(tables: Tables, x: Tensor, freqs) -> Tensor:
    """The file's ``apply_rotary_emb(x, (cos, sin))`` on ``(B, S, C)``."""
    if not carries_positions(freqs):
        return rotate_token_tables(x, freqs[0], freqs[1], True, "as_is")
    return apply(
        x,
        tables.cos,
        tables.sin,
        freqs[0],
        interleaved=True,
        mrope_section=tables.section,
        mrope_interleaved=True,
    )


def _unpatched(rope, original, q, args):
    # diffusers' formula in float64: its float32 angles reach 1.6e4 rad.
    with self_check.InFloat64():
        hidden, frames, height, width, scale, coords = args
        coords = None if coords is None else coords.double()
        freqs = type(rope).forward(rope, hidden.double(), frames, height, width, scale, coords)
        return original(q.double(), freqs).float()


def _patched(rope, tables, q, args):
    hidden, frames, height, width, scale, coords = args
    rows = positions(rope, tables, 1, frames, height, width, scale, coords, hidden.device)
    return ltx_apply(tables, q, (rows, rows))


def patch(model: nn.Module, row, record: PatchRecord, patcher: ProcessorPatcher, options) -> None:
    rope = getattr(model, row.rope[0])
    tables = make_tables(rope, device_of(model))
    calls = [type(m.processor).__call__ for m in attention_modules(model)]
    original = next((f for c in calls if (f := library_function(c, NAME))), None)
    if original is None:
        raise NotImplementedError(f"torch_rope.diffusers.patch: no processor calls {NAME}")
    device = tables.cos.device
    hidden = torch.zeros(1, 24, 1, device=device)
    scale = (torch.tensor(8 / 25.0), 32.0, 32.0)  # what LTXPipeline hands it
    coords = torch.rand(1, 3, 24, generator=torch.Generator().manual_seed(0)) * 50
    for args in ((hidden, 2, 3, 4, scale, None), (hidden, None, None, None, None, coords)):
        q = probe((1, 24, rope.dim), device, torch.float32)
        self_check.check(
            rope,
            type(rope).__name__,
            functools.partial(_unpatched, rope, original, q, args),
            functools.partial(_patched, rope, tables, q, args),
        )
    swaps = {NAME: Swap(functools.partial(ltx_apply, tables), original)}
    install(model, [rope], tables, forward, swaps, ROTARY_ARGUMENTS, record, patcher)
