# SPDX-License-Identifier: BSD-3-Clause
"""flash-attn's ``apply_rotary_emb`` over :func:`torch_rope.apply` / :func:`torch_rope.apply_`
(re-exported by :mod:`torch_rope.compat`).

flash-attn's ``cos``/``sin`` are already tables ``(seqlen_ro, rotary_dim / 2)``: they are passed
through (16-bit ones upcast to float32, exactly, as flash-attn's kernel loads them). Positions are
described, not computed per token: batched ``x`` gets ``arange(S) + seqlen_offsets``, varlen
``x`` the packed-sequence form (``cu_seqlens``, ``seq_offsets``).

Differences from flash-attn, each one a refusal where flash-attn is silent: a position past the
tables (with a tensor ``seqlen_offsets``) is an error, not an unrotated token; ``max_seqlen`` is
required and checked against the tables as flash-attn does, but a sequence longer than it is still
rotated in full (flash-attn's grid would skip its tail); ``cu_seqlens[-1]`` must equal ``x``'s
token count.
"""

import numbers
from typing import Optional, Union

import torch
from torch import Tensor

from ..ops.rotation import apply, apply_
from .errors import PeerNames, peer_words

# The op's names -> flash-attn's (a varlen call's seq_offsets are its seqlen_offsets).
_WORDS = PeerNames("apply_rotary_emb", {"seq_offsets": "seqlen_offsets"})


def _table(name: str, table: Tensor) -> Tensor:
    if not isinstance(table, Tensor) or not table.is_floating_point() or table.dim() != 2:
        raise ValueError(
            f"apply_rotary_emb: {name} must be a floating-point (seqlen_ro, rotary_dim / 2) "
            "tensor, got "
            + (f"shape {list(table.shape)}" if isinstance(table, Tensor) else type(table).__name__)
        )
    # The kernel reads float32 or float64 tables; flash-attn loads any float dtype as float32.
    return table if table.dtype in (torch.float32, torch.float64) else table.float()


def _offsets_tensor(seqlen_offsets: Tensor, count: int, device) -> Tensor:
    if seqlen_offsets.dtype not in (torch.int32, torch.int64):
        raise TypeError(
            f"apply_rotary_emb: seqlen_offsets must be an int or an int32/int64 tensor, got "
            f"{seqlen_offsets.dtype}"
        )
    if seqlen_offsets.shape != (count,):
        raise ValueError(
            f"apply_rotary_emb: seqlen_offsets must be an int or a ({count},) tensor (one offset "
            f"per sequence), got shape {list(seqlen_offsets.shape)}"
        )
    if seqlen_offsets.device != device:
        raise ValueError(
            f"apply_rotary_emb: seqlen_offsets must be on x's device {device}, got "
            f"{seqlen_offsets.device}"
        )
    return seqlen_offsets


class _RotateLeafInPlace(torch.autograd.Function):
    """``inplace=True`` on a leaf that requires grad, as flash-attn's own tests call it before a
    backward: the leaf's values are rotated in place (autograd refuses an in-place op on such a
    leaf, so the write runs inside this function's forward, where grad mode is off, exactly as
    flash-attn's autograd function writes it) and an alias of it is returned whose gradient is
    the inverse rotation. The write bumps the leaf's version counter, so an earlier op that saved
    the leaf for its backward refuses to run on the rotated values."""

    @staticmethod
    def forward(ctx, x, cos, sin, kw):
        apply_(x, cos, sin, **kw)
        ctx.tables, ctx.kw = (cos, sin), kw
        return x  # not marked dirty: autograd returns a view of x with this function's gradient

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.tables
        return apply(grad, cos, sin, **ctx.kw, inverse=True), None, None, None


def _rotate(x, cos, sin, inplace, **kw):
    if not inplace:
        return peer_words(_WORDS, apply, x, cos, sin, **kw)
    if x.is_leaf and x.requires_grad and torch.is_grad_enabled():
        return peer_words(_WORDS, _RotateLeafInPlace.apply, x, cos, sin, kw)
    return peer_words(_WORDS, apply_, x, cos, sin, **kw)


def apply_rotary_emb(
    x: Tensor,
    cos: Tensor,
    sin: Tensor,
    interleaved: bool = False,
    inplace: bool = False,
    seqlen_offsets: Union[int, Tensor] = 0,
    cu_seqlens: Optional[Tensor] = None,
    max_seqlen: Optional[int] = None,
) -> Tensor:
    """flash-attn's ``apply_rotary_emb``: ``x`` rotated (``x`` itself when ``inplace``; for a
    leaf that requires grad, an alias of it, as flash-attn returns).

    * ``x``: ``(B, S, H, D)``, or packed ``(total, H, D)`` with ``cu_seqlens`` ``(B + 1,)`` and
      ``max_seqlen``.
    * ``cos``, ``sin``: ``(seqlen_ro, rotary_dim / 2)``; the first ``rotary_dim`` features
      rotate, the rest pass through.
    * ``interleaved``: ``False`` rotates ``(k, k + rotary_dim/2)``, ``True`` ``(2k, 2k + 1)``;
      plane ``k`` reads column ``k`` in both.
    * ``seqlen_offsets``: an int, or an int32/int64 ``(B,)`` tensor: token ``s`` of sequence
      ``b`` is at position ``s + offset_b`` (KV-cache decoding).

    Gradient: to ``x`` (the inverse rotation), none to the tables, as flash-attn. Math in float32
    (float64 for float64 ``x``), rounded once.
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"apply_rotary_emb: x must be a tensor, got {type(x).__name__}")
    cos, sin = _table("cos", cos), _table("sin", sin)
    if sin.shape != cos.shape:
        raise ValueError(
            f"apply_rotary_emb: sin must have cos's shape {list(cos.shape)}, got {list(sin.shape)}"
        )
    varlen = cu_seqlens is not None
    want_dim = 3 if varlen else 4
    if x.dim() != want_dim:
        raise ValueError(
            "apply_rotary_emb: x must be "
            + ("(total, H, D) with cu_seqlens" if varlen else "(B, S, H, D) without cu_seqlens")
            + f", got shape {list(x.shape)}"
        )
    seqlen_ro = cos.size(0)
    if 2 * cos.size(1) > x.size(-1):
        raise ValueError(
            f"apply_rotary_emb: rotary_dim = 2 * cos.size(1) = {2 * cos.size(1)} must be <= the "
            f"head dim of x, {x.size(-1)}"
        )
    int_offset = isinstance(seqlen_offsets, numbers.Integral) and not isinstance(
        seqlen_offsets, bool
    )
    if not int_offset and not isinstance(seqlen_offsets, Tensor):
        raise TypeError(
            "apply_rotary_emb: seqlen_offsets must be an int or an int32/int64 tensor, got "
            f"{type(seqlen_offsets).__name__}"
        )
    if varlen:
        if max_seqlen is None:
            raise ValueError("apply_rotary_emb: cu_seqlens needs max_seqlen (as flash-attn)")
        seqlen = int(max_seqlen)
    else:
        seqlen = x.size(1)
    if int_offset and int(seqlen_offsets) + seqlen > seqlen_ro:
        raise ValueError(
            "apply_rotary_emb: seqlen_offsets + "
            + ("max_seqlen" if varlen else "seqlen")
            + f" = {int(seqlen_offsets)} + {seqlen} exceeds the tables' {seqlen_ro} positions"
        )
    if seqlen > seqlen_ro:
        raise ValueError(f"apply_rotary_emb: max_seqlen = {seqlen} exceeds cos's {seqlen_ro} rows")

    if varlen:
        count = cu_seqlens.numel() - 1
        if int_offset:
            offsets = (
                None
                if int(seqlen_offsets) == 0
                else torch.full(
                    (count,), int(seqlen_offsets), dtype=torch.int64, device=cu_seqlens.device
                )
            )
        else:
            offsets = _offsets_tensor(seqlen_offsets, count, x.device)
        return _rotate(x, cos, sin, inplace, cu_seqlens=cu_seqlens, seq_offsets=offsets,
                       interleaved=interleaved)  # fmt: skip
    positions = torch.arange(x.size(1), device=x.device)
    if int_offset:
        positions = (positions + int(seqlen_offsets)).unsqueeze(-1)  # (S, 1)
    else:
        offsets = _offsets_tensor(seqlen_offsets, x.size(0), x.device)
        positions = (positions.unsqueeze(0) + offsets.unsqueeze(1)).unsqueeze(-1)  # (B, S, 1)
    return _rotate(x, cos, sin, inplace, positions=positions, interleaved=interleaved)
