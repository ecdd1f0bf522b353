# SPDX-License-Identifier: BSD-3-Clause
"""The typed wrapper of ``torch.ops.rope.mla_apply_cache``: the cache rows of multi-head latent
attention (docs/api.md, "MLA cache rows"). Re-exported by :mod:`torch_rope.ops` and
:mod:`torch_rope`."""

from typing import Optional, Tuple

import torch
from torch import Tensor

from ._fusions import cache_scale, output_scale, require_sources
from ._native import _C
from .rotation import eager_fast_path

_mla_apply_cache = torch.ops.rope.mla_apply_cache.default
_fast_mla_apply_cache = _C._mla_apply_cache
_OP = "rope.mla_apply_cache"


def mla_apply_cache(
    q_pe: Tensor,
    k_pe: Tensor,
    kv_c: Tensor,
    cos: Tensor,
    sin: Tensor,
    positions: Tensor,
    kv_cache: Tensor,
    kpe_cache: Optional[Tensor],
    slot_mapping: Tensor,
    *,
    q_nope: Optional[Tensor] = None,
    v: Optional[Tensor] = None,
    v_cache: Optional[Tensor] = None,
    interleaved: bool = True,
    kv_scale=None,
    v_scale=None,
    q_dtype: Optional[torch.dtype] = None,
    q_scale=None,
    multiply_by_scale: bool = False,
) -> Tuple[Tensor, Tensor]:
    """Rotate ``q_pe`` and ``k_pe``, write the cache rows ``[kv_c | k_pe]`` of multi-head latent
    attention (DeepSeek-V2/V3), and return ``(q_pe_out, q_nope_out)``.

    ``q_pe`` ``(T, H, R)``, ``k_pe`` ``(T, R)`` (the one latent head), ``kv_c`` ``(T, L)``;
    ``positions`` as for :func:`apply_qk_cache`, ``(T, 1)``. Caches: one of width ``L + R``
    (vLLM's layout: ``kpe_cache=None``, rows ``[kv_c | rotated k_pe]``) or two, ``kv_cache`` of
    width ``L`` and ``kpe_cache`` of width ``R`` (FlashInfer's ``ckv`` / ``kpe``); each
    ``(num_slots, width)`` or paged ``(num_blocks, block_size, width)``, token ``t`` into slot
    ``slot_mapping[t]`` (int64; negative: padding, nothing written). A cache has k_pe's dtype or
    is float8 with ``kv_scale``. ``q_nope`` ``(T, H, N)`` is returned quantized alongside
    ``q_pe``; ``q_dtype`` (float8) with ``q_scale`` makes both outputs float8. With key parts
    of a heads dim (``k_pe`` ``(T, Hk, R)``, ``kv_c`` ``(T, Hk, L)``, caches ``(..., Hk,
    width)``) and ``v`` / ``v_cache`` (``v_scale``), it writes FlashInfer's split GQA rows.
    ``multiply_by_scale=True``: every scale multiplies (FlashInfer's rule). Not differentiable.
    """
    multiply = multiply_by_scale
    kv_scale = cache_scale(_OP, "kv_scale", kv_scale, kv_cache, multiply)
    v_scale = cache_scale(_OP, "v_scale", v_scale, v_cache, multiply)
    q_scale = output_scale(
        _OP, "q_scale", q_scale, q_dtype, q_pe.device, multiply,
        applies_to="a float8 q_dtype", holder="the q outputs are",
    )  # fmt: skip
    if (
        eager_fast_path(q_pe, k_pe, kv_c, cos, sin)
        and type(positions) is Tensor
        and type(kv_cache) is Tensor
        and type(slot_mapping) is Tensor
    ):
        return _fast_mla_apply_cache(
            q_pe, k_pe, kv_c, cos, sin, positions, kv_cache, kpe_cache, slot_mapping, q_nope, v,
            v_cache, interleaved, kv_scale, v_scale, q_dtype, q_scale, multiply_by_scale,
        )  # fmt: skip
    require_sources(_OP, cos, sin, positions)
    return _mla_apply_cache(
        q_pe, k_pe, kv_c, cos, sin, positions, kv_cache, kpe_cache, slot_mapping, q_nope=q_nope,
        v=v, v_cache=v_cache, interleaved=interleaved, kv_scale=kv_scale, v_scale=v_scale,
        q_dtype=q_dtype, q_scale=q_scale, multiply_by_scale=multiply_by_scale,
    )  # fmt: skip
