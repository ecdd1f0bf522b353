# SPDX-License-Identifier: BSD-3-Clause
"""Qwen-Image-style RoPE: image grids centred on zero (negative positions), text after them on
every axis, complex tables.

The RoPE module (``QwenEmbedRope``: Qwen-Image and its controlnet; ``QwenEmbedLayer3DRope``:
Qwen-Image-Layered; ``NucleusMoEEmbedRope``: NucleusMoE-Image) holds complex64 tables for
positions -4096 .. 4095 (float32 angles, a share of the head per axis, ``theta ** (-2 j /
axes_dim[a])``). Its forward takes the images' ``(frame, height, width)`` and the text length and
returns ``(image freqs, text freqs)``: image ``i``'s tokens at frame ``i`` (Layered: its
condition image at frame -1), rows ``-(h - h // 2) .. h // 2 - 1`` and columns likewise
(``scale_rope``; else from 0); text token ``j`` at ``m + j`` on all three axes, ``m`` the largest
``max(h // 2, w // 2)`` of the images (NucleusMoE: the last image's). The processors call their
file's ``apply_rotary_emb_qwen`` / ``_apply_rotary_emb_nucleus(x, freqs, use_real=False)`` on
``(B, S, H, D)`` q and k of each stream (NucleusMoE: the text keys only), GPT-J pairs.

Patched, on this model instance only: the RoPE module holds :class:`..tables.Tables` whose origin
covers the negative positions (``-max_positions .. max_positions - 1`` from patch on, so that a
model compiled at once runs; eager calls grow them past that), and its forward returns the
positions' rows, int64 ``(S, 3)`` per stream, in the same pair; the processors rotate with
:func:`qwen_apply`.
"""

import functools
from typing import List, Tuple

import torch
from torch import Tensor, nn

from ..._patching.record import PatchRecord
from ..._patching.self_check import probe
from ...vision import axes_inv_freq
from .. import self_check
from ..model_parts import attention_modules, device_of
from ..processors import ProcessorPatcher, Swap, library_function
from ..rotate import carries_positions, rotate_positions, rotate_token_tables
from ..tables import Tables
from .install import install

ROTARY_ARGUMENTS = ("image_rotary_emb",)
#: The rotation functions of the three model files.
NAMES = ("apply_rotary_emb_qwen", "_apply_rotary_emb_nucleus")


def _shapes(video_fhw) -> List[Tuple[int, int, int]]:
    # As diffusers: the first sample's images stand for the batch's.
    if isinstance(video_fhw, list):
        video_fhw = video_fhw[0]
    if not isinstance(video_fhw, list):
        video_fhw = [video_fhw]
    return [tuple(int(n) for n in fhw) for fhw in video_fhw]


def _axis(n: int, centred: bool) -> Tuple[int, int]:
    return (-(n - n // 2), n // 2) if centred else (0, n)


def positions(rope: nn.Module, video_fhw, text_len: int, device) -> Tuple[Tensor, Tensor]:
    """The image tokens' and text tokens' (frame, row, column) positions, int64 ``(S, 3)``
    each, after making the tables cover them."""
    shapes = _shapes(video_fhw)
    layered = hasattr(rope, "_compute_condition_freqs")
    last_only = type(rope).__name__.startswith("Nucleus")
    centred = bool(rope.scale_rope)
    spans, text_start = [], 0
    for index, (frames, height, width) in enumerate(shapes):
        frame = (-1, 0) if layered and index == len(shapes) - 1 else (index, index + frames)
        spans.append((frame, _axis(height, centred), _axis(width, centred)))
        extent = max(height // 2, width // 2) if centred else max(height, width)
        text_start = extent if last_only else max(text_start, extent)
    if layered:
        text_start = max(text_start, len(shapes) - 1)
    low = min([0] + [span[0] for axes in spans for span in axes])
    high = max([text_start + text_len - 1] + [span[1] - 1 for axes in spans for span in axes])
    origin = rope.torch_rope.cover(low, high)
    pieces = []
    for (f0, f1), (r0, r1), (c0, c1) in spans:
        grid = torch.meshgrid(
            torch.arange(f0, f1, device=device),
            torch.arange(r0, r1, device=device),
            torch.arange(c0, c1, device=device),
            indexing="ij",
        )
        pieces.append(torch.stack(grid, dim=-1).reshape(-1, 3))
    image = torch.cat(pieces) + origin
    text = (torch.arange(text_len, device=device) + text_start + origin)[:, None].expand(-1, 3)
    return image, text


def forward(rope: nn.Module, video_fhw, device=None, max_txt_seq_len=None):
    """The patched forward of ``QwenEmbedRope`` and ``NucleusMoEEmbedRope``."""
    if max_txt_seq_len is None:
        raise ValueError("`max_txt_seq_len` must be provided.")
    return positions(rope, video_fhw, int(max_txt_seq_len), device or rope.torch_rope.cos.device)


def layered_forward(rope: nn.Module, video_fhw, max_txt_seq_len, device=None):
    """The patched forward of ``QwenEmbedLayer3DRope`` (its arguments in its order)."""
    return positions(rope, video_fhw, int(max_txt_seq_len), device or rope.torch_rope.cos.device)


def qwen_apply(
    tables: Tables, x: Tensor, freqs_cis, use_real: bool = True, use_real_unbind_dim: int = -1
) -> Tensor:
    """The files' ``apply_rotary_emb_qwen(x, freqs_cis, use_real, use_real_unbind_dim)``: x is
    ``(B, S, H, D)``; ``use_real=False`` (what the processors pass) rotates GPT-J pairs at the
    positions of one stream."""
    if use_real:  # diffusers' real form broadcasts its (S, D) tables as (1, 1, S, D)
        if carries_positions(freqs_cis):
            return rotate_positions(tables, x, freqs_cis[0], "bhsd")
        cos, sin = freqs_cis
        return rotate_token_tables(x, cos, sin, use_real_unbind_dim == -1, "bhsd")
    if not carries_positions(freqs_cis):
        return rotate_token_tables(x, freqs_cis, None, True, "bshd")
    return rotate_positions(tables, x, freqs_cis, "bshd")


def _check(rope: nn.Module, tables: Tables, original) -> None:
    device = tables.cos.device
    shapes = [(1, 3, 4), (1, 2, 3)] if hasattr(rope, "_compute_condition_freqs") else [(1, 3, 4)]
    text_len = 5
    head = sum(rope.axes_dim)
    q_image = probe((1, sum(f * h * w for f, h, w in shapes), 2, head), device, torch.float32)
    q_text = probe((1, text_len, 2, head), device, torch.float32, seed=1)

    def rotate(apply_fn, freqs):
        return torch.cat(
            [
                apply_fn(q_image, freqs[0], use_real=False),
                apply_fn(q_text, freqs[1], use_real=False),
            ],
            dim=1,
        )

    self_check.check(
        rope,
        type(rope).__name__,
        lambda: rotate(original, _unpatched_freqs(rope, shapes, text_len, device)),
        lambda: rotate(
            functools.partial(qwen_apply, tables),
            _patched_positions(rope, tables, shapes, text_len, device),
        ),
    )


def _unpatched_freqs(rope, shapes, text_len, device):
    return type(rope).forward(rope, [shapes], max_txt_seq_len=text_len, device=device)


def _patched_positions(rope, tables, shapes, text_len, device):
    holder = self_check.WithTables(rope, tables)
    return positions(holder, [shapes], text_len, device)


def patch(model: nn.Module, row, record: PatchRecord, patcher: ProcessorPatcher, options) -> None:
    rope = getattr(model, row.rope[0])
    inv_freq, section = axes_inv_freq(list(rope.axes_dim), float(rope.theta))
    # Centred grids reach below zero: the tables cover -rows .. rows - 1 from the start, so a
    # model compiled right after patch (which cannot grow them) runs at once.
    rows = options.rows
    tables = Tables(inv_freq, section, True, rows=rows, device=device_of(model), low=-rows)
    calls = [type(m.processor).__call__ for m in attention_modules(model)]
    originals = {n: f for n in NAMES for c in calls if (f := library_function(c, n)) is not None}
    if len(originals) != 1:
        raise NotImplementedError(
            f"torch_rope.diffusers.patch: expected this {type(model).__name__}'s processors to "
            f"rotate with one of {NAMES}, found {sorted(originals)}; not patching"
        )
    name, original = next(iter(originals.items()))
    _check(rope, tables, original)
    layered = hasattr(rope, "_compute_condition_freqs")
    swaps = {name: Swap(functools.partial(qwen_apply, tables), original)}
    install(
        model,
        [rope],
        tables,
        layered_forward if layered else forward,
        swaps,
        ROTARY_ARGUMENTS,
        record,
        patcher,
    )
