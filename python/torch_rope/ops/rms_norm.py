# SPDX-License-Identifier: BSD-3-Clause
"""The typed wrapper of ``torch.ops.rope.rms_norm_apply_qk``: fused QK-RMSNorm + RoPE.
Re-exported by :mod:`torch_rope.ops` and :mod:`torch_rope`."""

from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor

from . import _autograd
from ._fusions import require_sources
from ._native import _C
from .qk import apply_qk
from .rotation import _flags, _section, eager_fast_path

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
    require_sources("rope.rms_norm_apply_qk", cos, sin, positions)
    mrope_section = _section("rope.rms_norm_apply_qk", mrope_section)
    flags = _flags(interleaved, inverse, mrope_section, mrope_interleaved)
    if _autograd.transforms_active():
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
