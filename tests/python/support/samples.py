# SPDX-License-Identifier: BSD-3-Clause
"""The suite's one catalogue of op inputs, kept the way pytorch/extension-cpp keeps it.

``GEOMETRIES`` builds ``(x, positions)`` for every documented layout and positions shape, and for
the awkward strides callers hand over (slices of fused projections, transposes, misaligned and
padded rows, expanded inputs and positions). ``sample_inputs(device, requires_grad)`` turns them
into small :class:`Sample` calls of every op - ``apply``, ``apply_``, ``apply.out``,
``apply_qk`` - over every dtype, both pair layouts, forward and inverse, full and partial rotary,
int32 and int64 positions, and trigonometric, float64 and arbitrary tables; and the same again
with multi-axis positions (``mrope_section``: both section layouts, one to four axes, an axis of
no planes, positions with the axis dim last in memory or first, as HF's ``(3, B, S)``
position_ids permuted). Those samples feed
the correctness test (against references.py), gradcheck / gradgradcheck and the differentiated
oracle, ``torch.library.opcheck`` and ``torch.compile`` (test_samples.py); test_apply.py crosses
``GEOMETRIES`` with dtypes, head_dims and both pair layouts.
"""

from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import references as ref
import torch
from helpers import dtype_id, make_tables, randn, table_dtype_for
from torch import Tensor

import torch_rope

B, H, S = 2, 3, 11
MAX_SEQ_LEN = 64


def spread_positions(n: int, device, dtype=torch.int64, max_seq_len: int = MAX_SEQ_LEN) -> Tensor:
    """n positions spread over the whole table, including 0 and max_seq_len - 1."""
    p = torch.randint(0, max_seq_len, (n,))
    p[0], p[-1] = 0, max_seq_len - 1
    return p.to(device=device, dtype=dtype)


# ---- layouts x positions shapes ------------------------------------------------------------------
# Each builder returns (x, positions) for head_dim D: positions int64, values in [0, MAX_SEQ_LEN).
# b, h, s default to the module's B, H, S; the samples below ask for smaller ones (gradcheck
# builds a numel x numel Jacobian).


def _bhsd_seq_positions(D, dtype, device, b=B, h=H, s=S):
    return randn(b, h, s, D, dtype=dtype, device=device), spread_positions(s, device)


def _bhsd_per_sequence(D, dtype, device, b=B, h=H, s=S):
    x = randn(b, h, s, D, dtype=dtype, device=device)
    return x, torch.randint(0, MAX_SEQ_LEN, (b, 1, s), device=device)


def _bhsd_every_row(D, dtype, device, b=B, h=H, s=S):
    x = randn(b, h, s, D, dtype=dtype, device=device)
    return x, torch.randint(0, MAX_SEQ_LEN, (b, h, s), device=device)


def _bshd_seq_column(D, dtype, device, b=B, h=H, s=S):
    x = randn(b, s, h, D, dtype=dtype, device=device)
    return x, spread_positions(s, device).unsqueeze(-1)


def _bshd_per_sequence(D, dtype, device, b=B, h=H, s=S):
    x = randn(b, s, h, D, dtype=dtype, device=device)
    return x, torch.randint(0, MAX_SEQ_LEN, (b, s, 1), device=device)


def _packed_varlen(D, dtype, device, b=B, h=H, s=S):
    lengths = (s // 2, 1, s - 2)  # three sequences, one of a single token
    positions = torch.cat([torch.arange(n) for n in lengths]).to(device).unsqueeze(-1)  # (T, 1)
    return randn(sum(lengths), h, D, dtype=dtype, device=device), positions


def _decode_offsets(D, dtype, device, b=B, h=H, s=S):
    start_pos, steps = 50, 4
    x = randn(b, h, steps, D, dtype=dtype, device=device)
    return x, start_pos + torch.arange(steps, device=device)


def _decode_one_token_per_sequence(D, dtype, device, b=B, h=H, s=S):
    # (B, 1, H, D) with each sequence at its own cache length.
    x = randn(b, 1, h, D, dtype=dtype, device=device)
    lengths = MAX_SEQ_LEN - 1 - 26 * torch.arange(b - 1, -1, -1)  # ..., 37, 63
    return x, lengths.to(device).view(b, 1, 1)


def _scalar_position(D, dtype, device, b=B, h=H, s=S):
    return randn(h, D, dtype=dtype, device=device), torch.tensor(29, device=device)


def _single_row(D, dtype, device, b=B, h=H, s=S):
    # A 1-D x: x.shape[:-1] is (), one row, a 0-dim position.
    return randn(D, dtype=dtype, device=device), torch.tensor(MAX_SEQ_LEN - 1, device=device)


def _q_sliced_from_fused_bsd(D, dtype, device, b=B, h=H, s=S):
    qkv = randn(b, s, 3 * D, dtype=dtype, device=device)
    return qkv[..., :D], spread_positions(s, device)


def _k_sliced_from_fused_bshd(D, dtype, device, b=B, h=H, s=S):
    qkv = randn(b, s, h, 3 * D, dtype=dtype, device=device)
    return qkv[..., D : 2 * D], spread_positions(s, device).unsqueeze(-1)


def _bshd_transposed_to_bhsd(D, dtype, device, b=B, h=H, s=S):
    x = randn(b, s, h, D, dtype=dtype, device=device).transpose(1, 2)
    return x, spread_positions(s, device)


def _last_dim_not_contiguous(D, dtype, device, b=B, h=H, s=S):
    x = randn(b, h, D, s, dtype=dtype, device=device).transpose(-1, -2)
    assert x.stride(-1) != 1
    return x, spread_positions(s, device)


def _misaligned_storage_offset(D, dtype, device, b=B, h=H, s=S):
    # Data pointer one element past an allocation: wide vector loads must not assume alignment.
    flat = randn(b * s * D + 1, dtype=dtype, device=device)
    return flat[1:].view(b, s, D), spread_positions(s, device)


def _odd_row_stride(D, dtype, device, b=B, h=H, s=S):
    # Rows 3*D + 1 elements apart, starting at offset 1.
    rows = randn(b, s, 3 * D + 1, dtype=dtype, device=device)
    return rows[..., 1 : D + 1], spread_positions(s, device)


def _strided_positions(D, dtype, device, b=B, h=H, s=S):
    # positions as a column of a wider tensor (stride 2), not contiguous.
    x = randn(b, h, s, D, dtype=dtype, device=device)
    return x, torch.randint(0, MAX_SEQ_LEN, (s, 2), device=device)[:, 1]


def _expanded_positions(D, dtype, device, b=B, h=H, s=S):
    # One decode position for every row, as a stride-0 view.
    x = randn(b, s, h, D, dtype=dtype, device=device)
    return x, torch.tensor([41], device=device).expand(b, s, 1)


def _broadcast_input(D, dtype, device, b=B, h=H, s=S):
    # A read-only expanded input (stride 0 over heads): legal for the ops that do not write x.
    x = randn(b, 1, s, D, dtype=dtype, device=device).expand(b, h, s, D)
    return x, spread_positions(s, device)


GEOMETRIES: Dict[str, Callable] = {
    "bhsd_S": _bhsd_seq_positions,
    "bhsd_B1S": _bhsd_per_sequence,
    "bhsd_BHS": _bhsd_every_row,
    "bshd_S1": _bshd_seq_column,
    "bshd_BS1": _bshd_per_sequence,
    "packed_T1": _packed_varlen,
    "decode_start_pos": _decode_offsets,
    "decode_per_sequence": _decode_one_token_per_sequence,
    "scalar_position": _scalar_position,
    "single_row_1d": _single_row,
    "q_from_fused_qkv_bsd": _q_sliced_from_fused_bsd,
    "k_from_fused_qkv_bshd": _k_sliced_from_fused_bshd,
    "transposed_bshd": _bshd_transposed_to_bhsd,
    "last_dim_strided": _last_dim_not_contiguous,
    "storage_offset_1": _misaligned_storage_offset,
    "odd_row_stride": _odd_row_stride,
    "strided_positions": _strided_positions,
    "expanded_positions": _expanded_positions,
    "expanded": _broadcast_input,
}
# Geometries whose x has overlapping memory: apply_ (which writes x) refuses them.
READ_ONLY_GEOMETRIES = {"expanded"}


# ---- samples -------------------------------------------------------------------------------------

OPS = ("apply", "apply_", "apply.out", "apply_qk")


@dataclass
class Sample:
    """One call of one op. ``inputs`` are the tensors it rotates: ``(x,)``, or ``(q, k)``."""

    name: str
    op: str
    inputs: Tuple[Tensor, ...]
    cos: Tensor
    sin: Tensor
    positions: Tensor
    interleaved: bool = True
    inverse: bool = False
    out: Optional[Tensor] = None  # apply.out's buffer
    mrope_section: Optional[Tuple[int, ...]] = None  # multi-axis positions (trailing axis dim)
    mrope_interleaved: bool = False

    @property
    def overload(self):
        return {
            "apply": torch.ops.rope.apply.default,
            "apply_": torch.ops.rope.apply_.default,
            "apply.out": torch.ops.rope.apply.out,
            "apply_qk": torch.ops.rope.apply_qk.default,
        }[self.op]

    @property
    def differentiable(self) -> bool:
        return self.op != "apply.out"  # out= is not differentiable, as aten's out= ops

    @property
    def dtype(self) -> torch.dtype:
        return self.inputs[0].dtype

    @property
    def kwargs(self) -> dict:
        kw = dict(interleaved=self.interleaved, inverse=self.inverse)
        if self.mrope_section is not None:
            kw.update(
                mrope_section=list(self.mrope_section), mrope_interleaved=self.mrope_interleaved
            )
        return kw

    def op_args(self):
        """``(args, kwargs)`` of the raw op, as torch.library.opcheck takes them."""
        inputs = self.inputs
        if self.op == "apply_" and inputs[0].requires_grad:
            # Autograd forbids writing into a leaf that requires grad: a model hands apply_ a
            # non-leaf, and so does this.
            inputs = (inputs[0].clone(),)
        kwargs = self.kwargs
        if self.op == "apply.out":
            kwargs["out"] = self.out
        return (*inputs, self.cos, self.sin, self.positions), kwargs

    def call(self, *inputs: Tensor) -> Tuple[Tensor, ...]:
        """Runs the op through the typed API (torch_rope.*) on ``inputs`` (default: the sample's
        own) and returns its results: the rotated tensor(s), ``x`` itself for apply_ (a clone of
        it when it requires grad), ``out`` for apply.out."""
        inputs = inputs or self.inputs
        args = (self.cos, self.sin, self.positions)
        if self.op == "apply":
            return (torch_rope.apply(inputs[0], *args, **self.kwargs),)
        if self.op == "apply_":
            x = inputs[0].clone() if inputs[0].requires_grad else inputs[0]
            return (torch_rope.apply_(x, *args, **self.kwargs),)
        if self.op == "apply.out":
            return (torch_rope.apply(inputs[0], *args, out=self.out, **self.kwargs),)
        return tuple(torch_rope.apply_qk(*inputs, *args, **self.kwargs))

    def expected(self, inputs: Optional[Tuple[Tensor, ...]] = None) -> Tuple[Tensor, ...]:
        """The float64 oracle (on the CPU) for each of ``inputs`` (default: the sample's own):
        differentiable in them, so gradients can be compared too."""
        inputs = inputs or self.inputs
        return tuple(
            ref.rope_with_tables(x, self.cos, self.sin, self.positions, **self.kwargs)
            for x in inputs
        )


def _tables(kind, rotary_dim, dtype, device):
    """``real``: cos/sin of the angles in the dtype's table dtype (float64 for float64 x);
    ``float64``: real tables in float64 whatever x is; ``random``: arbitrary values, every entry
    different, rows not unit-norm (only the true transpose passes the gradient checks)."""
    if kind == "real":
        return make_tables(MAX_SEQ_LEN, rotary_dim, device, table_dtype_for(dtype))
    if kind == "float64":
        return make_tables(MAX_SEQ_LEN, rotary_dim, device, torch.float64)
    g = torch.Generator().manual_seed(1234 + rotary_dim)
    shape = (MAX_SEQ_LEN, rotary_dim // 2)
    cos = torch.randn(shape, generator=g, dtype=torch.float64).to(table_dtype_for(dtype))
    sin = torch.randn(shape, generator=g, dtype=torch.float64).to(table_dtype_for(dtype))
    return cos.to(device), sin.to(device)


# (op, geometry, dtype, head_dim, rotary_dim, interleaved, inverse, tables, int32 positions)
# Every geometry appears; every op meets every dtype, both pair layouts, inverse, partial rotary
# and int32 positions; each differentiable op has float64 samples in both pair layouts, forward
# and inverse, with real and with arbitrary tables (the gradcheck set).
_PLAN = [
    # apply
    ("apply", "bhsd_S", torch.float64, 8, 8, True, False, "real", False),
    ("apply", "bhsd_S", torch.float64, 10, 6, False, True, "random", False),
    ("apply", "bhsd_BHS", torch.float64, 10, 6, True, True, "random", True),
    ("apply", "bshd_S1", torch.float64, 8, 8, False, False, "random", False),
    ("apply", "single_row_1d", torch.float64, 10, 6, False, False, "real", False),
    ("apply", "bshd_BS1", torch.bfloat16, 24, 24, False, True, "real", True),
    ("apply", "packed_T1", torch.float16, 24, 16, True, False, "real", True),
    ("apply", "decode_start_pos", torch.float32, 24, 16, False, False, "float64", False),
    ("apply", "scalar_position", torch.float32, 16, 16, True, True, "real", False),
    ("apply", "expanded", torch.bfloat16, 16, 16, False, False, "real", False),
    ("apply", "expanded_positions", torch.float32, 24, 8, True, False, "random", False),
    ("apply", "q_from_fused_qkv_bsd", torch.float16, 16, 16, False, True, "float64", False),
    ("apply", "storage_offset_1", torch.float32, 16, 16, True, False, "real", False),
    # apply_
    ("apply_", "bhsd_B1S", torch.float64, 8, 8, True, False, "real", False),
    ("apply_", "transposed_bshd", torch.float64, 10, 6, False, True, "random", True),
    ("apply_", "k_from_fused_qkv_bshd", torch.float64, 10, 6, True, True, "random", False),
    ("apply_", "packed_T1", torch.float64, 8, 8, False, False, "random", True),
    ("apply_", "last_dim_strided", torch.float32, 16, 8, False, False, "real", True),
    ("apply_", "odd_row_stride", torch.bfloat16, 16, 16, True, True, "real", False),
    ("apply_", "strided_positions", torch.float16, 24, 24, False, False, "float64", False),
    ("apply_", "decode_per_sequence", torch.float32, 16, 16, True, False, "random", False),
    # apply.out (into out buffers laid out as in _out_buffer)
    ("apply.out", "bshd_S1", torch.float32, 24, 16, True, False, "real", True),
    ("apply.out", "last_dim_strided", torch.bfloat16, 16, 16, False, True, "real", False),
    ("apply.out", "expanded", torch.float64, 10, 6, False, False, "random", False),
    ("apply.out", "decode_per_sequence", torch.float16, 16, 8, True, True, "float64", True),
]


def _out_buffer(x, index):
    """apply.out's buffer for x: a KV-cache slot, a last-dim-strided view, or contiguous."""
    kind = index % 3
    if kind == 0 and x.dim() >= 2:  # a slot of a longer cache along dim 1
        cache = torch.full(
            (x.shape[0], x.shape[1] + 3) + tuple(x.shape[2:]), 7.0, dtype=x.dtype, device=x.device
        )
        return cache[:, 2 : 2 + x.shape[1]]
    if kind == 1:
        return torch.full(tuple(x.shape) + (2,), 7.0, dtype=x.dtype, device=x.device)[..., 0]
    return torch.full(x.shape, 7.0, dtype=x.dtype, device=x.device)


# apply_qk: (name, q heads, k heads, layout, dtype, head_dim, rotary_dim, interleaved, inverse,
# tables)
_QK_PLAN = [
    ("gqa_bhsd", 4, 2, "bhsd", torch.float64, 8, 8, True, False, "real"),
    ("mqa_bshd_fused", 4, 1, "bshd_fused", torch.float64, 10, 6, False, True, "random"),
    ("gqa_packed", 2, 1, "packed", torch.float64, 10, 6, True, True, "random"),
    ("gqa_bhsd_per_sequence", 2, 1, "bhsd", torch.float64, 8, 8, False, False, "random"),
    ("bshd", 3, 3, "bshd_fused", torch.bfloat16, 24, 16, True, False, "real"),
    ("packed", 4, 2, "packed", torch.float16, 16, 16, False, True, "float64"),
    ("bhsd", 2, 2, "bhsd", torch.float32, 24, 24, True, False, "random"),
]


def _qk_inputs(layout, hq, hk, D, dtype, device):
    b, s = 2, 3
    if layout == "bhsd":
        q, k = (
            randn(b, hq, s, D, dtype=dtype, device=device),
            randn(b, hk, s, D, dtype=dtype, device=device),
        )
        return q, k, torch.randint(0, MAX_SEQ_LEN, (b, 1, s), device=device)
    if layout == "bshd_fused":  # q and k sliced out of one (B, S, (Hq + 2 Hk) D) projection
        fused = randn(b, s, (hq + 2 * hk) * D, dtype=dtype, device=device)
        q = fused[..., : hq * D].view(b, s, hq, D)
        k = fused[..., hq * D : (hq + hk) * D].view(b, s, hk, D)
        return q, k, (20 + torch.arange(s, device=device)).unsqueeze(-1)
    lengths = (2, 1)
    positions = torch.cat([torch.arange(n) for n in lengths]).to(device).unsqueeze(-1)
    t = sum(lengths)
    return (
        randn(t, hq, D, dtype=dtype, device=device),
        randn(t, hk, D, dtype=dtype, device=device),
        positions,
    )


# ---- multi-axis positions (M-RoPE) -----------------------------------------------------------
# The same geometries, with positions of one more, trailing, axis dim: (S, A) for (B, H, S, D),
# (B, 1, S, A), (B, S, 1, A) and (S, 1, A) for (B, S, H, D), (T, 1, A) for packed (T, H, D), (A,)
# for a single row. Axis 0 keeps the geometry's positions (0 and MAX_SEQ_LEN - 1 included), the
# other axes are drawn on their own, so a plane reading the wrong axis shows.


def multi_axis_positions(positions: Tensor, num_axes: int, dtype, axis_first: bool) -> Tensor:
    """``positions`` (one axis) as ``positions.shape + (num_axes,)``. ``axis_first``: stored axis
    by axis, ``(A, *shape)`` in memory and permuted (the axis dim has the largest stride), as
    HF's ``(3, B, S)`` position_ids are when moved to the end."""
    others = [
        torch.randint(0, MAX_SEQ_LEN, positions.shape, device=positions.device)
        for _ in range(num_axes - 1)
    ]
    axes = [positions.to(torch.int64)] + others
    if axis_first:
        p = torch.stack(axes, dim=0).to(dtype).movedim(0, -1)
        assert positions.dim() == 0 or not p.is_contiguous()
        return p
    return torch.stack(axes, dim=-1).to(dtype)


# (op, geometry, dtype, head_dim, rotary_dim, interleaved, inverse, tables, int32 positions,
#  mrope_section, mrope_interleaved, axis_first)
# Every op meets both section layouts and both pair layouts (all four pairs overall), every
# dtype, inverse, partial rotary, int32, 1 to 4 axes; the float64 ones are the gradcheck set.
_MROPE_PLAN = [
    # apply
    ("apply", "bhsd_S", torch.float64, 10, 8, True, False, "real", False, (1, 2, 1), False, False),
    ("apply", "bhsd_B1S", torch.float64, 8, 8, False, True, "random", True, (2, 1, 1), True, True),
    ("apply", "bshd_BS1", torch.float64, 8, 8, True, True, "random", False, (1, 1, 1, 1), False,
     False),
    ("apply", "packed_T1", torch.bfloat16, 24, 16, False, False, "real", True, (2, 3, 3), True,
     False),
    ("apply", "last_dim_strided", torch.float32, 16, 12, True, False, "float64", False, (3, 3),
     False, True),
    ("apply", "bshd_S1", torch.float16, 16, 16, True, True, "real", False, (2, 3, 3), True, False),
    # apply_
    ("apply_", "bhsd_BHS", torch.float64, 10, 6, False, False, "random", False, (1, 1, 1), True,
     True),
    ("apply_", "transposed_bshd", torch.float64, 8, 8, True, True, "real", True, (0, 2, 2), False,
     False),
    ("apply_", "decode_per_sequence", torch.float16, 16, 16, True, False, "float64", True,
     (4, 2, 2), False, False),
    ("apply_", "k_from_fused_qkv_bshd", torch.bfloat16, 16, 8, False, True, "real", False,
     (2, 1, 1), True, False),
    ("apply_", "odd_row_stride", torch.float32, 16, 16, True, False, "real", False, (8,), False,
     False),
    # apply.out
    ("apply.out", "bshd_BS1", torch.float32, 24, 16, False, True, "random", True, (2, 3, 3), True,
     True),
    ("apply.out", "expanded", torch.float64, 10, 6, True, False, "real", False, (3,), False,
     False),
    ("apply.out", "scalar_position", torch.float16, 16, 12, True, True, "float64", False,
     (2, 2, 2), True, False),
    ("apply.out", "packed_T1", torch.bfloat16, 16, 16, False, False, "real", True, (3, 5), False,
     False),
]  # fmt: skip

# apply_qk: (name, q heads, k heads, layout, dtype, head_dim, rotary_dim, interleaved, inverse,
# tables, mrope_section, mrope_interleaved)
_QK_MROPE_PLAN = [
    ("gqa_bhsd", 4, 2, "bhsd", torch.float64, 8, 8, True, False, "real", (2, 1, 1), True),
    ("mqa_bshd_fused", 4, 1, "bshd_fused", torch.float64, 10, 6, False, True, "random",
     (1, 1, 1), False),
    ("gqa_packed", 2, 1, "packed", torch.bfloat16, 16, 12, False, False, "real", (2, 2, 2), True),
    ("bhsd", 2, 2, "bhsd", torch.float16, 16, 16, True, True, "float64", (4, 4), False),
]  # fmt: skip


def _mrope_id(section, mrope_interleaved):
    return f"-mrope{'_'.join(map(str, section))}{'-il3' if mrope_interleaved else ''}"


def sample_inputs(device, requires_grad: bool):
    """Every sample, built on ``device``. With ``requires_grad`` the rotated inputs are leaves
    that require grad, and apply.out (not differentiable) has no samples."""

    def leaf(t):
        return t.detach().requires_grad_() if requires_grad else t

    samples = []
    for i, (op, geometry, dtype, D, rotary_dim, interleaved, inverse, tables, int32) in enumerate(
        _PLAN
    ):
        if requires_grad and op == "apply.out":
            continue
        assert not (op == "apply_" and geometry in READ_ONLY_GEOMETRIES), "apply_ writes x"
        x, positions = GEOMETRIES[geometry](D, dtype, device, b=2, h=2, s=3)
        cos, sin = _tables(tables, rotary_dim, dtype, device)
        name = (
            f"{op}-{geometry}-{dtype_id(dtype)}-d{D}r{rotary_dim}-"
            f"{'il' if interleaved else 'half'}{'-inv' if inverse else ''}-{tables}"
            f"{'-int32' if int32 else ''}"
        )
        samples.append(
            Sample(
                name,
                op,
                (leaf(x),),
                cos,
                sin,
                positions.to(torch.int32 if int32 else torch.int64),
                interleaved,
                inverse,
                out=_out_buffer(x, i) if op == "apply.out" else None,
            )
        )
    for name, hq, hk, layout, dtype, D, rotary_dim, interleaved, inverse, tables in _QK_PLAN:
        q, k, positions = _qk_inputs(layout, hq, hk, D, dtype, device)
        cos, sin = _tables(tables, rotary_dim, dtype, device)
        name = (
            f"apply_qk-{name}-{dtype_id(dtype)}-d{D}r{rotary_dim}-"
            f"{'il' if interleaved else 'half'}{'-inv' if inverse else ''}-{tables}"
        )
        samples.append(
            Sample(name, "apply_qk", (leaf(q), leaf(k)), cos, sin, positions, interleaved, inverse)
        )
    for i, row in enumerate(_MROPE_PLAN):
        op, geometry, dtype, D, rotary_dim, interleaved, inverse, tables, int32 = row[:9]
        section, mrope_interleaved, axis_first = row[9:]
        if requires_grad and op == "apply.out":
            continue
        assert not (op == "apply_" and geometry in READ_ONLY_GEOMETRIES), "apply_ writes x"
        assert sum(section) == rotary_dim // 2, row
        x, positions = GEOMETRIES[geometry](D, dtype, device, b=2, h=2, s=3)
        positions = multi_axis_positions(
            positions, len(section), torch.int32 if int32 else torch.int64, axis_first
        )
        cos, sin = _tables(tables, rotary_dim, dtype, device)
        name = (
            f"{op}-{geometry}-{dtype_id(dtype)}-d{D}r{rotary_dim}-"
            f"{'il' if interleaved else 'half'}{'-inv' if inverse else ''}-{tables}"
            f"{'-int32' if int32 else ''}{_mrope_id(section, mrope_interleaved)}"
            f"{'-axis_first' if axis_first else ''}"
        )
        samples.append(
            Sample(
                name,
                op,
                (leaf(x),),
                cos,
                sin,
                positions,
                interleaved,
                inverse,
                out=_out_buffer(x, i) if op == "apply.out" else None,
                mrope_section=section,
                mrope_interleaved=mrope_interleaved,
            )
        )
    for row in _QK_MROPE_PLAN:
        name, hq, hk, layout, dtype, D, rotary_dim, interleaved, inverse, tables = row[:10]
        section, mrope_interleaved = row[10:]
        q, k, positions = _qk_inputs(layout, hq, hk, D, dtype, device)
        positions = multi_axis_positions(positions, len(section), torch.int64, False)
        cos, sin = _tables(tables, rotary_dim, dtype, device)
        name = (
            f"apply_qk-{name}-{dtype_id(dtype)}-d{D}r{rotary_dim}-"
            f"{'il' if interleaved else 'half'}{'-inv' if inverse else ''}-{tables}"
            f"{_mrope_id(section, mrope_interleaved)}"
        )
        samples.append(
            Sample(
                name,
                "apply_qk",
                (leaf(q), leaf(k)),
                cos,
                sin,
                positions,
                interleaved,
                inverse,
                mrope_section=section,
                mrope_interleaved=mrope_interleaved,
            )
        )
    return samples


def sample_ids(requires_grad: bool):
    """The samples' names, for pytest ids (built once on the CPU at collection)."""
    return [s.name for s in sample_inputs("cpu", requires_grad)]
