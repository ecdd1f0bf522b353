# SPDX-License-Identifier: BSD-3-Clause
"""Differential fuzzing of every op against the float64 references (references.py), one block
per op family, each with a fast count (every run) and a ``slow`` count.

Hypothesis draws the geometry first (dtypes, layout, rank, head_dim, rotary_dim, the memory layout
of each tensor and table, the shape and dtype of positions, ...) and the data after, from a drawn
seed, so a failure shrinks to a small geometry.

* **rope** (apply, apply_, apply.out, apply_qk; then again with multi-axis positions): the error
  bound follows from the dtypes: the library computes in float32 (float64 for float64 x) and
  rounds once to the storage type. Gradients are checked through the transpose (the same op with
  sin negated, which is the transpose for any tables, rotations or not), and a call with one bad
  position must raise and write nothing.
* **rms_norm** (rms_norm_apply_qk), **kv_cache** (apply_qk_cache), **forms** (the freqs= and
  packed-sequence overloads), **qk_fp8** (apply_qk_fp8, .out), **qk_fp8_dynamic**
  (apply_qk_fp8_dynamic, .out), **mla_cache** (mla_apply_cache) and
  **norm_cache** (rms_norm_apply_qk_cache): each drawn call becomes a sample of samples.py and is
  judged by that family's own check (the one the sample matrix runs); the norm's four gradients
  against the differentiated oracle; bad positions and slots must raise and leave every cache
  byte (and out= buffer) as it was.

A new op family appends a block: a strategy, a check (usually its sample class's), the two
tests, and ``fuzzed(family, *overloads)`` naming what it draws (test_catalogue.py requires every
overload of torch.ops.rope there). A shrunk failure becomes a named regression test
(test_regression_* in test_apply.py).
"""

import math
from dataclasses import dataclass
from typing import Optional, Tuple

import pytest
import references as ref
import torch
from helpers import TOLERANCES, cpu_and_cuda, rotation_error_bound, same_bits
from samples import (
    FormSample,
    KvCacheSample,
    MlaSample,
    NormCacheSample,
    QkFp8DynamicSample,
    QkFp8Sample,
    RmsNormSample,
    dynamic_out_sample,
    fp8_out_buffer,
    make_caches,
    mla_caches,
)

import torch_rope

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

# The overloads each block below fuzzes, by family (test_catalogue.py holds every torch.ops.rope
# overload to a block here).
FUZZED = {}


def fuzzed(family: str, *overloads):
    assert family not in FUZZED, f"family {family} fuzzed twice"
    FUZZED[family] = overloads


# ---- family: rope (apply, apply_, apply.out, apply_qk) ------------------------------------------

FAST_EXAMPLES = 250
SLOW_EXAMPLES = 4000
# SLOW_BUDGET: the slow counts of the four blocks added last (the forms, apply_qk_fp8,
# mla_apply_cache, rms_norm_apply_qk_cache) are 500, not 2,000: at 2,000 the four took 168 s of one
# worker on the 2-core VM, more than the README's test command (20 minutes in all) can give; their
# bit-level matrices are the op-major files' and the host run's.

X_LAYOUTS = [
    "contiguous", "permuted", "padded", "sliced", "offset", "expanded", "last_strided",
    "self_overlapping",
]  # fmt: skip
OUT_LAYOUTS = ["contiguous", "padded", "sliced", "last_strided", "self_overlapping"]
TABLE_LAYOUTS = ["contiguous", "row_padded", "last_strided", "transposed", "offset"]
DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]


@dataclass
class Case:
    op: str  # apply, apply_, apply.out, apply_qk
    dtype: torch.dtype
    table_dtype: torch.dtype
    interleaved: bool
    inverse: bool
    half: int  # rotary_dim // 2
    head_dim: int
    rows: Tuple[int, ...]  # x.shape[:-1]; for apply_qk, q's (k differs in the head dim)
    k_heads: int  # apply_qk: k's size in the last row dim
    x_layout: str
    out_layout: str  # apply.out: layout of out
    cos_layout: str
    sin_layout: str
    max_seq_len: int
    pos_shape: Tuple[int, ...]
    pos_dtype: torch.dtype
    pos_transposed: bool
    bad_position: bool  # inject one out-of-range position (CPU): must raise, write nothing
    grad: bool
    seed: int
    mrope_section: Optional[Tuple[int, ...]] = None  # multi-axis: pos_shape ends in the axis dim
    mrope_interleaved: bool = False

    @property
    def mrope(self) -> dict:
        if self.mrope_section is None:
            return {}
        return dict(
            mrope_section=list(self.mrope_section), mrope_interleaved=self.mrope_interleaved
        )


@st.composite
def cases(draw):
    op = draw(st.sampled_from(["apply", "apply_", "apply.out", "apply_qk"]))
    half = draw(st.integers(0, 40))
    tail = draw(st.integers(0 if half else 1, 12))
    rank = draw(st.integers(1, 4))  # row dims
    rows = tuple(draw(st.lists(st.integers(1, 5), min_size=rank, max_size=rank)))
    if draw(st.integers(0, 19)) == 0:  # now and then an empty tensor
        rows = rows[:-1] + (0,)
    k_heads = draw(st.integers(1, 4))
    # positions broadcast (aligned right) to the row dims; for apply_qk they must also broadcast
    # to k, whose last row dim (heads) differs, so they are 1 there.
    n_pos = draw(st.integers(0, rank))
    pos_shape = []
    for i, size in enumerate(rows[rank - n_pos :]):
        is_heads = op == "apply_qk" and rank - n_pos + i == rank - 1
        pos_shape.append(1 if is_heads or draw(st.booleans()) else size)
    # expand()ed memory is refused by PyTorch's own check before ours; self-overlapping views
    # are drawn for every op: the writing ops must refuse them and write nothing.
    layouts = (
        X_LAYOUTS
        if op in ("apply", "apply_qk")
        else [layout for layout in X_LAYOUTS if layout != "expanded"]
    )
    dtype = draw(st.sampled_from(DTYPES))
    return Case(
        op=op,
        dtype=dtype,
        table_dtype=draw(st.sampled_from([torch.float32, torch.float64])),
        interleaved=draw(st.booleans()),
        inverse=draw(st.booleans()),
        half=half,
        head_dim=2 * half + tail,
        rows=rows,
        k_heads=k_heads,
        x_layout=draw(st.sampled_from(layouts)),
        out_layout=draw(st.sampled_from(OUT_LAYOUTS)),
        cos_layout=draw(st.sampled_from(TABLE_LAYOUTS)),
        sin_layout=draw(st.sampled_from(TABLE_LAYOUTS)),
        max_seq_len=draw(st.integers(1, 70)),
        pos_shape=tuple(pos_shape),
        pos_dtype=draw(st.sampled_from([torch.int32, torch.int64])),
        pos_transposed=draw(st.booleans()),
        bad_position=op in ("apply_", "apply.out") and draw(st.integers(0, 9)) == 0,
        grad=dtype in (torch.float64, torch.float32)
        and op in ("apply", "apply_qk")
        and draw(st.booleans()),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


# ---- building tensors of a given logical shape in a given memory layout ------------------------


def _filled(shape, dtype, device, gen):
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype=dtype, device=device)


def make_with_layout(shape, layout, dtype, device, gen):
    """A tensor of logical `shape` whose memory layout is `layout`; values random."""
    shape = tuple(shape)
    if layout == "contiguous" or len(shape) == 0:
        return _filled(shape, dtype, device, gen)
    if layout == "permuted":  # leading dims in reverse memory order, last dim contiguous
        lead = shape[:-1][::-1]
        t = _filled(lead + shape[-1:], dtype, device, gen)
        n = len(shape) - 1
        return t.permute(*range(n - 1, -1, -1), n)
    if layout == "padded":  # rows further apart than head_dim, starting at an offset
        t = _filled(shape[:-1] + (shape[-1] + 5,), dtype, device, gen)
        return t[..., 3 : 3 + shape[-1]]
    if layout == "sliced":  # every other element of the first dim
        t = _filled((2 * shape[0],) + shape[1:], dtype, device, gen)
        return t[::2]
    if layout == "offset":  # storage offset of one element: misaligned for vector loads
        n = math.prod(shape)
        return _filled((n + 1,), dtype, device, gen)[1:].view(shape)
    if layout == "expanded":  # stride 0 in the first dim
        t = _filled((1,) + shape[1:], dtype, device, gen)
        return t.expand(shape)
    if layout == "last_strided":  # stride 2 in the feature dim: copied once by the op
        t = _filled(shape[:-1] + (2 * shape[-1],), dtype, device, gen)
        return t[..., ::2]
    if layout == "self_overlapping":  # rows of the first dim start head_dim - 1 apart
        strides = list(torch.empty(shape, device="meta").stride())
        if len(shape) >= 2:
            strides[0] = max(shape[-1] - 1, 1)
        extent = 1 + sum((n - 1) * st for n, st in zip(shape, strides)) if all(shape) else 0
        return _filled((extent,), dtype, device, gen).as_strided(shape, strides)
    raise ValueError(layout)


def has_self_overlap(t):
    """Whether two elements of ``t`` share an address: the element offsets, listed and counted
    (the fuzz shapes are small), independently of the library's check."""
    if t.numel() == 0:
        return False
    offsets = torch.zeros((), dtype=torch.long)
    for size, stride in zip(t.shape, t.stride()):
        offsets = offsets.unsqueeze(-1) + torch.arange(size) * stride
    return offsets.unique().numel() < t.numel()


def make_table(rows, half, layout, dtype, device, gen):
    """Arbitrary values (not cos/sin of anything): a swapped table or a wrong column shows.

    The padded and strided layouts slice a parent of the same width (2 * half + 3), as tables cut
    from one wider buffer are: cos and sin then share a row stride while only one has unit last
    stride (the class of the review's defect 1)."""
    width = 2 * half + 3
    if layout == "contiguous":
        return _filled((rows, half), dtype, device, gen)
    if layout == "row_padded":
        return _filled((rows, width), dtype, device, gen)[:, 1 : 1 + half]
    if layout == "last_strided":
        return _filled((rows, width), dtype, device, gen)[:, 1 : 1 + 2 * half : 2]
    if layout == "transposed":
        return _filled((half, rows), dtype, device, gen).t()
    if layout == "offset":
        return _filled((rows * half + 1,), dtype, device, gen)[1:].view(rows, half)
    raise ValueError(layout)


# ---- the reference ---------------------------------------------------------------------------


def reference(x, cos, sin, positions, *, interleaved, inverse, **mrope):
    """float64 rotation of x (on the CPU) by the given tables, gathered at the positions."""
    return ref.rope_with_tables(
        x.detach(), cos, sin, positions, interleaved=interleaved, inverse=inverse, **mrope
    )


def error_bound(x, cos, sin, positions, case, want):
    """|library - reference| allowed per element: one rounding to the storage type, plus a few
    roundings of the float32 (float64 for float64 x) math, relative to the plane's terms
    (|a| + |b|)(|c| + |s|) (helpers.rotation_error_bound). That also covers float64 tables
    rounded to float32 for the math."""
    store_eps = torch.finfo(case.dtype).eps / 2
    math_dtype = torch.float64 if case.dtype == torch.float64 else torch.float32
    bound = store_eps * want.abs() + torch.finfo(case.dtype).tiny
    return bound + rotation_error_bound(
        x, cos, sin, positions, interleaved=case.interleaved, math_dtype=math_dtype, **case.mrope
    )


# ---- the property --------------------------------------------------------------------------


def check_case(case: Case, device: str):
    gen = torch.Generator().manual_seed(case.seed)
    cos = make_table(case.max_seq_len, case.half, case.cos_layout, case.table_dtype, device, gen)
    sin = make_table(case.max_seq_len, case.half, case.sin_layout, case.table_dtype, device, gen)
    pos = torch.randint(0, case.max_seq_len, case.pos_shape, generator=gen).to(case.pos_dtype)
    if case.pos_transposed and pos.dim() >= 2:  # same values, last two dims swapped in memory
        pos = pos.transpose(-1, -2).contiguous().transpose(-1, -2)
    if case.bad_position and device == "cpu" and pos.numel() and math.prod(case.rows):
        # The last entry, through any strides (a transposed pos has no flat view).
        pos[tuple(n - 1 for n in pos.shape)] = case.max_seq_len + 3 if case.seed % 2 else -1
        bad = True
    else:
        bad = False
    pos = pos.to(device)
    kw = dict(interleaved=case.interleaved, inverse=case.inverse, **case.mrope)
    shape = case.rows + (case.head_dim,)
    x = make_with_layout(shape, case.x_layout, case.dtype, device, gen)

    if case.op == "apply_qk":
        k_shape = case.rows[:-1] + (case.k_heads, case.head_dim)
        # q and k as slices of one fused projection (B.., Hq + Hk, D).
        fused = make_with_layout(
            case.rows[:-1] + (case.rows[-1] + case.k_heads, case.head_dim),
            case.x_layout if case.x_layout != "expanded" else "contiguous",
            case.dtype,
            device,
            gen,
        )
        q, k = fused[..., : case.rows[-1], :], fused[..., case.rows[-1] :, :]
        assert k.shape == k_shape
        q_before, k_before = q.clone(), k.clone()
        if case.grad:
            q, k = q.detach().requires_grad_(), k.detach().requires_grad_()
        q_out, k_out = torch_rope.apply_qk(q, k, cos, sin, pos, **kw)
        for inp, out in ((q, q_out), (k, k_out)):
            _assert_rotated(out, inp, cos, sin, pos, case, kw)
        assert torch.equal(q.detach(), q_before) and torch.equal(k.detach(), k_before)
        if case.grad and q.numel() + k.numel():
            gq, gk = torch.randn_like(q_out), torch.randn_like(k_out)
            torch.autograd.backward([q_out, k_out], [gq, gk])
            _assert_transpose(q.grad, gq, cos, sin, pos, case)
            _assert_transpose(k.grad, gk, cos, sin, pos, case)
        return

    x_before = x.clone()
    if case.op == "apply":
        if case.grad:
            x = x.detach().requires_grad_()
        out = torch_rope.apply(x, cos, sin, pos, **kw)
        _assert_rotated(out, x, cos, sin, pos, case, kw)
        assert out.is_contiguous()
        assert torch.equal(x.detach(), x_before), "apply modified its input"
        if case.grad and x.numel():
            g = torch.randn_like(out)
            out.backward(g)
            _assert_transpose(x.grad, g, cos, sin, pos, case)
        return

    if case.op == "apply_":
        if has_self_overlap(x):
            with pytest.raises(RuntimeError, match=r"rope\.apply_: x has overlapping memory"):
                torch_rope.apply_(x, cos, sin, pos, **kw)
            assert torch.equal(x, x_before), "a refused apply_ wrote into x"
            return
        if bad:
            with pytest.raises(IndexError):
                torch_rope.apply_(x, cos, sin, pos, **kw)
            assert torch.equal(x, x_before), "a failed apply_ wrote into x"
            return
        torch_rope.apply_(x, cos, sin, pos, **kw)
        _assert_rotated(x, x_before, cos, sin, pos, case, kw)
        return

    # apply.out
    out = make_with_layout(shape, case.out_layout, case.dtype, device, gen)
    out_before = out.clone()
    if has_self_overlap(out):
        with pytest.raises(RuntimeError, match=r"rope\.apply\.out: out has overlapping memory"):
            torch_rope.apply(x, cos, sin, pos, out=out, **kw)
        assert torch.equal(out, out_before), "a refused out= call wrote into out"
        return
    if bad:
        with pytest.raises(IndexError):
            torch_rope.apply(x, cos, sin, pos, out=out, **kw)
        assert torch.equal(out, out_before), "a failed out= call wrote into out"
        return
    assert torch_rope.apply(x, cos, sin, pos, out=out, **kw) is out
    _assert_rotated(out, x, cos, sin, pos, case, kw)
    assert torch.equal(x, x_before)


def _assert_rotated(out, x, cos, sin, pos, case, kw):
    assert out.shape == x.shape and out.dtype == x.dtype and out.device == x.device
    want = reference(x, cos, sin, pos, **kw)
    got = out.detach().cpu().to(torch.float64)
    bound = error_bound(x, cos, sin, pos, case, want)
    err = (got - want).abs()
    rotary = 2 * case.half
    assert torch.equal(got[..., rotary:], want[..., rotary:]), "pass-through features changed"
    worst = (err - bound).max().item() if err.numel() else 0.0
    assert worst <= 0, f"error exceeds the dtype bound by {worst:.3g} ({case})"


def _assert_transpose(grad, g, cos, sin, pos, case):
    want = reference(
        g, cos, sin, pos, interleaved=case.interleaved, inverse=not case.inverse, **case.mrope
    )
    bound = error_bound(g, cos, sin, pos, case, want)
    err = (grad.cpu().to(torch.float64) - want).abs()
    assert (err <= bound).all(), f"gradient is not the transpose ({case})"


fuzzed(
    "rope",
    torch.ops.rope.apply.default,
    torch.ops.rope.apply_.default,
    torch.ops.rope.apply.out,
    torch.ops.rope.apply_qk.default,
)


@pytest.mark.parametrize("device", cpu_and_cuda())
@settings(max_examples=FAST_EXAMPLES)
@given(case=cases())
def test_fuzz_against_float64_reference(case, device):
    check_case(case, device)


@pytest.mark.slow
@pytest.mark.parametrize("device", cpu_and_cuda())
@settings(max_examples=SLOW_EXAMPLES)
@given(case=cases())
def test_fuzz_against_float64_reference_many(case, device):
    check_case(case, device)


# ---- multi-axis positions (mrope_section) ------------------------------------------------------
# The same geometry, then a section: 1 to 4 axes whose sizes (zeros allowed) add up to the drawn
# rotary_dim / 2, either section layout (interleaved needs 3 axes), and positions with one more,
# trailing, axis dim (stored transposed half the time: the axis dim not innermost).

MROPE_FAST_EXAMPLES = 150
MROPE_SLOW_EXAMPLES = 2000


@st.composite
def multi_axis_cases(draw):
    case = draw(cases())
    num_axes = draw(st.integers(1, 4))
    cuts = sorted(
        draw(st.lists(st.integers(0, case.half), min_size=num_axes - 1, max_size=num_axes - 1))
    )
    bounds = [0] + cuts + [case.half]
    case.mrope_section = tuple(b - a for a, b in zip(bounds, bounds[1:]))
    case.mrope_interleaved = num_axes == 3 and draw(st.booleans())
    case.pos_shape = case.pos_shape + (num_axes,)
    return case


@pytest.mark.parametrize("device", cpu_and_cuda())
@settings(max_examples=MROPE_FAST_EXAMPLES)
@given(case=multi_axis_cases())
def test_fuzz_multi_axis_against_float64_reference(case, device):
    check_case(case, device)


@pytest.mark.slow
@pytest.mark.parametrize("device", cpu_and_cuda())
@settings(max_examples=MROPE_SLOW_EXAMPLES)
@given(case=multi_axis_cases())
def test_fuzz_multi_axis_against_float64_reference_many(case, device):
    check_case(case, device)


# ---- shared by the families below --------------------------------------------------------------


@st.composite
def positions_shape(draw, rows, heads_dim):
    """A positions shape that broadcasts (aligned right) to ``rows``, with a 1 at ``heads_dim``
    (an index into rows, or None) so that it also broadcasts to the other tensor's head count."""
    rank = len(rows)
    n_pos = draw(st.integers(0, rank))
    shape = []
    for i, size in enumerate(rows[rank - n_pos :]):
        shape.append(1 if rank - n_pos + i == heads_dim or draw(st.booleans()) else size)
    return tuple(shape)


@st.composite
def mrope_sections(draw, half):
    """None (one axis) two times in three; else 1 to 4 axes whose sizes (zeros allowed) add up
    to ``half``, and whether the Qwen3-VL interleaving is used (3 axes)."""
    if draw(st.integers(0, 2)):
        return None, False
    num_axes = draw(st.integers(1, 4))
    cuts = sorted(
        draw(st.lists(st.integers(0, half), min_size=num_axes - 1, max_size=num_axes - 1))
    )
    bounds = [0] + cuts + [half]
    section = tuple(b - a for a, b in zip(bounds, bounds[1:]))
    return section, num_axes == 3 and draw(st.booleans())


def make_positions(shape, max_seq_len, dtype, transposed, device, gen):
    pos = torch.randint(0, max_seq_len, shape, generator=gen).to(dtype)
    if transposed and pos.dim() >= 2:  # same values, last two dims swapped in memory
        pos = pos.transpose(-1, -2).contiguous().transpose(-1, -2)
    return pos.to(device)


def poison_last_position(pos, max_seq_len, seed):
    """One out-of-range position, the last entry (a kernel that checked as it went would have
    written everything before it), above the table or negative."""
    pos[tuple(n - 1 for n in pos.shape)] = max_seq_len + 3 if seed % 2 else -1


# ---- family: rms_norm (rms_norm_apply_qk) -------------------------------------------------------
# q and k of any rank and layout (k differs in its heads dim), weights of any floating dtype,
# contiguous or strided, eps and weight_offset, every table layout, one or more axes. Compared by
# the sample matrix's own check (samples.RmsNormSample: the float64 oracle within the dtype's
# tolerance, inputs unchanged); float64 and float32 draws also compare their four gradients with
# the differentiated oracle; a bad position (CPU) must raise.

NORM_FAST_EXAMPLES = 100
NORM_SLOW_EXAMPLES = 2000


@dataclass
class NormCase:
    dtype: torch.dtype
    table_dtype: torch.dtype
    interleaved: bool
    inverse: bool
    half: int
    head_dim: int
    rows: Tuple[int, ...]  # q.shape[:-1]; k's differs in the last (heads) dim
    k_heads: int
    q_layout: str
    k_layout: str
    weight_dtypes: Tuple[torch.dtype, torch.dtype]
    weights_strided: Tuple[bool, bool]
    eps: float
    weight_offset: float
    cos_layout: str
    sin_layout: str
    max_seq_len: int
    pos_shape: Tuple[int, ...]
    pos_dtype: torch.dtype
    pos_transposed: bool
    mrope_section: Optional[Tuple[int, ...]]
    mrope_interleaved: bool
    bad_position: bool
    grad: bool
    seed: int


@st.composite
def norm_cases(draw):
    half = draw(st.integers(0, 40))
    rank = draw(st.integers(1, 4))
    rows = tuple(draw(st.lists(st.integers(1, 5), min_size=rank, max_size=rank)))
    if draw(st.integers(0, 19)) == 0:
        rows = rows[:-1] + (0,)
    pos_shape = draw(positions_shape(rows, rank - 1))
    section, mrope_interleaved = draw(mrope_sections(half))
    if section is not None:
        pos_shape += (len(section),)
    dtype = draw(st.sampled_from(DTYPES))
    float_dtype = st.sampled_from(DTYPES)
    return NormCase(
        dtype=dtype,
        table_dtype=draw(st.sampled_from([torch.float32, torch.float64])),
        interleaved=draw(st.booleans()),
        inverse=draw(st.booleans()),
        half=half,
        head_dim=2 * half + draw(st.integers(0 if half else 1, 12)),
        rows=rows,
        k_heads=draw(st.integers(1, 4)),
        q_layout=draw(st.sampled_from(X_LAYOUTS)),
        k_layout=draw(st.sampled_from(X_LAYOUTS)),
        weight_dtypes=(draw(float_dtype), draw(float_dtype)),
        weights_strided=(draw(st.booleans()), draw(st.booleans())),
        eps=draw(st.sampled_from([1e-6, 1e-5, 0.1, 1.0])),
        weight_offset=draw(st.sampled_from([0.0, 1.0, 0.5])),
        cos_layout=draw(st.sampled_from(TABLE_LAYOUTS)),
        sin_layout=draw(st.sampled_from(TABLE_LAYOUTS)),
        max_seq_len=draw(st.integers(1, 70)),
        pos_shape=pos_shape,
        pos_dtype=draw(st.sampled_from([torch.int32, torch.int64])),
        pos_transposed=draw(st.booleans()),
        mrope_section=section,
        mrope_interleaved=mrope_interleaved,
        bad_position=draw(st.integers(0, 9)) == 0,
        grad=dtype in (torch.float64, torch.float32) and draw(st.booleans()),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def _weight(D, dtype, strided, device, gen):
    w = 1.0 + 0.5 * torch.randn(2 * D if strided else D, generator=gen, dtype=torch.float64)
    w = w.to(dtype).to(device)
    return w[::2] if strided else w


def check_norm_case(case: NormCase, device: str):
    gen = torch.Generator().manual_seed(case.seed)
    cos = make_table(case.max_seq_len, case.half, case.cos_layout, case.table_dtype, device, gen)
    sin = make_table(case.max_seq_len, case.half, case.sin_layout, case.table_dtype, device, gen)
    pos = make_positions(
        case.pos_shape, case.max_seq_len, case.pos_dtype, case.pos_transposed, "cpu", gen
    )
    q = make_with_layout(case.rows + (case.head_dim,), case.q_layout, case.dtype, device, gen)
    k_shape = case.rows[:-1] + (case.k_heads, case.head_dim)
    k = make_with_layout(k_shape, case.k_layout, case.dtype, device, gen)
    weights = tuple(
        _weight(case.head_dim, dtype, strided, device, gen)
        for dtype, strided in zip(case.weight_dtypes, case.weights_strided)
    )
    kw = dict(eps=case.eps, weight_offset=case.weight_offset, interleaved=case.interleaved)
    kw.update(inverse=case.inverse, mrope_interleaved=case.mrope_interleaved)
    if case.bad_position and device == "cpu" and pos.numel() and q.numel() + k.numel():
        poison_last_position(pos, case.max_seq_len, case.seed)
        q_before, k_before = q.clone(), k.clone()
        with pytest.raises(IndexError, match=r"rope\.rms_norm_apply_qk: positions "):
            torch_rope.rms_norm_apply_qk(
                q, k, *weights, cos, sin, pos.to(device), mrope_section=case.mrope_section, **kw
            )
        assert torch.equal(q, q_before) and torch.equal(k, k_before)
        return
    inputs = (q, k, *weights)
    if case.grad:
        inputs = tuple(t.detach().requires_grad_() for t in inputs)
    sample = RmsNormSample(
        f"fuzz-{case.seed}", inputs, cos, sin, pos.to(device), mrope_section=case.mrope_section,
        heads=(case.rows[-1], case.k_heads), **kw,
    )  # fmt: skip
    before = sample.snapshot()
    results = sample.call()
    sample.check(results, before)
    if case.grad and any(out.numel() for out in results):
        grads_out = [torch.randn(out.shape, generator=gen, dtype=torch.float64) for out in results]
        got = torch.autograd.grad(
            results, inputs, [g.to(out) for g, out in zip(grads_out, results)]
        )
        leaves = [x.detach().cpu().double().requires_grad_() for x in inputs]
        want = torch.autograd.grad(sample.expected(tuple(leaves)), leaves, grads_out)
        for grad, expected, x in zip(got, want, inputs):
            assert grad.dtype == x.dtype and grad.shape == x.shape
            # No more precise than the op's math (a float64 weight of a float32 call).
            tolerance = max(TOLERANCES[x.dtype], TOLERANCES[case.dtype], key=lambda t: t["rtol"])
            torch.testing.assert_close(grad.cpu(), expected.to(grad.dtype), **tolerance)


fuzzed("rms_norm", torch.ops.rope.rms_norm_apply_qk.default)


@pytest.mark.parametrize("device", cpu_and_cuda())
@settings(max_examples=NORM_FAST_EXAMPLES)
@given(case=norm_cases())
def test_fuzz_rms_norm_against_float64_reference(case, device):
    check_norm_case(case, device)


@pytest.mark.slow
@pytest.mark.parametrize("device", cpu_and_cuda())
@settings(max_examples=NORM_SLOW_EXAMPLES)
@given(case=norm_cases())
def test_fuzz_rms_norm_against_float64_reference_many(case, device):
    check_norm_case(case, device)


# ---- family: kv_cache (apply_qk_cache) ----------------------------------------------------------
# Random token counts (none included), head counts (MHA, GQA, MQA), head_dims and v head_dims,
# q/k/v layouts (slices of one fused projection among them), positions shapes, table layouts,
# flat or paged caches of any block size, contiguous, with padded rows or halves of one buffer,
# in the sources' dtype or either float8 format (scales as a Python float, a 0-d or a (1,) tensor,
# small enough to saturate now and then), slots in any order with padding, with or without v.
# Compared by the sample matrix's own check (samples.KvCacheSample: q and the stored rows against
# the float64 oracle and the float8 rule, every other byte of the caches' allocations unchanged);
# on the CPU a bad slot (out of range, repeated) or position must raise and write nothing.

CACHE_FAST_EXAMPLES = 150
CACHE_SLOW_EXAMPLES = 3000
CACHE_FORMATS = ["same", torch.float8_e4m3fn, torch.float8_e5m2]
QKV_LAYOUTS = ["contiguous", "fused", "padded", "offset", "last_strided", "permuted"]
BAD_CACHE_CALLS = ["slot_out_of_range", "slot_repeated", "position_out_of_range"]


@dataclass
class CacheCase:
    dtype: torch.dtype
    table_dtype: torch.dtype
    interleaved: bool
    half: int
    head_dim: int
    v_dim: int
    tokens: int
    q_heads: int
    kv_heads: int
    with_v: bool
    k_format: object  # "same" or a float8 dtype
    v_format: object
    slots_shape: Tuple[int, ...]  # (num_slots,) or (num_blocks, block_size)
    cache_layout: str  # contiguous, padded_rows, halves
    qkv_layout: str
    cos_layout: str
    sin_layout: str
    max_seq_len: int
    pos_shape: Tuple[int, ...]
    pos_dtype: torch.dtype
    pos_strided: bool
    padding: Tuple[bool, ...]  # per token: a negative slot
    scale_form: str  # float, tensor_0d, tensor_1
    k_scale: float
    v_scale: float
    bad: Optional[str]  # one of BAD_CACHE_CALLS (CPU): must raise, write nothing
    seed: int


@st.composite
def cache_cases(draw):
    half = draw(st.integers(0, 24))
    tokens = draw(st.integers(0, 7))
    kv_heads = draw(st.integers(1, 3))
    q_heads = kv_heads * draw(st.integers(1, 3))
    with_v = draw(st.booleans())
    k_format = draw(st.sampled_from(CACHE_FORMATS))
    v_format = draw(st.sampled_from(CACHE_FORMATS))
    cache_layout = draw(st.sampled_from(["contiguous", "padded_rows", "halves"]))
    if cache_layout == "halves":  # one buffer: one dtype
        v_format = k_format
    num_slots = tokens + draw(st.integers(0, 8))
    if draw(st.booleans()):  # paged
        block_size = draw(st.integers(1, 5))
        slots_shape = (max(1, -(-num_slots // block_size)), block_size)
    else:
        slots_shape = (max(1, num_slots),)
    # positions broadcast to (T, Hq) and to (T, Hkv): (T, H) only when the counts agree.
    pos_shape = draw(
        st.sampled_from(
            [(tokens, 1), (1, 1), (), (1,)] + ([(tokens, q_heads)] if q_heads == kv_heads else [])
        )
    )
    dtype = draw(st.sampled_from(DTYPES))
    return CacheCase(
        dtype=dtype,
        table_dtype=draw(st.sampled_from([torch.float32, torch.float64])),
        interleaved=draw(st.booleans()),
        half=half,
        head_dim=2 * half + draw(st.integers(0 if half else 1, 8)),
        v_dim=draw(st.integers(1, 20)),
        tokens=tokens,
        q_heads=q_heads,
        kv_heads=kv_heads,
        with_v=with_v,
        k_format=k_format,
        v_format=v_format,
        slots_shape=slots_shape,
        cache_layout=cache_layout,
        qkv_layout=draw(st.sampled_from(QKV_LAYOUTS)),
        cos_layout=draw(st.sampled_from(TABLE_LAYOUTS)),
        sin_layout=draw(st.sampled_from(TABLE_LAYOUTS)),
        max_seq_len=draw(st.integers(1, 70)),
        pos_shape=pos_shape,
        pos_dtype=draw(st.sampled_from([torch.int32, torch.int64])),
        pos_strided=draw(st.booleans()),
        padding=tuple(draw(st.lists(st.booleans(), min_size=tokens, max_size=tokens))),
        scale_form=draw(st.sampled_from(["float", "tensor_0d", "tensor_1"])),
        k_scale=2.0 ** draw(st.integers(-9, 3)) * draw(st.sampled_from([1.0, 0.75, 1.3])),
        v_scale=2.0 ** draw(st.integers(-9, 3)) * draw(st.sampled_from([1.0, 0.75, 1.3])),
        bad=draw(st.sampled_from(BAD_CACHE_CALLS)) if draw(st.integers(0, 9)) == 0 else None,
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def _qkv(case, device, gen):
    """q (T, Hq, D), k (T, Hkv, D), v (T, Hkv, Dv) in the case's layout."""
    T, hq, hkv, D, Dv = case.tokens, case.q_heads, case.kv_heads, case.head_dim, case.v_dim
    if case.qkv_layout == "fused":  # one (T, Hq D + Hkv D + Hkv Dv + 3) projection
        width = (hq + hkv) * D + hkv * Dv
        qkv = _filled((T, width + 3), case.dtype, device, gen)
        q = qkv[:, : hq * D].view(T, hq, D)
        k = qkv[:, hq * D : (hq + hkv) * D].view(T, hkv, D)
        return q, k, qkv[:, (hq + hkv) * D : width].view(T, hkv, Dv)
    return tuple(
        make_with_layout(shape, case.qkv_layout, case.dtype, device, gen)
        for shape in ((T, hq, D), (T, hkv, D), (T, hkv, Dv))
    )


def _slot_mapping(case, bad, gen):
    """Distinct slots, padding tokens negative; ``bad``: the last token's slot past the caches, or
    the first token's slot again."""
    num_slots = math.prod(case.slots_shape)
    perm = torch.randperm(num_slots, generator=gen)[: case.tokens]
    negative = -1 - torch.randint(0, 5, (case.tokens,), generator=gen)
    slots = torch.where(torch.tensor(case.padding, dtype=torch.bool), negative, perm)
    if bad == "slot_out_of_range":
        slots[-1] = num_slots + int(torch.randint(0, 3, (), generator=gen))
    elif bad == "slot_repeated":
        slots[0] = slots[-1] = perm[0]
    return slots


def check_cache_case(case: CacheCase, device: str):
    gen = torch.Generator().manual_seed(case.seed)
    cos = make_table(case.max_seq_len, case.half, case.cos_layout, case.table_dtype, device, gen)
    sin = make_table(case.max_seq_len, case.half, case.sin_layout, case.table_dtype, device, gen)
    q, k, v = _qkv(case, device, gen)
    pos = torch.randint(0, case.max_seq_len, case.pos_shape + (2,), generator=gen)
    pos = (pos[..., 1] if case.pos_strided else pos[..., 0].contiguous()).to(case.pos_dtype)
    bad = case.bad if device == "cpu" else None  # CUDA: device asserts, no host check
    if bad == "position_out_of_range" and not (pos.numel() and case.tokens):
        bad = None
    if case.tokens < {"slot_out_of_range": 1, "slot_repeated": 2}.get(bad, 0):
        bad = None  # no token (no two tokens) to give the bad slot
    if bad == "position_out_of_range":
        poison_last_position(pos, case.max_seq_len, case.seed)
    slot_mapping = _slot_mapping(case, bad, gen)

    def cache_dtype(fmt):
        return case.dtype if fmt == "same" else fmt

    k_cache, v_cache, bases = make_caches(
        case.cache_layout, case.slots_shape, case.kv_heads, case.head_dim, case.v_dim,
        cache_dtype(case.k_format), cache_dtype(case.v_format) if case.with_v else None,
        device, gen,
    )  # fmt: skip

    def scale(fmt, value):
        if fmt == "same":
            return None
        if case.scale_form == "float":
            return value
        t = torch.tensor(value, dtype=torch.float32, device=device)
        return t if case.scale_form == "tensor_0d" else t.view(1)

    k_scale = scale(case.k_format, case.k_scale)
    v_scale = scale(case.v_format, case.v_scale) if case.with_v else None
    sample = KvCacheSample(
        f"fuzz-{case.seed}", (q, k, v) if case.with_v else (q, k), cos, sin, pos.to(device),
        k_cache, v_cache, slot_mapping.to(device), bases, interleaved=case.interleaved,
        k_scale=k_scale, v_scale=v_scale,
    )  # fmt: skip
    before = sample.snapshot()
    if bad is not None:
        message = {
            "slot_out_of_range": r"slot_mapping must be < the caches' slot count",
            "slot_repeated": r"slot_mapping holds slot \d+ twice",
            "position_out_of_range": r"positions must be in \[0, max_seq_len\)",
        }[bad]
        with pytest.raises((IndexError, RuntimeError), match=r"rope\.apply_qk_cache: " + message):
            sample.call()
        _, bases_before = before
        for base, base_before in zip(bases, bases_before):
            assert same_bits(base, base_before), "a call that raised wrote a cache"
        return
    sample.check(sample.call(), before)


fuzzed("kv_cache", torch.ops.rope.apply_qk_cache.default)


@pytest.mark.parametrize("device", cpu_and_cuda())
@settings(max_examples=CACHE_FAST_EXAMPLES)
@given(case=cache_cases())
def test_fuzz_apply_qk_cache_against_float64_reference(case, device):
    check_cache_case(case, device)


@pytest.mark.slow
@pytest.mark.parametrize("device", cpu_and_cuda())
@settings(max_examples=CACHE_SLOW_EXAMPLES)
@given(case=cache_cases())
def test_fuzz_apply_qk_cache_against_float64_reference_many(case, device):
    check_cache_case(case, device)


# ---- family: forms (the freqs= and packed-sequence overloads of the rope ops) ------------------
# Each of apply, apply_, apply.out and apply_qk in each form: freqs= with positions of any shape
# that broadcasts (int32, or int64 up to 2^40; multi-axis sections), the tables or freqs with
# random packings (empty sequences, seq_offsets or none, cp_size 1, 2 or 4 at any rank, int32 or
# int64 boundaries), x of any layout, any attention factor. Compared by the sample matrix's own
# check (samples.FormSample: the float64 oracle, exact angles for freqs=, inputs unchanged).

FORM_FAST_EXAMPLES = 100
FORM_SLOW_EXAMPLES = 500  # see SLOW_BUDGET
FORM_X_LAYOUTS = ["contiguous", "permuted", "padded", "sliced", "offset", "last_strided"]


@dataclass
class FormCase:
    op: str
    form: str  # freqs, varlen, freqs_varlen
    dtype: torch.dtype
    interleaved: bool
    inverse: bool
    half: int
    head_dim: int
    tokens: int
    heads: int  # x (T, heads, D); apply_qk: q's
    k_heads: int
    x_layout: str
    out_layout: str
    lengths: Tuple[int, ...]  # the packed forms: global sequence lengths
    offsets: Optional[Tuple[int, ...]]
    cp_size: int
    cp_rank: int
    int32: bool
    pos_shape: Tuple[int, ...]  # freqs=: positions' shape (before the axis dim)
    far: bool  # freqs=: int64 positions up to 2^40
    mrope_section: Optional[Tuple[int, ...]]
    mrope_interleaved: bool
    theta: float
    attention_factor: float
    table_dtype: torch.dtype
    cos_layout: str
    sin_layout: str
    seed: int


@st.composite
def form_cases(draw):
    op = draw(st.sampled_from(["apply", "apply_", "apply.out", "apply_qk"]))
    form = draw(st.sampled_from(["freqs", "varlen", "freqs_varlen"]))
    half = draw(st.integers(1, 12))
    cp_size = draw(st.sampled_from([1, 2, 4])) if form != "freqs" else 1
    unit = 2 * cp_size if cp_size > 1 else 1
    num_seqs = draw(st.integers(1, 4))
    lengths = tuple(unit * draw(st.integers(0, 3)) for _ in range(num_seqs))
    tokens = sum(lengths) // cp_size if form != "freqs" else draw(st.integers(1, 6))
    heads = draw(st.integers(1, 3))
    k_heads = draw(st.integers(1, 3)) if op == "apply_qk" else heads
    rows = (tokens, heads)
    # positions broadcast to q's rows and to k's: a 1 in the heads dim for apply_qk.
    pos_shape = draw(positions_shape(rows, 1 if op == "apply_qk" else None))
    section, mrope_interleaved = (None, False)
    if form == "freqs":
        section, mrope_interleaved = draw(mrope_sections(half))
    with_offsets = form != "freqs" and draw(st.booleans())
    return FormCase(
        op=op,
        form=form,
        dtype=draw(st.sampled_from(DTYPES)),
        interleaved=draw(st.booleans()),
        inverse=draw(st.booleans()),
        half=half,
        head_dim=2 * half + draw(st.integers(0, 6)),
        tokens=tokens,
        heads=heads,
        k_heads=k_heads,
        x_layout=draw(st.sampled_from(FORM_X_LAYOUTS)),
        out_layout=draw(st.sampled_from(["contiguous", "padded", "last_strided"])),
        lengths=lengths,
        offsets=tuple(draw(st.integers(0, 20)) for _ in lengths) if with_offsets else None,
        cp_size=cp_size,
        cp_rank=draw(st.integers(0, cp_size - 1)),
        int32=draw(st.booleans()),
        pos_shape=pos_shape,
        far=draw(st.booleans()),
        mrope_section=section,
        mrope_interleaved=mrope_interleaved,
        theta=draw(st.sampled_from([1e4, 5e5])),
        attention_factor=draw(st.sampled_from([1.0, 0.75, 1.3])),
        table_dtype=draw(st.sampled_from([torch.float32, torch.float64])),
        cos_layout=draw(st.sampled_from(TABLE_LAYOUTS)),
        sin_layout=draw(st.sampled_from(TABLE_LAYOUTS)),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def check_form_case(case: FormCase, device: str):
    gen = torch.Generator().manual_seed(case.seed)
    index_dtype = torch.int32 if case.int32 else torch.int64
    positions = packed = None
    max_pos = 0
    if case.form == "freqs":
        shape = case.pos_shape + ((len(case.mrope_section),) if case.mrope_section else ())
        top = 2**40 if case.far and not case.int32 else 70
        positions = make_positions(shape, top, index_dtype, False, device, gen)
    else:
        cu = torch.tensor([0, *case.lengths]).cumsum(0)
        offsets = None if case.offsets is None else torch.tensor(case.offsets)
        packed = {
            "cu_seqlens": cu.to(index_dtype).to(device),
            "seq_offsets": None if offsets is None else offsets.to(index_dtype).to(device),
            "cp_size": case.cp_size,
            "cp_rank": case.cp_rank,
        }
        rows = ref.packed_positions(cu, offsets, case.cp_size, case.cp_rank)
        max_pos = int(rows.max()) if rows.numel() else 0
    if "freqs" in case.form:
        angles = {
            "freqs": ref.inv_freq(2 * case.half, case.theta).to(device),
            "attention_factor": case.attention_factor,
        }
    else:  # arbitrary tables, long enough for the packing's last position
        rows = max_pos + 1 + int(torch.randint(0, 3, (), generator=gen))
        angles = {
            name: make_table(rows, case.half, layout, case.table_dtype, device, gen)
            for name, layout in (("cos", case.cos_layout), ("sin", case.sin_layout))
        }
    x_shape = (case.tokens, case.heads, case.head_dim)
    inputs = (make_with_layout(x_shape, case.x_layout, case.dtype, device, gen),)
    if case.op == "apply_qk":
        k_shape = (case.tokens, case.k_heads, case.head_dim)
        inputs += (make_with_layout(k_shape, case.x_layout, case.dtype, device, gen),)
    out = None
    if case.op == "apply.out":
        out = make_with_layout(x_shape, case.out_layout, case.dtype, device, gen)
    sample = FormSample(
        f"fuzz-{case.seed}", case.op, case.form, inputs, angles, positions, packed,
        case.interleaved, case.inverse, out=out, mrope_section=case.mrope_section,
        mrope_interleaved=case.mrope_interleaved,
    )  # fmt: skip
    before = sample.snapshot()
    sample.check(sample.call(), before)


fuzzed(
    "forms",
    *(
        getattr(getattr(torch.ops.rope, op), form)
        for op in ("apply", "apply_", "apply_qk")
        for form in ("freqs", "varlen", "freqs_varlen")
    ),
    torch.ops.rope.apply.freqs_out,
    torch.ops.rope.apply.varlen_out,
    torch.ops.rope.apply.freqs_varlen_out,
)


@pytest.mark.parametrize("device", cpu_and_cuda())
@settings(max_examples=FORM_FAST_EXAMPLES)
@given(case=form_cases())
def test_fuzz_forms_against_float64_reference(case, device):
    check_form_case(case, device)


@pytest.mark.slow
@pytest.mark.parametrize("device", cpu_and_cuda())
@settings(max_examples=FORM_SLOW_EXAMPLES)
@given(case=form_cases())
def test_fuzz_forms_against_float64_reference_many(case, device):
    check_form_case(case, device)


# ---- shared by the serving fusions' blocks -----------------------------------------------------

FP8_FORMATS = [torch.float8_e4m3fn, torch.float8_e5m2]
FUSION_LAYOUTS = ["contiguous", "padded", "offset", "last_strided", "permuted", "sliced"]


def _draw_scale(draw):
    return 2.0 ** draw(st.integers(-6, 3)) * draw(st.sampled_from([1.0, 0.75, 1.3]))


def _scale_of(form, value, device):
    if form == "float":
        return value
    t = torch.tensor(value, dtype=torch.float32, device=device)
    return t if form == "tensor_0d" else t.view(1)


def _refused_writes_nothing(sample, message, op):
    """The call raises naming the op, and every allocation it would write keeps its bits."""
    _, bases_before = sample.snapshot()
    with pytest.raises((IndexError, RuntimeError), match=rf"rope\.{op}: " + message):
        sample.call()
    for base, base_before in zip(sample.bases, bases_before):
        assert same_bits(base, base_before), "a call that raised wrote"


BAD_MESSAGES = {
    "slot_out_of_range": r"slot_mapping must be < the caches' slot count",
    "slot_repeated": r"slot_mapping holds slot \d+ twice",
    # (multi-axis positions name the axis: "positions of axis 0 (positions[..., 0]) must be in")
    "position_out_of_range": r"positions (of axis \d+ \(positions\[\.\.\., \d+\]\) )?must be in "
    r"\[0, max_seq_len\)",
}


# ---- family: qk_fp8 (apply_qk_fp8, apply_qk_fp8.out) -------------------------------------------
# Any token and head counts (GQA, MQA), head_dim and rotary_dim, no-RoPE parts of any width or
# none, q and k of any layout, positions of any broadcasting shape (multi-axis too), every table
# layout, both float8 formats, both scale rules, every scale form, new outputs or out= buffers
# with padding around them. Compared by the sample matrix's own check (samples.QkFp8Sample); on
# the CPU a bad position must raise and leave the out= buffers as they were.

QK_FP8_FAST_EXAMPLES = 100
QK_FP8_SLOW_EXAMPLES = 500  # see SLOW_BUDGET


@st.composite
def qk_fp8_cases(draw):
    half = draw(st.integers(0, 16))
    tokens = draw(st.integers(0, 6))
    k_heads = draw(st.integers(1, 3))
    q_heads = k_heads * draw(st.integers(1, 3))
    pos_shape = draw(
        st.sampled_from(
            [(tokens, 1), (1, 1), (), (1,)] + ([(tokens, q_heads)] if q_heads == k_heads else [])
        )
    )
    section, mrope_interleaved = draw(mrope_sections(half)) if half else (None, False)
    return dict(
        dtype=draw(st.sampled_from(DTYPES)),
        fp8=draw(st.sampled_from(FP8_FORMATS)),
        half=half,
        head_dim=2 * half + draw(st.integers(0 if half else 1, 8)),
        tokens=tokens,
        q_heads=q_heads,
        k_heads=k_heads,
        nope=(draw(st.sampled_from([None, 4, 9])), draw(st.sampled_from([None, 3, 8]))),
        layouts=(draw(st.sampled_from(FUSION_LAYOUTS)), draw(st.sampled_from(FUSION_LAYOUTS))),
        interleaved=draw(st.booleans()),
        multiply=draw(st.booleans()),
        scale_form=draw(st.sampled_from(["float", "tensor_0d", "tensor_1", None])),
        scales=(_draw_scale(draw), _draw_scale(draw)),
        pos_shape=pos_shape,
        pos_dtype=draw(st.sampled_from([torch.int32, torch.int64])),
        mrope=(section, mrope_interleaved),
        table=(
            draw(st.sampled_from([torch.float32, torch.float64])),
            draw(st.sampled_from(TABLE_LAYOUTS)),
            draw(st.sampled_from(TABLE_LAYOUTS)),
        ),
        max_seq_len=draw(st.integers(1, 70)),
        out=draw(st.booleans()),
        bad_position=draw(st.integers(0, 9)) == 0,
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def check_qk_fp8_case(case: dict, device: str):
    gen = torch.Generator().manual_seed(case["seed"])
    T, hq, hk, D = case["tokens"], case["q_heads"], case["k_heads"], case["head_dim"]
    table_dtype, cos_layout, sin_layout = case["table"]
    cos = make_table(case["max_seq_len"], case["half"], cos_layout, table_dtype, device, gen)
    sin = make_table(case["max_seq_len"], case["half"], sin_layout, table_dtype, device, gen)
    section, mrope_interleaved = case["mrope"]
    shape = case["pos_shape"] + ((len(section),) if section else ())
    pos = make_positions(shape, case["max_seq_len"], case["pos_dtype"], False, "cpu", gen)
    q = make_with_layout((T, hq, D), case["layouts"][0], case["dtype"], device, gen)
    k = make_with_layout((T, hk, D), case["layouts"][1], case["dtype"], device, gen)
    nq, nk = case["nope"]
    q_nope = None if nq is None else make_with_layout((T, hq, nq), "padded", case["dtype"],
                                                      device, gen)  # fmt: skip
    k_nope = None if nk is None else make_with_layout((T, hk, nk), "contiguous", case["dtype"],
                                                      device, gen)  # fmt: skip
    form, fp8 = case["scale_form"], case["fp8"]
    q_scale, k_scale = (None, None) if form is None else (
        _scale_of(form, value, device) for value in case["scales"])  # fmt: skip
    outs, bases = None, ()
    if case["out"]:
        made = [None if x is None else fp8_out_buffer(x.shape, fp8, device)
                for x in (q, k, q_nope, k_nope)]  # fmt: skip
        outs = tuple(None if m is None else m[0] for m in made)
        bases = tuple(m[1] for m in made if m is not None)
    bad = case["bad_position"] and device == "cpu" and pos.numel() and T
    if bad:
        poison_last_position(pos, case["max_seq_len"], case["seed"])
    sample = QkFp8Sample(
        f"fuzz-{case['seed']}", "apply_qk_fp8.out" if outs else "apply_qk_fp8", (q, k), cos, sin,
        pos.to(device), fp8, q_nope=q_nope, k_nope=k_nope, q_scale=q_scale, k_scale=k_scale,
        interleaved=case["interleaved"], multiply_by_scale=case["multiply"],
        mrope_section=section, mrope_interleaved=mrope_interleaved, outs=outs, bases=bases,
    )  # fmt: skip
    if bad:
        op = "apply_qk_fp8.out" if outs else "apply_qk_fp8"
        _refused_writes_nothing(sample, BAD_MESSAGES["position_out_of_range"], op)
        return
    before = sample.snapshot()
    sample.check(sample.call(), before)


fuzzed("qk_fp8", torch.ops.rope.apply_qk_fp8.default, torch.ops.rope.apply_qk_fp8.out)


@pytest.mark.parametrize("device", cpu_and_cuda())
@settings(max_examples=QK_FP8_FAST_EXAMPLES)
@given(case=qk_fp8_cases())
def test_fuzz_apply_qk_fp8_against_float64_reference(case, device):
    check_qk_fp8_case(case, device)


@pytest.mark.slow
@pytest.mark.parametrize("device", cpu_and_cuda())
@settings(max_examples=QK_FP8_SLOW_EXAMPLES)
@given(case=qk_fp8_cases())
def test_fuzz_apply_qk_fp8_against_float64_reference_many(case, device):
    check_qk_fp8_case(case, device)


# ---- family: qk_fp8_dynamic (apply_qk_fp8_dynamic, .out) ---------------------------------------
# apply_qk_fp8's cases (their nope parts and static scales unused) with scales per row or per
# token, float32 or powers of two, forward or inverse, new outputs or out= buffers. Compared by
# samples.QkFp8DynamicSample's check; on the CPU a bad position must raise and write nothing.

QK_FP8_DYNAMIC_FAST_EXAMPLES = 60


@st.composite
def qk_fp8_dynamic_cases(draw):
    case = draw(qk_fp8_cases())
    case.update(
        per_token=draw(st.booleans()),
        pow2=draw(st.booleans()),
        inverse=draw(st.booleans()),
        out=draw(st.booleans()),
    )
    return case


def check_qk_fp8_dynamic_case(case: dict, device: str):
    gen = torch.Generator().manual_seed(case["seed"])
    T, hq, hk, D = case["tokens"], case["q_heads"], case["k_heads"], case["head_dim"]
    table_dtype, cos_layout, sin_layout = case["table"]
    cos = make_table(case["max_seq_len"], case["half"], cos_layout, table_dtype, device, gen)
    sin = make_table(case["max_seq_len"], case["half"], sin_layout, table_dtype, device, gen)
    section, mrope_interleaved = case["mrope"]
    shape = case["pos_shape"] + ((len(section),) if section else ())
    pos = make_positions(shape, case["max_seq_len"], case["pos_dtype"], False, "cpu", gen)
    q = make_with_layout((T, hq, D), case["layouts"][0], case["dtype"], device, gen)
    k = make_with_layout((T, hk, D), case["layouts"][1], case["dtype"], device, gen)
    bad = case["bad_position"] and device == "cpu" and pos.numel() and T
    if bad:
        poison_last_position(pos, case["max_seq_len"], case["seed"])
    sample = QkFp8DynamicSample(
        f"fuzz-{case['seed']}", "apply_qk_fp8_dynamic", (q, k), cos, sin, pos.to(device),
        case["fp8"], per_token=case["per_token"], pow2_scale=case["pow2"],
        interleaved=case["interleaved"], mrope_section=section,
        mrope_interleaved=mrope_interleaved, inverse=case["inverse"],
    )  # fmt: skip
    if case["out"]:
        sample = dynamic_out_sample(sample)
    if bad:
        message = BAD_MESSAGES["position_out_of_range"]
        op = "apply_qk_fp8_dynamic" + (".out" if case["out"] else "")
        bases_before = [b.clone() for b in sample.bases]
        with pytest.raises(IndexError, match=rf"rope\.{op}: " + message):
            sample.call()
        assert all(same_bits(b, c) for b, c in zip(sample.bases, bases_before)), "written"
        return
    before = sample.snapshot()
    sample.check(sample.call(), before)


fuzzed(
    "qk_fp8_dynamic",
    torch.ops.rope.apply_qk_fp8_dynamic.default,
    torch.ops.rope.apply_qk_fp8_dynamic.out,
)


@pytest.mark.parametrize("device", cpu_and_cuda())
@settings(max_examples=QK_FP8_DYNAMIC_FAST_EXAMPLES)
@given(case=qk_fp8_dynamic_cases())
def test_fuzz_apply_qk_fp8_dynamic_against_float64_reference(case, device):
    check_qk_fp8_dynamic_case(case, device)


# ---- family: mla_cache (mla_apply_cache) -------------------------------------------------------
# Any token and head counts, kv_lora_rank, rope dim and q_nope width (or none), one cache or two
# (or the two column slices of one buffer), flat or paged of any block size, in the sources'
# dtype or either float8 format with every scale form and both rules, float8 q outputs, the GQA
# rows with v, slots in any order with padding, every table layout. Compared by the sample
# matrix's own check (samples.MlaSample); on the CPU a bad slot or position must raise and write
# nothing.

MLA_FAST_EXAMPLES = 100
MLA_SLOW_EXAMPLES = 500  # see SLOW_BUDGET


@st.composite
def mla_cases(draw):
    tokens = draw(st.integers(0, 7))
    key_heads = draw(st.sampled_from([None, None, 1, 2]))
    num_slots = tokens + draw(st.integers(0, 8))
    block_size = draw(st.sampled_from([None, 1, 3, 4]))
    return dict(
        dtype=draw(st.sampled_from(DTYPES)),
        cache_format=draw(st.sampled_from(["same", *FP8_FORMATS])),
        layout=draw(st.sampled_from(["one", "two", "slices"])),
        block_size=block_size,
        num_slots=max(1, num_slots),
        tokens=tokens,
        heads=draw(st.integers(0, 4)),
        key_heads=key_heads,
        L=draw(st.integers(1, 40)),
        half=draw(st.integers(1, 16)),
        N=draw(st.sampled_from([None, 3, 8])),
        Dv=draw(st.sampled_from([None, 5, 16])) if key_heads else None,
        interleaved=draw(st.booleans()),
        padding=tuple(draw(st.lists(st.booleans(), min_size=tokens, max_size=tokens))),
        scale_form=draw(st.sampled_from(["float", "tensor_0d", "tensor_1"])),
        scales=(_draw_scale(draw), _draw_scale(draw), _draw_scale(draw)),
        q_fp8=draw(st.sampled_from([None, None, *FP8_FORMATS])),
        multiply=draw(st.booleans()),
        pos_shape=draw(st.sampled_from([(tokens, 1), (1, 1)])),
        pos_dtype=draw(st.sampled_from([torch.int32, torch.int64])),
        table=(
            draw(st.sampled_from([torch.float32, torch.float64])),
            draw(st.sampled_from(TABLE_LAYOUTS)),
            draw(st.sampled_from(TABLE_LAYOUTS)),
        ),
        max_seq_len=draw(st.integers(1, 70)),
        bad=draw(st.sampled_from(BAD_CACHE_CALLS)) if draw(st.integers(0, 9)) == 0 else None,
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def _fuzz_slots(num_slots, padding, bad, gen):
    """Distinct slots, padding tokens negative; ``bad``: the last token's slot past the caches, or
    the first token's slot again."""
    T = len(padding)
    perm = torch.randperm(num_slots, generator=gen)[:T]
    negative = -1 - torch.randint(0, 5, (T,), generator=gen)
    slots = torch.where(torch.tensor(padding, dtype=torch.bool), negative, perm)
    if bad == "slot_out_of_range":
        slots[-1] = num_slots + int(torch.randint(0, 3, (), generator=gen))
    elif bad == "slot_repeated":
        slots[0] = slots[-1] = perm[0]
    return slots


def _usable_bad(bad, device, tokens, positions):
    bad = bad if device == "cpu" else None  # CUDA: device asserts, no host check
    if bad == "position_out_of_range" and not (positions.numel() and tokens):
        return None
    if tokens < {"slot_out_of_range": 1, "slot_repeated": 2}.get(bad, 0):
        return None  # no token (no two tokens) to give the bad slot
    return bad


def check_mla_case(case: dict, device: str):
    gen = torch.Generator().manual_seed(case["seed"])
    T, H, hk, L, R = case["tokens"], case["heads"], case["key_heads"], case["L"], 2 * case["half"]
    dtype = case["dtype"]
    table_dtype, cos_layout, sin_layout = case["table"]
    cos = make_table(case["max_seq_len"], case["half"], cos_layout, table_dtype, device, gen)
    sin = make_table(case["max_seq_len"], case["half"], sin_layout, table_dtype, device, gen)
    pos = make_positions(case["pos_shape"], case["max_seq_len"], case["pos_dtype"], False, "cpu",
                         gen)  # fmt: skip
    bad = _usable_bad(case["bad"], device, T, pos)
    if bad == "position_out_of_range":
        poison_last_position(pos, case["max_seq_len"], case["seed"])
    key = (T,) if hk is None else (T, hk)
    q_pe = _filled((T, H, R), dtype, device, gen)
    k_pe = _filled((*key, R), dtype, device, gen)
    kv_c = _filled((*key, L), dtype, device, gen)
    q_nope = None if case["N"] is None else _filled((T, H, case["N"]), dtype, device, gen)
    v = None if case["Dv"] is None else _filled((*key, case["Dv"]), dtype, device, gen)
    bs, n = case["block_size"], case["num_slots"]
    lead = (n,) if bs is None else (-(-n // bs), bs)
    fmt = case["cache_format"]
    cache_dtype = dtype if fmt == "same" else fmt
    kv_cache, kpe_cache, v_cache, bases = mla_caches(
        case["layout"], lead, hk, L, R, case["Dv"], cache_dtype, device, gen
    )
    slots = _fuzz_slots(math.prod(lead), case["padding"], bad, gen)
    form = case["scale_form"]
    kv_value, v_value, q_value = case["scales"]
    fp8_cache = fmt != "same"
    sample = MlaSample(
        f"fuzz-{case['seed']}", (q_pe, k_pe, kv_c), cos, sin, pos.to(device), kv_cache, kpe_cache,
        slots.to(device), bases, bs is not None, q_nope=q_nope, v=v, v_cache=v_cache,
        interleaved=case["interleaved"],
        kv_scale=_scale_of(form, kv_value, device) if fp8_cache else None,
        v_scale=_scale_of(form, v_value, device) if fp8_cache and v is not None else None,
        q_dtype=case["q_fp8"],
        q_scale=None if case["q_fp8"] is None else _scale_of(form, q_value, device),
        multiply_by_scale=case["multiply"],
    )  # fmt: skip
    if bad is not None:
        _refused_writes_nothing(sample, BAD_MESSAGES[bad], "mla_apply_cache")
        return
    before = sample.snapshot()
    sample.check(sample.call(), before)


fuzzed("mla_cache", torch.ops.rope.mla_apply_cache.default)


@pytest.mark.parametrize("device", cpu_and_cuda())
@settings(max_examples=MLA_FAST_EXAMPLES)
@given(case=mla_cases())
def test_fuzz_mla_apply_cache_against_float64_reference(case, device):
    check_mla_case(case, device)


@pytest.mark.slow
@pytest.mark.parametrize("device", cpu_and_cuda())
@settings(max_examples=MLA_SLOW_EXAMPLES)
@given(case=mla_cases())
def test_fuzz_mla_apply_cache_against_float64_reference_many(case, device):
    check_mla_case(case, device)


# ---- family: norm_cache (rms_norm_apply_qk_cache) ----------------------------------------------
# The kv_cache block's draws (tokens, heads, layouts, caches of every format, layout and paging,
# slots, scales, bad calls), with the norm's weights of any dtype, contiguous or strided, eps and
# weight_offset, a float8 q of either format, and multi-axis positions. Compared by the sample
# matrix's own check (samples.NormCacheSample).

NORM_CACHE_FAST_EXAMPLES = 100
NORM_CACHE_SLOW_EXAMPLES = 500  # see SLOW_BUDGET


@st.composite
def norm_cache_cases(draw):
    case = draw(cache_cases())
    section, mrope_interleaved = (None, False)
    if case.half and case.pos_shape:
        section, mrope_interleaved = draw(mrope_sections(case.half))
    float_dtype = st.sampled_from(DTYPES)
    return case, dict(
        weight_dtypes=(draw(float_dtype), draw(float_dtype)),
        weights_strided=(draw(st.booleans()), draw(st.booleans())),
        eps=draw(st.sampled_from([1e-6, 1e-5, 0.1, 1.0])),
        weight_offset=draw(st.sampled_from([0.0, 1.0, 0.5])),
        q_fp8=draw(st.sampled_from([None, None, *FP8_FORMATS])),
        q_scale=_draw_scale(draw),
        mrope=(section, mrope_interleaved),
    )


def check_norm_cache_case(drawn, device: str):
    case, norm = drawn
    gen = torch.Generator().manual_seed(case.seed)
    cos = make_table(case.max_seq_len, case.half, case.cos_layout, case.table_dtype, device, gen)
    sin = make_table(case.max_seq_len, case.half, case.sin_layout, case.table_dtype, device, gen)
    q, k, v = _qkv(case, device, gen)
    section, mrope_interleaved = norm["mrope"]
    shape = case.pos_shape + ((len(section),) if section else ())
    pos = make_positions(shape, case.max_seq_len, case.pos_dtype, case.pos_strided, "cpu", gen)
    bad = _usable_bad(case.bad, device, case.tokens, pos)
    if bad == "position_out_of_range":
        poison_last_position(pos, case.max_seq_len, case.seed)
    slot_mapping = _slot_mapping(case, bad, gen)

    def cache_dtype(fmt):
        return case.dtype if fmt == "same" else fmt

    k_cache, v_cache, bases = make_caches(
        case.cache_layout, case.slots_shape, case.kv_heads, case.head_dim, case.v_dim,
        cache_dtype(case.k_format), cache_dtype(case.v_format) if case.with_v else None,
        device, gen,
    )  # fmt: skip
    weights = tuple(
        _weight(case.head_dim, dtype, strided, device, gen)
        for dtype, strided in zip(norm["weight_dtypes"], norm["weights_strided"])
    )
    k_scale = None if case.k_format == "same" else _scale_of(case.scale_form, case.k_scale,
                                                             device)  # fmt: skip
    v_scale = None
    if case.with_v and case.v_format != "same":
        v_scale = _scale_of(case.scale_form, case.v_scale, device)
    q_dtype = norm["q_fp8"]
    sample = NormCacheSample(
        f"fuzz-{case.seed}", (q, k, v) if case.with_v else (q, k), *weights, cos, sin,
        pos.to(device), k_cache, v_cache, slot_mapping.to(device), bases, eps=norm["eps"],
        weight_offset=norm["weight_offset"], interleaved=case.interleaved, k_scale=k_scale,
        v_scale=v_scale, q_dtype=q_dtype,
        q_scale=None if q_dtype is None else _scale_of(case.scale_form, norm["q_scale"], device),
        mrope_section=section, mrope_interleaved=mrope_interleaved,
    )  # fmt: skip
    if bad is not None:
        _refused_writes_nothing(sample, BAD_MESSAGES[bad], "rms_norm_apply_qk_cache")
        return
    before = sample.snapshot()
    sample.check(sample.call(), before)


fuzzed("norm_cache", torch.ops.rope.rms_norm_apply_qk_cache.default)


@pytest.mark.parametrize("device", cpu_and_cuda())
@settings(max_examples=NORM_CACHE_FAST_EXAMPLES)
@given(drawn=norm_cache_cases())
def test_fuzz_rms_norm_apply_qk_cache_against_float64_reference(drawn, device):
    check_norm_cache_case(drawn, device)


@pytest.mark.slow
@pytest.mark.parametrize("device", cpu_and_cuda())
@settings(max_examples=NORM_CACHE_SLOW_EXAMPLES)
@given(drawn=norm_cache_cases())
def test_fuzz_rms_norm_apply_qk_cache_against_float64_reference_many(drawn, device):
    check_norm_cache_case(drawn, device)
