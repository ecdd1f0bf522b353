# SPDX-License-Identifier: BSD-3-Clause
"""The typed wrappers of ``torch.ops.rope.apply_qk_fp8`` (and its ``out=`` overload) and of
``torch.ops.rope.apply_qk_fp8_dynamic`` (scales computed from the rows): RoPE with float8 q and k
(docs/api.md, "RoPE with float8 q and k"). Re-exported by :mod:`torch_rope.ops` and
:mod:`torch_rope`."""

from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor

from ._fusions import require_sources, scale_tensor
from ._native import _C
from .rotation import _section, _typed_section, eager_fast_path

_apply_qk_fp8 = torch.ops.rope.apply_qk_fp8.default
_apply_qk_fp8_out = torch.ops.rope.apply_qk_fp8.out
_fast_apply_qk_fp8 = _C._apply_qk_fp8
_OP = "rope.apply_qk_fp8"


def apply_qk_fp8(
    q: Tensor,
    k: Tensor,
    cos: Tensor,
    sin: Tensor,
    positions: Tensor,
    *,
    q_nope: Optional[Tensor] = None,
    k_nope: Optional[Tensor] = None,
    q_scale=None,
    k_scale=None,
    dtype: Optional[torch.dtype] = None,
    interleaved: bool = True,
    multiply_by_scale: bool = False,
    mrope_section: Optional[Sequence[int]] = None,
    mrope_interleaved: bool = False,
    inverse: bool = False,
    out: Optional[Sequence[Optional[Tensor]]] = None,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Rotate ``q`` and ``k`` as :func:`apply_qk` and return them as float8, with their no-RoPE
    parts quantized alongside: ``(q_out, k_out, q_nope_out, k_nope_out)``.

    ``q`` ``(T, Hq, D)``, ``k`` ``(T, Hk, D)`` (the first ``rotary_dim`` features rotate, the
    rest pass through), ``q_nope`` ``(T, Hq, Nq)`` and ``k_nope`` ``(T, Hk, Nk)`` (MLA's split
    heads: quantized, not rotated; None gives an empty ``(T, H, 0)`` output). Every output is
    ``dtype`` (``torch.float8_e4m3fn`` by default, or ``torch.float8_e5m2``) and stores
    ``(value / scale).clamp(-max, max).to(dtype)`` of the float32 value (float64 for float64
    inputs), bit for bit as torch; ``multiply_by_scale=True`` stores ``value * scale`` instead
    (FlashInfer's rule). ``q_scale`` scales q and q_nope, ``k_scale`` k and k_nope: a Python
    number or a one-element float32 tensor on q's device, finite and > 0; None is 1.
    ``out=(q_out, k_out, q_nope_out, k_nope_out)`` writes the caller's float8 buffers instead
    (the nope ones None without their input) and returns them. ``inverse=True`` rotates by
    the negated angle (:func:`apply`'s ``inverse``, as DeepSeek-V4 rotates the attention output
    back before its projection) before quantizing. Not differentiable.
    """
    device = q.device
    if q_scale is not None and type(q_scale) is not Tensor:
        q_scale = scale_tensor(_OP, "q_scale", q_scale, device, multiply_by_scale)
    if k_scale is not None and type(k_scale) is not Tensor:
        k_scale = scale_tensor(_OP, "k_scale", k_scale, device, multiply_by_scale)
    if out is not None:
        require_sources(_OP, cos, sin, positions)
        out = tuple(out) + (None,) * (4 - len(out))
        if len(out) != 4 or out[0] is None or out[1] is None:
            raise ValueError(
                f"{_OP}: out must be (q_out, k_out) or (q_out, k_out, q_nope_out, k_nope_out), "
                f"got {out!r}"
            )
        _apply_qk_fp8_out(
            q,
            k,
            cos,
            sin,
            positions,
            q_nope=q_nope,
            k_nope=k_nope,
            q_scale=q_scale,
            k_scale=k_scale,
            interleaved=interleaved,
            multiply_by_scale=multiply_by_scale,
            mrope_section=_section(_OP, mrope_section),
            mrope_interleaved=mrope_interleaved,
            inverse=inverse,
            q_out=out[0],
            k_out=out[1],
            q_nope_out=out[2],
            k_nope_out=out[3],
        )
        return out
    if (
        _typed_section(mrope_section)
        and eager_fast_path(q, k, cos, sin, positions)
        and (q_nope is None or type(q_nope) is Tensor)
        and (k_nope is None or type(k_nope) is Tensor)
    ):
        return _fast_apply_qk_fp8(
            q,
            k,
            cos,
            sin,
            positions,
            q_nope,
            k_nope,
            q_scale,
            k_scale,
            dtype,
            interleaved,
            multiply_by_scale,
            None if mrope_section is None else list(mrope_section),
            mrope_interleaved,
            inverse,
        )
    require_sources(_OP, cos, sin, positions)
    return _apply_qk_fp8(
        q,
        k,
        cos,
        sin,
        positions,
        q_nope=q_nope,
        k_nope=k_nope,
        q_scale=q_scale,
        k_scale=k_scale,
        dtype=dtype,
        interleaved=interleaved,
        multiply_by_scale=multiply_by_scale,
        mrope_section=_section(_OP, mrope_section),
        mrope_interleaved=mrope_interleaved,
        inverse=inverse,
    )


_apply_qk_fp8_dynamic = torch.ops.rope.apply_qk_fp8_dynamic.default
_apply_qk_fp8_dynamic_out = torch.ops.rope.apply_qk_fp8_dynamic.out
_DYNAMIC_OP = "rope.apply_qk_fp8_dynamic"


def apply_qk_fp8_dynamic(
    q: Tensor,
    k: Tensor,
    cos: Tensor,
    sin: Tensor,
    positions: Tensor,
    *,
    dtype: Optional[torch.dtype] = None,
    interleaved: bool = True,
    per_token: bool = False,
    pow2_scale: bool = False,
    mrope_section: Optional[Sequence[int]] = None,
    mrope_interleaved: bool = False,
    inverse: bool = False,
    out: Optional[Sequence[Tensor]] = None,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Rotate ``q`` and ``k`` as :func:`apply_qk` and return them as float8 with scales computed
    from the rotated rows in the same pass: ``(q_out, k_out, q_scale, k_scale)``.

    ``q`` ``(T, Hq, D)``, ``k`` ``(T, Hk, D)`` (the first ``rotary_dim`` features rotate, the rest
    pass through). Each (token, head) row gets one float32 scale ``amax / max`` of its rotated
    values (``max``: 448 for ``torch.float8_e4m3fn``, the default ``dtype``, 57344 for
    ``torch.float8_e5m2``), or with ``per_token=True`` one scale for all heads of a token;
    ``pow2_scale=True`` rounds each scale up to a power of two (UE8M0, as DeepSeek's recipes
    store them). The rows store ``(value / scale).clamp(-max, max).to(dtype)`` of the float32
    value, bit for bit as torch. ``q_scale`` is ``(T, Hq, 1)`` (``(T, 1, 1)`` per token), so
    ``q_out.float() * q_scale`` dequantizes. An all-zero row gets scale 1; a row with an
    infinity gets scale inf (``2**127`` with ``pow2_scale``), one with a NaN scale NaN
    (docs/quant_formats.md has the table). ``inverse=True`` rotates by the negated angle before
    the scales are taken. ``out=(q_out, k_out, q_scale, k_scale)`` writes the caller's buffers
    (float8 rows of q's and k's shapes, float32 scales of the shapes above, any strides) and
    returns them; their dtype is then q_out's. Not differentiable.
    """
    require_sources(_DYNAMIC_OP, cos, sin, positions)
    if out is not None:
        out = tuple(out)
        if len(out) != 4 or any(t is None for t in out):
            raise ValueError(
                f"{_DYNAMIC_OP}: out must be (q_out, k_out, q_scale, k_scale), got {out!r}"
            )
        if dtype is not None and isinstance(out[0], Tensor) and out[0].dtype != dtype:
            raise ValueError(
                f"{_DYNAMIC_OP}: dtype={dtype} disagrees with q_out's dtype {out[0].dtype} "
                "(with out=, q_out's dtype is the format: pass one or the other)"
            )
        _apply_qk_fp8_dynamic_out(
            q,
            k,
            cos,
            sin,
            positions,
            interleaved=interleaved,
            per_token=per_token,
            pow2_scale=pow2_scale,
            mrope_section=_section(_DYNAMIC_OP, mrope_section),
            mrope_interleaved=mrope_interleaved,
            inverse=inverse,
            q_out=out[0],
            k_out=out[1],
            q_scale_out=out[2],
            k_scale_out=out[3],
        )
        return out
    return _apply_qk_fp8_dynamic(
        q,
        k,
        cos,
        sin,
        positions,
        dtype=dtype,
        interleaved=interleaved,
        per_token=per_token,
        pow2_scale=pow2_scale,
        mrope_section=_section(_DYNAMIC_OP, mrope_section),
        mrope_interleaved=mrope_interleaved,
        inverse=inverse,
    )
