# SPDX-License-Identifier: BSD-3-Clause
"""Typed wrappers over ``torch.ops.rope.*``.

Shared conventions (see the README for the full contract):

* ``x`` (``q``, ``k``): float64/float32/float16/bfloat16, shape ``(..., head_dim)``, any strides
  (a last-dim stride of 1 is read without a copy; other layouts are copied once).
* ``cos``, ``sin``: ``(max_seq_len, rotary_dim // 2)`` float32 (or float64) tables, e.g. from
  :func:`rope_tables`. ``rotary_dim = 2 * cos.size(-1) <= head_dim``; the remaining features pass
  through unchanged.
* ``positions``: int32/int64, broadcastable (NumPy rules, aligned right) to ``x.shape[:-1]``:
  ``(S,)`` for ``(B, H, S, D)``, ``(B, 1, S)`` per sequence, ``(S, 1)`` for ``(B, S, H, D)``,
  ``(T, 1)`` for packed ``(T, H, D)``, ``start_pos + arange(S)`` when decoding with a KV cache.
  Values must be in ``[0, max_seq_len)``.
* ``interleaved=True`` rotates pairs ``(2k, 2k+1)`` (Meta Llama, GPT-J); ``False`` rotates
  ``(k, k + rotary_dim // 2)`` (HF ``rotate_half``, GPT-NeoX).
* ``inverse=True`` rotates by the negative angle: undoes the rotation; it is also the gradient.
* ``mrope_section`` (multi-axis positions, M-RoPE: Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4V, 2-D
  vision RoPE): the number of planes that read each axis, adding up to ``rotary_dim // 2`` (at
  most 4 axes). ``positions`` then has a trailing axis dim of size ``len(mrope_section)``
  (``positions[..., a]`` is axis ``a``) and ``positions.shape[:-1]`` broadcasts to
  ``x.shape[:-1]``. ``mrope_interleaved=False``: contiguous runs of planes per axis (Qwen2-VL);
  ``True`` (Qwen3-VL, 3 axes): plane ``k`` reads axis 1 if ``k % 3 == 1 and k < 3 *
  mrope_section[1]``, axis 2 if ``k % 3 == 2 and k < 3 * mrope_section[2]``, else axis 0. Both are
  independent of ``interleaved`` (the pair layout).
* Gradients flow to ``x``/``q``/``k`` only, never to ``cos``, ``sin`` or ``positions``.
* ``torch.func`` (``grad``, ``vjp``, ``jvp``, ``vmap``, ``jacrev``, ``jacfwd``, ...) works through
  these functions; the raw ``torch.ops.rope.*`` support ``vmap`` only.
"""

from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor

from . import _C, _forms, _functorch
from ._op_arguments import (
    _flags,
    _is_compiling,
    _section,
    _typed_section,
    eager_fast_path,
)
from ._tables import rope_tables  # noqa: F401  (re-exported: torch_rope.ops.rope_tables)
from .distributed import maybe_register_for as _maybe_register_for

_apply = torch.ops.rope.apply.default
_apply_inplace = torch.ops.rope.apply_.default
_apply_out = torch.ops.rope.apply.out
_apply_qk = torch.ops.rope.apply_qk.default

_fast_apply = _C._apply
# Dynamo before torch 2.6 (pytorch#140202) refuses an out= op that returns nothing.
_dynamo_refuses_out = torch.torch_version.TorchVersion(torch.__version__) < (2, 6)
_fast_apply_inplace = _C._apply_
_fast_apply_qk = _C._apply_qk


def _missing_source(op: str, cos, sin, positions):
    """The forms' ``TypeError`` for a call with no angle source (cos and sin, or freqs=) or no
    position source (positions, or cu_seqlens=): it names what is missing."""
    _forms.resolve(op, cos, sin, positions, None, 1.0, None, None, 1, 0, None, False)


def apply(
    x: Tensor,
    cos: Optional[Tensor] = None,
    sin: Optional[Tensor] = None,
    positions: Optional[Tensor] = None,
    *,
    freqs: Optional[Tensor] = None,
    attention_factor: float = 1.0,
    cu_seqlens: Optional[Tensor] = None,
    seq_offsets: Optional[Tensor] = None,
    cp_size: int = 1,
    cp_rank: int = 0,
    interleaved: bool = True,
    inverse: bool = False,
    mrope_section: Optional[Sequence[int]] = None,
    mrope_interleaved: bool = False,
    out: Optional[Tensor] = None,
) -> Tensor:
    """Return ``x`` with its first ``rotary_dim`` features rotated by the positions' angles.

    The result is a new contiguous tensor of ``x``'s shape and dtype (math in float32, float64
    for float64 inputs). With ``out=``, the result is written into ``out`` instead (e.g. a
    KV-cache slot: any strides, ``x``'s shape and dtype, never resized, sharing no memory with
    an input) and ``out`` is returned; ``out=`` is not differentiable. ``mrope_section`` and
    ``mrope_interleaved``: multi-axis positions (see the module docstring).

    Other forms (docs/api.md): ``freqs=`` (float64 ``(rotary_dim // 2,)``, with
    ``attention_factor``) instead of ``cos, sin``: table-free, every float32 output within
    ``2^-23 * attention_factor * (|a| + |b|)`` of the exact rotation at any position >= 0;
    ``cu_seqlens=`` (with ``seq_offsets``, ``cp_size``, ``cp_rank``) instead of ``positions``:
    packed sequences, x ``(T, ..., head_dim)`` with its tokens on dim 0.
    """
    if (
        freqs is not None
        or cu_seqlens is not None
        or seq_offsets is not None
        or cp_size != 1
        or cp_rank != 0
        or attention_factor != 1.0
    ):
        return _forms.apply(x, cos, sin, positions, freqs, attention_factor, cu_seqlens,
                            seq_offsets, cp_size, cp_rank, interleaved, inverse, mrope_section,
                            mrope_interleaved, out)  # fmt: skip
    if (
        out is None
        and (mrope_section is None or _typed_section(mrope_section))
        and eager_fast_path(x, cos, sin, positions)
    ):
        if mrope_section is None and not mrope_interleaved:
            return _fast_apply(x, cos, sin, positions, interleaved, inverse)
        return _fast_apply(
            x, cos, sin, positions, interleaved, inverse, mrope_section, mrope_interleaved
        )
    if cos is None or sin is None or positions is None:
        _missing_source("rope.apply" if out is None else "rope.apply.out", cos, sin, positions)
    mrope_section = _section("rope.apply" if out is None else "rope.apply.out", mrope_section)
    flags = _flags(interleaved, inverse, mrope_section, mrope_interleaved)
    if type(x) is not Tensor:  # a subclass such as DTensor
        _maybe_register_for(x)
    if out is not None:
        if type(out) is not Tensor or (
            _is_compiling() and (_dynamo_refuses_out or not out.is_contiguous())
        ):
            # DTensor cannot run an out= overload that returns nothing (it returns `out` from
            # out= ops), and Dynamo refuses any op called with a non-contiguous out= (e.g. a
            # KV-cache slot): the same values reach `out` through the out-of-place op and a copy.
            if torch.is_grad_enabled() and x.requires_grad:
                raise RuntimeError(
                    "rope.apply.out: functions with out=... arguments don't support automatic "
                    "differentiation, but one of the arguments requires grad"
                )
            out.copy_(_apply(x, cos, sin, positions, **flags))
            return out
        _apply_out(x, cos, sin, positions, out=out, **flags)
        return out
    if _functorch.transforms_active():
        return _functorch.Rotate.apply(
            x, cos, sin, positions, interleaved, inverse, mrope_section, mrope_interleaved
        )
    return _apply(x, cos, sin, positions, **flags)


def apply_(
    x: Tensor,
    cos: Optional[Tensor] = None,
    sin: Optional[Tensor] = None,
    positions: Optional[Tensor] = None,
    *,
    freqs: Optional[Tensor] = None,
    attention_factor: float = 1.0,
    cu_seqlens: Optional[Tensor] = None,
    seq_offsets: Optional[Tensor] = None,
    cp_size: int = 1,
    cp_rank: int = 0,
    interleaved: bool = True,
    inverse: bool = False,
    mrope_section: Optional[Sequence[int]] = None,
    mrope_interleaved: bool = False,
) -> Tensor:
    """Rotate ``x`` in place and return it. Every check runs before anything is written.
    ``freqs=`` and ``cu_seqlens=`` forms as :func:`apply`."""
    if (
        freqs is not None
        or cu_seqlens is not None
        or seq_offsets is not None
        or cp_size != 1
        or cp_rank != 0
        or attention_factor != 1.0
    ):
        return _forms.apply_(x, cos, sin, positions, freqs, attention_factor, cu_seqlens,
                             seq_offsets, cp_size, cp_rank, interleaved, inverse, mrope_section,
                             mrope_interleaved)  # fmt: skip
    if (mrope_section is None or _typed_section(mrope_section)) and eager_fast_path(
        x, cos, sin, positions
    ):
        if mrope_section is None and not mrope_interleaved:
            _fast_apply_inplace(x, cos, sin, positions, interleaved, inverse)
        else:
            _fast_apply_inplace(
                x, cos, sin, positions, interleaved, inverse, mrope_section, mrope_interleaved
            )
        return x
    if cos is None or sin is None or positions is None:
        _missing_source("rope.apply_", cos, sin, positions)
    mrope_section = _section("rope.apply_", mrope_section)
    if type(x) is not Tensor:  # a subclass such as DTensor
        _maybe_register_for(x)
    if _functorch.transforms_active():
        return _functorch.rotate_inplace(
            x, cos, sin, positions, interleaved, inverse, mrope_section, mrope_interleaved
        )
    _apply_inplace(
        x, cos, sin, positions, **_flags(interleaved, inverse, mrope_section, mrope_interleaved)
    )
    return x


def apply_qk(
    q: Tensor,
    k: Tensor,
    cos: Optional[Tensor] = None,
    sin: Optional[Tensor] = None,
    positions: Optional[Tensor] = None,
    *,
    freqs: Optional[Tensor] = None,
    attention_factor: float = 1.0,
    cu_seqlens: Optional[Tensor] = None,
    seq_offsets: Optional[Tensor] = None,
    cp_size: int = 1,
    cp_rank: int = 0,
    interleaved: bool = True,
    inverse: bool = False,
    mrope_section: Optional[Sequence[int]] = None,
    mrope_interleaved: bool = False,
) -> Tuple[Tensor, Tensor]:
    """Rotate queries and keys together (one kernel launch on CUDA).

    ``q`` and ``k`` may have different head counts (GQA/MQA); ``positions`` is broadcast against
    ``q.shape[:-1]`` and ``k.shape[:-1]`` separately. ``freqs=`` and ``cu_seqlens=`` forms as
    :func:`apply` (with packed sequences, q and k share their tokens on dim 0).
    """
    if (
        freqs is not None
        or cu_seqlens is not None
        or seq_offsets is not None
        or cp_size != 1
        or cp_rank != 0
        or attention_factor != 1.0
    ):
        return _forms.apply_qk(q, k, cos, sin, positions, freqs, attention_factor, cu_seqlens,
                               seq_offsets, cp_size, cp_rank, interleaved, inverse,
                               mrope_section, mrope_interleaved)  # fmt: skip
    if (mrope_section is None or _typed_section(mrope_section)) and eager_fast_path(
        q, k, cos, sin, positions
    ):
        if mrope_section is None and not mrope_interleaved:
            return _fast_apply_qk(q, k, cos, sin, positions, interleaved, inverse)
        return _fast_apply_qk(
            q, k, cos, sin, positions, interleaved, inverse, mrope_section, mrope_interleaved
        )
    if cos is None or sin is None or positions is None:
        _missing_source("rope.apply_qk", cos, sin, positions)
    mrope_section = _section("rope.apply_qk", mrope_section)
    if type(q) is not Tensor or type(k) is not Tensor:  # a subclass such as DTensor
        _maybe_register_for(q, k)
    if _functorch.transforms_active():
        return _functorch.RotateQK.apply(
            q, k, cos, sin, positions, interleaved, inverse, mrope_section, mrope_interleaved
        )
    return _apply_qk(
        q, k, cos, sin, positions, **_flags(interleaved, inverse, mrope_section, mrope_interleaved)
    )


# The wrappers of the other op families, re-exported so that torch_rope.ops names every op. They
# import apply_qk from this module, so they come last.
# The serving fusions (RoPE with float8 outputs, into caches): one module per op family.
from ._kv_cache_norm_ops import rms_norm_apply_qk_cache  # noqa: E402, F401
from ._kv_cache_ops import apply_qk_cache  # noqa: E402, F401
from ._mla_ops import mla_apply_cache  # noqa: E402, F401
from ._qk_fp8_ops import apply_qk_fp8  # noqa: E402, F401
from ._rms_norm_ops import rms_norm_apply_qk  # noqa: E402, F401
