# SPDX-License-Identifier: BSD-3-Clause
""":class:`torch_rope.RotaryPositionalEmbedding`'s forward in each mode (tables with positions,
table-free, packed sequences in either): for plain tensors in eager mode one C++ call
(csrc/rules.h: module_apply_frequencies, module_apply_packed), else the Python mirrors of those
rules, with the same messages, then :func:`torch_rope.apply` (the path torch.compile and
torch.func trace: they cannot trace into a pybind11 call). tests/python/module pins each mirror to
its C++ original over the sample inputs.
"""

import sys
from typing import NamedTuple, Optional

import torch
from torch import Tensor

from ..distributed import as_dtensors_like
from ..distributed.dtensor_args import wrap_global
from ..ops._native import _C
from ..ops.rotation import apply, eager_fast_path

_MODULE = "RotaryPositionalEmbedding"


class Packed(NamedTuple):
    """The packed sequences of a call (``forward(x, cu_seqlens=...)``, x's tokens on dim 0), as
    the op's packed-sequence form and C++'s rope::PackedSequences take them."""

    cu_seqlens: Tensor
    seq_offsets: Optional[Tensor]
    cp_size: int
    cp_rank: int


def forward_tables(module, x: Tensor, token_positions: Optional[Tensor]) -> Tensor:
    """The tables mode's forward with positions (or the default arange), as torch.compile and
    torch.func trace it: the C++ rules of csrc/rules.h, mirrored."""
    if token_positions is not None and not isinstance(token_positions, Tensor):
        raise TypeError(
            "RotaryPositionalEmbedding: token_positions must be an int32/int64 Tensor or "
            f"None, got {type(token_positions).__name__}"
        )
    check_module_input(x, module.d_k, module.seq_dim, token_positions is not None)
    num_axes = 0 if module.mrope_section is None else len(module.mrope_section)
    positions = module_positions(x, token_positions, module.seq_dim, num_axes)
    positions = long_rope_positions(positions, module._long_offset, module._long_after)
    cos, sin = module._buffers["cos"], module._buffers["sin"]
    if type(x) is not Tensor:  # a DTensor x gets DTensor tables and positions, no communication
        cos, sin, positions = as_dtensors_like(x, cos, sin, positions)
    if num_axes:
        return apply(
            x,
            cos,
            sin,
            positions,
            interleaved=module.interleaved,
            mrope_section=module.mrope_section,
            mrope_interleaved=module.mrope_interleaved,
        )
    return apply(x, cos, sin, positions, interleaved=module.interleaved)


def forward_frequencies(module, x: Tensor, token_positions: Optional[Tensor]) -> Tensor:
    """A table-free module's forward with positions (or the default arange)."""
    buffers = module._buffers
    freqs, long_freqs = buffers["freqs"], buffers.get("long_freqs")
    if (
        module.mrope_section is None
        and eager_fast_path(x)
        and (token_positions is None or type(token_positions) is Tensor)
    ):
        return _C._module_forward_frequencies(
            x, token_positions, freqs, long_freqs, module.attention_factor, module.long_after,
            module.d_k, module.seq_dim, module.interleaved,
        )  # fmt: skip
    if token_positions is not None and not isinstance(token_positions, Tensor):
        raise TypeError(
            f"{_MODULE}: token_positions must be an int32/int64 Tensor or None, got "
            f"{type(token_positions).__name__}"
        )
    check_module_input(x, module.d_k, module.seq_dim, token_positions is not None)
    num_axes = 0 if module.mrope_section is None else len(module.mrope_section)
    positions = module_positions(x, token_positions, module.seq_dim, num_axes)
    freqs = long_rope_frequencies(freqs, long_freqs, positions, module.long_after)
    if type(x) is not Tensor:  # a DTensor x: replicated freqs, positions placed as for tables
        freqs, _, positions = as_dtensors_like(x, freqs, freqs, positions)
    kw = {}
    if num_axes:
        kw.update(mrope_section=module.mrope_section, mrope_interleaved=module.mrope_interleaved)
    return apply(
        x,
        freqs=freqs,
        positions=positions,
        attention_factor=module.attention_factor,
        interleaved=module.interleaved,
        **kw,
    )


def forward_packed(module, x: Tensor, packed: Packed) -> Tensor:
    """The forward with packed sequences (x (T, ..., d_k), tokens on dim 0), either mode:
    LongRoPE's switch from the largest position the sequences give (tables: the sequences'
    offsets shifted to the long tables; table-free: the long frequencies)."""
    cu_seqlens, seq_offsets, cp_size, cp_rank = packed
    if module.mrope_section is not None:
        raise ValueError(
            f"{_MODULE}: cu_seqlens cannot be combined with mrope_section (multi-axis "
            "positions are per token); pass the positions"
        )
    buffers = module._buffers
    tables = module.tables
    cos, sin = (buffers["cos"], buffers["sin"]) if tables else (None, None)
    freqs = None if tables else buffers["freqs"]
    long_freqs = None if tables else buffers.get("long_freqs")
    if (
        eager_fast_path(x)
        and type(cu_seqlens) is Tensor
        and (seq_offsets is None or type(seq_offsets) is Tensor)
    ):
        check_module_input(x, module.d_k, module.seq_dim, True)
        return _C._module_forward_packed(
            x, cos, sin, module.long_offset, freqs, long_freqs, module.attention_factor,
            module.long_after, cu_seqlens, seq_offsets, cp_size, cp_rank, module.interleaved,
        )  # fmt: skip
    check_module_input(x, module.d_k, module.seq_dim, True)
    switches = module.long_offset != 0 if tables else long_freqs is not None
    if switches and cu_seqlens.dim() == 1 and cu_seqlens.shape[0] > 1:
        is_long = packed_last_position(cu_seqlens, seq_offsets, cp_size, cp_rank) >= (
            module.long_after
        )
        if tables:
            base = (
                seq_offsets.to(torch.int64)
                if seq_offsets is not None
                else torch.zeros(
                    cu_seqlens.shape[0] - 1, dtype=torch.int64, device=cu_seqlens.device
                )
            )
            seq_offsets = base + is_long.to(torch.int64) * module.long_offset
        else:
            freqs = torch.where(is_long, long_freqs, freqs)
    if type(x) is not Tensor:  # DTensor x: every other tensor replicated
        cos, sin, freqs, cu_seqlens, seq_offsets = _replicated_like(
            x, cos, sin, freqs, cu_seqlens, seq_offsets
        )
    if tables:
        return apply(
            x, cos, sin, cu_seqlens=cu_seqlens, seq_offsets=seq_offsets, cp_size=cp_size,
            cp_rank=cp_rank, interleaved=module.interleaved,
        )  # fmt: skip
    return apply(
        x, freqs=freqs, attention_factor=module.attention_factor, cu_seqlens=cu_seqlens,
        seq_offsets=seq_offsets, cp_size=cp_size, cp_rank=cp_rank, interleaved=module.interleaved,
    )  # fmt: skip


# ---- the mirrors of csrc/rules.h ---------------------------------------------------------------
# torch.compile and torch.func cannot trace into a pybind11 call, so the path they take runs
# these mirrors of csrc/rules.h (check_module_input, module_positions, long_rope_positions), with
# the same messages. tests/python pins each to its C++ original over the sample inputs.


def check_module_input(x: Tensor, d_k: int, seq_dim: int, has_positions: bool) -> None:
    """rope::detail::check_module_input: x is (..., d_k), with a sequence axis when positions
    are not given."""
    if x.dim() < 1 or x.shape[-1] != d_k:
        raise ValueError(
            f"{_MODULE}: x.size(-1) must equal d_k = {d_k}, got x of shape {list(x.shape)}"
        )
    if not has_positions and x.dim() - 1 < -seq_dim - 1:
        raise ValueError(
            f"{_MODULE}: without token_positions, x needs a sequence axis at seq_dim = {seq_dim}, "
            f"got x of shape {list(x.shape)}"
        )


def module_positions(
    x: Tensor, token_positions: Optional[Tensor], seq_dim: int, num_axes: int = 0
) -> Tensor:
    """rope::detail::module_positions: the positions the module passes to rope.apply for x.
    Multi-axis modules (``num_axes > 0``) keep the trailing axis dim last."""
    trailing = -seq_dim - 2  # dims of x.shape[:-1] after the sequence axis
    rank = x.dim() - 1
    axis_dims = 1 if num_axes else 0
    # (S,) and (B, S) get the trailing unit dims, decided on the dims the caller gave (the (B, S)
    # rule below first inserts unit dims between B and S).
    one_or_two_dims = True
    if token_positions is None:
        if rank < trailing + 1:
            raise ValueError(
                f"{_MODULE}: without token_positions, x needs a sequence axis at seq_dim = "
                f"{seq_dim}, got x of shape {list(x.shape)}"
            )
        positions = torch.arange(x.shape[seq_dim], device=x.device)
        if num_axes:
            positions = positions.unsqueeze(-1).expand(positions.shape[0], num_axes)
    else:
        positions = token_positions
        if num_axes and (positions.dim() < 1 or positions.shape[-1] != num_axes):
            raise ValueError(
                f"{_MODULE}: token_positions must have a trailing axis dim of size "
                f"len(mrope_section) = {num_axes} (token_positions[..., a] is axis a), got "
                f"token_positions of shape {list(positions.shape)}"
            )
        one_or_two_dims = positions.dim() - axis_dims <= 2
        if positions.dim() - axis_dims == 2 and rank >= 2 + trailing:
            for _ in range(rank - 2 - trailing):  # (B, S): B on x's first axis
                positions = positions.unsqueeze(1)
    if one_or_two_dims:
        for _ in range(trailing):
            positions = positions.unsqueeze(-1 - axis_dims)
    if token_positions is not None and rank >= 0:
        rows = x.shape[:-1]
        row_shape = positions.shape[: positions.dim() - axis_dims]
        fits = len(row_shape) <= len(rows) and all(
            p == 1 or p == r for p, r in zip(reversed(row_shape), reversed(rows))
        )
        if not fits:
            raise ValueError(
                f"{_MODULE}: token_positions of shape {list(token_positions.shape)} do not fit x "
                f"of shape {list(x.shape)} with seq_dim = {seq_dim}. The module reads 1-D "
                "positions as (S,) along x's sequence axis (seq_dim), 2-D positions as (B, S) "
                "with B on x's first axis, and positions of 3 or more dims as broadcastable to "
                "x.shape[:-1]. For x laid out (B, S, H, D) construct the module with seq_dim=-3, "
                "for (B, H, S, D) with seq_dim=-2"
                + (
                    ""
                    if type(x) is Tensor
                    else " (x is a DTensor: these are global shapes, so positions must be global "
                    "and broadcastable to the global shape)"
                )
            )
    return positions


def long_rope_positions(positions: Tensor, long_offset: int, long_after: int) -> Tensor:
    """rope::detail::long_rope_positions: LongRoPE's switch on the device (no host sync). Rows
    shift to the long-factor tables when the call's largest position is >= long_after
    (transformers' rule: ``max(positions) + 1 > original_max_position_embeddings``)."""
    if not long_offset or positions.numel() == 0:
        return positions
    is_long = (positions.max() >= long_after).to(positions.dtype)
    return positions + is_long * long_offset


def long_rope_frequencies(
    freqs: Tensor, long_freqs: Optional[Tensor], positions: Tensor, long_after: int
) -> Tensor:
    """rope::detail::long_rope_frequencies: LongRoPE's long set when the call's largest position
    is >= long_after, on the device (no host sync)."""
    if long_freqs is None or positions.numel() == 0:
        return freqs
    return torch.where(positions.max() >= long_after, long_freqs, freqs)


def packed_last_position(
    cu_seqlens: Tensor, seq_offsets: Optional[Tensor], cp_size: int, cp_rank: int
) -> Tensor:
    """rope::detail::packed_last_position: the largest position packed sequences give this rank
    (a 0-dim int64 tensor on cu_seqlens' device; -1 when no sequence has a token)."""
    cu = cu_seqlens.to(torch.int64)
    n = cu.shape[0] - 1
    if n <= 0:
        return torch.full((), -1, dtype=torch.int64, device=cu.device)
    lengths = cu[1:] - cu[:-1]
    if cp_size == 1:
        last = lengths - 1
    else:
        last = lengths - torch.div(lengths, 2 * cp_size, rounding_mode="floor") * cp_rank - 1
    if seq_offsets is not None:
        last = last + seq_offsets.to(torch.int64)
    return torch.where(lengths > 0, last, torch.full_like(last, -1)).max()


def _replicated_like(x, *tensors):
    dtensor_module = sys.modules.get("torch.distributed.tensor")
    if dtensor_module is None or not isinstance(x, dtensor_module.DTensor):
        return tensors
    replicated = (dtensor_module.Replicate(),) * x.device_mesh.ndim
    mesh = x.device_mesh
    return tuple(None if t is None else wrap_global(t, mesh, replicated) for t in tensors)
