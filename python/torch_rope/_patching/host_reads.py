# SPDX-License-Identifier: BSD-3-Clause
"""Whether a patched model may read its positions on the host now.

A library computes its angles per call, so its models run at any position; a patched model looks
its positions up in tables, and reads them on the host (one device sync) to grow the tables or to
check them. That read must not happen while a graph is traced or captured.
"""

import torch
from torch import Tensor


def readable(positions: Tensor) -> bool:
    """Whether the positions' values may be read on the host now: not while torch.compile or
    torch.jit traces (the read would break the graph, or be baked in as a constant), on the meta
    device, or while a CUDA graph is captured (a sync is not allowed then)."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing() or positions.device.type == "meta":
        return False
    return not (positions.is_cuda and torch.cuda.is_current_stream_capturing())
