# SPDX-License-Identifier: BSD-3-Clause
"""Wan-style RoPE: the latent video grid's (frame, row, column), tables built once, GPT-J pairs.

The RoPE module (``WanRotaryPosEmbed`` and its copies: Wan 2.1/2.2, Wan-VACE, Wan-Animate,
SkyReels-V2, ChronoEdit, SANA-Video) builds float64-angle cos/sin for positions
``0 .. max_seq_len - 1`` once, at ``__init__``, a share of the head per axis (``t_dim``,
``h_dim``, ``w_dim``), and its forward gathers them on the grid of the latents it is handed,
``(1, F * H * W, 1, D)``. The self-attention processors rotate q and k ``(B, S, H, D)`` with a
function defined inside ``__call__``, ``apply_rotary_emb(x, cos, sin)``, in the input's dtype
(bf16 math in a bf16 model; ours is float32). ChronoEdit's two-frame edits put their frames at
positions 0 and ``temporal_skip_len - 1``.

Patched, on this model instance only: the RoPE module holds :class:`..tables.Tables` for the same
``max_seq_len`` positions (float64 frequencies, a share per axis) and its forward returns the
grid's positions ``(1, F * H * W, 1, 3)``, the rank and sequence dim of the cos/sin it replaces
(context parallelism splits them there), as the pair ``(positions, positions)``; the processors'
nested function is a stub that calls :func:`nested_apply`, one ``rope::apply`` per tensor.

A model cast to bf16 before patch (``pipe.to(torch.bfloat16)``; ChronoEdit's and SANA-Video's
bf16 loads too, whose ``_keep_in_fp32_modules`` do not keep the RoPE module) has its cos/sin
buffers rounded to bf16, and diffusers rotates with those: the self-check judges ours by the
float32 buffers they were rounded from (:func:`..self_check.as_built`), and the patched model
rotates with float32 tables, at least as accurate as the unpatched one.
"""

import functools
import inspect

import torch
from torch import Tensor, nn

from ..._patching.record import PatchRecord, bind
from ..._patching.self_check import probe
from ...ops import apply
from ...vision import axes_inv_freq
from .. import self_check
from ..model_parts import attention_modules, device_of, require_patched
from ..processors import ProcessorPatcher, Swap, library_function
from ..rotate import carries_positions, rotate_token_tables
from ..tables import Tables

#: The processors' nested rotation function, and the argument they receive the RoPE by.
NAME = "apply_rotary_emb"
ROTARY_ARGUMENTS = ("rotary_emb",)


def _split(rope: nn.Module):
    """The head's share of each axis in the forward (ChronoEdit's forward splits by thirds)."""
    d = rope.attention_head_dim
    if hasattr(rope, "temporal_skip_len"):
        return [d - 2 * (d // 3), d // 3, d // 3]
    return _built(rope)


def _built(rope: nn.Module):
    """The head's share of each axis its buffers were built with (ChronoEdit keeps no t_dim)."""
    d = rope.attention_head_dim
    h = w = 2 * (d // 6)
    return [getattr(rope, "t_dim", d - h - w), getattr(rope, "h_dim", h), getattr(rope, "w_dim", w)]


def _theta(rope: nn.Module) -> float:
    return float(inspect.signature(type(rope).__init__).parameters["theta"].default)


def grid_positions(rope: nn.Module, hidden_states: Tensor) -> Tensor:
    """The (frame, row, column) of every token, ``(1, F * H * W, 1, 3)``."""
    _, _, frames, height, width = hidden_states.shape
    p_t, p_h, p_w = rope.patch_size
    f, h, w = frames // p_t, height // p_h, width // p_w
    device = hidden_states.device
    if frames == 2 and hasattr(rope, "temporal_skip_len"):  # ChronoEdit's edit pair
        frame = torch.tensor([0, min(rope.temporal_skip_len, rope.max_seq_len) - 1], device=device)
    else:
        frame = torch.arange(f, device=device)
    grid = torch.meshgrid(
        frame, torch.arange(h, device=device), torch.arange(w, device=device), indexing="ij"
    )
    return torch.stack(grid, dim=-1).reshape(1, -1, 1, 3)


def grid_forward(rope: nn.Module, hidden_states: Tensor):
    positions = grid_positions(rope, hidden_states)
    return positions, positions


def nested_apply(tables: Tables, hidden_states: Tensor, freqs_cos, freqs_sin) -> Tensor:
    """The processors' ``apply_rotary_emb(x, cos, sin)``: positions from the patched module, or
    (a caller's own) cos/sin."""
    if not carries_positions(freqs_cos):
        return rotate_token_tables(hidden_states, freqs_cos, freqs_sin, True, "as_is")
    return apply(
        hidden_states,
        tables.cos,
        tables.sin,
        freqs_cos,
        interleaved=True,
        mrope_section=tables.section,
    )


def patch(model: nn.Module, row, record: PatchRecord, patcher: ProcessorPatcher, options) -> None:
    rope = getattr(model, row.rope[0])
    theta = _theta(rope)
    built, _ = axes_inv_freq(_built(rope), theta)
    split = _split(rope)
    if sum(split) != rope.attention_head_dim or any(d % 2 for d in split):
        raise NotImplementedError(
            f"torch_rope.diffusers.patch: {type(rope).__name__} splits its head into {split}, "
            "not whole pairs per axis; not patching"
        )
    tables = Tables(
        built, [d // 2 for d in split], True, rows=rope.max_seq_len, device=device_of(model)
    )
    swaps = {NAME: Swap(functools.partial(nested_apply, tables))}
    attention = attention_modules(model)
    rotating = [m for m in attention if library_function(type(m.processor).__call__, NAME)]
    if not rotating:
        raise NotImplementedError(
            f"torch_rope.diffusers.patch: no processor of this {type(model).__name__} defines "
            f"{NAME}; not patching"
        )
    original = library_function(type(rotating[0].processor).__call__, NAME)
    frames = 2 if hasattr(rope, "temporal_skip_len") else 3
    p_t, p_h, p_w = rope.patch_size
    hidden = torch.zeros(1, 1, frames * p_t, 3 * p_h, 2 * p_w, device=tables.cos.device)
    q = probe((1, frames * 6, 2, rope.attention_head_dim), tables.cos.device, torch.float32)
    # A model cast to bf16 before patch has its RoPE buffers rounded: judge ours by the float32
    # ones they were rounded from.
    reference = self_check.as_built(rope, type(rope).__name__)
    self_check.check(
        rope,
        type(rope).__name__,
        lambda: original(q, *type(rope).forward(reference, hidden)),
        lambda: nested_apply(tables, q, *grid_forward(rope, hidden)),
    )
    record.set(rope, "torch_rope", tables)
    record.set(rope, "forward", bind(grid_forward, rope))
    patched = [m for m in attention if patcher.patch_processor(m, swaps)]
    require_patched(model, patched, ROTARY_ARGUMENTS)
