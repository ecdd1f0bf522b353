# SPDX-License-Identifier: BSD-3-Clause
"""The self-check every patched layer passes before it is patched: one probe forward of the layer
unpatched and one patched must agree."""

import torch
from torch import Tensor


def close(want: Tensor, got: Tensor, dtype: torch.dtype) -> bool:
    """Whether two probe outputs agree for a layer of ``dtype``: float32 rotations differ by float32
    rounding; 16-bit layers also round q and k to their dtype at different points."""
    tol = 1e-4 if dtype in (torch.float32, torch.float64) else 5e-2
    scale = want.abs().max().item() or 1.0
    return want.shape == got.shape and (want - got).abs().max().item() <= tol * scale
