# SPDX-License-Identifier: BSD-3-Clause
"""What the fused ops' wrappers share (apply_qk_cache, rms_norm_apply_qk, rms_norm_apply_qk_cache,
apply_qk_fp8, mla_apply_cache): a missing angle or position source refused by name, and
per-tensor fp8 scales as the ops take them: a Python number becomes a one-element float32 tensor
on the output's device, after the check the C++ op makes of a CPU tensor (finite and > 0) and the
one only a number needs (float32 holds it); for an output that is not float8 (a 16/32-bit cache,
a q_dtype of None), a number scale of 1 means no scale and any other is refused."""

import math
from typing import Dict, Optional

import torch
from torch import Tensor

from .rotation import _is_compiling


def require_sources(op: str, cos, sin, positions) -> None:
    """A ``TypeError`` naming the missing ones when the angle source (``cos`` and ``sin``) or the
    position source (``positions``) is None, as the rope ops' forms refuse a missing source; the
    op itself would raise a ``RuntimeError`` for the first None it meets. Called on the wrappers'
    slow paths only: the fast path takes tensors."""
    if cos is None or sin is None or positions is None:
        missing = [
            n for n, v in (("cos", cos), ("sin", sin), ("positions", positions)) if v is None
        ]
        raise TypeError(
            f"{op}: give the cos and sin tables and positions (tensors), got None for "
            + " and ".join(missing)
        )


# Python-number scales already made one-element float32 CPU tensors (never written to).
_CPU_SCALES: Dict[float, Tensor] = {}


# The scales a float32 holds as a normal number: the ops read the scale as a float32 (a Python
# number is made one here), and a number outside this range would reach them as 0 (1e-50), a
# subnormal (flushed to 0 on some devices) or inf (1e39; torch.full refuses it unnamed).
_FLOAT32 = torch.finfo(torch.float32)


def check_scale(op: str, name: str, scale, multiply: bool = False) -> float:
    """A Python-number scale as a float, after the checks the op makes of a tensor scale (finite
    and > 0) and the one only a number needs: that float32 holds it."""
    value = float(scale)
    rule = "*" if multiply else "/"
    if not (math.isfinite(value) and value > 0):
        # 0 would store +-max (NaN for a zero value), a negative scale flipped signs, NaN NaN and
        # inf zeros (or, multiplied, the reverse): none is a quantization.
        raise ValueError(
            f"{op}: {name} must be a finite number > 0 (stored = saturate(value {rule} {name})), "
            f"got {scale!r}"
        )
    if not _FLOAT32.tiny <= value <= _FLOAT32.max:
        raise ValueError(
            f"{op}: {name} must be within float32's normal range [{_FLOAT32.tiny:.7g}, "
            f"{_FLOAT32.max:.7g}] (the op reads it as a float32; stored = saturate(value {rule} "
            f"{name})), got {scale!r}"
        )
    return value


def scale_tensor(op: str, name: str, scale, device, multiply: bool = False) -> Optional[Tensor]:
    """``scale`` as the op's scale argument: None and tensors as they are; a Python number (or
    numpy scalar) checked (:func:`check_scale`) and made a float32 tensor on ``device``."""
    if scale is None or isinstance(scale, Tensor):
        return scale
    value = check_scale(op, name, scale, multiply)
    device = torch.device(device)
    if device.type != "cpu" or _is_compiling():
        return torch.full((), value, dtype=torch.float32, device=device)
    # Decode calls this every step with the same few scales; torch.full costs ~2 us, a quarter of
    # a B=1 fp8 apply_qk_cache call. CPU only: a CUDA tensor filled on one stream could be read on
    # another before the fill ran.
    tensor = _CPU_SCALES.get(value)
    if tensor is None:
        if len(_CPU_SCALES) >= 64:
            _CPU_SCALES.clear()
        tensor = _CPU_SCALES[value] = torch.full((), value, dtype=torch.float32)
    return tensor


FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def output_scale(
    op: str,
    name: str,
    scale,
    dtype: Optional[torch.dtype],
    device,
    multiply: bool = False,
    *,
    applies_to: str = "float8 caches",
    holder: str = "the cache is",
) -> Optional[Tensor]:
    """The scale of an output of ``dtype`` as the op takes it: None and tensors as they are (the
    op checks a tensor against the dtype); a number as :func:`scale_tensor` for a float8 dtype;
    otherwise None for 1 (no scale) and a ``ValueError`` for any other number, since the values
    are stored unscaled. ``applies_to`` / ``holder`` word that error: "float8 caches" / "the
    cache is" (``{name}=2.0 applies to float8 caches only; the cache is torch.float32``) or, for
    a q output, "a float8 q_dtype" / "the q outputs are"."""
    if scale is None or isinstance(scale, Tensor):
        return scale
    if dtype in FP8:
        return scale_tensor(op, name, scale, device, multiply)
    if float(scale) != 1.0:
        raise ValueError(
            f"{op}: {name}={scale} applies to {applies_to} only; {holder} {dtype} (values are "
            f"stored unscaled), so pass {name}=None or 1"
        )
    return None


def cache_scale(
    op: str, name: str, scale, cache: Optional[Tensor], multiply: bool = False
) -> Optional[Tensor]:
    """A cache's scale (``k_scale``, ``v_scale``, ``kv_scale``) as the op takes it: as
    :func:`output_scale` for the cache's dtype and device; a number given with no cache (None)
    is a ``ValueError``."""
    if scale is None or isinstance(scale, Tensor):
        return scale
    if cache is None:
        raise ValueError(f"{op}: {name} given without its cache (None)")
    return output_scale(op, name, scale, cache.dtype, cache.device, multiply)
