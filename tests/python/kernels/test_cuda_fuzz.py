# SPDX-License-Identifier: BSD-3-Clause
"""CUDA against CPU on random calls (hypothesis): the same views of the same buffers on both
devices, every op, dtype, layout and alignment the CUDA kernel plans differently.

Two halves:

* ``test_fuzz_calls_on_cpu`` runs everywhere: every drawn call on the CPU against a float64 oracle
  computed here from the tables' own values, plus the guard-band checks. It keeps the generator
  and the harness honest where there is no GPU.
* ``test_cuda_matches_cpu`` (needs a GPU) runs each call on both devices: the tails bit for bit,
  the rotated features within the dtype's tolerance of the CPU and of the oracle, nothing written
  outside x's view by ``apply_``, no input changed. ``scripts/gpu_check.sh`` runs it with
  ``ROPE_CUDA_FUZZ_EXAMPLES=5000``.
"""

import os
from dataclasses import dataclass, field

import pytest
import references as ref
import torch
from helpers import TOLERANCES, needs_cuda

import torch_rope

hypothesis = pytest.importorskip("hypothesis", reason="the fuzz needs hypothesis")
st = hypothesis.strategies

CPU_EXAMPLES = int(os.environ.get("ROPE_CPU_FUZZ_EXAMPLES", "150"))
CUDA_EXAMPLES = int(os.environ.get("ROPE_CUDA_FUZZ_EXAMPLES", "300"))
TABLE_LAYOUTS = ["dense", "row-padded", "col-step-2", "transposed", "offset"]


@dataclass
class Layout:
    """Where a view sits in its 1-D buffer: memory order of the dims, padding, offset, expand."""

    order: list  # dims from innermost to outermost in memory
    pads: list  # extra elements added to each dim's stride (by position in `order`)
    inner_step: int = 1
    offset: int = 0
    expanded_dim: int = -1  # a dim given stride 0 (inputs of out-of-place ops only)

    def strides(self, sizes):
        strides = [0] * len(sizes)
        extent = 1
        for i, d in enumerate(self.order):
            strides[d] = self.inner_step if i == 0 else extent + self.pads[i]
            extent = strides[d] * max(sizes[d], 1)
        if 0 <= self.expanded_dim < len(sizes) and sizes[self.expanded_dim] > 1:
            strides[self.expanded_dim] = 0
        return strides

    def describe(self):
        return (
            f"order {self.order} pads {self.pads} step {self.inner_step} "
            f"offset {self.offset} expanded {self.expanded_dim}"
        )


@dataclass
class Call:
    op: str
    dtype: torch.dtype
    table_dtype: torch.dtype
    interleaved: bool
    inverse: bool
    head_dim: int
    rotary_dim: int
    rows: list
    k_rows: list
    pos_sizes: list
    pos_dtype: torch.dtype
    max_seq_len: int
    x_layout: Layout
    k_layout: Layout
    fused_heads_dim: int  # >= 0: q and k are slices of one qkv buffer along this dim
    cos_layout: str
    sin_layout: str
    seed: int
    tags: set = field(default_factory=set)


@st.composite
def layouts(draw, rank, allow_expand):
    order = list(range(rank - 1, -1, -1))
    if rank > 1 and draw(st.integers(0, 9)) == 0:
        order = draw(st.permutations(order))
    elif rank > 2 and draw(st.integers(0, 3)) == 0:
        order = [order[0]] + draw(st.permutations(order[1:]))
    pads = [0] + [draw(st.sampled_from([0, 0, 0, 1, 3, 8, 16])) for _ in range(rank - 1)]
    inner_step = 2 if rank > 0 and draw(st.integers(0, 19)) == 0 else 1
    offset = draw(st.sampled_from([0, 0, 0, 8, 16, 1, 2, 3, 5, 7]))
    expanded = (
        draw(st.integers(0, rank - 2))
        if allow_expand and rank > 1 and draw(st.integers(0, 7)) == 0
        else -1
    )
    return Layout(order, pads, inner_step, offset, expanded)


@st.composite
def calls(draw):
    op = draw(st.sampled_from(["apply", "apply_", "apply_qk"]))
    dtype = draw(st.sampled_from([torch.float64, torch.float32, torch.float16, torch.bfloat16]))
    table_dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    head_dim = draw(
        st.one_of(st.sampled_from([64, 80, 96, 120, 128, 136, 160]), st.integers(1, 72))
    )
    even = head_dim - head_dim % 2
    rotary_dim = draw(st.one_of(st.just(even), st.integers(0, even // 2).map(lambda h: 2 * h)))
    rows = draw(st.lists(st.integers(1, 5), min_size=0, max_size=3))
    if rows and draw(st.integers(0, 4)) == 0:
        rows[draw(st.integers(0, len(rows) - 1))] = draw(st.integers(6, 33))
    pos_rank = draw(st.integers(0, len(rows)))
    pos_sizes = [s if draw(st.booleans()) else 1 for s in rows[len(rows) - pos_rank :]]
    k_rows = list(rows)
    heads = [
        d
        for d in range(len(rows))
        if d < len(rows) - pos_rank or pos_sizes[d - (len(rows) - pos_rank)] == 1
    ]
    fused = -1
    if op == "apply_qk" and heads:
        h = draw(st.sampled_from(heads))
        k_rows[h] = draw(st.integers(1, rows[h] + 2))
        if draw(st.booleans()):
            fused = h
    rank = len(rows) + 1
    return Call(
        op=op,
        dtype=dtype,
        table_dtype=table_dtype,
        interleaved=draw(st.booleans()),
        inverse=draw(st.booleans()),
        head_dim=head_dim,
        rotary_dim=rotary_dim,
        rows=rows,
        k_rows=k_rows,
        pos_sizes=pos_sizes,
        pos_dtype=draw(st.sampled_from([torch.int32, torch.int64])),
        max_seq_len=draw(st.integers(1, 64)),
        x_layout=draw(layouts(rank, op != "apply_")),
        k_layout=draw(layouts(rank, True)),
        fused_heads_dim=fused,
        cos_layout=draw(st.sampled_from(TABLE_LAYOUTS)),
        sin_layout=draw(st.sampled_from(TABLE_LAYOUTS)),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def view_in_buffer(sizes, layout, dtype, gen, device):
    """A view of ``sizes`` laid out as ``layout`` in a random buffer with guard elements."""
    strides = layout.strides(sizes)
    span = 0 if 0 in sizes else 1 + sum((s - 1) * st_ for s, st_ in zip(sizes, strides))
    buffer = torch.randn(layout.offset + span + 5, generator=gen, dtype=torch.float64).to(dtype)
    buffer = buffer.to(device)
    return buffer.as_strided(sizes, strides, layout.offset), buffer


def table_in_layout(values, layout, device):
    """``values`` (max_seq_len, half) in one of the layouts a caller may pass, on ``device``."""
    rows, half = values.shape
    strides, offset = {
        "dense": ((half, 1), 0),
        "row-padded": ((half + 3, 1), 0),
        "col-step-2": ((2 * half, 2), 0),
        "transposed": ((1, rows), 0),
        "offset": ((half, 1), 1),
    }[layout]
    numel = offset + 1 + max(rows - 1, 0) * strides[0] + max(half - 1, 0) * strides[1] + 3
    buffer = torch.zeros(numel, dtype=values.dtype, device=device)
    view = buffer.as_strided((rows, half), strides, offset)
    view.copy_(values.to(device))
    return view


def build(call, device):
    """The call's tensors on ``device``: the same values and layouts for every device."""
    gen = torch.Generator().manual_seed(call.seed)
    x_sizes = call.rows + [call.head_dim]
    k_sizes = call.k_rows + [call.head_dim]
    t = {}
    if call.fused_heads_dim >= 0:
        h = call.fused_heads_dim
        qkv = list(x_sizes)
        qkv[h] = call.rows[h] + 2 * call.k_rows[h]
        both, buffer = view_in_buffer(qkv, call.x_layout, call.dtype, gen, device)
        t["x"] = both.narrow(h, 0, call.rows[h])
        t["k"] = both.narrow(h, call.rows[h], call.k_rows[h])
        t["x_buffer"] = t["k_buffer"] = buffer
    else:
        t["x"], t["x_buffer"] = view_in_buffer(x_sizes, call.x_layout, call.dtype, gen, device)
        if call.op == "apply_qk":
            t["k"], t["k_buffer"] = view_in_buffer(k_sizes, call.k_layout, call.dtype, gen, device)
    positions = torch.randint(
        0, call.max_seq_len, call.pos_sizes, generator=gen, dtype=torch.int64
    ).to(call.pos_dtype)
    t["positions"] = positions.to(device)
    half = call.rotary_dim // 2
    angles = (torch.rand(call.max_seq_len, half, generator=gen, dtype=torch.float64) - 0.5) * 6.3
    t["cos"] = table_in_layout(angles.cos().to(call.table_dtype), call.cos_layout, device)
    t["sin"] = table_in_layout(angles.sin().to(call.table_dtype), call.sin_layout, device)
    return t


def run(call, t):
    """The op on ``t``; returns the results (x after the call for apply_)."""
    kw = dict(interleaved=call.interleaved, inverse=call.inverse)
    if call.op == "apply":
        return [torch_rope.apply(t["x"], t["cos"], t["sin"], t["positions"], **kw)]
    if call.op == "apply_":
        torch_rope.apply_(t["x"], t["cos"], t["sin"], t["positions"], **kw)
        return [t["x"]]
    return list(torch_rope.apply_qk(t["x"], t["k"], t["cos"], t["sin"], t["positions"], **kw))


def outside(buffer, view):
    """The elements of ``buffer`` that ``view`` does not cover."""
    mask = torch.ones(buffer.numel(), dtype=torch.bool)
    mask.as_strided(view.shape, view.stride(), view.storage_offset()).fill_(False)
    return buffer.cpu()[mask]


def bits(t):
    t = t.detach().cpu().contiguous()
    return t.view({8: torch.int64, 4: torch.int32, 2: torch.int16}[t.element_size()])


def check_call(call, device, reference_device=None):
    t = build(call, device)
    before = {k: v.detach().cpu().clone() for k, v in t.items()}
    got = run(call, t)
    names = ["x"] if call.op != "apply_qk" else ["x", "k"]
    # Inputs untouched; apply_ wrote inside x only.
    for key in ("cos", "sin", "positions"):
        assert torch.equal(bits(t[key]), bits(before[key])), f"{key} changed"
    if call.op == "apply_":
        assert torch.equal(
            bits(outside(t["x_buffer"], t["x"])), bits(outside(before["x_buffer"], t["x"]))
        ), "apply_ wrote outside x"
    else:
        for n in names:
            assert torch.equal(bits(t[n + "_buffer"]), bits(before[n + "_buffer"])), f"{n} changed"
    want_other = run(call, build(call, reference_device)) if reference_device else None
    rotary_dim = call.rotary_dim
    for i, n in enumerate(names):
        x_in = before[n]
        out = got[i].cpu()
        assert out.shape == x_in.shape and out.dtype == x_in.dtype
        # The tables' own values (so any table dtype compares tightly).
        want = ref.rope_with_tables(
            x_in,
            before["cos"],
            before["sin"],
            before["positions"],
            interleaved=call.interleaved,
            inverse=call.inverse,
        ).to(call.dtype)
        torch.testing.assert_close(out, want, **TOLERANCES[call.dtype])
        # The tail is the input's, bit for bit.
        assert torch.equal(bits(out[..., rotary_dim:]), bits(x_in[..., rotary_dim:]))
        if want_other is not None:
            other = want_other[i].cpu()
            torch.testing.assert_close(out, other, **TOLERANCES[call.dtype])
            assert torch.equal(bits(out[..., rotary_dim:]), bits(other[..., rotary_dim:]))


SETTINGS = dict(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(hypothesis.HealthCheck),
)


@hypothesis.settings(max_examples=CPU_EXAMPLES, **SETTINGS)
@hypothesis.given(calls())
def test_fuzz_calls_on_cpu(call):
    check_call(call, "cpu")


@needs_cuda
@hypothesis.settings(max_examples=CUDA_EXAMPLES, **SETTINGS)
@hypothesis.given(calls())
def test_cuda_matches_cpu(call):
    check_call(call, "cuda", reference_device="cpu")


def test_the_generator_reaches_every_path():
    """The calls drawn cover what the CUDA kernel plans differently (checked on the strategy
    itself, so it holds with or without a GPU)."""
    seen = set()

    @hypothesis.settings(max_examples=400, **SETTINGS)
    @hypothesis.given(calls())
    def draw(call):
        seen.add(call.op)
        seen.add(str(call.dtype))
        seen.add(f"tables {call.table_dtype}")
        if call.fused_heads_dim >= 0:
            seen.add("fused qkv")
        if call.x_layout.offset % 8:
            seen.add("misaligned offset")
        if call.x_layout.expanded_dim >= 0:
            seen.add("expanded")
        if call.x_layout.inner_step != 1:
            seen.add("inner step 2")
        if call.rotary_dim == 0:
            seen.add("rotary 0")
        if 0 < call.rotary_dim < call.head_dim:
            seen.add("partial rotary")
        if len(call.pos_sizes) < len(call.rows) or 1 in call.pos_sizes:
            seen.add("broadcast positions")
        seen.add(f"cos {call.cos_layout}")
        seen.add(f"sin {call.sin_layout}")

    draw()
    want = {
        "apply",
        "apply_",
        "apply_qk",
        "fused qkv",
        "misaligned offset",
        "expanded",
        "inner step 2",
        "rotary 0",
        "partial rotary",
        "broadcast positions",
        "tables torch.float64",
    } | {f"cos {layout}" for layout in TABLE_LAYOUTS}
    assert want <= seen, f"never drawn: {sorted(want - seen)}"
