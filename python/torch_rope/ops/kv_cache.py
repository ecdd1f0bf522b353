# SPDX-License-Identifier: BSD-3-Clause
"""The typed wrapper of ``torch.ops.rope.apply_qk_cache``: RoPE into a KV cache (docs/api.md,
"RoPE into a KV cache"). Re-exported by :mod:`torch_rope.ops` and :mod:`torch_rope`."""

from typing import Dict, Optional, Sequence

import torch
from torch import Tensor

from ._fusions import check_scale, require_sources
from ._native import _C
from .rotation import _is_compiling, _section, eager_fast_path

_apply_qk_cache = torch.ops.rope.apply_qk_cache.default
_fast_apply_qk_cache = _C._apply_qk_cache
_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def _cache_scale(
    name: str, scale, cache: Optional[Tensor], op: str = "rope.apply_qk_cache"
) -> Optional[Tensor]:
    """A Python-number scale as the op's one-element float32 tensor on the cache's device; for a
    16/32-bit cache, 1 means no scale and anything else is an error. ``op``: the name errors
    start with (rope.rms_norm_apply_qk_cache shares this)."""
    if scale is None or isinstance(scale, Tensor):
        return scale
    if cache is None:
        raise ValueError(f"{op}: {name} given without its cache (None)")
    if cache.dtype not in _FP8:
        if float(scale) != 1.0:
            raise ValueError(
                f"{op}: {name}={scale} applies to float8 caches only; the cache "
                f"is {cache.dtype} (values are stored unscaled), so pass {name}=None or 1"
            )
        return None
    value = check_scale(op, name, scale)
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
        k_scale = _cache_scale("k_scale", k_scale, k_cache)
    if v_scale is not None and type(v_scale) is not Tensor:
        v_scale = _cache_scale("v_scale", v_scale, v_cache)
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
    require_sources("rope.apply_qk_cache", cos, sin, positions)
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
        mrope_section=_section("rope.apply_qk_cache", mrope_section),
        mrope_interleaved=mrope_interleaved,
    )
