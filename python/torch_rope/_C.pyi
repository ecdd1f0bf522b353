# SPDX-License-Identifier: BSD-3-Clause
# The typed face of torch_rope._C, the pybind11 module of csrc/python/bindings.cpp (and the test
# hooks of csrc/python/exact_angle_hooks.cpp). Loading it registers torch.ops.rope.*; the package
# imports it in one place, torch_rope/ops/_native.py. Keep this file in step with the bindings: a
# function bound without py::arg names takes its arguments by position only (the "/" below).

from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

_RopeParameter = Union[bool, int, float, List[float], str]

class Scaling:
    """A parsed scaling variant, opaque to Python (rope::RopeScaling)."""

    def __init__(self) -> None: ...
    @property
    def rope_type(self) -> str: ...

# ---- build information ------------------------------------------------------------------------

def compiled_with_cuda() -> bool: ...
def cpu_kernel_isa() -> str: ...
def cpu_kernel_variant() -> str: ...

# ---- the table builder and its scaling variants -------------------------------------------------

def parse_scaling(parameters: Dict[str, _RopeParameter], theta: float) -> Scaling: ...
def supported_rope_types() -> List[str]: ...
def rope_tables(
    theta: float,
    rotary_dim: int,
    max_seq_len: int,
    device: Optional[torch.device] = None,
    *,
    scaling: Scaling = ...,
    dtype: torch.dtype = torch.float32,
) -> Tuple[Tensor, Tensor]: ...
def rope_frequencies(
    theta: float, rotary_dim: int, scaling: Scaling, seq_len: int
) -> Tuple[Tensor, float]: ...
def rope_tables_from_inv_freq(
    inv_freq: Tensor,
    max_seq_len: int,
    attention_scaling: float = 1.0,
    dtype: torch.dtype = torch.float32,
    device: Optional[torch.device] = None,
) -> Tuple[Tensor, Tensor]: ...

# ---- the module's rules (csrc/rules.h) ----------------------------------------------------------

def module_tables(
    theta: float,
    rotary_dim: int,
    max_seq_len: int,
    scaling: Scaling,
    dtype: torch.dtype,
    device: Optional[torch.device],
) -> Tuple[Tensor, Tensor, int, int]: ...
def module_frequencies(
    theta: float,
    rotary_dim: int,
    max_seq_len: int,
    scaling: Scaling,
    device: Optional[torch.device],
) -> Tuple[Tensor, Optional[Tensor], float, int]: ...
def check_module_arguments(
    theta: float,
    d_k: int,
    rotary_dim: int,
    max_seq_len: int,
    dtype: torch.dtype,
    seq_dim: int,
    tables: bool = True,
) -> None: ...
def check_module_multi_axis(
    rotary_dim: int, mrope_section: Optional[Sequence[int]], mrope_interleaved: bool
) -> None: ...
def check_position_count(who: str, max_seq_len: int, /) -> None: ...
def check_table_length(who: str, max_seq_len: int, rotary_dim: int) -> None: ...
def check_module_input(x: Tensor, d_k: int, seq_dim: int, has_positions: bool) -> None: ...
def module_positions(
    x: Tensor, token_positions: Optional[Tensor], seq_dim: int, num_axes: int = 0
) -> Tensor: ...
def long_rope_positions(positions: Tensor, long_offset: int, long_after: int) -> Tensor: ...
def long_rope_frequencies(
    freqs: Tensor, long_freqs: Tensor, positions: Tensor, long_after: int
) -> Tensor: ...
def packed_last_position(
    cu_seqlens: Tensor, seq_offsets: Optional[Tensor], cp_size: int, cp_rank: int
) -> Tensor: ...

# ---- the module's forwards for plain tensors in eager mode --------------------------------------

def _module_forward(
    x: Tensor,
    positions: Optional[Tensor],
    cos: Tensor,
    sin: Tensor,
    d_k: int,
    seq_dim: int,
    interleaved: bool,
    /,
) -> Tensor: ...
def _module_forward_frequencies(
    x: Tensor,
    positions: Optional[Tensor],
    freqs: Tensor,
    long_freqs: Optional[Tensor],
    attention_factor: float,
    long_after: int,
    d_k: int,
    seq_dim: int,
    interleaved: bool,
    /,
) -> Tensor: ...
def _module_forward_packed(
    x: Tensor,
    cos: Optional[Tensor],
    sin: Optional[Tensor],
    long_offset: int,
    freqs: Optional[Tensor],
    long_freqs: Optional[Tensor],
    attention_factor: float,
    long_after: int,
    cu_seqlens: Tensor,
    seq_offsets: Optional[Tensor],
    cp_size: int,
    cp_rank: int,
    interleaved: bool,
    /,
) -> Tensor: ...

# ---- the typed entry points of the ops' eager fast path (python/torch_rope/ops) -----------------
# The same dispatcher calls as torch.ops.rope.*, without the boxed call's argument parsing.

def _apply(
    x: Tensor,
    cos: Tensor,
    sin: Tensor,
    positions: Tensor,
    interleaved: bool,
    inverse: bool,
    mrope_section: Optional[Sequence[int]] = None,
    mrope_interleaved: bool = False,
) -> Tensor: ...
def _apply_(
    x: Tensor,
    cos: Tensor,
    sin: Tensor,
    positions: Tensor,
    interleaved: bool,
    inverse: bool,
    mrope_section: Optional[Sequence[int]] = None,
    mrope_interleaved: bool = False,
) -> None: ...
def _apply_qk(
    q: Tensor,
    k: Tensor,
    cos: Tensor,
    sin: Tensor,
    positions: Tensor,
    interleaved: bool,
    inverse: bool,
    mrope_section: Optional[Sequence[int]] = None,
    mrope_interleaved: bool = False,
) -> Tuple[Tensor, Tensor]: ...
def _apply_freqs(
    x: Tensor,
    freqs: Tensor,
    positions: Tensor,
    *,
    attention_factor: float = 1.0,
    interleaved: bool = True,
    inverse: bool = False,
    mrope_section: Optional[Sequence[int]] = None,
    mrope_interleaved: bool = False,
) -> Tensor: ...
def _apply_varlen(
    x: Tensor,
    cos: Tensor,
    sin: Tensor,
    cu_seqlens: Tensor,
    *,
    seq_offsets: Optional[Tensor] = None,
    cp_size: int = 1,
    cp_rank: int = 0,
    interleaved: bool = True,
    inverse: bool = False,
) -> Tensor: ...
def _apply_freqs_varlen(
    x: Tensor,
    freqs: Tensor,
    cu_seqlens: Tensor,
    *,
    seq_offsets: Optional[Tensor] = None,
    cp_size: int = 1,
    cp_rank: int = 0,
    attention_factor: float = 1.0,
    interleaved: bool = True,
    inverse: bool = False,
) -> Tensor: ...
def _apply_inplace_freqs(
    x: Tensor,
    freqs: Tensor,
    positions: Tensor,
    *,
    attention_factor: float = 1.0,
    interleaved: bool = True,
    inverse: bool = False,
    mrope_section: Optional[Sequence[int]] = None,
    mrope_interleaved: bool = False,
) -> None: ...
def _apply_inplace_varlen(
    x: Tensor,
    cos: Tensor,
    sin: Tensor,
    cu_seqlens: Tensor,
    *,
    seq_offsets: Optional[Tensor] = None,
    cp_size: int = 1,
    cp_rank: int = 0,
    interleaved: bool = True,
    inverse: bool = False,
) -> None: ...
def _apply_inplace_freqs_varlen(
    x: Tensor,
    freqs: Tensor,
    cu_seqlens: Tensor,
    *,
    seq_offsets: Optional[Tensor] = None,
    cp_size: int = 1,
    cp_rank: int = 0,
    attention_factor: float = 1.0,
    interleaved: bool = True,
    inverse: bool = False,
) -> None: ...
def _apply_qk_freqs(
    q: Tensor,
    k: Tensor,
    freqs: Tensor,
    positions: Tensor,
    *,
    attention_factor: float = 1.0,
    interleaved: bool = True,
    inverse: bool = False,
    mrope_section: Optional[Sequence[int]] = None,
    mrope_interleaved: bool = False,
) -> Tuple[Tensor, Tensor]: ...
def _apply_qk_varlen(
    q: Tensor,
    k: Tensor,
    cos: Tensor,
    sin: Tensor,
    cu_seqlens: Tensor,
    *,
    seq_offsets: Optional[Tensor] = None,
    cp_size: int = 1,
    cp_rank: int = 0,
    interleaved: bool = True,
    inverse: bool = False,
) -> Tuple[Tensor, Tensor]: ...
def _apply_qk_freqs_varlen(
    q: Tensor,
    k: Tensor,
    freqs: Tensor,
    cu_seqlens: Tensor,
    *,
    seq_offsets: Optional[Tensor] = None,
    cp_size: int = 1,
    cp_rank: int = 0,
    attention_factor: float = 1.0,
    interleaved: bool = True,
    inverse: bool = False,
) -> Tuple[Tensor, Tensor]: ...
def _apply_qk_cache(
    q: Tensor,
    k: Tensor,
    v: Optional[Tensor],
    cos: Tensor,
    sin: Tensor,
    positions: Tensor,
    k_cache: Tensor,
    v_cache: Optional[Tensor],
    slot_mapping: Tensor,
    interleaved: bool,
    k_scale: Optional[Tensor],
    v_scale: Optional[Tensor],
    /,
) -> Tensor: ...
def _rms_norm_apply_qk(
    q: Tensor,
    k: Tensor,
    q_weight: Tensor,
    k_weight: Tensor,
    cos: Tensor,
    sin: Tensor,
    positions: Tensor,
    eps: float,
    weight_offset: float,
    interleaved: bool,
    inverse: bool,
    /,
) -> Tuple[Tensor, Tensor]: ...
def _rms_norm_apply_qk_cache(
    q: Tensor,
    k: Tensor,
    v: Optional[Tensor],
    q_weight: Tensor,
    k_weight: Tensor,
    cos: Tensor,
    sin: Tensor,
    positions: Tensor,
    k_cache: Tensor,
    v_cache: Optional[Tensor],
    slot_mapping: Tensor,
    eps: float,
    weight_offset: float,
    interleaved: bool,
    k_scale: Optional[Tensor],
    v_scale: Optional[Tensor],
    q_dtype: Optional[torch.dtype],
    q_scale: Optional[Tensor],
    /,
) -> Tensor: ...
def _apply_qk_fp8(
    q: Tensor,
    k: Tensor,
    cos: Tensor,
    sin: Tensor,
    positions: Tensor,
    q_nope: Optional[Tensor],
    k_nope: Optional[Tensor],
    q_scale: Optional[Tensor],
    k_scale: Optional[Tensor],
    dtype: Optional[torch.dtype],
    interleaved: bool,
    multiply_by_scale: bool,
    mrope_section: Optional[Sequence[int]],
    mrope_interleaved: bool,
    inverse: bool,
    /,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]: ...
def _mla_apply_cache(
    q_pe: Tensor,
    k_pe: Tensor,
    kv_c: Tensor,
    cos: Tensor,
    sin: Tensor,
    positions: Tensor,
    kv_cache: Tensor,
    kpe_cache: Optional[Tensor],
    slot_mapping: Tensor,
    q_nope: Optional[Tensor],
    v: Optional[Tensor],
    v_cache: Optional[Tensor],
    interleaved: bool,
    kv_scale: Optional[Tensor],
    v_scale: Optional[Tensor],
    q_dtype: Optional[torch.dtype],
    q_scale: Optional[Tensor],
    multiply_by_scale: bool,
    /,
) -> Tuple[Tensor, Tensor]: ...

# ---- the inference engines' cache form (torch_rope.compat; csrc/engine_call.h) -------------------

def _rotate_heads_in_place(
    positions: Tensor,
    query: Tensor,
    key: Optional[Tensor],
    head_size: int,
    cos_sin_cache: Tensor,
    interleaved: bool,
) -> None: ...
def _rotate_heads(
    positions: Tensor,
    query: Tensor,
    key: Tensor,
    head_size: int,
    cos_sin_cache: Tensor,
    interleaved: bool,
) -> Tuple[Tensor, Tensor]: ...

# ---- test hooks of the exact-angle core (csrc/common_exact_angle.h): not API --------------------

def _exact_angle_test(
    positions: Tensor, freqs: Tensor, path: str, attention_factor: float = 1.0
) -> Tuple[Tensor, Tensor, Tensor, Tensor]: ...
def _exact_rotation_test(
    xa: Tensor, xb: Tensor, cos: Tensor, sin: Tensor, path: str
) -> Tuple[Tensor, Tensor]: ...
