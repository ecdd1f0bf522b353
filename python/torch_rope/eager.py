# SPDX-License-Identifier: BSD-3-Clause
"""The eager baseline: a plain-PyTorch implementation of the rope ops, to compare against.

It computes what ``torch.ops.rope.apply`` computes (same layouts, partial rotary, broadcasting,
float32 math) with ordinary tensor ops, so it is slow (several passes over memory) and is what the
benchmarks call "eager". The library's own tests do not use it as their oracle.
"""

import torch
from torch import Tensor


def apply(
    x: Tensor,
    cos: Tensor,
    sin: Tensor,
    positions: Tensor,
    *,
    interleaved: bool = True,
    inverse: bool = False,
) -> Tensor:
    """Reference rotation; same signature and semantics as :func:`torch_rope.apply`."""
    half = cos.size(-1)
    rotary_dim = 2 * half
    math_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    c = cos[positions].to(math_dtype)  # positions.shape + (half,)
    s = sin[positions].to(math_dtype)
    if inverse:
        s = -s
    rot = x[..., :rotary_dim].to(math_dtype)
    if interleaved:
        a, b = rot[..., 0::2], rot[..., 1::2]
    else:
        a, b = rot[..., :half], rot[..., half:]
    ra = a * c - b * s
    rb = a * s + b * c
    if interleaved:
        rotated = torch.stack((ra, rb), dim=-1).flatten(-2)
    else:
        rotated = torch.cat((ra, rb), dim=-1)
    out = torch.cat((rotated.to(x.dtype), x[..., rotary_dim:]), dim=-1)
    return out.contiguous()


def apply_qk(q, k, cos, sin, positions, *, interleaved=True, inverse=False):
    """Reference for :func:`torch_rope.apply_qk`: two independent rotations."""
    return (
        apply(q, cos, sin, positions, interleaved=interleaved, inverse=inverse),
        apply(k, cos, sin, positions, interleaved=interleaved, inverse=inverse),
    )
