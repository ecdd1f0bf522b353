# SPDX-License-Identifier: BSD-3-Clause
"""The cos/sin tables of plain or scaled RoPE, from the C++ builder (re-exported by
:mod:`torch_rope.ops` and :mod:`torch_rope`)."""

from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _C


def rope_tables(
    theta: float,
    rotary_dim: int,
    max_seq_len: int,
    device: Optional[torch.device] = None,
    *,
    scaling: Optional[dict] = None,
    dtype: torch.dtype = torch.float32,
) -> Tuple[Tensor, Tensor]:
    """Build ``(cos, sin)`` tables of shape ``(max_seq_len, rotary_dim // 2)``.

    ``cos[p, k] = attention_scaling * cos(p * inv_freq[k])``, with ``inv_freq[k] =
    theta ** (-2k / rotary_dim)`` unless ``scaling`` says otherwise. ``scaling`` is a transformers
    ``rope_parameters`` dict (``{"rope_type": "llama3", "factor": 8.0, ...}``; see the README's
    "Scaling variants"). Angles are computed in float64 and rounded once to ``dtype`` (float32,
    or float64 for float64 inputs). Built in chunks by the same C++ function the C++ module
    uses, so the peak memory is the tables themselves.
    """
    from ._scaling import _integer, _number, parse_scaling

    theta = _number("theta", theta)
    return _C.rope_tables(
        theta,
        _integer("rotary_dim", rotary_dim),
        _integer("max_seq_len", max_seq_len),
        None if device is None else torch.device(device),
        scaling=parse_scaling(scaling, theta),
        dtype=dtype,
    )
