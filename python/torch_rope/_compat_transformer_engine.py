# SPDX-License-Identifier: BSD-3-Clause
"""TransformerEngine's ``apply_rotary_pos_emb`` over :func:`torch_rope.apply` (re-exported by
:mod:`torch_rope.compat`).

TE's ``freqs`` are **angles**, not cos/sin and not frequencies: ``freqs[p, 0, 0, i]`` is the angle
feature ``i`` of a token at position ``p`` turns by, ``(s2, 1, 1, d2)``, each plane's angle written
twice as TE's ``RotaryPositionEmbedding`` builds it (``cat(a, a)`` for the half split,
``[a0, a0, a1, a1, ...]`` for adjacent pairs). The only conversion done here is angles -> cos/sin
tables ``(s2, d2 / 2)``: one angle per plane, cos and sin taken in float64 and stored in float32
(float64 for float64 ``t``); the angles are read in float32, as TE's fused kernel reads them
(float64 for float64 ``t``). Positions are described, not computed per token: ``thd`` becomes
the packed-sequence form (``cu_seqlens``, ``seq_offsets = start_positions``, ``cp_size``,
``cp_rank``); ``sbhd``/``bshd`` a small ``(s, b)`` positions tensor that TE's zigzag rule gives.
"""

import numbers
import weakref
from typing import Optional

import torch
from torch import Tensor

from ._op_arguments import _is_compiling
from .ops import apply

_FORMATS = ("sbhd", "bshd", "thd")


def _int_arg(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"apply_rotary_pos_emb: {name} must be an int, got {value!r}")
    return int(value)


def _index_tensor(name: str, value: Tensor, length: int, device: torch.device) -> Tensor:
    """An int32/int64 ``(length,)`` tensor on ``device``, else an error naming it."""
    if not isinstance(value, Tensor) or value.dtype not in (torch.int32, torch.int64):
        raise TypeError(
            f"apply_rotary_pos_emb: {name} must be an int32 or int64 tensor, got "
            + (str(value.dtype) if isinstance(value, Tensor) else type(value).__name__)
        )
    if value.shape != (length,):
        raise ValueError(
            f"apply_rotary_pos_emb: {name} must have shape ({length},), got {list(value.shape)}"
        )
    if value.device != device:
        raise ValueError(
            f"apply_rotary_pos_emb: {name} must be on t's device {device}, got {value.device}"
        )
    return value


class _LastTables:
    """The tables of the last angles seen. A model passes the same ``freqs`` to every layer (q and
    k each): they are converted once, until ``freqs`` is freed or written in place (its version
    counter moves)."""

    key = None  # (weakref to freqs, freqs._version, interleaved, table dtype)
    tables = None

    @classmethod
    def get(cls, freqs: Tensor, t: Tensor, interleaved: bool):
        table_dtype = torch.float64 if t.dtype == torch.float64 else torch.float32
        if type(freqs) is not Tensor or _is_compiling():
            return _tables(freqs, t, interleaved)
        if cls.key is not None:
            ref, version, was_interleaved, dtype = cls.key
            if (
                ref() is freqs
                and version == freqs._version
                and was_interleaved == interleaved
                and dtype == table_dtype
            ):
                return cls.tables
        # Normal tensors even under inference_mode: a later training call saves them for backward.
        with torch.inference_mode(False):
            tables = _tables(freqs, t, interleaved)
        cls.key = (weakref.ref(freqs), freqs._version, interleaved, table_dtype)
        cls.tables = tables
        return tables


def _tables(freqs: Tensor, t: Tensor, interleaved: bool):
    """cos/sin tables ``(s2, d2 / 2)`` of the first angle of each plane of TE's angles."""
    if not isinstance(freqs, Tensor) or not freqs.is_floating_point():
        raise TypeError("apply_rotary_pos_emb: freqs must be a floating-point tensor of angles")
    if freqs.dim() != 4 or freqs.size(1) != 1 or freqs.size(2) != 1 or freqs.size(3) % 2:
        raise ValueError(
            "apply_rotary_pos_emb: freqs must be angles of shape (s2, 1, 1, d2) with d2 even, got "
            f"{list(freqs.shape)}"
        )
    if freqs.device != t.device:
        raise ValueError(
            f"apply_rotary_pos_emb: freqs must be on t's device {t.device}, got {freqs.device}"
        )
    angle_dtype = torch.float64 if t.dtype == torch.float64 else torch.float32
    angles = freqs.detach().view(freqs.size(0), freqs.size(3)).to(angle_dtype)
    half = angles.size(-1) // 2
    first, second = (
        (angles[:, 0::2], angles[:, 1::2]) if interleaved else (angles[:, :half], angles[:, half:])
    )
    # TE's kernel turns every feature by its own angle: a rotation only when both features of a
    # plane share theirs. Checked where it costs no host sync (and not while tracing: the check
    # reads values).
    if first.device.type == "cpu" and not _is_compiling() and not torch.equal(first, second):
        raise ValueError(
            "apply_rotary_pos_emb: freqs must hold each plane's angle twice, as TE's "
            "RotaryPositionEmbedding builds it ("
            + ("[a0, a0, a1, a1, ...]" if interleaved else "cat(a, a)")
            + f" for interleaved={interleaved}); these angles differ within a plane"
        )
    table_dtype = torch.float64 if t.dtype == torch.float64 else torch.float32
    first = first.double()
    return torch.cos(first).to(table_dtype), torch.sin(first).to(table_dtype)


def _zigzag(local_len: int, cp_size: int, cp_rank: int, device) -> Tensor:
    """Positions of the local indices of a sequence of ``local_len`` tokens on ``cp_rank``: TE's
    dual-chunk layout (chunks ``cp_rank`` and ``2 cp_size - 1 - cp_rank`` of the sequence)."""
    j = torch.arange(local_len, device=device)
    if cp_size == 1:
        return j
    c = local_len // 2
    return torch.where(j < c, j + cp_rank * c, j - c + (2 * cp_size - 1 - cp_rank) * c)


def apply_rotary_pos_emb(
    t: Tensor,
    freqs: Tensor,
    tensor_format: str = "sbhd",
    start_positions: Optional[Tensor] = None,
    interleaved: bool = False,
    fused: bool = False,
    cu_seqlens: Optional[Tensor] = None,
    cp_size: int = 1,
    cp_rank: int = 0,
) -> Tensor:
    """TransformerEngine's ``apply_rotary_pos_emb``: a new tensor, ``t`` rotated.

    * ``t``: ``(s, b, h, d)`` (``"sbhd"``), ``(b, s, h, d)`` (``"bshd"``) or packed ``(T, h, d)``
      (``"thd"``, with ``cu_seqlens``).
    * ``freqs``: angles ``(s2, 1, 1, d2)`` (TE's duplicated layout, see the module docstring);
      the first ``d2`` features of each head rotate, the rest pass through.
    * ``start_positions``: int tensor ``(b,)`` (``(N,)`` for ``thd``), each sequence's first
      position (default 0).
    * ``interleaved``: ``False`` rotates ``(k, k + d2/2)`` (``rotate_half``), ``True`` adjacent
      pairs ``(2k, 2k + 1)``.
    * ``cu_seqlens`` (``thd``): ``(N + 1,)`` int32/int64 boundaries; with ``cp_size > 1`` the
      padded global ones, each sequence split in ``2 cp_size`` chunks of which ``cp_rank`` holds
      chunks ``cp_rank`` and ``2 cp_size - 1 - cp_rank`` (the same zigzag for ``sbhd``/``bshd``,
      whose ``s`` is then the local length).
    * ``fused``: accepted, changes nothing (one kernel either way; math in float32, float64 for
      float64 ``t``, rounded once, as TE's fused path).

    Gradient: to ``t`` only (the inverse rotation), none to ``freqs``, as TE's fused path.
    """
    del fused  # one path; TE's flag chose between its kernel and its PyTorch code
    if tensor_format not in _FORMATS:
        raise ValueError(
            f"apply_rotary_pos_emb: tensor_format must be one of {_FORMATS}, got {tensor_format!r}"
        )
    if not isinstance(t, Tensor):
        raise TypeError(f"apply_rotary_pos_emb: t must be a tensor, got {type(t).__name__}")
    cp_size, cp_rank = _int_arg("cp_size", cp_size), _int_arg("cp_rank", cp_rank)
    if cp_size < 1:
        raise ValueError(f"apply_rotary_pos_emb: cp_size must be >= 1, got {cp_size}")
    if not 0 <= cp_rank < cp_size:
        raise ValueError(
            f"apply_rotary_pos_emb: cp_rank must be in [0, cp_size) = [0, {cp_size}), got {cp_rank}"
        )
    want_dim = 3 if tensor_format == "thd" else 4
    if t.dim() != want_dim:
        raise ValueError(
            f"apply_rotary_pos_emb: t must be {want_dim}-D for tensor_format={tensor_format!r}, "
            f"got shape {list(t.shape)}"
        )
    cos, sin = _LastTables.get(freqs, t, interleaved)
    if 2 * cos.size(-1) > t.size(-1):
        raise ValueError(
            f"apply_rotary_pos_emb: freqs' last dim d2 = {2 * cos.size(-1)} must be <= the head "
            f"dim of t, {t.size(-1)}"
        )

    if tensor_format == "thd":
        if cu_seqlens is None:
            raise ValueError("apply_rotary_pos_emb: tensor_format='thd' needs cu_seqlens")
        if start_positions is not None:
            start_positions = _index_tensor(
                "start_positions", start_positions, cu_seqlens.numel() - 1, t.device
            )
        return apply(t, cos, sin, cu_seqlens=cu_seqlens, seq_offsets=start_positions,
                     cp_size=cp_size, cp_rank=cp_rank, interleaved=interleaved)  # fmt: skip

    if cu_seqlens is not None:
        raise ValueError(
            f"apply_rotary_pos_emb: cu_seqlens goes with tensor_format='thd', got it with "
            f"{tensor_format!r}"
        )
    seq_dim, batch_dim = (0, 1) if tensor_format == "sbhd" else (1, 0)
    seq_len, batch = t.size(seq_dim), t.size(batch_dim)
    if cp_size > 1 and seq_len % 2:
        raise ValueError(
            f"apply_rotary_pos_emb: with cp_size > 1 the local sequence length must be even (two "
            f"chunks per rank), got s = {seq_len}"
        )
    if seq_len * cp_size > cos.size(0):
        raise ValueError(
            f"apply_rotary_pos_emb: freqs has {cos.size(0)} positions, fewer than s * cp_size = "
            f"{seq_len} * {cp_size}"
        )
    positions = _zigzag(seq_len, cp_size, cp_rank, t.device)  # (s,)
    if start_positions is not None:
        start = _index_tensor("start_positions", start_positions, batch, t.device)
        positions = positions.unsqueeze(0) + start.unsqueeze(1)  # (b, s)
        if tensor_format == "sbhd":
            positions = positions.t()
    elif tensor_format == "bshd":
        positions = positions.unsqueeze(0)
    else:
        positions = positions.unsqueeze(1)
    # Over the heads: (s, b, 1) or (b, s, 1), and (s, 1, 1) / (1, s, 1) without start positions.
    return apply(t, cos, sin, positions.unsqueeze(-1), interleaved=interleaved)
