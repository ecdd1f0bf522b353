# SPDX-License-Identifier: BSD-3-Clause
"""The typed wrapper of ``torch.ops.rope.apply_qk_cache``: RoPE into a KV cache (docs/api.md,
"RoPE into a KV cache"). Re-exported by :mod:`torch_rope.ops` and :mod:`torch_rope`."""

from typing import Optional, Sequence

import torch
from torch import Tensor

from ._fusions import cache_scale, require_sources
from ._native import _C
from .rotation import _section, eager_fast_path

_apply_qk_cache = torch.ops.rope.apply_qk_cache.default
_fast_apply_qk_cache = _C._apply_qk_cache
_OP = "rope.apply_qk_cache"


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
    mrope_section: Optional[Sequence[int]] = None,
    mrope_interleaved: bool = False,
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
    as ``(value / scale).clamp(-max, max).to(fp8)``. ``mrope_section`` (multi-axis positions
    with a trailing axis dim, as :func:`apply`) rotates each plane by its axis's position. Not
    differentiable. See docs/api.md.
    """
    if k_scale is not None and type(k_scale) is not Tensor:
        k_scale = cache_scale(_OP, "k_scale", k_scale, k_cache)
    if v_scale is not None and type(v_scale) is not Tensor:
        v_scale = cache_scale(_OP, "v_scale", v_scale, v_cache)
    if (
        mrope_section is None
        and not mrope_interleaved
        and eager_fast_path(q, k, cos, sin, positions)
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
    require_sources(_OP, cos, sin, positions)
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
        mrope_section=_section(_OP, mrope_section),
        mrope_interleaved=mrope_interleaved,
    )
