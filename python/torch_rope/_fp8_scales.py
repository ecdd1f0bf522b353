# SPDX-License-Identifier: BSD-3-Clause
"""Per-tensor fp8 scales as the serving fusions' ops take them (apply_qk_fp8,
rms_norm_apply_qk_cache, mla_apply_cache): a Python number becomes a one-element float32 tensor
on the output's device, after the check the C++ op makes of a CPU tensor (finite and > 0)."""

import math
from typing import Dict, Optional

import torch
from torch import Tensor

from ._op_arguments import _is_compiling

# Python-number scales already made one-element float32 CPU tensors (never written to).
_CPU_SCALES: Dict[float, Tensor] = {}


def scale_tensor(op: str, name: str, scale, device, multiply: bool = False) -> Optional[Tensor]:
    """``scale`` as the op's scale argument: None and tensors as they are; a Python number (or
    numpy scalar) checked and made a float32 tensor on ``device``."""
    if scale is None or isinstance(scale, Tensor):
        return scale
    value = float(scale)
    if not (math.isfinite(value) and value > 0):
        # 0 would store +-max (NaN for a zero value), a negative scale flipped signs, NaN NaN and
        # inf zeros (or, multiplied, the reverse): none is a quantization.
        rule = "*" if multiply else "/"
        raise ValueError(
            f"{op}: {name} must be a finite number > 0 (stored = saturate(value {rule} {name})), "
            f"got {scale!r}"
        )
    device = torch.device(device)
    if device.type != "cpu" or _is_compiling():
        return torch.full((), value, dtype=torch.float32, device=device)
    # Decode calls this every step with the same few scales; torch.full costs ~2 us. CPU only: a
    # CUDA tensor filled on one stream could be read on another before the fill ran.
    tensor = _CPU_SCALES.get(value)
    if tensor is None:
        if len(_CPU_SCALES) >= 64:
            _CPU_SCALES.clear()
        tensor = _CPU_SCALES[value] = torch.full((), value, dtype=torch.float32)
    return tensor
