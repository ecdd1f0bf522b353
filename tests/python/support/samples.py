# SPDX-License-Identifier: BSD-3-Clause
"""The suite's one catalogue of op inputs, kept the way pytorch/extension-cpp keeps it: one block
per op family, every block feeding the same checks.

``GEOMETRIES`` builds ``(x, positions)`` for every documented layout and positions shape, and for
the awkward strides callers hand over (slices of fused projections, transposes, misaligned and
padded rows, expanded inputs and positions). Each op family then has a block of three parts:

1. a sample class (an :class:`OpSample`): one call of one of its ops, run through the typed API
   (``call``) or as the raw op with its arguments (``overload``, ``op_args``, for opcheck), its
   float64 oracle from references.py (``expected``, differentiable in the inputs), and ``check``:
   the call's results against that oracle within the dtype's tolerance, and everything the call
   must leave alone left alone;
2. a plan: rows of inputs chosen so that every dtype, both pair layouts, partial rotary, int32
   and int64 positions, multi-axis positions and the awkward strides each meet every op;
3. a builder, ``<family>_samples(device, requires_grad)``, registered with
   :func:`register_family`.

``sample_inputs(device, requires_grad)`` returns every family's samples; test_samples.py runs each
through the correctness check, the gradients of the differentiable ones (the differentiated
oracle in every dtype, gradcheck and gradgradcheck in float64), ``torch.library.opcheck`` and
``torch.compile(fullgraph=True)``. A new op (or a new form of one) appends its block; nothing in
test_samples.py changes. The families:

* **rope** - ``apply``, ``apply_``, ``apply.out``, ``apply_qk`` over every geometry, forward and
  inverse, trigonometric, float64 and arbitrary tables, and again with multi-axis positions
  (``mrope_section``: both section layouts, one to four axes, an axis of no planes, positions with
  the axis dim last in memory or first, as HF's ``(3, B, S)`` position_ids permuted);
* **rms_norm** - ``rms_norm_apply_qk`` over ``QK_GEOMETRIES`` (q and k of GQA/MQA head counts:
  decode, packed, fused-qkv slices, a last-dim stride, a misaligned start, transposes, strided and
  expanded positions, an empty q), eps and Gemma's weight offset, weights of another dtype or
  strided, multi-axis positions;
* **kv_cache** - ``apply_qk_cache`` over ``CACHE_GEOMETRIES`` (q, k, v of ``(T, H, D)``: fused-qkv
  slices, a last-dim stride, a misaligned start, per-head, broadcast and strided positions, no
  tokens) into flat and paged caches, caches that are halves of one buffer or rows padded for
  alignment, 16/32-bit and float8 caches (both formats, the scale as a Python float, a 0-d or a
  1-element tensor), padding (negative) slots, and no v;
* **forms** - the ``freqs=`` and packed-sequence (``cu_seqlens``, ``seq_offsets``, context
  parallelism) overloads of the four rope ops;
* **qk_fp8** - ``apply_qk_fp8`` and ``apply_qk_fp8.out`` (both float8 formats and scale rules,
  no-RoPE parts, out= buffers with padding around them);
* **qk_fp8_dynamic** - ``apply_qk_fp8_dynamic`` and ``apply_qk_fp8_dynamic.out`` (scales per
  row and per token, float32 and powers of two, both float8 formats, multi-axis positions, the
  inverse rotation, no tokens, out= rows and strided scales with padding around them);
* **mla_cache** - ``mla_apply_cache`` (one cache or two, flat or paged, float8 caches and q, the
  GQA rows with v);
* **norm_cache** - ``rms_norm_apply_qk_cache`` (the kv_cache family's geometries and caches with
  the norm's weights, eps and offset, a float8 q, multi-axis positions).

test_catalogue.py requires every overload of torch.ops.rope to be some sample's ``overload``.

test_apply.py crosses ``GEOMETRIES`` with dtypes, head_dims and both pair layouts;
test_rms_norm_apply_qk.py and test_apply_qk_cache.py cross their family's geometries with dtypes
and layouts through the same builders and checks.
"""

from dataclasses import dataclass, replace
from typing import Callable, Dict, List, Optional, Tuple

import references as ref
import torch
from helpers import (
    TOLERANCES,
    dtype_id,
    make_tables,
    randn,
    rotation_error_bound,
    same_bits,
    table_dtype_for,
)
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


# ---- the sample protocol and the family registry -----------------------------------------------


class OpSample:
    """What every family's sample provides; test_samples.py uses nothing else.

    ``inputs`` are the tensors ``call`` takes (``call()`` uses the sample's own): the leaves the
    gradient checks differentiate, and the compiled function's arguments."""

    name: str
    op: str
    inputs: Tuple[Tensor, ...]
    # torch.library.opcheck's keyword arguments (e.g. the test_utils a float8 call can run), and
    # the torch it needs, as needs_torch's (version, what) (None: any torch the project builds on).
    opcheck_kwargs: dict = {}
    opcheck_needs_torch: Optional[Tuple[str, str]] = None

    @property
    def overload(self):
        """The raw op, ``torch.ops.rope.<op>.<overload>``."""
        raise NotImplementedError

    @property
    def differentiable(self) -> bool:
        raise NotImplementedError

    @property
    def dtype(self) -> torch.dtype:
        return self.inputs[0].dtype

    def op_args(self):
        """``(args, kwargs)`` of the raw op, as torch.library.opcheck takes them."""
        raise NotImplementedError

    def call(self, *inputs: Tensor) -> Tuple[Tensor, ...]:
        """Runs the op through the typed API (torch_rope.*) and returns its results."""
        raise NotImplementedError

    def expected(self, inputs: Optional[Tuple[Tensor, ...]] = None) -> Tuple[Tensor, ...]:
        """The float64 oracle (on the CPU) of each of ``call``'s results, differentiable in
        ``inputs`` (default: the sample's own)."""
        raise NotImplementedError

    def written(self) -> Tuple[Tensor, ...]:
        """The tensors a call writes besides its results (apply_'s x, out, the caches)."""
        return ()

    def snapshot(self):
        """What ``check`` needs of the state before the call: copies of what the call reads."""
        return tuple(x.detach().clone() for x in self.inputs)

    def check(self, results: Tuple[Tensor, ...], before) -> None:
        """``results`` of ``call()`` against the oracle, and nothing written that must not be."""
        raise NotImplementedError


# family name -> (its ops, its builder ``(device, requires_grad) -> [samples]``), in order.
FAMILIES: Dict[str, Tuple[Tuple[str, ...], Callable[..., List[OpSample]]]] = {}


def register_family(name: str, ops: Tuple[str, ...], builder: Callable[..., List[OpSample]]):
    assert name not in FAMILIES, f"family {name} registered twice"
    FAMILIES[name] = (tuple(ops), builder)


def all_ops() -> Tuple[str, ...]:
    """Every op of every family."""
    return tuple(op for ops, _ in FAMILIES.values() for op in ops)


def sample_inputs(device, requires_grad: bool) -> List[OpSample]:
    """Every family's samples, built on ``device``. With ``requires_grad`` the differentiable
    inputs are leaves that require grad, and the ops that are not differentiable (apply.out,
    apply_qk_cache) have no samples."""
    samples = [s for _, builder in FAMILIES.values() for s in builder(device, requires_grad)]
    assert not requires_grad or all(s.differentiable for s in samples)
    return samples


def sample_ids(requires_grad: bool):
    """The samples' names, for pytest ids (built once on the CPU at collection)."""
    return [s.name for s in sample_inputs("cpu", requires_grad)]


def _assert_unchanged(now: Tensor, before: Tensor, what: str):
    assert same_bits(now, before), f"{what} was modified"


# ---- family: rope (apply, apply_, apply.out, apply_qk) -----------------------------------------

ROPE_OPS = ("apply", "apply_", "apply.out", "apply_qk")


@dataclass
class RopeSample(OpSample):
    """One call of one rope op. ``inputs`` are the tensors it rotates: ``(x,)``, or ``(q, k)``."""

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

    def written(self) -> Tuple[Tensor, ...]:
        return (self.out,) if self.op == "apply.out" else ()

    def check(self, results, before):
        # before: copies of the inputs (apply_ overwrites its x).
        want = self.expected(before)
        rotary_dim = 2 * self.cos.size(-1)
        for out, x_before, expected in zip(results, before, want):
            assert out.shape == x_before.shape and out.dtype == x_before.dtype
            assert out.device == x_before.device
            torch.testing.assert_close(out.cpu(), expected.to(out.dtype), **TOLERANCES[out.dtype])
            assert torch.equal(out[..., rotary_dim:], x_before[..., rotary_dim:]), (
                "pass-through features changed"
            )
        if self.op == "apply_":
            assert results[0] is self.inputs[0], "apply_ must return x itself"
        elif self.op == "apply.out":
            assert results[0] is self.out, "apply(..., out=) must return out"
        else:
            assert all(out.is_contiguous() for out in results)
        if self.op != "apply_":
            for x, x_before in zip(self.inputs, before):
                assert torch.equal(x, x_before), f"{self.op} modified its input"


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


def rope_samples(device, requires_grad: bool) -> List[OpSample]:
    """The rope family's samples, built on ``device``. With ``requires_grad`` the rotated inputs
    are leaves that require grad, and apply.out (not differentiable) has no samples."""

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
            RopeSample(
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
            RopeSample(
                name, "apply_qk", (leaf(q), leaf(k)), cos, sin, positions, interleaved, inverse
            )
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
            RopeSample(
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
            RopeSample(
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


register_family("rope", ROPE_OPS, rope_samples)


# ---- family: rms_norm (rms_norm_apply_qk) -------------------------------------------------------
# q and k of their own head counts (GQA, MQA) with positions that broadcast to both. Each builder
# returns (q, k, positions) for head_dim D: values N(0, 1), positions int64 in [0, MAX_SEQ_LEN).
# Small sizes: gradcheck builds a numel x numel Jacobian.

RMS_NORM_OPS = ("rms_norm_apply_qk",)


def _qk(q_shape, k_shape, dtype, device):
    return randn(*q_shape, dtype=dtype, device=device), randn(*k_shape, dtype=dtype, device=device)


def _qk_bhsd_seq_positions(hq, hk, D, dtype, device, b=2, s=3):
    q, k = _qk((b, hq, s, D), (b, hk, s, D), dtype, device)
    return q, k, spread_positions(s, device)


def _qk_bhsd_per_sequence(hq, hk, D, dtype, device, b=2, s=3):
    q, k = _qk((b, hq, s, D), (b, hk, s, D), dtype, device)
    return q, k, torch.randint(0, MAX_SEQ_LEN, (b, 1, s), device=device)


def _qk_bshd_decode(hq, hk, D, dtype, device, b=2, s=3):
    # (B, 1, H, D): one new token per sequence, each at its own cache length.
    q, k = _qk((b, 1, hq, D), (b, 1, hk, D), dtype, device)
    lengths = MAX_SEQ_LEN - 1 - 23 * torch.arange(b - 1, -1, -1)
    return q, k, lengths.to(device).view(b, 1, 1)


def _qk_packed_varlen(hq, hk, D, dtype, device, b=2, s=3):
    lengths = (2, 1)  # two sequences, one of a single token
    positions = torch.cat([torch.arange(n) for n in lengths]).to(device).unsqueeze(-1)  # (T, 1)
    return (*_qk((3, hq, D), (3, hk, D), dtype, device), positions)


def _qk_from_fused_qkv_bshd(hq, hk, D, dtype, device, b=2, s=3):
    # q and k sliced out of one (B, S, (Hq + 2 Hk) D) projection: rows strided, last dim stride 1.
    fused = randn(b, s, (hq + 2 * hk) * D, dtype=dtype, device=device)
    q = fused[..., : hq * D].view(b, s, hq, D)
    k = fused[..., hq * D : (hq + hk) * D].view(b, s, hk, D)
    return q, k, (20 + torch.arange(s, device=device)).unsqueeze(-1)


def _qk_last_dim_strided(hq, hk, D, dtype, device, b=2, s=3):
    # q with last-dim stride 2 (read through a copy), k plain.
    q, k = _qk((b, s, hq, 2 * D), (b, s, hk, D), dtype, device)
    return q[..., ::2], k, spread_positions(s, device).unsqueeze(-1)


def _qk_misaligned_storage_offset(hq, hk, D, dtype, device, b=2, s=3):
    # Data pointers one element past an allocation: wide vector loads must not assume alignment.
    q, k = _qk((b * s * hq * D + 1,), (b * s * hk * D + 1,), dtype, device)
    q, k = q[1:].view(b, s, hq, D), k[1:].view(b, s, hk, D)
    return q, k, spread_positions(s, device).unsqueeze(-1)


def _qk_bshd_transposed_to_bhsd(hq, hk, D, dtype, device, b=2, s=3):
    q, k = _qk((b, s, hq, D), (b, s, hk, D), dtype, device)
    return q.transpose(1, 2), k.transpose(1, 2), spread_positions(s, device)


def _qk_strided_positions(hq, hk, D, dtype, device, b=2, s=3):
    # positions as a column of a wider tensor (stride 2).
    q, k = _qk((b, hq, s, D), (b, hk, s, D), dtype, device)
    return q, k, torch.randint(0, MAX_SEQ_LEN, (s, 2), device=device)[:, 1]


def _qk_expanded_positions(hq, hk, D, dtype, device, b=2, s=3):
    # One decode position for every row, as a stride-0 view.
    q, k = _qk((b, s, hq, D), (b, s, hk, D), dtype, device)
    return q, k, torch.tensor([41], device=device).expand(b, s, 1)


def _qk_empty_q(hq, hk, D, dtype, device, b=2, s=3):
    # No query tokens, three key tokens: one empty output, one full.
    q, k = _qk((0, hq, D), (s, hk, D), dtype, device)
    return q, k, torch.tensor([[MAX_SEQ_LEN - 1]], device=device)


def _qk_single_row(hq, hk, D, dtype, device, b=2, s=3):
    # 1-D q and k: one row each, a 0-dim position.
    return (*_qk((D,), (D,), dtype, device), torch.tensor(29, device=device))


QK_GEOMETRIES: Dict[str, Callable] = {
    "bhsd_S": _qk_bhsd_seq_positions,
    "bhsd_B1S": _qk_bhsd_per_sequence,
    "bshd_decode": _qk_bshd_decode,
    "packed_T1": _qk_packed_varlen,
    "fused_qkv_bshd": _qk_from_fused_qkv_bshd,
    "last_dim_strided": _qk_last_dim_strided,
    "storage_offset_1": _qk_misaligned_storage_offset,
    "transposed_bshd": _qk_bshd_transposed_to_bhsd,
    "strided_positions": _qk_strided_positions,
    "expanded_positions": _qk_expanded_positions,
    "empty_q": _qk_empty_q,
    "single_row_1d": _qk_single_row,
}


def _norm_weights(kind, D, dtype, device):
    """``(q_weight, k_weight)``, values 1 + N(0, 0.5^2). ``own``: q's dtype; ``float32_k``:
    k_weight float32 whatever q is; ``mixed``: bfloat16 and float64; ``strided``: q_weight a
    stride-2 float32 view."""
    g = torch.Generator().manual_seed(7 + D)
    values = [1.0 + 0.5 * torch.randn(D, generator=g, dtype=torch.float64) for _ in range(2)]
    if kind == "own":
        dtypes = (dtype, dtype)
    elif kind == "float32_k":
        dtypes = (dtype, torch.float32)
    elif kind == "mixed":
        dtypes = (torch.bfloat16, torch.float64)
    else:
        assert kind == "strided", kind
        wide = torch.stack([values[0], values[0]], dim=-1).reshape(2 * D)
        return wide.to(torch.float32).to(device)[::2], values[1].to(dtype).to(device)
    return tuple(v.to(d).to(device) for v, d in zip(values, dtypes))


@dataclass
class RmsNormSample(OpSample):
    """One call of rms_norm_apply_qk. ``inputs``: ``(q, k, q_weight, k_weight)``."""

    name: str
    inputs: Tuple[Tensor, ...]
    cos: Tensor
    sin: Tensor
    positions: Tensor
    eps: float = 1e-6
    weight_offset: float = 0.0
    interleaved: bool = True
    inverse: bool = False
    mrope_section: Optional[Tuple[int, ...]] = None
    mrope_interleaved: bool = False
    heads: Tuple[int, int] = (1, 1)  # (q heads, k heads), for the coverage test
    op: str = "rms_norm_apply_qk"

    @property
    def overload(self):
        return torch.ops.rope.rms_norm_apply_qk.default

    @property
    def differentiable(self) -> bool:
        return True

    @property
    def kwargs(self) -> dict:
        kw = dict(
            eps=self.eps,
            weight_offset=self.weight_offset,
            interleaved=self.interleaved,
            inverse=self.inverse,
        )
        if self.mrope_section is not None:
            kw.update(
                mrope_section=list(self.mrope_section), mrope_interleaved=self.mrope_interleaved
            )
        return kw

    def op_args(self):
        return (*self.inputs, self.cos, self.sin, self.positions), self.kwargs

    def call(self, *inputs: Tensor) -> Tuple[Tensor, ...]:
        inputs = inputs or self.inputs
        return tuple(
            torch_rope.rms_norm_apply_qk(*inputs, self.cos, self.sin, self.positions, **self.kwargs)
        )

    def expected(self, inputs=None) -> Tuple[Tensor, ...]:
        q, k, q_weight, k_weight = inputs or self.inputs
        kw = self.kwargs
        return tuple(
            ref.rms_norm_rope_with_tables(x, w, self.cos, self.sin, self.positions, **kw)
            for x, w in ((q, q_weight), (k, k_weight))
        )

    def check(self, results, before):
        want = self.expected(before)
        assert len(results) == 2
        for out, x, expected in zip(results, before[:2], want):
            assert out.shape == x.shape and out.dtype == x.dtype and out.device == x.device
            assert out.is_contiguous(), "rms_norm_apply_qk returns new contiguous tensors"
            torch.testing.assert_close(out.cpu(), expected.to(out.dtype), **TOLERANCES[out.dtype])
        for name, x, x_before in zip(("q", "k", "q_weight", "k_weight"), self.inputs, before):
            _assert_unchanged(x, x_before, name)


# (geometry, q heads, k heads, dtype, head_dim, rotary_dim, interleaved, inverse, tables,
#  int32 positions, eps, weight_offset, weights, mrope (section, mrope_interleaved, axis_first))
# Every dtype, both pair layouts forward and inverse, partial rotary, int32 and int64 positions,
# GQA and MQA, Gemma's offset, weights of another dtype and strided, every QK geometry, and
# multi-axis positions (both section layouts, 1 to 4 axes, an axis of no planes, axis-first
# positions). The float64 rows are the gradcheck set: both pair layouts, inverse, partial rotary
# with an offset, arbitrary tables, multi-axis.
_RMS_NORM_PLAN = [
    ("bhsd_S", 2, 1, torch.float64, 8, 8, True, False, "real", False, 1e-6, 0.0, "own", None),
    ("bhsd_B1S", 2, 1, torch.float64, 8, 8, False, False, "real", False, 0.1, 0.0, "own", None),
    ("packed_T1", 2, 1, torch.float64, 10, 6, False, True, "random", True, 0.1, 1.0, "own", None),
    ("bshd_decode", 2, 1, torch.float64, 8, 8, False, False, "random", False, 0.5, 0.5, "own",
     ((1, 2, 1), False, False)),
    ("transposed_bshd", 2, 2, torch.float64, 8, 8, True, True, "real", True, 1e-6, 0.5, "own",
     ((2, 1, 1), True, True)),
    ("single_row_1d", 1, 1, torch.float64, 10, 6, True, False, "random", False, 1e-6, 1.0, "own",
     None),
    ("fused_qkv_bshd", 4, 2, torch.bfloat16, 24, 16, True, False, "real", False, 1e-6, 0.0,
     "float32_k", None),
    ("last_dim_strided", 2, 1, torch.float32, 16, 8, False, True, "float64", True, 1e-5, 1.0,
     "strided", None),
    ("storage_offset_1", 2, 2, torch.float16, 24, 24, True, False, "real", False, 1e-6, 0.0, "own",
     None),
    ("bhsd_B1S", 3, 1, torch.float32, 16, 16, False, False, "random", False, 0.5, 0.0, "mixed",
     None),
    ("strided_positions", 2, 2, torch.bfloat16, 16, 16, True, True, "real", True, 1e-6, 1.0,
     "own", None),
    ("packed_T1", 2, 1, torch.float16, 16, 16, True, True, "float64", True, 1e-6, 1.0, "own",
     ((2, 3, 3), True, False)),
    ("bhsd_S", 2, 1, torch.bfloat16, 16, 8, False, True, "real", False, 1e-6, 0.0, "own",
     ((1, 1, 1, 1), False, True)),
    ("expanded_positions", 2, 1, torch.float32, 16, 12, True, False, "real", False, 1e-6, 0.0,
     "own", ((0, 3, 3), False, False)),
    ("empty_q", 2, 1, torch.float32, 16, 16, False, False, "real", False, 1e-6, 0.0, "own", None),
]  # fmt: skip


def rms_norm_sample(
    geometry,
    hq,
    hk,
    dtype,
    D,
    rotary_dim,
    interleaved,
    inverse,
    tables,
    int32,
    eps,
    weight_offset,
    weights,
    mrope,
    device,
    requires_grad=False,
    b=2,
    s=3,
) -> RmsNormSample:
    """One rms_norm_apply_qk sample of a plan row (test_rms_norm_apply_qk.py crosses its own rows
    with every dtype and layout through this). q is scaled by 3 and k by 0.2: the norm must not
    care."""
    q, k, positions = QK_GEOMETRIES[geometry](hq, hk, D, dtype, device, b=b, s=s)
    with torch.no_grad():
        q.mul_(3.0)
        k.mul_(0.2)
    section, mrope_interleaved, axis_first = mrope if mrope else (None, False, False)
    pos_dtype = torch.int32 if int32 else torch.int64
    if section is not None:
        assert sum(section) == rotary_dim // 2, (geometry, section, rotary_dim)
        positions = multi_axis_positions(positions, len(section), pos_dtype, axis_first)
    else:
        positions = positions.to(pos_dtype)
    q_weight, k_weight = _norm_weights(weights, D, dtype, device)
    cos, sin = _tables(tables, rotary_dim, dtype, device)
    name = (
        f"rms_norm_apply_qk-{geometry}-q{hq}k{hk}-{dtype_id(dtype)}-d{D}r{rotary_dim}-"
        f"{'il' if interleaved else 'half'}{'-inv' if inverse else ''}-{tables}"
        f"{'-int32' if int32 else ''}{f'-eps{eps:g}' if eps != 1e-6 else ''}"
        f"{f'-offset{weight_offset:g}' if weight_offset else ''}"
        f"{'' if weights == 'own' else '-w_' + weights}"
        f"{_mrope_id(section, mrope_interleaved) if section is not None else ''}"
        f"{'-axis_first' if axis_first else ''}"
    )
    inputs = (q, k, q_weight, k_weight)
    if requires_grad:
        inputs = tuple(t.detach().requires_grad_() for t in inputs)
    return RmsNormSample(
        name,
        inputs,
        cos,
        sin,
        positions,
        eps=eps,
        weight_offset=weight_offset,
        interleaved=interleaved,
        inverse=inverse,
        mrope_section=section,
        mrope_interleaved=mrope_interleaved,
        heads=(hq, hk),
    )


def rms_norm_samples(device, requires_grad: bool) -> List[OpSample]:
    """The rms_norm family's samples; with ``requires_grad`` q, k and both weights are leaves
    that require grad."""
    return [rms_norm_sample(*row, device, requires_grad) for row in _RMS_NORM_PLAN]


register_family("rms_norm", RMS_NORM_OPS, rms_norm_samples)


# ---- family: kv_cache (apply_qk_cache) ----------------------------------------------------------
# q (T, Hq, D), k (T, Hkv, D), v (T, Hkv, Dv) and positions that broadcast to (T, H) of each; the
# rows go to slots of a flat (num_slots, H, D) or paged (num_blocks, block_size, H, D) cache.

KV_CACHE_OPS = ("apply_qk_cache",)
CACHE_TOKENS = 5
CACHE_BLOCKS, CACHE_BLOCK_SIZE = 4, 3  # 12 slots, flat or paged


def _cache_contiguous(T, hq, hkv, D, Dv, dtype, device):
    q = randn(T, hq, D, dtype=dtype, device=device)
    k, v = (
        randn(T, hkv, D, dtype=dtype, device=device),
        randn(T, hkv, Dv, dtype=dtype, device=device),
    )
    return q, k, v, torch.randint(0, MAX_SEQ_LEN, (T, 1), device=device)


def _cache_fused_qkv(T, hq, hkv, D, Dv, dtype, device):
    # q, k, v sliced out of one (T, Hq D + Hkv D + Hkv Dv + 8) projection row (8: padding).
    width = (hq + hkv) * D + hkv * Dv
    qkv = randn(T, width + 8, dtype=dtype, device=device)
    q = qkv[:, : hq * D].view(T, hq, D)
    k = qkv[:, hq * D : (hq + hkv) * D].view(T, hkv, D)
    v = qkv[:, (hq + hkv) * D : width].view(T, hkv, Dv)
    return q, k, v, (10 + torch.arange(T, device=device)).view(T, 1)


def _cache_last_dim_strided(T, hq, hkv, D, Dv, dtype, device):
    # q and v with a last-dim stride of 2 (each copied once by the op), k plain.
    q = randn(T, hq, 2 * D, dtype=dtype, device=device)[..., ::2]
    v = randn(T, hkv, 2 * Dv, dtype=dtype, device=device)[..., ::2]
    k = randn(T, hkv, D, dtype=dtype, device=device)
    return q, k, v, spread_positions(T, device).view(T, 1)


def _cache_misaligned(T, hq, hkv, D, Dv, dtype, device):
    def offset_by_one(*shape):
        n = 1
        for size in shape:
            n *= size
        return randn(n + 1, dtype=dtype, device=device)[1:].view(*shape)

    q, k, v = offset_by_one(T, hq, D), offset_by_one(T, hkv, D), offset_by_one(T, hkv, Dv)
    return q, k, v, spread_positions(T, device).view(T, 1)


def _cache_per_head_positions(T, hq, hkv, D, Dv, dtype, device):
    # (T, H) positions: every head at its own position (as many q heads as k heads).
    assert hq == hkv
    q, k, v, _ = _cache_contiguous(T, hq, hkv, D, Dv, dtype, device)
    return q, k, v, torch.randint(0, MAX_SEQ_LEN, (T, hq), device=device)


def _cache_one_position(T, hq, hkv, D, Dv, dtype, device):
    # A (1, 1) position for every token and head.
    q, k, v, _ = _cache_contiguous(T, hq, hkv, D, Dv, dtype, device)
    return q, k, v, torch.tensor([[MAX_SEQ_LEN - 1]], device=device)


def _cache_strided_positions(T, hq, hkv, D, Dv, dtype, device):
    # (T, 1) positions as a column of a wider tensor.
    q, k, v, _ = _cache_contiguous(T, hq, hkv, D, Dv, dtype, device)
    return q, k, v, torch.randint(0, MAX_SEQ_LEN, (T, 3), device=device)[:, 1:2]


def _cache_no_tokens(T, hq, hkv, D, Dv, dtype, device):
    return _cache_contiguous(0, hq, hkv, D, Dv, dtype, device)


CACHE_GEOMETRIES: Dict[str, Callable] = {
    "contiguous": _cache_contiguous,
    "fused_qkv": _cache_fused_qkv,
    "last_dim_strided": _cache_last_dim_strided,
    "storage_offset_1": _cache_misaligned,
    "per_head_positions": _cache_per_head_positions,
    "one_position": _cache_one_position,
    "strided_positions": _cache_strided_positions,
    "no_tokens": _cache_no_tokens,
}


def _cache_buffer(shape, dtype, device, gen=None):
    """Random contents in ``dtype`` (float8 included): rows the op must not write keep them."""
    return torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype).to(device)


def make_caches(layout, slots_shape, hkv, D, Dv, k_dtype, v_dtype, device, gen=None):
    """``(k_cache, v_cache, bases)``: caches of ``slots_shape`` (``(num_slots,)`` or
    ``(num_blocks, block_size)``) rows (v_cache None when v_dtype is), and the allocations they
    are views of, each contiguous. ``contiguous``: a buffer each; ``halves``: both caches in one
    (2, *slots_shape, H, max(D, Dv) + 16) buffer, rows padded; ``padded_rows``: rows 8 elements
    into a wider row."""
    if layout == "halves":
        assert v_dtype in (k_dtype, None)
        width = max(D, Dv) + 16
        base = _cache_buffer((2, *slots_shape, hkv, width), k_dtype, device, gen)
        v_cache = None if v_dtype is None else base[1, ..., 16 : 16 + Dv]
        return base[0, ..., :D], v_cache, (base,)
    if layout == "padded_rows":
        k_base = _cache_buffer((*slots_shape, hkv, D + 12), k_dtype, device, gen)
        k_cache = k_base[..., 8 : 8 + D]
        if v_dtype is None:
            return k_cache, None, (k_base,)
        v_base = _cache_buffer((*slots_shape, hkv, Dv + 12), v_dtype, device, gen)
        return k_cache, v_base[..., 8 : 8 + Dv], (k_base, v_base)
    assert layout == "contiguous", layout
    k_cache = _cache_buffer((*slots_shape, hkv, D), k_dtype, device, gen)
    if v_dtype is None:
        return k_cache, None, (k_cache,)
    v_cache = _cache_buffer((*slots_shape, hkv, Dv), v_dtype, device, gen)
    return k_cache, v_cache, (k_cache, v_cache)


def _slot_mapping(kind, T, device):
    """int64 (T,) slots of the 12: ``padding``: distinct random slots, two tokens padding (-1 and
    -5); ``all_padding``: every token padding; ``dense``: 0..T-1; ``scattered``: from the last
    slot down, every other."""
    num_slots = CACHE_BLOCKS * CACHE_BLOCK_SIZE
    if kind == "padding":
        slots = torch.randperm(num_slots)[:T]
        if T >= 2:
            slots[T // 2], slots[-1] = -1, -5
    elif kind == "all_padding":
        slots = -1 - 2 * torch.arange(T)
    elif kind == "dense":
        slots = torch.arange(T)
    else:
        assert kind == "scattered", kind
        slots = num_slots - 1 - 2 * torch.arange(T)
    return slots.to(device=device, dtype=torch.int64)


def _scale(form, value, device):
    """A float8 cache's scale: a Python float, a 0-d or a (1,) float32 tensor."""
    if form == "float":
        return value
    t = torch.tensor(value, dtype=torch.float32, device=device)
    return t if form == "tensor_0d" else t.view(1)


@dataclass
class KvCacheSample(OpSample):
    """One call of apply_qk_cache. ``inputs``: ``(q, k, v)``, or ``(q, k)`` without v; ``bases``:
    the allocations the caches are views of (every element the call must not write is checked,
    row padding and the other half of a shared buffer included)."""

    name: str
    inputs: Tuple[Tensor, ...]
    cos: Tensor
    sin: Tensor
    positions: Tensor
    k_cache: Tensor
    v_cache: Optional[Tensor]
    slot_mapping: Tensor
    bases: Tuple[Tensor, ...]
    interleaved: bool = True
    k_scale: object = None  # a Python float or a float32 tensor (float8 caches)
    v_scale: object = None
    op: str = "apply_qk_cache"
    opcheck_needs_torch = (
        "2.5",
        "torch.library.opcheck of a mutating op with optional mutable args",
    )

    @property
    def overload(self):
        return torch.ops.rope.apply_qk_cache.default

    @property
    def differentiable(self) -> bool:
        return False  # the cache write has no gradient (docs/api.md)

    @property
    def has_fp8(self) -> bool:
        return any(
            c is not None and c.dtype in ref.FP8_DTYPES for c in (self.k_cache, self.v_cache)
        )

    @property
    def opcheck_kwargs(self) -> dict:
        # opcheck's schema test compares mutated inputs with arithmetic that float8 lacks (mul is
        # not implemented for Float8_e4m3fn); every other test runs on the float8 calls too.
        if self.has_fp8:
            return dict(
                test_utils=(
                    "test_faketensor",
                    "test_aot_dispatch_dynamic",
                    "test_autograd_registration",
                )
            )
        return {}

    def _split(self, inputs):
        q, k = inputs[:2]
        return q, k, inputs[2] if len(inputs) > 2 else None

    def op_args(self):
        q, k, v = self._split(self.inputs)
        scales = {}
        for name, scale, cache in (
            ("k_scale", self.k_scale, self.k_cache),
            ("v_scale", self.v_scale, self.v_cache),
        ):
            if isinstance(scale, float):  # the raw op takes tensors; the wrapper makes them so
                scale = torch.tensor(scale, dtype=torch.float32, device=cache.device)
            scales[name] = scale
        args = (q, k, v, self.cos, self.sin, self.positions, self.k_cache, self.v_cache)
        return (*args, self.slot_mapping), dict(interleaved=self.interleaved, **scales)

    def call(self, *inputs: Tensor) -> Tuple[Tensor, ...]:
        q, k, v = self._split(inputs or self.inputs)
        q_out = torch_rope.apply_qk_cache(
            q, k, v, self.cos, self.sin, self.positions, self.k_cache, self.v_cache,
            self.slot_mapping, interleaved=self.interleaved, k_scale=self.k_scale,
            v_scale=self.v_scale,
        )  # fmt: skip
        return (q_out,)

    def expected(self, inputs=None) -> Tuple[Tensor, ...]:
        return self._oracle(inputs or self.inputs)[:1]

    def _oracle(self, inputs):
        q, k, v = self._split(inputs)
        return ref.rope_into_cache(
            q, k, v, self.cos, self.sin, self.positions, self.slot_mapping,
            interleaved=self.interleaved,
        )  # fmt: skip

    def written(self) -> Tuple[Tensor, ...]:
        return tuple(c for c in (self.k_cache, self.v_cache) if c is not None)

    def snapshot(self):
        reads = (*self.inputs, self.cos, self.sin, self.positions, self.slot_mapping)
        return (
            tuple(t.clone() for t in reads),
            tuple(base.clone() for base in self.bases),
        )

    def check(self, results, before):
        reads_before, bases_before = before
        inputs_before = reads_before[: len(self.inputs)]
        q_want, k_rows, v_rows, slots = self._oracle(inputs_before)
        (q_out,) = results
        q = self.inputs[0]
        assert q_out.shape == q.shape and q_out.dtype == q.dtype and q_out.device == q.device
        assert q_out.is_contiguous(), "apply_qk_cache returns a new contiguous q"
        torch.testing.assert_close(q_out.cpu(), q_want.to(q.dtype), **TOLERANCES[q.dtype])
        # The stored k rows: the rotation within the dtype's tolerance, or for a float8 cache a
        # byte between the quantizations of the rotation's error bounds (the op rotates in
        # float32, float64 for float64, and quantizes that once).
        k = inputs_before[1]
        index = ref.cache_row_index(self.k_cache, slots)
        got_k = self.k_cache[index].cpu()
        math_dtype = torch.float64 if k.dtype == torch.float64 else torch.float32
        if self.k_cache.dtype in ref.FP8_DTYPES:
            # (the stored tokens' bounds, in token order, as k_rows)
            slack = rotation_error_bound(
                k, self.cos, self.sin, self.positions, interleaved=self.interleaved,
                math_dtype=math_dtype,
            )[self.slot_mapping.cpu() >= 0]  # fmt: skip
            lo, hi = ref.fp8_bounds(k_rows, slack, self.k_scale, self.k_cache.dtype, math_dtype)
            decoded = got_k.double()
            assert (lo.double() <= decoded).all() and (decoded <= hi.double()).all(), (
                "a float8 k row is not the quantization of the rotated k"
            )
        else:
            torch.testing.assert_close(got_k, k_rows.to(k.dtype), **TOLERANCES[k.dtype])
        # The stored v rows: v itself, or its quantization, bit for bit.
        if self.v_cache is not None:
            got_v = self.v_cache[ref.cache_row_index(self.v_cache, slots)].cpu()
            v_dtype = inputs_before[2].dtype
            if self.v_cache.dtype in ref.FP8_DTYPES:
                math = torch.float64 if v_dtype == torch.float64 else torch.float32
                want_v = ref.quantize_fp8(v_rows.to(math), self.v_scale, self.v_cache.dtype)
            else:
                want_v = v_rows.to(v_dtype)
            assert same_bits(got_v, want_v), "a v row is not v as stored"
        # Every other element of the caches' allocations is as it was.
        for base, base_before in zip(self.bases, bases_before):
            keep = torch.ones(base.shape, dtype=torch.bool)
            for cache in self.written():
                if cache.untyped_storage().data_ptr() != base.untyped_storage().data_ptr():
                    continue
                rows = keep.as_strided(
                    cache.shape, cache.stride(), cache.storage_offset() - base.storage_offset()
                )
                rows[ref.cache_row_index(rows, slots)] = False
            assert same_bits(base.cpu()[keep], base_before.cpu()[keep]), (
                "an element outside the stored rows was written"
            )
        names = ("q", "k", "v")[: len(self.inputs)] + ("cos", "sin", "positions", "slot_mapping")
        reads = (*self.inputs, self.cos, self.sin, self.positions, self.slot_mapping)
        for name, t, t_before in zip(names, reads, reads_before):
            _assert_unchanged(t, t_before, name)


# (geometry, dtype, k_cache dtype, v_cache dtype (None: no v), cache layout, head_dim,
#  rotary_dim, v head_dim, q heads, kv heads, interleaved, tables, int32 positions, slots,
#  (scale form, k_scale, v_scale))
# Every dtype into caches of its own dtype and into both float8 formats (from every dtype),
# flat, paged, halves of one buffer and padded rows, both pair layouts, partial rotary, MHA / GQA
# / MQA, int32 and int64 positions, per-head, broadcast and strided positions, padding slots
# (some and all), no v, no tokens, every scale form, a float8 k cache beside a 16/32-bit v one,
# and a k scale small enough that the largest values saturate.
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
_KV_CACHE_PLAN = [
    ("contiguous", torch.bfloat16, torch.bfloat16, torch.bfloat16, "paged", 16, 16, 8, 4, 2,
     True, "real", False, "padding", None),
    ("contiguous", torch.float32, torch.float32, None, "flat", 16, 8, 16, 4, 1, False, "random",
     True, "padding", None),
    ("per_head_positions", torch.float64, torch.float64, torch.float64, "paged", 10, 6, 10, 2, 2,
     True, "float64", False, "dense", None),
    ("storage_offset_1", torch.float16, torch.float16, torch.float16, "flat", 24, 24, 24, 3, 3,
     False, "float64", False, "scattered", None),
    ("fused_qkv", torch.bfloat16, torch.bfloat16, torch.bfloat16, "halves", 16, 16, 16, 4, 2,
     True, "real", False, "padding", None),
    ("contiguous", torch.bfloat16, E4M3, E4M3, "paged", 16, 16, 16, 4, 2, True, "real", False,
     "padding", ("float", 0.05, 0.02)),
    ("last_dim_strided", torch.float32, E5M2, E5M2, "flat", 16, 8, 8, 2, 1, False, "random",
     True, "padding", ("tensor_0d", 0.25, 0.5)),
    ("contiguous", torch.float16, E4M3, E5M2, "paged", 24, 16, 8, 2, 2, False, "real", False,
     "scattered", ("tensor_1", 0.004, 0.1)),
    ("storage_offset_1", torch.float64, E5M2, E5M2, "padded_rows", 10, 6, 10, 2, 1, True,
     "float64", False, "padding", ("float", 0.125, 0.125)),
    ("strided_positions", torch.float32, E4M3, torch.float32, "paged", 16, 16, 16, 2, 2, True,
     "real", True, "padding", ("float", 0.05, None)),
    ("one_position", torch.float32, torch.float32, torch.float32, "padded_rows", 16, 12, 16, 4,
     2, False, "real", False, "all_padding", None),
    ("strided_positions", torch.bfloat16, E4M3, None, "flat", 16, 16, 16, 2, 1, True, "real",
     False, "dense", ("tensor_0d", 0.05, None)),
    ("no_tokens", torch.bfloat16, torch.bfloat16, torch.bfloat16, "paged", 16, 16, 16, 4, 2,
     True, "real", False, "dense", None),
]  # fmt: skip


def kv_cache_sample(
    geometry,
    dtype,
    k_cache_dtype,
    v_cache_dtype,
    layout,
    D,
    rotary_dim,
    Dv,
    hq,
    hkv,
    interleaved,
    tables,
    int32,
    slots,
    scales,
    device,
    T=CACHE_TOKENS,
) -> KvCacheSample:
    """One apply_qk_cache sample of a plan row (test_apply_qk_cache.py crosses its own rows with
    every dtype, cache layout and pair layout through this)."""
    q, k, v, positions = CACHE_GEOMETRIES[geometry](T, hq, hkv, D, Dv, dtype, device)
    # flat and paged: a buffer each; halves and padded rows: paged and flat views.
    paged = layout in ("paged", "halves")
    slots_shape = (CACHE_BLOCKS, CACHE_BLOCK_SIZE) if paged else (CACHE_BLOCKS * CACHE_BLOCK_SIZE,)
    kind = "contiguous" if layout in ("flat", "paged") else layout
    k_cache, v_cache, bases = make_caches(
        kind, slots_shape, hkv, D, Dv, k_cache_dtype, v_cache_dtype, device
    )
    slot_mapping = _slot_mapping(slots, q.size(0), device)
    cos, sin = _tables(tables, rotary_dim, dtype, device)
    form, k_value, v_value = scales or (None, None, None)
    k_scale = None if k_value is None else _scale(form, k_value, device)
    v_scale = None if v_value is None else _scale(form, v_value, device)
    inputs = (q, k) if v_cache is None else (q, k, v)

    def cache_id(c):  # the source's own dtype, a float8 format, or no cache
        return "same" if c == dtype else "none" if c is None else str(c)[len("torch.float8_") :]

    name = (
        f"apply_qk_cache-{geometry}-{dtype_id(dtype)}-{layout}-k_{cache_id(k_cache_dtype)}-"
        f"v_{cache_id(v_cache_dtype)}-d{D}r{rotary_dim}v{Dv}-q{hq}kv{hkv}-"
        f"{'il' if interleaved else 'half'}-{tables}{'-int32' if int32 else ''}-{slots}"
        f"{f'-{form}' if form else ''}"
    )
    return KvCacheSample(
        name,
        inputs,
        cos,
        sin,
        positions.to(torch.int32 if int32 else torch.int64),
        k_cache,
        v_cache,
        slot_mapping,
        bases,
        interleaved=interleaved,
        k_scale=k_scale,
        v_scale=v_scale,
    )


def kv_cache_samples(device, requires_grad: bool) -> List[OpSample]:
    """The kv_cache family's samples (none with ``requires_grad``: not differentiable)."""
    if requires_grad:
        return []
    return [kv_cache_sample(*row, device) for row in _KV_CACHE_PLAN]


register_family("kv_cache", KV_CACHE_OPS, kv_cache_samples)


# ---- family: forms (the table-free freqs= and packed-sequence overloads of the rope ops) --------
# One sample per (op, form) and more: every op (apply, apply_, apply.out, apply_qk) with each of
# the three forms (freqs, varlen, freqs_varlen), every dtype, both pair layouts, forward and
# inverse, partial rotary, int32 and int64 positions or boundaries, an attention factor, seq_offsets
# and context parallelism, multi-axis positions with freqs, positions past 2^32. The float64 ones
# are the gradcheck set. Their oracle is references.py's: rope_with_frequencies (exact angles
# from mpmath) or rope_with_tables at the positions references.packed_positions writes out.

FORMS = ("freqs", "varlen", "freqs_varlen")


@dataclass
class FormSample(OpSample):
    """One call of one rope op in one of the forms. ``inputs`` are the tensors it rotates."""

    name: str
    op: str
    form: str
    inputs: Tuple[Tensor, ...]
    angles: dict  # {"freqs", "attention_factor"} or {"cos", "sin"}
    positions: Optional[Tensor] = None  # freqs form
    packed: Optional[dict] = None  # {"cu_seqlens", "seq_offsets", "cp_size", "cp_rank"}
    interleaved: bool = True
    inverse: bool = False
    out: Optional[Tensor] = None
    mrope_section: Optional[Tuple[int, ...]] = None
    mrope_interleaved: bool = False

    @property
    def overload(self):
        if self.op == "apply.out":
            return getattr(torch.ops.rope.apply, f"{self.form}_out")
        return getattr(getattr(torch.ops.rope, self.op), self.form)

    @property
    def differentiable(self) -> bool:
        return self.op != "apply.out"

    @property
    def dtype(self) -> torch.dtype:
        return self.inputs[0].dtype

    def api_kwargs(self) -> dict:
        """The torch_rope.* keywords of the call (angle and position sources, flags)."""
        kw = dict(self.angles, interleaved=self.interleaved, inverse=self.inverse)
        if self.positions is not None:
            kw["positions"] = self.positions
        if self.packed is not None:
            kw.update(self.packed)
        if self.mrope_section is not None:
            kw.update(
                mrope_section=list(self.mrope_section), mrope_interleaved=self.mrope_interleaved
            )
        return kw

    def op_args(self):
        """``(args, kwargs)`` of the raw overload, as torch.library.opcheck takes them."""
        inputs = self.inputs
        if self.op == "apply_" and inputs[0].requires_grad:
            inputs = (inputs[0].clone(),)
        kw = dict(interleaved=self.interleaved, inverse=self.inverse)
        if "freqs" in self.angles:
            angle_args = (self.angles["freqs"],)
            kw["attention_factor"] = self.angles["attention_factor"]
        else:
            angle_args = (self.angles["cos"], self.angles["sin"])
        if self.positions is not None:
            where = (self.positions,)
            if self.mrope_section is not None:
                kw.update(
                    mrope_section=list(self.mrope_section),
                    mrope_interleaved=self.mrope_interleaved,
                )
        else:
            where = (self.packed["cu_seqlens"],)
            kw.update(
                seq_offsets=self.packed["seq_offsets"],
                cp_size=self.packed["cp_size"],
                cp_rank=self.packed["cp_rank"],
            )
        if self.op == "apply.out":
            kw["out"] = self.out
        return (*inputs, *angle_args, *where), kw

    def call(self, *inputs: Tensor) -> Tuple[Tensor, ...]:
        """The op through the typed API (torch_rope.*), as Sample.call."""
        inputs = inputs or self.inputs
        kw = self.api_kwargs()
        if self.op == "apply":
            return (torch_rope.apply(inputs[0], **kw),)
        if self.op == "apply_":
            x = inputs[0].clone() if inputs[0].requires_grad else inputs[0]
            return (torch_rope.apply_(x, **kw),)
        if self.op == "apply.out":
            return (torch_rope.apply(inputs[0], out=self.out, **kw),)
        return tuple(torch_rope.apply_qk(*inputs, **kw))

    def row_positions(self, x: Tensor) -> Tensor:
        """The positions of x's rows: the given ones, or the packed sequences' (T, 1, ..., 1)."""
        if self.positions is not None:
            return self.positions
        p = ref.packed_positions(
            self.packed["cu_seqlens"],
            self.packed["seq_offsets"],
            self.packed["cp_size"],
            self.packed["cp_rank"],
        )
        return p.view(-1, *([1] * (x.dim() - 2)))

    def expected(self, inputs: Optional[Tuple[Tensor, ...]] = None) -> Tuple[Tensor, ...]:
        """The float64 oracle (on the CPU) for each of ``inputs``, differentiable in them."""
        inputs = inputs or self.inputs
        out = []
        for x in inputs:
            positions = self.row_positions(x)
            kw = dict(interleaved=self.interleaved, inverse=self.inverse)
            if self.mrope_section is not None:
                kw.update(
                    mrope_section=self.mrope_section, mrope_interleaved=self.mrope_interleaved
                )
            if "freqs" in self.angles:
                out.append(
                    ref.rope_with_frequencies(
                        x,
                        self.angles["freqs"],
                        positions,
                        attention_factor=self.angles["attention_factor"],
                        **kw,
                    )
                )
            else:
                out.append(
                    ref.rope_with_tables(x, self.angles["cos"], self.angles["sin"], positions, **kw)
                )
        return tuple(out)

    def written(self) -> Tuple[Tensor, ...]:
        return (self.out,) if self.op == "apply.out" else ()

    def check(self, results, before):
        # before: copies of the inputs (apply_ overwrites its x).
        want = self.expected(before)
        half = (self.angles["freqs"].numel() if "freqs" in self.angles
                else self.angles["cos"].size(-1))  # fmt: skip
        for out, x_before, expected in zip(results, before, want):
            assert out.shape == x_before.shape and out.dtype == x_before.dtype
            assert out.device == x_before.device
            torch.testing.assert_close(out.cpu(), expected.to(out.dtype), **TOLERANCES[out.dtype])
            assert torch.equal(out[..., 2 * half :], x_before[..., 2 * half :]), (
                "pass-through features changed"
            )
        if self.op == "apply_":
            assert results[0] is self.inputs[0], "apply_ must return x itself"
        elif self.op == "apply.out":
            assert results[0] is self.out, "apply(..., out=) must return out"
        else:
            assert all(out.is_contiguous() for out in results)
        if self.op != "apply_":
            for x, x_before in zip(self.inputs, before):
                assert torch.equal(x, x_before), f"{self.op} modified its input"


def _form_angles(form, rotary_dim, dtype, device, attention_factor):
    if form == "varlen":
        cos, sin = _tables("real", rotary_dim, dtype, device)
        return {"cos": cos, "sin": sin}
    return {
        "freqs": ref.inv_freq(rotary_dim, 500000.0).to(device),
        "attention_factor": attention_factor,
    }


# Packed sequences: (cu_seqlens global boundaries, seq_offsets or None, cp_size, cp_rank).
_PACKINGS = {
    "three": ([0, 3, 3, 5], [1, 0, 7], 1, 0),
    "one": ([0, 4], None, 1, 0),
    "cp2_rank1": ([0, 8, 12], [2, 5], 2, 1),
    "cp4_rank2": ([0, 8, 8, 16], [0, 3, 0], 4, 2),
}

# (op, form, dtype, head_dim, rotary_dim, interleaved, inverse, geometry or packing, int32,
#  attention factor)
_FORM_PLAN = [
    # apply
    ("apply", "freqs", torch.float64, 8, 8, True, False, "bhsd_S", False, 1.0),
    ("apply", "freqs", torch.float64, 10, 6, False, True, "bshd_BS1", True, 0.8),
    ("apply", "freqs", torch.float32, 16, 16, True, True, "decode_per_sequence", False, 1.0),
    ("apply", "freqs", torch.bfloat16, 24, 16, False, False, "packed_T1", True, 1.3),
    ("apply", "varlen", torch.float64, 8, 8, True, False, "three", False, 1.0),
    ("apply", "varlen", torch.float64, 10, 6, False, True, "cp2_rank1", True, 1.0),
    ("apply", "varlen", torch.float16, 16, 16, True, True, "cp4_rank2", False, 1.0),
    ("apply", "freqs_varlen", torch.float64, 8, 8, False, False, "cp2_rank1", False, 1.2),
    ("apply", "freqs_varlen", torch.float64, 10, 6, True, True, "three", True, 1.0),
    ("apply", "freqs_varlen", torch.float32, 16, 16, False, False, "one", False, 0.9),
    # apply_
    ("apply_", "freqs", torch.float64, 8, 8, False, True, "bhsd_B1S", False, 1.1),
    ("apply_", "freqs", torch.float16, 16, 8, True, False, "transposed_bshd", True, 1.0),
    ("apply_", "varlen", torch.float64, 10, 6, True, False, "cp4_rank2", True, 1.0),
    ("apply_", "varlen", torch.bfloat16, 16, 16, False, True, "three", False, 1.0),
    ("apply_", "freqs_varlen", torch.float64, 8, 8, True, True, "cp2_rank1", False, 0.7),
    ("apply_", "freqs_varlen", torch.float32, 24, 16, False, False, "three", True, 1.0),
    # apply.out
    ("apply.out", "freqs", torch.float32, 24, 16, True, False, "bshd_S1", False, 1.0),
    ("apply.out", "freqs", torch.float64, 10, 6, False, True, "expanded", True, 1.4),
    ("apply.out", "varlen", torch.float32, 16, 16, False, False, "cp2_rank1", False, 1.0),
    ("apply.out", "varlen", torch.bfloat16, 16, 8, True, True, "three", True, 1.0),
    ("apply.out", "freqs_varlen", torch.float16, 16, 16, True, False, "cp4_rank2", False, 1.0),
    ("apply.out", "freqs_varlen", torch.float64, 8, 8, False, True, "one", True, 0.5),
]

# apply_qk: (q heads, k heads, form, dtype, head_dim, rotary_dim, interleaved, inverse, packing)
_FORM_QK_PLAN = [
    (4, 2, "freqs", torch.float64, 8, 8, True, False, None),
    (2, 1, "freqs", torch.bfloat16, 16, 16, False, True, None),
    (4, 1, "varlen", torch.float64, 10, 6, False, False, "cp2_rank1"),
    (2, 2, "varlen", torch.float32, 16, 16, True, True, "three"),
    (2, 1, "freqs_varlen", torch.float64, 8, 8, True, True, "cp4_rank2"),
    (3, 1, "freqs_varlen", torch.float16, 24, 16, False, False, "three"),
]

# Multi-axis positions with freqs: (op, dtype, head_dim, rotary_dim, interleaved, section,
# mrope_interleaved)
_FORM_MROPE_PLAN = [
    ("apply", torch.float64, 8, 8, False, (2, 1, 1), True),
    ("apply_", torch.float32, 16, 12, True, (3, 3), False),
    ("apply.out", torch.bfloat16, 16, 16, False, (2, 3, 3), True),
]

# Positions far from the tables' world: past 2^32 (int64), for the frequency form only.
_BIG = 2**32 + 12345


def _packed(name, device, int32):
    cu, offsets, cp_size, cp_rank = _PACKINGS[name]
    dtype = torch.int32 if int32 else torch.int64
    return {
        "cu_seqlens": torch.tensor(cu, dtype=dtype, device=device),
        "seq_offsets": None if offsets is None else torch.tensor(offsets, dtype=dtype).to(device),
        "cp_size": cp_size,
        "cp_rank": cp_rank,
    }


def _packed_tokens(name):
    cu, _, cp_size, _ = _PACKINGS[name]
    return cu[-1] // cp_size


def form_samples(device, requires_grad: bool) -> List[OpSample]:
    """The forms family's samples; with ``requires_grad`` the rotated inputs are leaves that
    require grad, and apply.out has none."""

    def leaf(t):
        return t.detach().requires_grad_() if requires_grad else t

    samples = []
    for i, row in enumerate(_FORM_PLAN):
        op, form, dtype, D, rotary_dim, interleaved, inverse, where, int32, af = row
        if requires_grad and op == "apply.out":
            continue
        angles = _form_angles(form, rotary_dim, dtype, device, af)
        positions = packed = None
        if form == "freqs":
            x, positions = GEOMETRIES[where](D, dtype, device, b=2, h=2, s=3)
            # Far positions for the table-free form (int64), or as they are (int32).
            positions = positions.to(torch.int32) if int32 else positions + _BIG
        else:
            x = randn(_packed_tokens(where), 2, D, dtype=dtype, device=device)
            packed = _packed(where, device, int32)
        name = (
            f"{op}-{form}-{where}-{dtype_id(dtype)}-d{D}r{rotary_dim}-"
            f"{'il' if interleaved else 'half'}{'-inv' if inverse else ''}"
            f"{'-int32' if int32 else ''}{f'-af{af}' if af != 1.0 else ''}"
        )
        samples.append(
            FormSample(
                name,
                op,
                form,
                (leaf(x),),
                angles,
                positions,
                packed,
                interleaved,
                inverse,
                out=_out_buffer(x, i) if op == "apply.out" else None,
            )  # fmt: skip
        )
    for row in _FORM_QK_PLAN:
        hq, hk, form, dtype, D, rotary_dim, interleaved, inverse, where = row
        angles = _form_angles(form, rotary_dim, dtype, device, 1.25)
        if form == "freqs":
            q, k, positions = _qk_inputs("bhsd", hq, hk, D, dtype, device)
            positions, packed = positions + _BIG, None
            where = "bhsd"
        else:
            t = _packed_tokens(where)
            q = randn(t, hq, D, dtype=dtype, device=device)
            k = randn(t, hk, D, dtype=dtype, device=device)
            positions, packed = None, _packed(where, device, False)
        name = (
            f"apply_qk-{form}-{where}-q{hq}k{hk}-{dtype_id(dtype)}-d{D}r{rotary_dim}-"
            f"{'il' if interleaved else 'half'}{'-inv' if inverse else ''}"
        )
        samples.append(
            FormSample(
                name,
                "apply_qk",
                form,
                (leaf(q), leaf(k)),
                angles,
                positions,
                packed,
                interleaved,
                inverse,
            )  # fmt: skip
        )
    for i, row in enumerate(_FORM_MROPE_PLAN):
        op, dtype, D, rotary_dim, interleaved, section, mrope_interleaved = row
        if requires_grad and op == "apply.out":
            continue
        x, positions = GEOMETRIES["bhsd_S"](D, dtype, device, b=2, h=2, s=3)
        positions = multi_axis_positions(positions, len(section), torch.int64, i % 2 == 1) + _BIG
        angles = _form_angles("freqs", rotary_dim, dtype, device, 1.0)
        name = (
            f"{op}-freqs-mrope{'_'.join(map(str, section))}{'-il3' if mrope_interleaved else ''}-"
            f"{dtype_id(dtype)}-d{D}r{rotary_dim}-{'il' if interleaved else 'half'}"
        )
        samples.append(
            FormSample(
                name,
                op,
                "freqs",
                (leaf(x),),
                angles,
                positions,
                None,
                interleaved,
                False,
                out=_out_buffer(x, i) if op == "apply.out" else None,
                mrope_section=section,
                mrope_interleaved=mrope_interleaved,
            )  # fmt: skip
        )
    return samples


register_family("forms", ROPE_OPS, form_samples)


# ---- shared by the serving fusions' families (qk_fp8, mla_cache, norm_cache) ----------------
# Their outputs and cache rows are 16/32-bit (the source's dtype, within its tolerance of the
# float64 oracle) or float8: within one fp8 step of the oracle's scaled value where it rotates,
# and bit for bit torch's own (value / scale).clamp(-max, max).to(fp8) where the value is copied
# (features past rotary_dim, the no-RoPE parts, kv_c, v). None of them is differentiable.

# opcheck's schema test compares mutated values with arithmetic that float8 lacks (mul is not
# implemented for Float8_e4m3fn); every other test runs on the float8 calls.
FP8_OPCHECK_UTILS = ("test_faketensor", "test_aot_dispatch_dynamic", "test_autograd_registration")
_MUTABLE_OPCHECK = ("2.5", "torch.library.opcheck of ops with optional mutable args")


def _scale_tensor(scale, device):
    """The raw ops take a scale as a float32 tensor; the wrappers make a Python number one."""
    if scale is None or isinstance(scale, Tensor):
        return scale
    return torch.tensor(scale, dtype=torch.float32, device=device)


def _assert_near(got: Tensor, want: Tensor, scale=None, multiply=False):
    """``got`` against its float64 value ``want``: float8 within one fp8 step of the scaled
    value, 16/32-bit within its dtype's tolerance."""
    if got.dtype in ref.FP8_DTYPES:
        ref.fp8_close(got, want, 1.0 if scale is None else scale, got.dtype, multiply=multiply)
    else:
        torch.testing.assert_close(got.cpu(), want.to(got.dtype), **TOLERANCES[got.dtype])


def _assert_stored_as(got: Tensor, value: Tensor, scale=None, multiply=False, what="a copy"):
    """``got`` holds the copied ``value``: bit for bit itself, or torch's quantization of it."""
    if got.dtype in ref.FP8_DTYPES:
        want = ref.quantize_fp8(
            value, 1.0 if scale is None else scale, got.dtype, multiply=multiply
        )
    else:
        want = value.detach().cpu().to(got.dtype)
    assert same_bits(got.cpu(), want), f"{what} is not its value as stored"


def _assert_only_rows_written(bases, bases_before, written):
    """Every element of the allocations ``bases`` keeps its bits but the rows ``written`` names:
    ``(view, index)`` pairs, the index of the written rows in the view (``...``: all of it)."""
    for base, base_before in zip(bases, bases_before):
        keep = torch.ones(base.shape, dtype=torch.bool)
        for view, index in written:
            if view.untyped_storage().data_ptr() != base.untyped_storage().data_ptr():
                continue
            rows = keep.as_strided(
                view.shape, view.stride(), view.storage_offset() - base.storage_offset()
            )
            rows[index] = False
        assert same_bits(base.cpu()[keep], base_before.cpu()[keep]), (
            "an element outside the written rows was written"
        )


def _assert_reads_unchanged(names, reads, reads_before):
    for name, t, t_before in zip(names, reads, reads_before):
        if t is not None:
            _assert_unchanged(t, t_before, name)


def _clones(tensors):
    return tuple(None if t is None else t.detach().clone() for t in tensors)


def _fp8_id(dtype):
    return str(dtype)[len("torch.float8_") :]


# ---- family: qk_fp8 (apply_qk_fp8, apply_qk_fp8.out) -------------------------------------------
# q (T, Hq, D), k (T, Hk, D) rotated (the first rotary_dim features) and stored as float8, their
# no-RoPE parts q_nope (T, Hq, Nq) and k_nope (T, Hk, Nk) quantized alongside; .out writes the
# caller's float8 buffers (views with padding around them, which must keep their bits).

QK_FP8_OPS = ("apply_qk_fp8", "apply_qk_fp8.out")


@dataclass
class QkFp8Sample(OpSample):
    """One call of apply_qk_fp8 (or .out). ``inputs``: ``(q, k)``; ``outs`` the .out buffers
    (views of ``bases``), None for a missing nope part."""

    name: str
    op: str
    inputs: Tuple[Tensor, ...]
    cos: Tensor
    sin: Tensor
    positions: Tensor
    fp8: torch.dtype
    q_nope: Optional[Tensor] = None
    k_nope: Optional[Tensor] = None
    q_scale: object = None  # a Python float, a 0-d or (1,) float32 tensor, or None (1)
    k_scale: object = None
    interleaved: bool = True
    multiply_by_scale: bool = False
    mrope_section: Optional[Tuple[int, ...]] = None
    mrope_interleaved: bool = False
    inverse: bool = False
    outs: Optional[Tuple[Optional[Tensor], ...]] = None
    bases: Tuple[Tensor, ...] = ()
    opcheck_needs_torch = _MUTABLE_OPCHECK
    opcheck_kwargs = dict(test_utils=FP8_OPCHECK_UTILS)

    @property
    def overload(self):
        return torch.ops.rope.apply_qk_fp8.out if self.outs else torch.ops.rope.apply_qk_fp8.default

    @property
    def differentiable(self) -> bool:
        return False

    def _kwargs(self, scale=lambda s: s) -> dict:
        kw = dict(
            q_nope=self.q_nope, k_nope=self.k_nope, q_scale=scale(self.q_scale),
            k_scale=scale(self.k_scale), interleaved=self.interleaved,
            multiply_by_scale=self.multiply_by_scale,
        )  # fmt: skip
        if self.inverse:
            kw["inverse"] = True
        if self.mrope_section is not None:
            kw.update(
                mrope_section=list(self.mrope_section), mrope_interleaved=self.mrope_interleaved
            )
        return kw

    def op_args(self):
        kw = self._kwargs(lambda s: _scale_tensor(s, self.inputs[0].device))
        if self.outs:
            kw.update(zip(("q_out", "k_out", "q_nope_out", "k_nope_out"), self.outs))
        else:
            kw["dtype"] = self.fp8
        return (*self.inputs, self.cos, self.sin, self.positions), kw

    def call(self, *inputs: Tensor) -> Tuple[Tensor, ...]:
        q, k = inputs or self.inputs
        args = (q, k, self.cos, self.sin, self.positions)
        if self.outs:
            got = torch_rope.apply_qk_fp8(*args, out=self.outs, **self._kwargs())
            return tuple(t for t in got if t is not None)
        return tuple(torch_rope.apply_qk_fp8(*args, dtype=self.fp8, **self._kwargs()))

    def _rotated(self, x):
        kw = {}
        if self.mrope_section is not None:
            kw = dict(mrope_section=self.mrope_section, mrope_interleaved=self.mrope_interleaved)
        return ref.rope_with_tables(
            x, self.cos, self.sin, self.positions, interleaved=self.interleaved,
            inverse=self.inverse, **kw
        )  # fmt: skip

    def expected(self, inputs=None) -> Tuple[Tensor, ...]:
        """The float64 values before quantization: q and k rotated, the nope parts."""
        q, k = inputs or self.inputs
        nopes = tuple(
            n.detach().cpu().double() for n in (self.q_nope, self.k_nope) if n is not None
        )
        return (self._rotated(q), self._rotated(k), *nopes)

    def written(self) -> Tuple[Tensor, ...]:
        return tuple(t for t in self.outs or () if t is not None)

    def snapshot(self):
        reads = (*self.inputs, self.q_nope, self.k_nope, self.cos, self.sin, self.positions)
        return _clones(reads), _clones(self.bases)

    def check(self, results, before):
        reads_before, bases_before = before
        q, k, q_nope, k_nope = reads_before[:4]
        rotary_dim = 2 * self.cos.size(-1)
        mul = self.multiply_by_scale
        got = list(results)
        if self.outs:
            for out in self.written():
                assert got.pop(0) is out, "apply_qk_fp8(..., out=) must return its buffers"
            got = [t for t in self.outs]
        for i, (x, scale, what) in enumerate(((q, self.q_scale, "q"), (k, self.k_scale, "k"))):
            out = got[i]
            assert out.dtype == self.fp8 and out.shape == x.shape and out.device == x.device
            assert self.outs or out.is_contiguous(), "new outputs are contiguous"
            _assert_near(out[..., :rotary_dim], self._rotated(x)[..., :rotary_dim], scale, mul)
            _assert_stored_as(
                out[..., rotary_dim:], x[..., rotary_dim:], scale, mul, f"{what} tail"
            )
        for i, (x, scale, heads, what) in enumerate(
            (
                (q_nope, self.q_scale, q.size(1), "q_nope"),
                (k_nope, self.k_scale, k.size(1), "k_nope"),
            )
        ):
            out = got[2 + i]
            if x is None:
                assert out is None or out.shape == (q.size(0), heads, 0), what
                continue
            assert out.dtype == self.fp8 and out.shape == x.shape
            _assert_stored_as(out, x, scale, mul, what)
        _assert_only_rows_written(self.bases, bases_before, [(t, ...) for t in self.written()])
        names = ("q", "k", "q_nope", "k_nope", "cos", "sin", "positions")
        reads = (*self.inputs, self.q_nope, self.k_nope, self.cos, self.sin, self.positions)
        _assert_reads_unchanged(names, reads, reads_before)


def fp8_out_buffer(shape, fp8, device):
    """A float8 output with padding around it (0x55 bytes): ``(view, base)``."""
    T, H, W = shape
    base = torch.full((T + 1, H + 1, W + 16), 0x55, dtype=torch.uint8, device=device).view(fp8)
    return base[1:, :H, 8 : 8 + W], base


def _qk_fp8_inputs(layout, T, hq, hk, D, dtype, device):
    if layout == "fused":  # q and k sliced out of one (T, (Hq + Hk) D + 8) projection row
        fused = randn(T, (hq + hk) * D + 8, dtype=dtype, device=device) * 3
        return fused[:, : hq * D].view(T, hq, D), fused[:, hq * D : (hq + hk) * D].view(T, hk, D)
    if layout == "last_dim_strided":
        q = (randn(T, hq, 2 * D, dtype=dtype, device=device) * 3)[..., ::2]
        return q, randn(T, hk, D, dtype=dtype, device=device) * 3
    assert layout == "contiguous", layout
    return (
        randn(T, hq, D, dtype=dtype, device=device) * 3,
        randn(T, hk, D, dtype=dtype, device=device) * 3,
    )


# (op, layout, dtype, fp8, tokens, q heads, k heads, head_dim, rotary_dim, q_nope width, k_nope
#  width (None: no nope part), interleaved, multiply_by_scale, (scale form, q_scale, k_scale) or
#  None, positions ("token", "per_head", "int32", "one"), (mrope_section, mrope_interleaved))
# Every dtype, both float8 formats, both pair layouts, both scale rules and every scale form (and
# none), partial rotary, with and without nope parts, GQA / MQA / per-head positions, int32
# positions, multi-axis positions of both section layouts, sliced and strided q, no tokens; .out
# into padded buffers.
_QK_FP8_PLAN = [
    ("apply_qk_fp8", "contiguous", torch.float64, E4M3, 5, 4, 2, 80, 48, 16, 8, True, False,
     ("float", 0.05, 0.1), "token", None),
    ("apply_qk_fp8", "contiguous", torch.float32, E5M2, 5, 4, 1, 64, 64, None, None, False, True,
     ("tensor_0d", 4.0, 8.0), "int32", None),
    ("apply_qk_fp8", "last_dim_strided", torch.float16, E4M3, 3, 3, 3, 32, 16, 8, None, True,
     True, ("tensor_1", 2.0, 0.5), "per_head", None),
    ("apply_qk_fp8", "contiguous", torch.bfloat16, E5M2, 4, 4, 2, 64, 64, None, None, False,
     False, None, "token", ((8, 12, 12), False)),
    ("apply_qk_fp8", "fused", torch.bfloat16, E4M3, 4, 2, 1, 32, 32, 16, 16, True, False,
     ("float", 0.02, 0.03), "one", None),
    ("apply_qk_fp8", "contiguous", torch.float32, E4M3, 5, 2, 2, 32, 16, None, 8, True, False,
     ("float", 0.05, 0.05), "token", ((4, 2, 2), True)),
    ("apply_qk_fp8", "contiguous", torch.float32, E4M3, 0, 4, 2, 32, 32, 8, 8, True, False,
     None, "token", None),
    ("apply_qk_fp8.out", "contiguous", torch.bfloat16, E4M3, 5, 4, 2, 80, 48, 16, 8, True, False,
     ("float", 0.1, 0.2), "token", None),
    ("apply_qk_fp8.out", "fused", torch.float32, E5M2, 4, 4, 1, 64, 64, None, None, False, True,
     ("tensor_0d", 4.0, 8.0), "token", None),
    ("apply_qk_fp8.out", "contiguous", torch.float64, E4M3, 3, 2, 2, 24, 16, 8, 8, False, False,
     ("tensor_1", 0.05, 0.1), "per_head", None),
    ("apply_qk_fp8.out", "contiguous", torch.float16, E5M2, 4, 2, 1, 16, 16, 8, None, True, False,
     ("float", 0.25, 0.5), "int32", ((2, 3, 3), False)),
]  # fmt: skip


def qk_fp8_sample(
    op, layout, dtype, fp8, T, hq, hk, D, rotary_dim, nq, nk, interleaved, multiply, scales,
    positions_kind, mrope, device,
) -> QkFp8Sample:  # fmt: skip
    """One apply_qk_fp8 sample of a plan row."""
    q, k = _qk_fp8_inputs(layout, T, hq, hk, D, dtype, device)
    q_nope = None if nq is None else randn(T, hq, nq, dtype=dtype, device=device) * 3
    k_nope = None if nk is None else randn(T, hk, nk, dtype=dtype, device=device) * 3
    cos, sin = _tables("real", rotary_dim, dtype, device)
    if positions_kind == "per_head":
        positions = torch.randint(0, MAX_SEQ_LEN, (T, hq), device=device)
    elif positions_kind == "one":
        positions = torch.tensor([[MAX_SEQ_LEN - 1]], device=device)
    else:
        positions = torch.randint(0, MAX_SEQ_LEN, (T, 1), device=device)
        if positions_kind == "int32":
            positions = positions.to(torch.int32)
    section, mrope_interleaved = mrope or (None, False)
    if section is not None:
        positions = multi_axis_positions(positions, len(section), positions.dtype, True)
    form, q_value, k_value = scales or (None, None, None)
    outs, bases = None, ()
    if op == "apply_qk_fp8.out":
        made = [
            None if x is None else fp8_out_buffer(x.shape, fp8, device)
            for x in (q, k, q_nope, k_nope)
        ]
        outs = tuple(None if m is None else m[0] for m in made)
        bases = tuple(m[1] for m in made if m is not None)
    name = (
        f"{op}-{layout}-{dtype_id(dtype)}-{_fp8_id(fp8)}-t{T}q{hq}k{hk}-d{D}r{rotary_dim}-"
        f"nope{nq or 0}_{nk or 0}-{'il' if interleaved else 'half'}"
        f"{'-multiply' if multiply else ''}-{form or 'no_scale'}-{positions_kind}"
        f"{_mrope_id(section, mrope_interleaved) if section is not None else ''}"
    )
    return QkFp8Sample(
        name, op, (q, k), cos, sin, positions, fp8, q_nope=q_nope, k_nope=k_nope,
        q_scale=None if q_value is None else _scale(form, q_value, device),
        k_scale=None if k_value is None else _scale(form, k_value, device),
        interleaved=interleaved, multiply_by_scale=multiply, mrope_section=section,
        mrope_interleaved=mrope_interleaved, outs=outs, bases=bases,
    )  # fmt: skip


def qk_fp8_samples(device, requires_grad: bool) -> List[OpSample]:
    """The qk_fp8 family's samples (none with ``requires_grad``: not differentiable)."""
    if requires_grad:
        return []
    samples = [qk_fp8_sample(*row, device) for row in _QK_FP8_PLAN]
    # The inverse rotation (DeepSeek-V4's output side) on a functional and an out= row, float64
    # and bf16, a partial rotation with nope parts, the half split with multi-axis positions.
    return samples + [_inverse(samples[i]) for i in (0, 3, 7)]


def _inverse(sample):
    """The sample rotating by the negated angle (``inverse=True``)."""
    return replace(sample, name=f"{sample.name}-inverse", inverse=True)


register_family("qk_fp8", QK_FP8_OPS, qk_fp8_samples)


# ---- family: qk_fp8_dynamic (apply_qk_fp8_dynamic) ----------------------------------------------
# q (T, Hq, D), k (T, Hk, D) rotated and stored as float8 with scales computed from the rotated
# rows: one per (token, head) row or per token, float32 or rounded up to powers of two.

QK_FP8_DYNAMIC_OPS = ("apply_qk_fp8_dynamic", "apply_qk_fp8_dynamic.out")


@dataclass
class QkFp8DynamicSample(OpSample):
    """One call of apply_qk_fp8_dynamic. ``inputs``: ``(q, k)``."""

    name: str
    op: str
    inputs: Tuple[Tensor, ...]
    cos: Tensor
    sin: Tensor
    positions: Tensor
    fp8: torch.dtype
    per_token: bool = False
    pow2_scale: bool = False
    interleaved: bool = True
    mrope_section: Optional[Tuple[int, ...]] = None
    mrope_interleaved: bool = False
    inverse: bool = False
    # .out: (q_out, k_out, q_scale, k_scale), views of ``bases`` (padding that must keep its bits)
    outs: Optional[Tuple[Tensor, ...]] = None
    bases: Tuple[Tensor, ...] = ()
    opcheck_kwargs = dict(test_utils=FP8_OPCHECK_UTILS)

    @property
    def overload(self):
        if self.outs:
            return torch.ops.rope.apply_qk_fp8_dynamic.out
        return torch.ops.rope.apply_qk_fp8_dynamic.default

    @property
    def differentiable(self) -> bool:
        return False

    def _kwargs(self) -> dict:
        kw = dict(
            dtype=self.fp8, interleaved=self.interleaved, per_token=self.per_token,
            pow2_scale=self.pow2_scale,
        )  # fmt: skip
        if self.inverse:
            kw["inverse"] = True
        if self.mrope_section is not None:
            kw.update(
                mrope_section=list(self.mrope_section), mrope_interleaved=self.mrope_interleaved
            )
        return kw

    def op_args(self):
        kw = self._kwargs()
        if self.outs:
            del kw["dtype"]
            kw.update(zip(("q_out", "k_out", "q_scale_out", "k_scale_out"), self.outs))
        return (*self.inputs, self.cos, self.sin, self.positions), kw

    def call(self, *inputs: Tensor) -> Tuple[Tensor, ...]:
        q, k = inputs or self.inputs
        kw = self._kwargs()
        if self.outs:
            kw.update(dtype=None, out=self.outs)
        return tuple(
            torch_rope.apply_qk_fp8_dynamic(q, k, self.cos, self.sin, self.positions, **kw)
        )

    def written(self) -> Tuple[Tensor, ...]:
        return self.outs or ()

    def expected(self, inputs=None) -> Tuple[Tensor, ...]:
        """The float64 values before quantization: q and k rotated."""
        q, k = inputs or self.inputs
        kw = {}
        if self.mrope_section is not None:
            kw = dict(mrope_section=self.mrope_section, mrope_interleaved=self.mrope_interleaved)
        return tuple(
            ref.rope_with_tables(x, self.cos, self.sin, self.positions,
                                 interleaved=self.interleaved, inverse=self.inverse, **kw)
            for x in (q, k)
        )  # fmt: skip

    def snapshot(self):
        return _clones((*self.inputs, self.cos, self.sin, self.positions, *self.bases))

    def check(self, results, before):
        if self.outs:
            assert all(r is o for r, o in zip(results, self.outs)), "out= returns its buffers"
            bases_before = before[5:]
            _assert_only_rows_written(self.bases, bases_before, [(t, ...) for t in self.outs])
            before = before[:5]
        q8, k8, q_scale, k_scale = results
        fmax = ref.FP8_MAX[self.fp8]
        dims = (-2, -1) if self.per_token else (-1,)
        for out, scale, x, value in zip((q8, k8), (q_scale, k_scale), before[:2], self.expected()):
            T, heads = x.shape[:2]
            assert out.dtype == self.fp8 and out.shape == x.shape
            assert self.outs or out.is_contiguous(), "new outputs are contiguous"
            assert scale.dtype == torch.float32 and scale.device == x.device
            assert scale.shape == (T, 1 if self.per_token else heads, 1)
            if value.numel() == 0:
                continue
            # The scale: the float64 amax / max within the float32 rotation's rounding, or the
            # power of two at or above it.
            want = value.abs().amax(dim=dims, keepdim=True) / fmax
            got = scale.cpu().double()
            if self.pow2_scale:
                assert torch.equal(got, torch.exp2(torch.log2(got).round()))
                assert torch.all(got >= want * (1 - 1e-6))
                assert torch.all(got < 2 * want * (1 + 1e-6))
            else:
                torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
            # The values: within one fp8 step of value / scale.
            rel, tiny = ref.FP8_STEP[self.fp8]
            torch.testing.assert_close(
                out.cpu().double(), (value / got).clamp(-fmax, fmax), rtol=rel, atol=tiny
            )
        names = ("q", "k", "cos", "sin", "positions")
        reads = (*self.inputs, self.cos, self.sin, self.positions)
        _assert_reads_unchanged(names, reads, before)


# (layout, dtype, fp8, tokens, q heads, k heads, head_dim, rotary_dim, interleaved, per_token,
#  pow2_scale, positions ("token", "per_head", "int32"), (mrope_section, mrope_interleaved))
# Every dtype, both float8 formats and pair layouts, per row and per token, float32 and
# power-of-two scales, partial rotary, GQA / MQA, per-head and int32 positions, multi-axis
# positions, sliced and strided q, no tokens.
_QK_FP8_DYNAMIC_PLAN = [
    ("contiguous", torch.bfloat16, E4M3, 5, 4, 2, 128, 128, True, False, False, "token", None),
    ("fused", torch.float16, E4M3, 4, 4, 1, 64, 32, False, True, True, "int32", None),
    ("last_dim_strided", torch.float32, E5M2, 3, 3, 3, 32, 16, True, False, True, "per_head",
     None),
    ("contiguous", torch.float64, E4M3, 4, 2, 2, 48, 48, False, True, False, "token", None),
    ("contiguous", torch.bfloat16, E5M2, 4, 4, 2, 64, 64, False, False, False, "token",
     ((8, 12, 12), False)),
    ("contiguous", torch.float32, E4M3, 0, 4, 2, 32, 32, True, True, False, "token", None),
]  # fmt: skip


def qk_fp8_dynamic_sample(
    layout, dtype, fp8, T, hq, hk, D, rotary_dim, interleaved, per_token, pow2, positions_kind,
    mrope, device,
) -> QkFp8DynamicSample:  # fmt: skip
    """One apply_qk_fp8_dynamic sample of a plan row."""
    q, k = _qk_fp8_inputs(layout, T, hq, hk, D, dtype, device)
    cos, sin = _tables("real", rotary_dim, dtype, device)
    if positions_kind == "per_head":
        positions = torch.randint(0, MAX_SEQ_LEN, (T, hq), device=device)
    else:
        positions = torch.randint(0, MAX_SEQ_LEN, (T, 1), device=device)
        if positions_kind == "int32":
            positions = positions.to(torch.int32)
    section, mrope_interleaved = mrope or (None, False)
    if section is not None:
        positions = multi_axis_positions(positions, len(section), positions.dtype, True)
    name = (
        f"apply_qk_fp8_dynamic-{layout}-{dtype_id(dtype)}-{_fp8_id(fp8)}-t{T}q{hq}k{hk}-"
        f"d{D}r{rotary_dim}-{'il' if interleaved else 'half'}-"
        f"{'per_token' if per_token else 'per_row'}{'-pow2' if pow2 else ''}-{positions_kind}"
        f"{_mrope_id(section, mrope_interleaved) if section is not None else ''}"
    )
    return QkFp8DynamicSample(
        name, "apply_qk_fp8_dynamic", (q, k), cos, sin, positions, fp8, per_token=per_token,
        pow2_scale=pow2, interleaved=interleaved, mrope_section=section,
        mrope_interleaved=mrope_interleaved,
    )  # fmt: skip


def qk_fp8_dynamic_samples(device, requires_grad: bool) -> List[OpSample]:
    """The qk_fp8_dynamic family's samples (none with ``requires_grad``)."""
    if requires_grad:
        return []
    samples = [qk_fp8_dynamic_sample(*row, device) for row in _QK_FP8_DYNAMIC_PLAN]
    # The inverse rotation: per token with powers of two, multi-axis. out=: into padded buffers
    # (per row, per token, the inverse). Not the call without tokens: opcheck's fake-tensor copy
    # of an empty view at its allocation's end fails in torch itself ("negative dimension");
    # test_apply_qk_fp8_dynamic.py calls that case.
    inverse = [_inverse(samples[i]) for i in (1, 4)]
    outs = [dynamic_out_sample(samples[i]) for i in (0, 1)] + [dynamic_out_sample(inverse[1])]
    return samples + inverse + outs


def dynamic_out_sample(sample):
    """The sample through apply_qk_fp8_dynamic.out: its float8 rows into padded buffers, its
    scales into strided views of padded float32 buffers."""
    q, k = sample.inputs
    device = q.device
    per_token = sample.per_token
    rows = [fp8_out_buffer(x.shape, sample.fp8, device) for x in (q, k)]
    scales = []
    for x in (q, k):
        T, H = x.shape[0], 1 if per_token else x.shape[1]
        base = torch.full((T + 1, H + 1, 3), -7.0, device=device)
        scales.append((base[1:, :H, 1:2], base))
    made = rows + scales
    return replace(
        sample, name=f"{sample.name}-out", op="apply_qk_fp8_dynamic.out",
        outs=tuple(m[0] for m in made), bases=tuple(m[1] for m in made),
    )  # fmt: skip


register_family("qk_fp8_dynamic", QK_FP8_DYNAMIC_OPS, qk_fp8_dynamic_samples)


# ---- family: mla_cache (mla_apply_cache) -------------------------------------------------------
# q_pe (T, H, R) and the latent head k_pe (T, R) rotate; rows [kv_c | k_pe] go to one cache of
# width L + R (vLLM) or to two, (L) and (R) wide (FlashInfer's ckv / kpe, also as the column
# slices of one buffer), flat (num_slots, W) or paged (num_blocks, block_size, W); with key heads
# (k_pe (T, Hk, R), kv_c (T, Hk, L), caches (..., Hk, W)) and v / v_cache, FlashInfer's GQA rows.

MLA_OPS = ("mla_apply_cache",)


@dataclass
class MlaSample(OpSample):
    """One call of mla_apply_cache. ``inputs``: ``(q_pe, k_pe, kv_c)``; ``bases``: the allocations
    the caches are views of."""

    name: str
    inputs: Tuple[Tensor, ...]
    cos: Tensor
    sin: Tensor
    positions: Tensor
    kv_cache: Tensor
    kpe_cache: Optional[Tensor]
    slot_mapping: Tensor
    bases: Tuple[Tensor, ...]
    paged: bool
    q_nope: Optional[Tensor] = None
    v: Optional[Tensor] = None
    v_cache: Optional[Tensor] = None
    interleaved: bool = True
    kv_scale: object = None
    v_scale: object = None
    q_dtype: Optional[torch.dtype] = None
    q_scale: object = None
    multiply_by_scale: bool = False
    op: str = "mla_apply_cache"
    opcheck_needs_torch = _MUTABLE_OPCHECK

    @property
    def overload(self):
        return torch.ops.rope.mla_apply_cache.default

    @property
    def differentiable(self) -> bool:
        return False

    @property
    def has_fp8(self) -> bool:
        caches = (self.kv_cache, self.kpe_cache, self.v_cache)
        return self.q_dtype is not None or any(
            c is not None and c.dtype in ref.FP8_DTYPES for c in caches
        )

    @property
    def opcheck_kwargs(self) -> dict:
        return dict(test_utils=FP8_OPCHECK_UTILS) if self.has_fp8 else {}

    def _kwargs(self, scale=lambda s: s) -> dict:
        return dict(
            q_nope=self.q_nope, v=self.v, v_cache=self.v_cache, interleaved=self.interleaved,
            kv_scale=scale(self.kv_scale), v_scale=scale(self.v_scale), q_dtype=self.q_dtype,
            q_scale=scale(self.q_scale), multiply_by_scale=self.multiply_by_scale,
        )  # fmt: skip

    def _args(self, inputs):
        return (*inputs, self.cos, self.sin, self.positions, self.kv_cache, self.kpe_cache,
                self.slot_mapping)  # fmt: skip

    def op_args(self):
        return self._args(self.inputs), self._kwargs(
            lambda s: _scale_tensor(s, self.inputs[0].device)
        )

    def call(self, *inputs: Tensor) -> Tuple[Tensor, ...]:
        return tuple(
            torch_rope.mla_apply_cache(*self._args(inputs or self.inputs), **self._kwargs())
        )

    def _rotated(self, x):
        x = x if x.dim() == 3 else x.unsqueeze(1)  # k_pe (T, R): one head
        return ref.rope_with_tables(
            x, self.cos, self.sin, self.positions, interleaved=self.interleaved
        )

    def expected(self, inputs=None) -> Tuple[Tensor, ...]:
        """The float64 values before storage: q_pe rotated and q_nope."""
        q_pe = (inputs or self.inputs)[0]
        q_nope = self.q_nope
        nope = q_pe.new_zeros(*q_pe.shape[:2], 0) if q_nope is None else q_nope
        return self._rotated(q_pe), nope.detach().cpu().double()

    def _index(self, slots):
        if not self.paged:
            return (slots,)
        block_size = self.kv_cache.size(1)
        return (torch.div(slots, block_size, rounding_mode="floor"), slots % block_size)

    def written(self) -> Tuple[Tensor, ...]:
        return tuple(c for c in (self.kv_cache, self.kpe_cache, self.v_cache) if c is not None)

    def snapshot(self):
        reads = (*self.inputs, self.q_nope, self.v, self.cos, self.sin, self.positions,
                 self.slot_mapping)  # fmt: skip
        return _clones(reads), _clones(self.bases)

    def check(self, results, before):
        reads_before, bases_before = before
        q_pe, k_pe, kv_c, q_nope, v = reads_before[:5]
        mul = self.multiply_by_scale
        q_pe_out, q_nope_out = results
        q_dtype = self.q_dtype or q_pe.dtype
        assert q_pe_out.dtype == q_dtype and q_pe_out.shape == q_pe.shape
        assert q_pe_out.device == q_pe.device
        _assert_near(q_pe_out, self._rotated(q_pe), self.q_scale, mul)
        if q_nope is None:
            assert q_nope_out.shape == (*q_pe.shape[:2], 0)
        else:
            assert q_nope_out.dtype == q_dtype and q_nope_out.shape == q_nope.shape
            _assert_stored_as(q_nope_out, q_nope, self.q_scale, mul, "q_nope")
        slots = self.slot_mapping.cpu()
        stored = slots >= 0
        index = self._index(slots[stored])
        L = kv_c.size(-1)
        if self.kpe_cache is None:
            rows = self.kv_cache.cpu()[index]
            ckv, kpe = rows[..., :L], rows[..., L:]
        else:
            ckv, kpe = self.kv_cache.cpu()[index], self.kpe_cache.cpu()[index]
        _assert_stored_as(ckv, kv_c[stored], self.kv_scale, mul, "a kv_c row")
        k_rot = self._rotated(k_pe)[stored]
        _assert_near(kpe, k_rot if k_pe.dim() == 3 else k_rot.squeeze(1), self.kv_scale, mul)
        if self.v_cache is not None:
            _assert_stored_as(self.v_cache.cpu()[index], v[stored], self.v_scale, mul, "a v row")
        _assert_only_rows_written(
            self.bases, bases_before, [(c, self._index(slots[stored])) for c in self.written()]
        )
        names = ("q_pe", "k_pe", "kv_c", "q_nope", "v", "cos", "sin", "positions", "slot_mapping")
        reads = (*self.inputs, self.q_nope, self.v, self.cos, self.sin, self.positions,
                 self.slot_mapping)  # fmt: skip
        _assert_reads_unchanged(names, reads, reads_before)


def mla_caches(layout, lead, hk, L, R, Dv, dtype, device, gen=None):
    """``(kv_cache, kpe_cache, v_cache, bases)``: ``one``: one (lead, L + R) cache; ``two``: a
    buffer each; ``slices``: the two column slices of one buffer. With key heads ``hk`` the
    caches are (lead, hk, W); v_cache (Dv) only with ``Dv``."""
    heads = () if hk is None else (hk,)
    if layout == "one":
        kv = _cache_buffer((*lead, *heads, L + R), dtype, device, gen)
        caches, bases = (kv, None), [kv]
    elif layout == "slices":
        buf = _cache_buffer((*lead, *heads, L + R), dtype, device, gen)
        caches, bases = (buf[..., :L], buf[..., L:]), [buf]
    else:
        assert layout == "two", layout
        caches = (
            _cache_buffer((*lead, *heads, L), dtype, device, gen),
            _cache_buffer((*lead, *heads, R), dtype, device, gen),
        )
        bases = list(caches)
    v_cache = None if Dv is None else _cache_buffer((*lead, *heads, Dv), dtype, device, gen)
    if v_cache is not None:
        bases.append(v_cache)
    return (*caches, v_cache, tuple(bases))


# (dtype, cache dtype, cache layout, paged, q heads, key heads (None: k_pe (T, R)), kv_lora_rank
#  L, rope dim R, q_nope width (None: none), v head dim (None: no v), interleaved, slots,
#  (scale form, kv_scale, v_scale) or None, (q_dtype, q_scale) or None, multiply_by_scale,
#  int32 positions, tokens)
# Every dtype into a cache of its own dtype, 16-bit and float32 sources into both float8 formats
# with every scale form and both scale rules, float8 q outputs, vLLM's one cache and FlashInfer's
# two (also the column slices of one buffer), flat and paged, both pair layouts, padding slots
# (some and all), the GQA rows with v, int32 positions, no q_nope, no tokens.
_MLA_PLAN = [
    (torch.float64, torch.float64, "one", False, 4, None, 40, 16, 8, None, True, "padding",
     None, None, False, False, CACHE_TOKENS),
    (torch.float32, torch.float32, "two", True, 2, None, 24, 16, None, None, False, "padding",
     None, None, False, True, CACHE_TOKENS),
    (torch.float16, torch.float16, "slices", True, 3, None, 32, 16, 8, None, True, "dense",
     None, None, False, False, CACHE_TOKENS),
    (torch.bfloat16, torch.bfloat16, "one", True, 4, None, 24, 32, 16, None, False,
     "all_padding", None, None, False, False, CACHE_TOKENS),
    (torch.bfloat16, E4M3, "one", True, 4, None, 40, 16, 8, None, True, "padding",
     ("float", 0.07, None), (E4M3, 0.07), False, False, CACHE_TOKENS),
    (torch.float16, E5M2, "two", False, 2, None, 32, 16, 8, None, False, "scattered",
     ("tensor_0d", 4.0, None), None, True, False, CACHE_TOKENS),
    (torch.float32, E4M3, "slices", True, 4, None, 24, 16, 8, None, True, "padding",
     ("tensor_1", 0.05, None), (E5M2, 0.1), False, True, CACHE_TOKENS),
    (torch.bfloat16, torch.bfloat16, "two", True, 4, 2, 16, 16, 8, 8, True, "padding",
     None, None, False, False, CACHE_TOKENS),
    (torch.bfloat16, E4M3, "two", False, 4, 2, 16, 16, None, 16, False, "dense",
     ("float", 0.1, 0.05), (E4M3, 0.2), False, False, CACHE_TOKENS),
    (torch.float32, torch.float32, "one", False, 4, None, 24, 16, 8, None, True, "dense",
     None, None, False, False, 0),
]  # fmt: skip


def mla_sample(
    dtype, cache_dtype, layout, paged, H, hk, L, R, N, Dv, interleaved, slots, scales, q_fp8,
    multiply, int32, T, device,
) -> MlaSample:  # fmt: skip
    """One mla_apply_cache sample of a plan row."""
    key = (T,) if hk is None else (T, hk)
    q_pe = randn(T, H, R, dtype=dtype, device=device) * 2
    k_pe = randn(*key, R, dtype=dtype, device=device) * 2
    kv_c = randn(*key, L, dtype=dtype, device=device) * 2
    q_nope = None if N is None else randn(T, H, N, dtype=dtype, device=device) * 2
    v = None if Dv is None else randn(*key, Dv, dtype=dtype, device=device)
    lead = (CACHE_BLOCKS, CACHE_BLOCK_SIZE) if paged else (CACHE_BLOCKS * CACHE_BLOCK_SIZE,)
    kv_cache, kpe_cache, v_cache, bases = mla_caches(
        layout, lead, hk, L, R, Dv, cache_dtype, device
    )
    positions = torch.randint(0, MAX_SEQ_LEN, (T, 1), device=device)
    positions = positions.to(torch.int32 if int32 else torch.int64)
    cos, sin = _tables("real", R, dtype, device)
    form, kv_value, v_value = scales or (None, None, None)
    q_dtype, q_value = q_fp8 or (None, None)
    name = (
        f"mla_apply_cache-{dtype_id(dtype)}-"
        f"{_fp8_id(cache_dtype) if cache_dtype in ref.FP8_DTYPES else 'same'}-{layout}-"
        f"{'paged' if paged else 'flat'}-t{T}h{H}{f'k{hk}' if hk else ''}-l{L}r{R}n{N or 0}"
        f"{f'v{Dv}' if Dv else ''}-{'il' if interleaved else 'half'}-{slots}"
        f"{f'-{form}' if form else ''}{f'-q_{_fp8_id(q_dtype)}' if q_dtype else ''}"
        f"{'-multiply' if multiply else ''}{'-int32' if int32 else ''}"
    )
    return MlaSample(
        name, (q_pe, k_pe, kv_c), cos, sin, positions, kv_cache, kpe_cache,
        _slot_mapping(slots, T, device), bases, paged, q_nope=q_nope, v=v, v_cache=v_cache,
        interleaved=interleaved,
        kv_scale=None if kv_value is None else _scale(form, kv_value, device),
        v_scale=None if v_value is None else _scale(form, v_value, device),
        q_dtype=q_dtype, q_scale=None if q_value is None else _scale(form, q_value, device),
        multiply_by_scale=multiply,
    )  # fmt: skip


def mla_samples(device, requires_grad: bool) -> List[OpSample]:
    """The mla_cache family's samples (none with ``requires_grad``: not differentiable)."""
    if requires_grad:
        return []
    return [mla_sample(*row, device) for row in _MLA_PLAN]


register_family("mla_cache", MLA_OPS, mla_samples)


# ---- family: norm_cache (rms_norm_apply_qk_cache) ----------------------------------------------
# rms_norm_apply_qk then apply_qk_cache in one pass: q, k normalised over head_dim (weights, eps,
# Gemma's offset), rotated, q returned (float8 with q_dtype), the k rows and v rows stored as in
# apply_qk_cache (CACHE_GEOMETRIES, make_caches, the same slot kinds and scale forms).

NORM_CACHE_OPS = ("rms_norm_apply_qk_cache",)


@dataclass
class NormCacheSample(OpSample):
    """One call of rms_norm_apply_qk_cache. ``inputs``: ``(q, k, v)``, or ``(q, k)`` without v."""

    name: str
    inputs: Tuple[Tensor, ...]
    q_weight: Tensor
    k_weight: Tensor
    cos: Tensor
    sin: Tensor
    positions: Tensor
    k_cache: Tensor
    v_cache: Optional[Tensor]
    slot_mapping: Tensor
    bases: Tuple[Tensor, ...]
    eps: float = 1e-6
    weight_offset: float = 0.0
    interleaved: bool = True
    k_scale: object = None
    v_scale: object = None
    q_dtype: Optional[torch.dtype] = None
    q_scale: object = None
    mrope_section: Optional[Tuple[int, ...]] = None
    mrope_interleaved: bool = False
    op: str = "rms_norm_apply_qk_cache"
    opcheck_needs_torch = _MUTABLE_OPCHECK

    @property
    def overload(self):
        return torch.ops.rope.rms_norm_apply_qk_cache.default

    @property
    def differentiable(self) -> bool:
        return False

    @property
    def has_fp8(self) -> bool:
        caches = (self.k_cache, self.v_cache)
        return self.q_dtype is not None or any(
            c is not None and c.dtype in ref.FP8_DTYPES for c in caches
        )

    @property
    def opcheck_kwargs(self) -> dict:
        return dict(test_utils=FP8_OPCHECK_UTILS) if self.has_fp8 else {}

    def _split(self, inputs):
        return inputs[0], inputs[1], inputs[2] if len(inputs) > 2 else None

    def _kwargs(self, scale=lambda s: s) -> dict:
        kw = dict(
            eps=self.eps, weight_offset=self.weight_offset, interleaved=self.interleaved,
            k_scale=scale(self.k_scale), v_scale=scale(self.v_scale), q_dtype=self.q_dtype,
            q_scale=scale(self.q_scale),
        )  # fmt: skip
        if self.mrope_section is not None:
            kw.update(
                mrope_section=list(self.mrope_section), mrope_interleaved=self.mrope_interleaved
            )
        return kw

    def _args(self, inputs):
        q, k, v = self._split(inputs)
        return (q, k, v, self.q_weight, self.k_weight, self.cos, self.sin, self.positions,
                self.k_cache, self.v_cache, self.slot_mapping)  # fmt: skip

    def op_args(self):
        return self._args(self.inputs), self._kwargs(
            lambda s: _scale_tensor(s, self.inputs[0].device)
        )

    def call(self, *inputs: Tensor) -> Tuple[Tensor, ...]:
        args = self._args(inputs or self.inputs)
        return (torch_rope.rms_norm_apply_qk_cache(*args, **self._kwargs()),)

    def _normed(self, x, weight):
        kw = {}
        if self.mrope_section is not None:
            kw = dict(mrope_section=self.mrope_section, mrope_interleaved=self.mrope_interleaved)
        return ref.rms_norm_rope_with_tables(
            x, weight, self.cos, self.sin, self.positions, eps=self.eps,
            weight_offset=self.weight_offset, interleaved=self.interleaved, **kw,
        )  # fmt: skip

    def expected(self, inputs=None) -> Tuple[Tensor, ...]:
        """The float64 q before storage (normalised, rotated)."""
        return (self._normed((inputs or self.inputs)[0], self.q_weight),)

    def written(self) -> Tuple[Tensor, ...]:
        return tuple(c for c in (self.k_cache, self.v_cache) if c is not None)

    def snapshot(self):
        reads = (*self.inputs, self.q_weight, self.k_weight, self.cos, self.sin, self.positions,
                 self.slot_mapping)  # fmt: skip
        return _clones(reads), _clones(self.bases)

    def check(self, results, before):
        reads_before, bases_before = before
        q, k, v = self._split(reads_before[: len(self.inputs)])
        (q_out,) = results
        q_dtype = self.q_dtype or q.dtype
        assert q_out.shape == q.shape and q_out.dtype == q_dtype and q_out.device == q.device
        assert q_out.is_contiguous(), "rms_norm_apply_qk_cache returns a new contiguous q"
        _assert_near(q_out, self._normed(q, self.q_weight), self.q_scale)
        slots = self.slot_mapping.cpu()
        stored = slots >= 0
        k_rows = self.k_cache.cpu()[ref.cache_row_index(self.k_cache.cpu(), slots[stored])]
        _assert_near(k_rows, self._normed(k, self.k_weight)[stored], self.k_scale)
        if self.v_cache is not None:
            v_rows = self.v_cache.cpu()[ref.cache_row_index(self.v_cache.cpu(), slots[stored])]
            _assert_stored_as(v_rows, v[stored], self.v_scale, what="a v row")
        _assert_only_rows_written(
            self.bases,
            bases_before,
            [(c, ref.cache_row_index(c.cpu(), slots[stored])) for c in self.written()],
        )
        names = ("q", "k", "v")[: len(self.inputs)] + (
            "q_weight", "k_weight", "cos", "sin", "positions", "slot_mapping"
        )  # fmt: skip
        reads = (*self.inputs, self.q_weight, self.k_weight, self.cos, self.sin, self.positions,
                 self.slot_mapping)  # fmt: skip
        _assert_reads_unchanged(names, reads, reads_before)


# (geometry, dtype, k_cache dtype, v_cache dtype (None: no v), cache layout, head_dim,
#  rotary_dim, v head_dim, q heads, kv heads, interleaved, tables, int32 positions, slots,
#  (scale form, k_scale, v_scale) or None, eps, weight_offset, weights, (q_dtype, q_scale) or
#  None, (mrope_section, mrope_interleaved, axis_first) or None)
# Every dtype into caches of its own dtype and into both float8 formats, float8 q, flat, paged,
# halves of one buffer and padded rows, both pair layouts, partial rotary, MHA / GQA / MQA, eps
# and Gemma's offset, weights of another dtype and strided, int32 and int64 positions, per-head,
# broadcast and strided positions, padding slots (some and all), no v, no tokens, every scale
# form, a float8 k cache beside a 16/32-bit v one, multi-axis positions of both section layouts.
_NORM_CACHE_PLAN = [
    ("contiguous", torch.bfloat16, torch.bfloat16, torch.bfloat16, "paged", 16, 16, 8, 4, 2,
     True, "real", False, "padding", None, 1e-6, 0.0, "own", None, None),
    ("contiguous", torch.float32, torch.float32, None, "flat", 16, 8, 16, 4, 1, False, "random",
     True, "padding", None, 1e-5, 1.0, "float32_k", None, None),
    ("per_head_positions", torch.float64, torch.float64, torch.float64, "paged", 10, 6, 10, 2, 2,
     True, "float64", False, "dense", None, 0.1, 0.5, "own", None, None),
    ("storage_offset_1", torch.float16, torch.float16, torch.float16, "flat", 24, 24, 24, 3, 3,
     False, "float64", False, "scattered", None, 1e-6, 0.0, "mixed", None, None),
    ("fused_qkv", torch.bfloat16, torch.bfloat16, torch.bfloat16, "halves", 16, 16, 16, 4, 2,
     True, "real", False, "padding", None, 1e-6, 1.0, "own", None, None),
    ("contiguous", torch.bfloat16, E4M3, E4M3, "paged", 16, 16, 16, 4, 2, True, "real", False,
     "padding", ("float", 0.1, 0.05), 1e-6, 0.0, "own", (E4M3, 0.05), None),
    ("last_dim_strided", torch.float32, E5M2, E5M2, "flat", 16, 8, 8, 2, 1, False, "random",
     True, "padding", ("tensor_0d", 0.25, 0.5), 1e-6, 0.0, "strided", None, None),
    ("contiguous", torch.float16, E4M3, E5M2, "paged", 24, 16, 8, 2, 2, False, "real", False,
     "scattered", ("tensor_1", 0.004, 0.1), 1e-6, 1.0, "own", (E5M2, 0.5), None),
    ("storage_offset_1", torch.float64, E5M2, E5M2, "padded_rows", 10, 6, 10, 2, 1, True,
     "float64", False, "padding", ("float", 0.125, 0.125), 1e-6, 0.0, "own", None, None),
    ("strided_positions", torch.float32, E4M3, torch.float32, "paged", 16, 16, 16, 2, 2, True,
     "real", True, "padding", ("float", 0.05, None), 1e-6, 0.0, "own", None, None),
    ("one_position", torch.float32, torch.float32, torch.float32, "padded_rows", 16, 12, 16, 4,
     2, False, "real", False, "all_padding", None, 1e-6, 0.0, "own", None, None),
    ("no_tokens", torch.bfloat16, torch.bfloat16, torch.bfloat16, "paged", 16, 16, 16, 4, 2,
     True, "real", False, "dense", None, 1e-6, 0.0, "own", None, None),
    ("contiguous", torch.bfloat16, torch.bfloat16, torch.bfloat16, "paged", 16, 16, 16, 4, 2,
     False, "real", False, "padding", None, 1e-6, 0.0, "own", None, ((2, 3, 3), True, False)),
    ("contiguous", torch.float32, E4M3, None, "flat", 16, 16, 16, 2, 1, True, "random", True,
     "dense", ("tensor_0d", 0.05, None), 1e-6, 0.5, "own", None, ((4, 2, 2), False, True)),
]  # fmt: skip


def norm_cache_sample(
    geometry, dtype, k_cache_dtype, v_cache_dtype, layout, D, rotary_dim, Dv, hq, hkv,
    interleaved, tables, int32, slots, scales, eps, weight_offset, weights, q_fp8, mrope, device,
    T=CACHE_TOKENS,
) -> NormCacheSample:  # fmt: skip
    """One rms_norm_apply_qk_cache sample of a plan row. q is scaled by 3 and k by 0.2: the norm
    must not care."""
    q, k, v, positions = CACHE_GEOMETRIES[geometry](T, hq, hkv, D, Dv, dtype, device)
    with torch.no_grad():
        q.mul_(3.0)
        k.mul_(0.2)
    paged = layout in ("paged", "halves")
    slots_shape = (CACHE_BLOCKS, CACHE_BLOCK_SIZE) if paged else (CACHE_BLOCKS * CACHE_BLOCK_SIZE,)
    kind = "contiguous" if layout in ("flat", "paged") else layout
    k_cache, v_cache, bases = make_caches(
        kind, slots_shape, hkv, D, Dv, k_cache_dtype, v_cache_dtype, device
    )
    pos_dtype = torch.int32 if int32 else torch.int64
    section, mrope_interleaved, axis_first = mrope or (None, False, False)
    if section is not None:
        positions = multi_axis_positions(positions, len(section), pos_dtype, axis_first)
    else:
        positions = positions.to(pos_dtype)
    q_weight, k_weight = _norm_weights(weights, D, dtype, device)
    cos, sin = _tables(tables, rotary_dim, dtype, device)
    form, k_value, v_value = scales or (None, None, None)
    q_dtype, q_value = q_fp8 or (None, None)

    def cache_id(c):
        return "same" if c == dtype else "none" if c is None else _fp8_id(c)

    name = (
        f"rms_norm_apply_qk_cache-{geometry}-{dtype_id(dtype)}-{layout}-"
        f"k_{cache_id(k_cache_dtype)}-v_{cache_id(v_cache_dtype)}-d{D}r{rotary_dim}v{Dv}-"
        f"q{hq}kv{hkv}-{'il' if interleaved else 'half'}-{tables}{'-int32' if int32 else ''}-"
        f"{slots}{f'-{form}' if form else ''}{f'-eps{eps:g}' if eps != 1e-6 else ''}"
        f"{f'-offset{weight_offset:g}' if weight_offset else ''}"
        f"{'' if weights == 'own' else '-w_' + weights}"
        f"{f'-q_{_fp8_id(q_dtype)}' if q_dtype else ''}"
        f"{_mrope_id(section, mrope_interleaved) if section is not None else ''}"
        f"{'-axis_first' if axis_first else ''}"
    )
    return NormCacheSample(
        name, (q, k) if v_cache is None else (q, k, v), q_weight, k_weight, cos, sin, positions,
        k_cache, v_cache, _slot_mapping(slots, q.size(0), device), bases, eps=eps,
        weight_offset=weight_offset, interleaved=interleaved,
        k_scale=None if k_value is None else _scale(form, k_value, device),
        v_scale=None if v_value is None else _scale(form, v_value, device),
        q_dtype=q_dtype, q_scale=None if q_value is None else _scale(form or "float", q_value,
                                                                     device),
        mrope_section=section, mrope_interleaved=mrope_interleaved,
    )  # fmt: skip


def norm_cache_samples(device, requires_grad: bool) -> List[OpSample]:
    """The norm_cache family's samples (none with ``requires_grad``: not differentiable)."""
    if requires_grad:
        return []
    return [norm_cache_sample(*row, device) for row in _NORM_CACHE_PLAN]


register_family("norm_cache", NORM_CACHE_OPS, norm_cache_samples)
