# SPDX-License-Identifier: BSD-3-Clause
"""The RoPE signatures proposed for PyTorch core (pytorch/pytorch PR #187286, open; read from its
description, its code was not available), computed by :func:`torch_rope.apply`::

    torch_rope.functional.rotary_embedding(x, cos, sin, position_ids=None, *, interleaved=False)
    torch_rope.functional.RotaryEmbedding(dim, max_seq_len=2048, base=10000)

* ``x``: ``(B, H, S, D)``, the layout of ``scaled_dot_product_attention``.
* ``cos``, ``sin``: ``(N, D/2)`` indexed by ``position_ids`` ``(B, S)`` (or ``(1, S)``) when it
  is given; otherwise any shape broadcastable against ``(B, H, S, D/2)``, e.g. ``(S, D/2)``.
  Read as tables, without a copy when float32/float64 and contiguous (16-bit ones are upcast to
  float32, exactly); a broadcast (stride-0) dim is not materialised.
* ``interleaved`` (keyword-only): ``False`` rotates ``(k, k + D/2)`` (LLaMA / Hugging Face
  ``rotate_half``), ``True`` adjacent pairs ``(2k, 2k + 1)`` (gpt-fast / torchtune).

What the description leaves open, chosen here: the whole head rotates (``cos.size(-1)`` must be
``D/2``); math in float32 (float64 for float64 ``x``), rounded once; the gradient flows to ``x``
only, not to ``cos``/``sin``; positions are range-checked.
"""

from typing import Optional

import torch
from torch import Tensor, nn

from .nn import apply_keeping_table_dtypes
from .ops.rotation import apply
from .ops.tables import rope_tables

__all__ = ["RotaryEmbedding", "rotary_embedding"]


def _table(table: Tensor) -> Tensor:
    return table if table.dtype in (torch.float32, torch.float64) else table.float()


def rotary_embedding(
    x: Tensor,
    cos: Tensor,
    sin: Tensor,
    position_ids: Optional[Tensor] = None,
    *,
    interleaved: bool = False,
) -> Tensor:
    """``x`` ``(B, H, S, D)`` rotated by ``cos``/``sin``, gathered at ``position_ids`` ``(B, S)``
    when given (see the module docstring). A new tensor; differentiable in ``x``."""
    if not isinstance(x, Tensor) or x.dim() != 4:
        raise ValueError(
            "rotary_embedding: x must be (B, H, S, D), got "
            + (f"shape {list(x.shape)}" if isinstance(x, Tensor) else type(x).__name__)
        )
    for name, t in (("cos", cos), ("sin", sin)):
        if not isinstance(t, Tensor) or not t.is_floating_point() or t.dim() < 1:
            raise TypeError(f"rotary_embedding: {name} must be a floating-point tensor")
    if sin.shape != cos.shape:
        raise ValueError(
            f"rotary_embedding: sin must have cos's shape {list(cos.shape)}, got {list(sin.shape)}"
        )
    half = x.size(-1) // 2
    if x.size(-1) % 2 or cos.size(-1) != half:
        raise ValueError(
            f"rotary_embedding: cos and sin must end in D/2 = {x.size(-1)} / 2 (x's head dim D "
            f"even; the whole head rotates), got cos of shape {list(cos.shape)}"
        )
    batch, _, seq_len = x.shape[:3]
    if position_ids is not None:
        if cos.dim() != 2:
            raise ValueError(
                "rotary_embedding: with position_ids, cos and sin must be (N, D/2) caches, got "
                f"cos of shape {list(cos.shape)}"
            )
        if not isinstance(position_ids, Tensor) or position_ids.dtype not in (
            torch.int32,
            torch.int64,
        ):
            raise TypeError("rotary_embedding: position_ids must be an int32 or int64 tensor")
        if (
            position_ids.dim() != 2
            or position_ids.size(1) != seq_len
            or (position_ids.size(0) not in (1, batch))
        ):
            raise ValueError(
                f"rotary_embedding: position_ids must be (B, S) = ({batch}, {seq_len}) (or "
                f"(1, S)), got {list(position_ids.shape)}"
            )
        # Every head of a token reads its row: positions (B, 1, S) against x's (B, H, S).
        return apply(x, _table(cos), _table(sin), position_ids.unsqueeze(1),
                     interleaved=interleaved)  # fmt: skip

    lead = cos.shape[:-1]
    try:
        fits = len(lead) <= 3 and torch.broadcast_shapes(lead, x.shape[:-1]) == x.shape[:-1]
    except RuntimeError:  # not broadcastable at all
        fits = False
    if not fits:
        raise ValueError(
            f"rotary_embedding: without position_ids, cos and sin must broadcast against "
            f"(B, H, S, D/2) = {[*x.shape[:-1], half]}, got {list(cos.shape)}"
        )
    # Each row of cos is a table row; the positions are the rows' indices, shaped as cos's
    # leading dims, so the broadcasting is done by the kernel, not by copying rows. A stride-0
    # (expanded) dim shrinks to one row first.
    for dim in range(len(lead)):
        if cos.size(dim) > 1 and cos.stride(dim) == 0 and sin.stride(dim) == 0:
            cos, sin = cos.narrow(dim, 0, 1), sin.narrow(dim, 0, 1)
    lead = cos.shape[:-1]
    rows = torch.arange(lead.numel(), device=x.device).view(lead)
    return apply(x, _table(cos.reshape(-1, half)), _table(sin.reshape(-1, half)), rows,
                 interleaved=interleaved)  # fmt: skip


class RotaryEmbedding(nn.Module):
    """The module of the proposal: ``RotaryEmbedding(dim, max_seq_len=2048, base=10000)``.

    Precomputes float32 ``cos``/``sin`` tables ``(max_seq_len, dim/2)`` of ``p * base^(-2k/dim)``
    (angles in float64, rounded once; buffers, not persistent, kept float32 when the model is
    cast). ``forward(x, position_ids=None)`` is :func:`rotary_embedding` with them: positions
    ``arange(S)`` by default. ``interleaved`` (keyword-only, default ``False`` = rotate_half) and
    ``device`` are this library's additions.
    """

    cos: Tensor
    sin: Tensor

    def __init__(
        self,
        dim: int,
        max_seq_len: int = 2048,
        base: float = 10000,
        *,
        interleaved: bool = False,
        device: Optional[torch.device] = None,
    ) -> None:
        super().__init__()
        if isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0 or dim % 2:
            raise ValueError(f"RotaryEmbedding: dim must be a positive even int, got {dim!r}")
        self.dim, self.max_seq_len, self.base = dim, max_seq_len, base
        self.interleaved = interleaved
        cos, sin = rope_tables(float(base), dim, max_seq_len, device)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: Tensor, position_ids: Optional[Tensor] = None) -> Tensor:
        if position_ids is not None:
            return rotary_embedding(x, self.cos, self.sin, position_ids,
                                    interleaved=self.interleaved)  # fmt: skip
        seq_len = x.size(-2) if isinstance(x, Tensor) and x.dim() == 4 else None
        if seq_len is not None and seq_len > self.max_seq_len:
            raise ValueError(
                f"RotaryEmbedding: x has {seq_len} positions, more than max_seq_len = "
                f"{self.max_seq_len}"
            )
        return rotary_embedding(x, self.cos[:seq_len], self.sin[:seq_len],
                                interleaved=self.interleaved)  # fmt: skip

    def _apply(self, fn, recurse=True):
        return apply_keeping_table_dtypes(self, super()._apply, fn, recurse)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, max_seq_len={self.max_seq_len}, base={self.base}"
