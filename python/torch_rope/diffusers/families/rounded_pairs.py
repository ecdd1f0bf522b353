# SPDX-License-Identifier: BSD-3-Clause
"""Kandinsky 5: 2x2 rotation matrices on GPT-J pairs from two RoPE modules, the rotated q and k
rounded to bfloat16 whatever the model's dtype.

``Kandinsky5RoPE1D(pos)`` (text) and ``Kandinsky5RoPE3D(shape, pos, scale_factor)`` (video)
index float32 angle buffers (``outer(arange(max_pos), freq)``, ``freq = exp(-log(max_period) j /
n)``, 1024 text rows, 128 per video axis) by positions the caller hands the transformer
(``text_rope_pos``; ``visual_rope_pos``, one index tensor per axis), divide the video angles by
``scale_factor`` (the pipeline's ``(1, 2, 2)`` or ``(1, 3.16, 3.16)``: fractional positions)
and return ``[[cos, -sin], [sin, cos]]``: text ``(S, 1, D / 2, 2, 2)`` (the model prepends a
batch dim), video ``(B, T, H, W, 1, D / 2, 2, 2)`` with (frame, row, column) over contiguous
shares of the head (``axes_dims``), which the model flattens over the grid (or over 8 x 8 blocks
for sparse attention). The processor (``Kandinsky5AttnProcessor``) rotates ``(B, S, H, D)`` q and
k with its nested ``apply_rotary(x, rope)``: float32 math, the result ``.to(torch.bfloat16)``,
then ``.type_as(query)``.

Patched, on this model instance only: each RoPE module returns positions of the same rank
(text ``(S, 1)``, video ``(B, T, H, W, 1, 3)``), which the model's own code reshapes as it does
its matrices. The text tables hold positions ``0 .. max_pos - 1``; the video tables are
coordinate tables whose row ``p`` holds ``p / scale_factor[a]`` on axis ``a``'s planes (built in
float64 once per scale and kept), so the caller's positions index them as they index diffusers'
buffers, with no host read. A negative position reads from the end, as tensor indexing does.
The processors (text blocks with the text tables, video blocks with the video ones) rotate with
one ``rope::apply`` and round the result to bfloat16 as diffusers does.
"""

import functools
import math

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from ..._patching.record import PatchRecord, bind
from ..._patching.self_check import probe
from ...ops import apply
from .. import self_check
from ..model_parts import attention_modules, device_of, require_patched
from ..processors import ProcessorPatcher, Swap, library_function
from ..tables import Tables

CALLER = "torch_rope.diffusers.patch"
ROTARY_ARGUMENTS = ("rotary_emb",)
NAME = "apply_rotary"
#: The blocks whose attention rotates with the text RoPE, and with the video RoPE.
TEXT_BLOCKS, VIDEO_BLOCKS = "text_transformer_blocks", "visual_transformer_blocks"
#: What diffusers' rotation rounds the rotated q and k to.
ROUNDED_TO = torch.bfloat16


def _frequencies(dim: int, max_period: float) -> Tensor:
    """diffusers' ``get_freqs(dim // 2, max_period)`` in float64."""
    n = dim // 2
    return torch.exp(-math.log(max_period) * torch.arange(n, dtype=torch.float64) / n)


def _wrapped(pos: Tensor, rows: int) -> Tensor:
    """Positions as tensor indexing reads them: a negative one from the end."""
    pos = torch.as_tensor(pos).long()
    return torch.where(pos < 0, pos + rows, pos)


def text_forward(rope: nn.Module, pos: Tensor) -> Tensor:
    """Kandinsky5RoPE1D once patched: the rows ``(*pos.shape, 1)`` (its matrices' rank, the
    plane dims dropped)."""
    return _wrapped(pos, rope.max_pos).to(rope.torch_rope.cos.device).unsqueeze(-1)


def video_forward(rope: nn.Module, shape, pos, scale_factor=(1.0, 1.0, 1.0)) -> Tensor:
    """Kandinsky5RoPE3D once patched: the coordinate tables of ``scale_factor`` current, and
    each token's row on each axis ``(B, T, H, W, 1, 3)``, laid out as diffusers' matrices."""
    batch, frames, height, width = shape
    tables = rope.torch_rope
    if not torch.compiler.is_compiling():
        scales = tuple(float(s) for s in scale_factor)
        base = torch.arange(tables.rows_per_axis, dtype=torch.float64)
        tables.coordinate_rows(("scale", scales), [base / s for s in scales])
    device = tables.cos.device
    axes = [_wrapped(p, n).to(device) for p, n in zip(pos, rope.max_pos)]
    grid = (batch, frames, height, width)
    found = torch.stack(
        [
            axes[0].view(1, frames, 1, 1).expand(grid),
            axes[1].view(1, 1, height, 1).expand(grid),
            axes[2].view(1, 1, 1, width).expand(grid),
        ],
        dim=-1,
    )
    return found.unsqueeze(-2)


def rounded_apply(tables: Tables, x: Tensor, rope: Tensor) -> Tensor:
    """The processor's ``apply_rotary(x, rope)`` by the op: ``rope`` the rows a patched RoPE
    module returned, or rotation matrices ``(..., D / 2, 2, 2)`` from elsewhere (rotated one
    table row per token); q/k ``(B, S, H, D)``; the result rounded to bfloat16, as diffusers'."""
    if rope.is_floating_point():
        cos = rope[..., 0, 0].to(device=x.device, dtype=torch.float32)
        sin = rope[..., 1, 0].to(device=x.device, dtype=torch.float32)
        rows = torch.arange(cos[..., 0].numel(), device=x.device).view(cos.shape[:-1])
        cos, sin = cos.reshape(-1, cos.size(-1)), sin.reshape(-1, sin.size(-1))
        out = apply(x, cos, sin, rows, interleaved=True)
    else:
        out = apply(x, tables.cos, tables.sin, rope, interleaved=True, mrope_section=tables.section)
    return out.to(ROUNDED_TO)


class NoRounding(TorchFunctionMode):
    """``.to(torch.bfloat16)`` a no-op: the self-check compares the rotation before the rounding
    both sides apply (a float32 rounding difference before it would flip a bf16 rounding, 2 ** -8
    relative, which is no verdict on the rotation)."""

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.to and (ROUNDED_TO in args or kwargs.get("dtype") is ROUNDED_TO):
            return args[0]
        return func(*args, **kwargs)


def _unrounded(function, *args):
    with NoRounding():
        return function(*args)


def make_tables(text: nn.Module, video: nn.Module, device):
    """The text tables (one axis, ``max_pos`` rows) and the video tables (three axes)."""
    text_tables = Tables(
        _frequencies(text.dim, text.max_period), None, True, rows=text.max_pos, device=device
    )
    dims = list(video.axes_dims)
    inv_freq = torch.cat([_frequencies(d, video.max_period) for d in dims])
    video_tables = Tables(inv_freq, [d // 2 for d in dims], True, rows=1, device=device)
    video_tables.rows_per_axis = max(video.max_pos)
    return text_tables, video_tables


def _default_scale(tables: Tables) -> None:
    """The video tables of scale 1 current (a model compiled right after patch runs at once)."""
    base = torch.arange(tables.rows_per_axis, dtype=torch.float64)
    tables.coordinate_rows(("scale", (1.0, 1.0, 1.0)), [base] * 3)


def _check(model, text, video, original, text_tables, video_tables) -> None:
    device = text_tables.cos.device
    d = text.dim
    name = type(model).__name__
    # A model cast to bf16 before patch: judge ours by the buffers its class builds.
    text = self_check.as_built(text, f"{name}'s text RoPE")
    video = self_check.as_built(video, f"{name}'s video RoPE")
    pos = torch.tensor([0, 3, 1, 6, 2, -1], device=device)
    q = probe((1, pos.numel(), 2, d), device, torch.float32)
    theirs = type(text).forward(text, pos).unsqueeze(0)
    ours = text_forward(self_check.WithTables(text, text_tables), pos).unsqueeze(0)
    self_check.check(
        model,
        f"{name}'s text RoPE",
        functools.partial(_unrounded, original, q, theirs),
        functools.partial(_unrounded, rounded_apply, text_tables, q, ours),
    )
    shape = (1, 2, 3, 4)
    vpos = [torch.arange(n, device=device) + o for n, o in zip(shape[1:], (0, 1, 2))]
    for scales in ((1.0, 1.0, 1.0), (1.0, 3.16, 2.0)):
        q = probe((1, 24, 2, sum(video.axes_dims)), device, torch.float32)
        theirs = type(video).forward(video, shape, vpos, scales).flatten(1, 3)
        ours = video_forward(
            self_check.WithTables(video, video_tables), shape, vpos, scales
        ).flatten(1, 3)
        self_check.check(
            model,
            f"{name}'s video RoPE",
            functools.partial(_unrounded, original, q, theirs),
            functools.partial(_unrounded, rounded_apply, video_tables, q, ours),
        )
    # diffusers' matrices handed to a patched processor rotate as diffusers rotates them.
    self_check.check(
        model,
        f"{name}'s rotation matrices",
        functools.partial(_unrounded, original, q, theirs),
        functools.partial(_unrounded, rounded_apply, video_tables, q, theirs),
    )


def patch(model: nn.Module, row, record: PatchRecord, patcher: ProcessorPatcher, options) -> None:
    text, video = (getattr(model, name) for name in row.rope)
    if len(set(video.max_pos)) != 1:
        raise NotImplementedError(
            f"{CALLER}: the video RoPE's axes have {video.max_pos} positions; one coordinate "
            "table for all three needs them equal (an index past a shorter axis would read a "
            "padded row instead of failing); not patching"
        )
    calls = [type(m.processor).__call__ for m in attention_modules(model)]
    original = next((f for c in calls if (f := library_function(c, NAME))), None)
    if original is None:
        raise NotImplementedError(f"{CALLER}: no processor of this model defines {NAME}")
    text_tables, video_tables = make_tables(text, video, device_of(model))
    _check(model, text, video, original, text_tables, video_tables)
    _default_scale(video_tables)
    patched = []
    for rope, tables, forward, blocks, key in (
        (text, text_tables, text_forward, getattr(model, TEXT_BLOCKS), "text"),
        (video, video_tables, video_forward, getattr(model, VIDEO_BLOCKS), "video"),
    ):
        record.set(rope, "torch_rope", tables)
        record.set(rope, "forward", bind(forward, rope))
        swaps = {NAME: Swap(functools.partial(rounded_apply, tables))}
        for attention in attention_modules(blocks):
            if patcher.patch_processor(attention, swaps, key):
                patched.append(attention)
    require_patched(model, patched, ROTARY_ARGUMENTS)
