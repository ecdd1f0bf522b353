# SPDX-License-Identifier: BSD-3-Clause
"""The typed wrapper of ``torch.ops.rope.rms_norm_apply_qk_cache``: QK-RMSNorm + RoPE + the
KV-cache write in one pass (docs/api.md, "QK-RMSNorm + RoPE into a KV cache"). Re-exported by
:mod:`torch_rope.ops` and :mod:`torch_rope`."""

from typing import Optional, Sequence

import torch
from torch import Tensor

from ._fusions import cache_scale, require_sources, scale_tensor
from ._native import _C
from .rotation import _section, eager_fast_path

_rms_norm_apply_qk_cache = torch.ops.rope.rms_norm_apply_qk_cache.default
_fast_rms_norm_apply_qk_cache = _C._rms_norm_apply_qk_cache
_OP = "rope.rms_norm_apply_qk_cache"


def rms_norm_apply_qk_cache(
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
    *,
    eps: float = 1e-6,
    weight_offset: float = 0.0,
    interleaved: bool = True,
    k_scale=None,
    v_scale=None,
    q_dtype: Optional[torch.dtype] = None,
    q_scale=None,
    mrope_section: Optional[Sequence[int]] = None,
    mrope_interleaved: bool = False,
) -> Tensor:
    """QK-RMSNorm, RoPE and the KV-cache write in one pass; returns the normalised, rotated ``q``.

    Each row of ``q`` ``(T, Hq, D)`` and ``k`` ``(T, Hkv, D)`` is normalised over its ``head_dim``
    as :func:`rms_norm_apply_qk` does, ``y = x / sqrt(mean(x**2) + eps) * (weight +
    weight_offset)``, then rotated (features past ``rotary_dim`` are only normalised); the ``k``
    rows and ``v`` ``(T, Hkv, Dv)`` (or None, then ``v_cache`` is None too) are written into
    their cache rows as :func:`apply_qk_cache` writes them (flat or paged caches, ``k``'s dtype or
    float8 with ``k_scale`` / ``v_scale``; a negative slot skips the token). ``q_out`` has
    ``q``'s dtype, or ``q_dtype`` float8 with ``q_scale`` (None is 1): stored
    ``(value / q_scale).clamp(-max, max)``. The math is float32 (float64 for float64 inputs) and
    every value is rounded once. ``mrope_section`` takes multi-axis positions, as :func:`apply`.
    Not differentiable.
    """
    if k_scale is not None and type(k_scale) is not Tensor:
        k_scale = cache_scale(_OP, "k_scale", k_scale, k_cache)
    if v_scale is not None and type(v_scale) is not Tensor:
        v_scale = cache_scale(_OP, "v_scale", v_scale, v_cache)
    if q_scale is not None and type(q_scale) is not Tensor:
        q_scale = scale_tensor(_OP, "q_scale", q_scale, q.device)
    if (
        mrope_section is None
        and not mrope_interleaved
        and eager_fast_path(q, k, q_weight, k_weight, cos)
        and type(sin) is Tensor
        and type(positions) is Tensor
        and type(k_cache) is Tensor
        and type(slot_mapping) is Tensor
        and (v is None or type(v) is Tensor)
        and (v_cache is None or type(v_cache) is Tensor)
    ):
        return _fast_rms_norm_apply_qk_cache(
            q,
            k,
            v,
            q_weight,
            k_weight,
            cos,
            sin,
            positions,
            k_cache,
            v_cache,
            slot_mapping,
            float(eps),
            float(weight_offset),
            interleaved,
            k_scale,
            v_scale,
            q_dtype,
            q_scale,
        )
    require_sources(_OP, cos, sin, positions)
    return _rms_norm_apply_qk_cache(
        q,
        k,
        v,
        q_weight,
        k_weight,
        cos,
        sin,
        positions,
        k_cache,
        v_cache,
        slot_mapping,
        eps=float(eps),
        weight_offset=float(weight_offset),
        interleaved=interleaved,
        k_scale=k_scale,
        v_scale=v_scale,
        q_dtype=q_dtype,
        q_scale=q_scale,
        mrope_section=_section(_OP, mrope_section),
        mrope_interleaved=mrope_interleaved,
    )
