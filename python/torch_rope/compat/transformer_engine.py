# SPDX-License-Identifier: BSD-3-Clause
"""TransformerEngine's ``apply_rotary_pos_emb`` over :func:`torch_rope.apply` (re-exported by
:mod:`torch_rope.compat`).

TE's ``freqs`` are **angles**, not cos/sin and not frequencies: ``freqs[p, 0, 0, i]`` is the angle
feature ``i`` of a token at position ``p`` turns by, ``(s2, 1, 1, d2)``, each plane's angle written
twice as TE's ``RotaryPositionEmbedding`` builds it (``cat(a, a)`` for the half split,
``[a0, a0, a1, a1, ...]`` for adjacent pairs). The only conversion done here is angles -> cos/sin
tables: one angle per plane, cos and sin taken in float64 and stored in float32 (float64 for
float64 ``t``); the angles are read in float32, as TE's fused kernel reads them (float64 for
float64 ``t``). The tables are computed from ``freqs`` on every call, as TE reads ``freqs`` on
every call: nothing is kept between calls, so no write to ``freqs`` (in place, through ``.data``,
through a numpy or DLPack alias, under inference mode) can leave old angles in use, and threads
share nothing. ``sbhd``/``bshd`` convert only the rows of the tokens' positions (a small ``(s,
b)`` positions tensor that TE's zigzag rule gives); ``thd`` becomes the packed-sequence form
(``cu_seqlens``, ``seq_offsets = start_positions``, ``cp_size``, ``cp_rank``), whose op finds
each token's position itself, over the tables of all of ``freqs``' rows.
"""

import numbers
from typing import Optional

import torch
from torch import Tensor

from ..ops.rotation import _is_compiling, apply
from .errors import PeerNames, peer_words

# The op's names -> TE's: thd's seq_offsets are its start_positions; the tables come from freqs.
_WORDS = PeerNames(
    "apply_rotary_pos_emb",
    {
        "x": "t",
        "seq_offsets": "start_positions",
        "2 * cos.size(-1)": "freqs.size(-1)",
        "cos.size(0)": "freqs.size(0)",
    },
)

_FORMATS = ("sbhd", "bshd", "thd")


def _int_arg(name: str, value) -> int:
    if type(value) is int:  # the usual case, without the Integral check's cost
        return value
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


def _angles(freqs: Tensor, t: Tensor) -> Tensor:
    """TE's angles as ``(s2, d2)``, detached (no gradient to freqs, as TE's fused path), in the
    dtype the math reads them in (float32; float64 for float64 ``t``)."""
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
    angles = freqs.detach().view(freqs.size(0), freqs.size(3))
    return angles if angles.dtype == angle_dtype else angles.to(angle_dtype)


def _tables(angles: Tensor, t: Tensor, interleaved: bool):
    """cos/sin tables ``(rows, d2 / 2)`` of the first angle of each plane of TE's angles (the
    rows given), computed from them on every call: TE reads ``freqs`` on every call, and a table
    kept from an earlier call cannot know whether ``freqs`` was written since (a write through
    ``.data``, a numpy or DLPack alias, or any write under inference mode, moves no version
    counter)."""
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


def _check_start_positions(start: Tensor, positions: Tensor, s2: int, batch_dim: int) -> None:
    """start_positions puts every token inside freqs' ``s2`` positions (on the CPU, where it costs
    no host sync; on CUDA a position past freqs is the gather's device assert)."""
    if start.device.type != "cpu" or _is_compiling() or positions.numel() == 0:
        return
    lowest, highest = torch.aminmax(positions)  # zigzag positions are >= 0: lowest < 0 iff start is
    if int(lowest) >= 0 and int(highest) < s2:
        return
    if bool((start < 0).any()):
        b = int(torch.nonzero(start < 0)[0, 0])
        raise ValueError(
            f"apply_rotary_pos_emb: start_positions must be >= 0, got start_positions[{b}] = "
            f"{int(start[b])}"
        )
    last = positions.amax(dim=1 - batch_dim)  # (b,): each sequence's last position
    b = int(torch.nonzero(last >= s2)[0, 0])
    raise ValueError(
        f"apply_rotary_pos_emb: freqs has {s2} positions; start_positions[{b}] = "
        f"{int(start[b])} puts a token of that sequence at position {int(last[b])}"
    )


def _thd_rows(cu_seqlens, start_positions, s2: int) -> int:
    """How many rows of freqs a packed batch reads: each sequence's positions are below its
    global length plus its start position (whatever cp_size). Read from a CPU cu_seqlens (no
    host sync); all ``s2`` rows otherwise, and whenever the values are not a valid batch (the op
    then names what is wrong)."""
    if (
        _is_compiling()
        or type(cu_seqlens) is not Tensor
        or cu_seqlens.device.type != "cpu"
        or cu_seqlens.dim() != 1
        or cu_seqlens.numel() < 2
        or cu_seqlens.dtype not in (torch.int32, torch.int64)
        or (start_positions is not None and start_positions.device.type != "cpu")
    ):
        return s2
    ends = cu_seqlens[1:] - cu_seqlens[:-1]
    if start_positions is not None:
        ends = ends + start_positions
    return max(0, min(s2, int(ends.max())))


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
    angles = _angles(freqs, t)
    s2, d2 = angles.shape
    if d2 > t.size(-1):
        raise ValueError(
            f"apply_rotary_pos_emb: freqs' last dim d2 = {d2} must be <= the head dim of t, "
            f"{t.size(-1)}"
        )

    if tensor_format == "thd":
        if cu_seqlens is None:
            raise ValueError("apply_rotary_pos_emb: tensor_format='thd' needs cu_seqlens")
        if start_positions is not None:
            start_positions = _index_tensor(
                "start_positions", start_positions, cu_seqlens.numel() - 1, t.device
            )
        # The op finds each token's position from cu_seqlens; the tables cover the rows it can
        # read: all of freqs, or (cu_seqlens on the CPU) up to the longest sequence's end.
        cos, sin = _tables(angles[: _thd_rows(cu_seqlens, start_positions, s2)], t, interleaved)
        return peer_words(_WORDS, apply, t, cos, sin, cu_seqlens=cu_seqlens,
                          seq_offsets=start_positions, cp_size=cp_size, cp_rank=cp_rank,
                          interleaved=interleaved)  # fmt: skip

    # sbhd / bshd: TE ignores cu_seqlens here (its own tests pass it with these formats); so do
    # these. The positions are known, so only their rows of freqs are converted (as TE reads
    # only them), one table row per (token, sequence).
    seq_dim, batch_dim = (0, 1) if tensor_format == "sbhd" else (1, 0)
    seq_len, batch = t.size(seq_dim), t.size(batch_dim)
    if cp_size > 1 and seq_len % 2:
        raise ValueError(
            f"apply_rotary_pos_emb: with cp_size > 1 the local sequence length must be even (two "
            f"chunks per rank), got s = {seq_len}"
        )
    if seq_len * cp_size > s2:
        raise ValueError(
            f"apply_rotary_pos_emb: freqs has {s2} positions, fewer than s * cp_size = "
            f"{seq_len} * {cp_size}"
        )
    positions = _zigzag(seq_len, cp_size, cp_rank, t.device)  # (s,)
    if start_positions is None:
        # Every sequence at the same positions, all below s * cp_size: those rows of freqs.
        cos, sin = _tables(angles[: seq_len * cp_size], t, interleaved)
        rows = positions.unsqueeze(0) if tensor_format == "bshd" else positions.unsqueeze(1)
    else:
        start = _index_tensor("start_positions", start_positions, batch, t.device)
        # In t's order: (s, b) or (b, s).
        if tensor_format == "sbhd":
            positions = positions.unsqueeze(1) + start.unsqueeze(0)
        else:
            positions = positions.unsqueeze(0) + start.unsqueeze(1)
        _check_start_positions(start, positions, s2, batch_dim=1 if tensor_format == "sbhd" else 0)
        # One table row per (token, sequence): row r holds the r-th entry of positions.
        cos, sin = _tables(angles.index_select(0, positions.reshape(-1)), t, interleaved)
        rows = torch.arange(positions.numel(), device=t.device).view(positions.shape)
    return peer_words(_WORDS, apply, t, cos, sin, rows.unsqueeze(-1), interleaved=interleaved)
