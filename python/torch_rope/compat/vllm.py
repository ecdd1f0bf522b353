# SPDX-License-Identifier: BSD-3-Clause
"""vLLM's ``concat_and_cache_mla`` (``vllm._custom_ops``, 0.33: ``torch.ops._C_cache_ops``) under
its name and signature: a thin layer over ``rope.mla_apply_cache`` with nothing to rotate.
Re-exported by :mod:`torch_rope.compat`.

From vLLM's own definition (its cache kernels' source, vllm/_custom_ops.py): ``kv_cache`` is
``(num_blocks, block_size, kv_lora_rank + rope_dim)``; token ``t`` (``t <
slot_mapping.size(0)``, which may be fewer than ``kv_c``'s rows: CUDA-graph padding) goes to
row ``slot_mapping[t]`` as ``[kv_c[t] | k_pe[t]]``, copied (``k_pe`` is already rotated); a
negative slot is skipped. ``kv_cache_dtype``: ``"auto"`` stores the inputs' dtype (the cache must
have it); ``"fp8"`` / ``"fp8_e4m3"`` store ``float8_e4m3fn`` and ``"fp8_e5m2"`` ``float8_e5m2``
(the cache may be ``uint8``, as vLLM allocates it, or that float8 dtype), each value
``saturate(value / scale[0])`` rounded to nearest even. ``skip_scale=True`` stores ``value``
unscaled (vLLM 0.33's flag; its kernel was not read: the name and its callers say so).

Differences, by design: an out-of-range slot raises (CPU) or trips a device assert (CUDA), and
on the CPU a repeated one raises, where vLLM writes out of bounds or races.
"""

import torch
from torch import Tensor

from ..ops.mla import mla_apply_cache
from .errors import PeerNames, peer_words

# The op's names -> vLLM's (the scale is the op's kv_scale).
_WORDS = PeerNames("concat_and_cache_mla", {"kv_scale": "scale"})

_FORMATS = {
    "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}

# Rotary tables of no planes: mla_apply_cache then copies k_pe as it is (rotary_dim 0).
_NO_PLANES = {}


def _no_rotation(device) -> tuple:
    key = str(device)
    tables = _NO_PLANES.get(key)
    if tables is None:
        empty = torch.empty(1, 0, dtype=torch.float32, device=device)
        tables = _NO_PLANES[key] = (empty, empty, torch.zeros((), dtype=torch.int64, device=device))
    return tables


def concat_and_cache_mla(
    kv_c: Tensor,
    k_pe: Tensor,
    kv_cache: Tensor,
    slot_mapping: Tensor,
    kv_cache_dtype: str,
    scale: Tensor,
    skip_scale: bool = False,
) -> None:
    """vLLM's ``concat_and_cache_mla``: ``[kv_c | k_pe]`` rows into ``kv_cache`` in place."""
    T = slot_mapping.size(0)
    kv_c = kv_c[:T]
    k_pe = k_pe[:T]
    if k_pe.dim() == 3 and k_pe.size(1) == 1:  # callers' (T, 1, rope_dim)
        k_pe = k_pe.squeeze(1)
    if kv_cache_dtype == "auto":
        if kv_cache.dtype != kv_c.dtype:
            raise ValueError(
                f"kv_cache_dtype='auto' stores kv_c's dtype {kv_c.dtype}: kv_cache must have it, "
                f"got {kv_cache.dtype}"
            )
        kv_scale = None
    elif kv_cache_dtype in _FORMATS:
        fp8 = _FORMATS[kv_cache_dtype]
        if kv_cache.dtype == torch.uint8:
            kv_cache = kv_cache.view(fp8)
        elif kv_cache.dtype != fp8:
            raise ValueError(
                f"kv_cache_dtype={kv_cache_dtype!r} stores {fp8}: kv_cache must be uint8 or {fp8}, "
                f"got {kv_cache.dtype}"
            )
        kv_scale = 1.0 if skip_scale else scale.reshape(-1)[:1]
    else:
        raise ValueError(
            f"kv_cache_dtype must be 'auto', 'fp8', 'fp8_e4m3' or 'fp8_e5m2', got "
            f"{kv_cache_dtype!r} (DeepSeek's tile-scaled 'fp8_ds_mla' layout is not offered)"
        )
    cos, sin, zero = _no_rotation(kv_c.device)
    q_pe = k_pe.unsqueeze(1)[:, :0]  # no q: (T, 0, rope_dim)
    peer_words(
        _WORDS, mla_apply_cache, q_pe, k_pe, kv_c, cos, sin, zero.expand(T, 1), kv_cache, None,
        slot_mapping, kv_scale=kv_scale,
    )  # fmt: skip
