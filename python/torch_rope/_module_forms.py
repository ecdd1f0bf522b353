# SPDX-License-Identifier: BSD-3-Clause
"""What :class:`torch_rope.RotaryPositionalEmbedding` adds for the new argument forms: the
table-free mode (``tables=False``: only the float64 frequencies as buffers) and packed sequences
(``forward(x, cu_seqlens=...)``), in both modes.

The eager path of plain tensors is one C++ call (csrc/rules.h: module_apply_frequencies,
module_apply_packed); the path torch.compile and torch.func trace runs the mirrors below, with
the same rules (tests/python/module pins them to the C++ functions).
"""

from typing import Optional

import torch
from torch import Tensor, nn

from . import _C
from ._op_arguments import eager_fast_path
from .ops import apply

_MODULE = "RotaryPositionalEmbedding"


# The floating buffers that keep their dtype when a module is cast: the tables, or the table-free
# mode's float64 frequencies.
_KEPT_BUFFERS = ("cos", "sin", "freqs", "long_freqs")


def apply_keeping_table_dtypes(module: nn.Module, apply_fn, fn, recurse) -> nn.Module:
    """``nn.Module._apply`` for a module with ``cos``/``sin`` table buffers (or the table-free
    ``freqs``): device moves apply to them, dtype casts do not. The exact originals are kept and
    only follow the device the cast sent them to (no bf16 round trip)."""
    tables = {name: module._buffers[name] for name in _KEPT_BUFFERS if name in module._buffers}
    apply_fn(fn, recurse)
    for name, original in tables.items():
        moved = module._buffers[name]
        if moved.dtype != original.dtype:
            module._buffers[name] = original.to(device=moved.device)
    return module


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


def forward_frequencies(module, x: Tensor, token_positions: Optional[Tensor]) -> Tensor:
    """A table-free module's forward with positions (or the default arange)."""
    from .nn import check_module_input, module_positions

    buffers = module._buffers
    freqs, long_freqs = buffers["freqs"], buffers.get("long_freqs")
    if module.mrope_section is None and (
        eager_fast_path(x) if token_positions is None else eager_fast_path(x, token_positions)
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
        from ._dtensor_args import as_dtensors_like

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


def forward_packed(
    module,
    x: Tensor,
    token_positions: Optional[Tensor],
    cu_seqlens: Tensor,
    seq_offsets: Optional[Tensor],
    cp_size: int,
    cp_rank: int,
) -> Tensor:
    """A module's forward with packed sequences (x (T, ..., d_k), tokens on dim 0), either mode:
    LongRoPE's switch from the largest position the sequences give (tables: the sequences'
    offsets shifted to the long tables; table-free: the long frequencies)."""
    from .nn import check_module_input

    if token_positions is not None:
        raise ValueError(f"{_MODULE}: give token_positions or cu_seqlens, not both")
    if module.mrope_section is not None:
        raise ValueError(
            f"{_MODULE}: cu_seqlens cannot be combined with mrope_section (multi-axis positions "
            "are per token); pass the positions"
        )
    buffers = module._buffers
    tables = module.tables
    cos, sin = (buffers["cos"], buffers["sin"]) if tables else (None, None)
    freqs = None if tables else buffers["freqs"]
    long_freqs = None if tables else buffers.get("long_freqs")
    if eager_fast_path(x, cu_seqlens) and (seq_offsets is None or type(seq_offsets) is Tensor):
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
    packed = dict(cu_seqlens=cu_seqlens, seq_offsets=seq_offsets, cp_size=cp_size, cp_rank=cp_rank)
    if tables:
        return apply(x, cos, sin, interleaved=module.interleaved, **packed)
    return apply(
        x,
        freqs=freqs,
        attention_factor=module.attention_factor,
        interleaved=module.interleaved,
        **packed,
    )


def _replicated_like(x, *tensors):
    import sys

    dtensor_module = sys.modules.get("torch.distributed.tensor")
    if dtensor_module is None or not isinstance(x, dtensor_module.DTensor):
        return tensors
    from ._dtensor_args import wrap_global

    replicated = (dtensor_module.Replicate(),) * x.device_mesh.ndim
    return tuple(None if t is None else wrap_global(t, x.device_mesh, replicated) for t in tensors)
