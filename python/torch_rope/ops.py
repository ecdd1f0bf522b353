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

import math
import numbers
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from . import _C, _functorch
from ._tables import rope_tables  # noqa: F401  (re-exported: torch_rope.ops.rope_tables)
from .distributed import maybe_register_for as _maybe_register_for

_apply = torch.ops.rope.apply.default
_apply_inplace = torch.ops.rope.apply_.default
_apply_out = torch.ops.rope.apply.out
_apply_qk = torch.ops.rope.apply_qk.default

# The eager fast path: for plain tensors, with no torch.compile, functorch transform or
# __torch_function__ mode around the call, the typed C++ entry points (csrc/python/bindings.cpp)
# make the same dispatcher call as torch.ops.rope.* without the boxed call's argument parsing
# (about 2 us of a decode-sized call). Everything else takes torch.ops, which Dynamo traces, and
# which honours subclasses (DTensor) and modes. is_compiling comes first: Dynamo folds it to
# True, so it never looks past it.
_is_compiling = torch.compiler.is_compiling
_functorch_active = torch._C._are_functorch_transforms_active
_function_mode_active = torch._C._is_torch_function_mode_enabled


# A plain tensor standing for an argument a call does not have (a fixed signature with defaults
# costs a third of a variadic one, and this runs on every decode call).
_ABSENT = torch.empty(0)


def eager_fast_path(a, b=_ABSENT, c=_ABSENT, d=_ABSENT, e=_ABSENT) -> bool:
    """Whether a call on these tensors may take the typed C++ entry points: eager, plain tensors
    (not None, not a subclass such as DTensor), no functorch transform and no
    ``__torch_function__`` mode. The one gate of ops.py and nn.py."""
    return (
        not _is_compiling()  # first: Dynamo folds it to True and looks no further
        and type(a) is Tensor
        and type(b) is Tensor
        and type(c) is Tensor
        and type(d) is Tensor
        and type(e) is Tensor
        and not _functorch_active()
        and not _function_mode_active()
    )


_fast_apply = _C._apply
# Dynamo before torch 2.6 (pytorch#140202) refuses an out= op that returns nothing.
_dynamo_refuses_out = torch.torch_version.TorchVersion(torch.__version__) < (2, 6)
_fast_apply_inplace = _C._apply_
_fast_apply_qk = _C._apply_qk


def _flags(
    interleaved: bool,
    inverse: bool,
    mrope_section: Optional[List[int]] = None,
    mrope_interleaved: bool = False,
) -> dict:
    """The keyword flags that differ from the schema's defaults (keywords cost per call)."""
    flags = {}
    if not interleaved or inverse:
        flags.update(interleaved=interleaved, inverse=inverse)
    if mrope_section is not None or mrope_interleaved:
        flags.update(mrope_section=mrope_section, mrope_interleaved=mrope_interleaved)
    return flags


def _typed_section(mrope_section) -> bool:
    """Whether the typed entry points take this mrope_section as it is: None, or a list or tuple
    of Python ints (anything else, a tensor or numpy ints, goes through :func:`_section`)."""
    return mrope_section is None or (
        type(mrope_section) in (list, tuple) and all(type(s) is int for s in mrope_section)
    )


def _is_plane_count(s) -> bool:
    """An integer (a Python or numpy int, an integer tensor's value); not a bool, not a float."""
    if isinstance(s, Tensor):
        integer = not (s.is_floating_point() or s.is_complex() or s.dtype == torch.bool)
        return s.dim() == 0 and integer
    return isinstance(s, numbers.Integral) and not isinstance(s, bool)


def _section(op: str, mrope_section: Optional[Sequence[int]]) -> Optional[List[int]]:
    """mrope_section as the op's int[] (a list of Python ints), or None. A float or bool entry is
    a TypeError, as the raw op and the module refuse them, rather than truncated (2.7 is not 2
    planes)."""
    if mrope_section is None:
        return None
    if isinstance(mrope_section, Tensor):
        mrope_section = mrope_section.tolist()
    for a, s in enumerate(mrope_section):
        if not _is_plane_count(s):
            raise TypeError(
                f"{op}: mrope_section[{a}] must be an int (a number of planes), got "
                f"{type(s).__name__} {s!r} in mrope_section={list(mrope_section)!r}"
            )
    return [int(s) for s in mrope_section]


def apply(
    x: Tensor,
    cos: Tensor,
    sin: Tensor,
    positions: Tensor,
    *,
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
    """
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
    cos: Tensor,
    sin: Tensor,
    positions: Tensor,
    *,
    interleaved: bool = True,
    inverse: bool = False,
    mrope_section: Optional[Sequence[int]] = None,
    mrope_interleaved: bool = False,
) -> Tensor:
    """Rotate ``x`` in place and return it. Every check runs before anything is written."""
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
    mrope_section = _section("rope.apply_", mrope_section)
    if type(x) is not Tensor:  # a subclass such as DTensor
        _maybe_register_for(x)
    if _functorch.transforms_active():
        return _functorch.RotateInplace.apply(
            x, cos, sin, positions, interleaved, inverse, mrope_section, mrope_interleaved
        )
    _apply_inplace(
        x, cos, sin, positions, **_flags(interleaved, inverse, mrope_section, mrope_interleaved)
    )
    return x


def apply_qk(
    q: Tensor,
    k: Tensor,
    cos: Tensor,
    sin: Tensor,
    positions: Tensor,
    *,
    interleaved: bool = True,
    inverse: bool = False,
    mrope_section: Optional[Sequence[int]] = None,
    mrope_interleaved: bool = False,
) -> Tuple[Tensor, Tensor]:
    """Rotate queries and keys together (one kernel launch on CUDA).

    ``q`` and ``k`` may have different head counts (GQA/MQA); ``positions`` is broadcast against
    ``q.shape[:-1]`` and ``k.shape[:-1]`` separately.
    """
    if (mrope_section is None or _typed_section(mrope_section)) and eager_fast_path(
        q, k, cos, sin, positions
    ):
        if mrope_section is None and not mrope_interleaved:
            return _fast_apply_qk(q, k, cos, sin, positions, interleaved, inverse)
        return _fast_apply_qk(
            q, k, cos, sin, positions, interleaved, inverse, mrope_section, mrope_interleaved
        )
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


_apply_qk_cache = torch.ops.rope.apply_qk_cache.default
_fast_apply_qk_cache = _C._apply_qk_cache
_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def _cache_scale(name: str, scale, cache: Optional[Tensor]) -> Optional[Tensor]:
    """A Python-number scale as the op's one-element float32 tensor on the cache's device; for a
    16/32-bit cache, 1 means no scale and anything else is an error."""
    if scale is None or isinstance(scale, Tensor):
        return scale
    if cache is None:
        raise ValueError(f"rope.apply_qk_cache: {name} given without its cache (None)")
    if cache.dtype not in _FP8:
        if float(scale) != 1.0:
            raise ValueError(
                f"rope.apply_qk_cache: {name}={scale} applies to float8 caches only; the cache "
                f"is {cache.dtype} (values are stored unscaled), so pass {name}=None or 1"
            )
        return None
    value = float(scale)
    if not (math.isfinite(value) and value > 0):
        # 0 would store +-max (NaN for a zero value), a negative scale flipped signs, NaN NaN
        # and inf zeros: none is a quantization. (A tensor scale on the CPU is checked in C++.)
        raise ValueError(
            f"rope.apply_qk_cache: {name} must be a finite number > 0 (stored = "
            f"saturate(value / {name})), got {scale!r}"
        )
    if cache.device.type != "cpu" or _is_compiling():
        return torch.full((), value, dtype=torch.float32, device=cache.device)
    # Decode calls this every step with the same few scales; torch.full costs ~2 us, a quarter of
    # a B=1 fp8 call. CPU only: a CUDA tensor filled on one stream could be read on another
    # before the fill ran.
    tensor = _CPU_SCALES.get(value)
    if tensor is None:
        if len(_CPU_SCALES) >= 64:
            _CPU_SCALES.clear()
        tensor = _CPU_SCALES[value] = torch.full((), value, dtype=torch.float32)
    return tensor


# Python-number scales already made one-element float32 CPU tensors (never written to).
_CPU_SCALES: Dict[float, Tensor] = {}


def apply_qk_cache(
    q: Tensor,
    k: Tensor,
    v: Optional[Tensor],
    cos: Tensor,
    sin: Tensor,
    positions: Tensor,
    k_cache: Tensor,
    v_cache: Optional[Tensor],
    slot_mapping: Tensor,
    *,
    interleaved: bool = True,
    k_scale=None,
    v_scale=None,
) -> Tensor:
    """Rotate ``q`` and ``k``, write the rotated ``k`` and ``v`` into their KV-cache rows, and
    return the rotated ``q`` (a new tensor).

    ``q`` ``(T, Hq, D)``, ``k`` ``(T, Hkv, D)``, ``v`` ``(T, Hkv, Dv)`` or None (then
    ``v_cache`` is None too); caches ``(num_slots, H, D)`` or paged ``(num_blocks, block_size,
    H, D)``, any strides with a unit last stride. Token ``t`` goes to slot
    ``slot_mapping[t]`` (int64; block ``s // block_size``, offset ``s % block_size``); a
    negative slot is padding (no cache write). A cache has its source's dtype, or is float8
    (``torch.float8_e4m3fn``, ``torch.float8_e5m2``) with a scale: ``k_scale`` / ``v_scale``, a
    Python float or a one-element float32 tensor on the cache's device, finite and > 0, stored
    as ``(value / scale).clamp(-max, max).to(fp8)``. Not differentiable. See docs/api.md.
    """
    if k_scale is not None and type(k_scale) is not Tensor:
        k_scale = _cache_scale("k_scale", k_scale, k_cache)
    if v_scale is not None and type(v_scale) is not Tensor:
        v_scale = _cache_scale("v_scale", v_scale, v_cache)
    if (
        eager_fast_path(q, k, cos, sin, positions)
        and type(k_cache) is Tensor
        and type(slot_mapping) is Tensor
        and (v is None or type(v) is Tensor)
        and (v_cache is None or type(v_cache) is Tensor)
    ):
        return _fast_apply_qk_cache(
            q,
            k,
            v,
            cos,
            sin,
            positions,
            k_cache,
            v_cache,
            slot_mapping,
            interleaved,
            k_scale,
            v_scale,
        )
    return _apply_qk_cache(
        q,
        k,
        v,
        cos,
        sin,
        positions,
        k_cache,
        v_cache,
        slot_mapping,
        interleaved=interleaved,
        k_scale=k_scale,
        v_scale=v_scale,
    )


_rms_norm_apply_qk = torch.ops.rope.rms_norm_apply_qk.default
_fast_rms_norm_apply_qk = _C._rms_norm_apply_qk


def _rms_norm_apply_qk_composite(
    q, k, q_weight, k_weight, cos, sin, positions, eps, weight_offset, flags
) -> Tuple[Tensor, Tensor]:
    """The same function from ATen ops and :func:`apply_qk` (which supports every torch.func
    transform): the route under grad/vjp/jvp/vmap. Rounds once, like the fused op."""
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32

    def norm(x, w):
        xf = x.to(acc)
        return (
            xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps) * (w.to(acc) + weight_offset)
        )

    q_out, k_out = apply_qk(norm(q, q_weight), norm(k, k_weight), cos, sin, positions, **flags)
    return q_out.to(q.dtype), k_out.to(k.dtype)


def rms_norm_apply_qk(
    q: Tensor,
    k: Tensor,
    q_weight: Tensor,
    k_weight: Tensor,
    cos: Tensor,
    sin: Tensor,
    positions: Tensor,
    *,
    eps: float = 1e-6,
    weight_offset: float = 0.0,
    interleaved: bool = True,
    inverse: bool = False,
    mrope_section: Optional[Sequence[int]] = None,
    mrope_interleaved: bool = False,
) -> Tuple[Tensor, Tensor]:
    """Fused QK-RMSNorm + RoPE (Qwen3, Gemma 3, OLMo 2): ``(q_out, k_out)``.

    Each row of ``q`` (``k``) is normalised over its whole ``head_dim``,
    ``y = x / sqrt(mean(x**2) + eps) * (weight + weight_offset)``, then rotated exactly as
    :func:`apply_qk` rotates (features past ``rotary_dim`` are only normalised), in float32
    (float64 for float64 inputs), and rounded once to ``q``'s (``k``'s) dtype. ``q_weight`` and
    ``k_weight`` are ``(head_dim,)``, any floating dtype; ``weight_offset=1.0`` is Gemma's
    ``(1 + w)``. ``eps`` must be finite and > 0 and a normal number in the math type (float32 for
    float32/16-bit inputs: ``>= 1.17549e-38``; float64: ``>= 2.22507e-308``). Gradients flow to
    ``q``, ``k`` and both weights (double backward too); ``torch.func`` transforms take an
    equivalent composite path.
    """
    if (
        mrope_section is None
        and not mrope_interleaved
        and type(sin) is Tensor
        and type(positions) is Tensor
        and eager_fast_path(q, k, q_weight, k_weight, cos)
    ):
        return _fast_rms_norm_apply_qk(
            q, k, q_weight, k_weight, cos, sin, positions, eps, weight_offset, interleaved, inverse
        )
    mrope_section = _section("rope.rms_norm_apply_qk", mrope_section)
    flags = _flags(interleaved, inverse, mrope_section, mrope_interleaved)
    if _functorch.transforms_active():
        return _rms_norm_apply_qk_composite(
            q, k, q_weight, k_weight, cos, sin, positions, float(eps), float(weight_offset), flags
        )
    return _rms_norm_apply_qk(
        q,
        k,
        q_weight,
        k_weight,
        cos,
        sin,
        positions,
        eps=float(eps),
        weight_offset=float(weight_offset),
        **flags,
    )
