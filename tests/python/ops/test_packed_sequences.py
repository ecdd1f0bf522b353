# SPDX-License-Identifier: BSD-3-Clause
"""Packed sequences instead of positions: rope.apply.varlen, apply.freqs_varlen and
their apply_, apply.*_out and apply_qk siblings.

For random packings (empty sequences, length 1, one sequence, thousands of them) and every rank
of cp_size 1, 2, 4 and 8 (TransformerEngine's zigzag layout), the results and the gradients
EQUAL, bit for bit, those of the same op given the positions that references.packed_positions
writes out token by token from the rules. Every bad cu_seqlens / seq_offsets / cp case is
refused, naming the argument, and writes nothing (the catalogue of test_errors.py, as the forms
family; the samples of samples.py run every form through opcheck and compile).
"""

import random

import pytest
import references as ref
import torch
from helpers import cpu_and_cuda, make_tables, needs_cuda

import torch_rope

MAX_SEQ_LEN = 4096


def packing(rng, num_seqs, cp_size, max_len=12, empty=0.2):
    """cu_seqlens (int64) of num_seqs sequences, each length a multiple of 2 cp_size (0 with
    probability `empty`), and their random seq_offsets."""
    unit = 2 * cp_size if cp_size > 1 else 1
    lengths = [
        0 if rng.random() < empty else unit * rng.randint(1, max_len) for _ in range(num_seqs)
    ]
    cu = torch.tensor([0] + lengths).cumsum(0)
    offsets = torch.tensor([rng.randint(0, 100) for _ in range(num_seqs)])
    return cu, offsets


PACKINGS = {
    "several": lambda rng, cp: packing(rng, 7, cp),
    "empty_and_length_one": lambda rng, cp: (
        torch.tensor([0, 0, 2 * cp if cp > 1 else 1, 2 * cp if cp > 1 else 1, 4 * cp + 4 * cp]),
        torch.tensor([3, 0, 5, 1]),
    ),
    "one_sequence": lambda rng, cp: packing(rng, 1, cp, empty=0.0),
    "thousands": lambda rng, cp: packing(rng, 2000 if cp == 1 else 600, cp, max_len=3, empty=0.3),
}


def _call(op, form, x, angles, cu, offsets, cp_size, cp_rank, k=None, interleaved=True):
    """The op under test with packed sequences."""
    kw = dict(cu_seqlens=cu, seq_offsets=offsets, cp_size=cp_size, cp_rank=cp_rank,
              interleaved=interleaved, **angles)  # fmt: skip
    if op == "apply":
        return (torch_rope.apply(x, **kw),)
    if op == "apply_":
        return (torch_rope.apply_(x.clone(), **kw),)
    if op == "apply.out":
        out = torch.empty_like(x)
        return (torch_rope.apply(x, out=out, **kw),)
    return torch_rope.apply_qk(x, k, **kw)


def _call_positions(op, x, angles, positions, k=None, interleaved=True):
    """The same op given the positions the rules give (each token's, over its heads)."""
    kw = dict(interleaved=interleaved, **angles)
    p = positions.view(-1, *([1] * (x.dim() - 2)))
    if "cos" in angles:
        kw = dict(interleaved=interleaved)
        args = (angles["cos"], angles["sin"], p)
    else:
        args = (None, None, p)
    if op == "apply_qk":
        return torch_rope.apply_qk(x, k, *args, **kw)
    return (torch_rope.apply(x, *args, **kw),)


def _angles(form, device, rotary_dim=8):
    if form == "tables":
        cos, sin = make_tables(MAX_SEQ_LEN, rotary_dim, device)
        return dict(cos=cos, sin=sin)
    return dict(freqs=ref.inv_freq(rotary_dim).to(device), attention_factor=0.75)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("form", ["tables", "freqs"])
@pytest.mark.parametrize("op", ["apply", "apply_", "apply.out", "apply_qk"])
@pytest.mark.parametrize("name", list(PACKINGS))
def test_every_rank_equals_the_positions_the_rules_give(name, op, form, device):
    rng = random.Random(f"{name}-{op}-{form}")
    angles = _angles(form, device)
    for cp_size in (1, 2, 4, 8):
        cu, offsets = PACKINGS[name](rng, cp_size)
        tokens = int(cu[-1]) // cp_size
        for cp_rank in range(cp_size):
            positions = ref.packed_positions(cu, offsets, cp_size, cp_rank)
            assert positions.numel() == tokens
            x = torch.randn(tokens, 2, 10, device=device)
            k = torch.randn(tokens, 1, 10, device=device) if op == "apply_qk" else None
            cu_, off_ = cu.to(device), offsets.to(device)
            if rng.random() < 0.5:  # int32 boundaries and offsets too
                cu_, off_ = cu_.int(), off_.int()
            interleaved = rng.random() < 0.5
            got = _call(op, form, x, angles, cu_, off_, cp_size, cp_rank, k, interleaved)
            want = _call_positions(op, x, angles, positions.to(device), k, interleaved)
            for g, w in zip(got, want):
                assert torch.equal(g, w), (name, op, form, cp_size, cp_rank)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("form", ["tables", "freqs"])
def test_gradients_equal_the_positions_form(form, device):
    rng = random.Random(350)
    angles = _angles(form, device)
    if form == "tables":
        angles = {k: v.double() for k, v in angles.items()}
    for cp_size in (1, 2, 4, 8):
        cu, offsets = packing(rng, 9, cp_size)
        tokens = int(cu[-1]) // cp_size
        cp_rank = rng.randrange(cp_size)
        positions = ref.packed_positions(cu, offsets, cp_size, cp_rank).to(device)
        x = torch.randn(tokens, 3, 10, dtype=torch.float64, device=device, requires_grad=True)
        k = torch.randn(tokens, 1, 10, dtype=torch.float64, device=device, requires_grad=True)
        q_out, k_out = torch_rope.apply_qk(
            x, k, cu_seqlens=cu.to(device), seq_offsets=offsets.to(device), cp_size=cp_size,
            cp_rank=cp_rank, **angles,
        )  # fmt: skip
        # The incoming gradients require grad: the rotation is linear, so its backward depends
        # on them alone, and the double backward below differentiates through them.
        gq = torch.randn_like(q_out).requires_grad_()
        gk = torch.randn_like(k_out).requires_grad_()
        got = torch.autograd.grad((q_out, k_out), (x, k), (gq, gk), create_graph=True)
        q_pos, k_pos = _call_positions("apply_qk", x, angles, positions, k)
        want = torch.autograd.grad((q_pos, k_pos), (x, k), (gq, gk), create_graph=True)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        # double backward: the gradient of the gradient (with respect to gq), both ways
        h = torch.randn_like(x)
        gg = torch.autograd.grad(got[0], gq, h)[0]
        ww = torch.autograd.grad(want[0], gq, h)[0]
        assert torch.equal(gg, ww)


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_layouts_of_x(device):
    """(T, D), (T, H, D), a transposed (H, T, D) view, a last-dim-strided x and a q sliced from
    a fused projection: the tokens stay on dim 0."""
    cu = torch.tensor([0, 3, 3, 8], device=device)
    offsets = torch.tensor([0, 4, 1000], device=device)
    positions = ref.packed_positions(cu.cpu(), offsets.cpu()).to(device)
    cos, sin = make_tables(MAX_SEQ_LEN, 8, device)
    xs = {
        "td": torch.randn(8, 12, device=device),
        "thd": torch.randn(8, 3, 12, device=device),
        "htd_transposed": torch.randn(3, 8, 12, device=device).transpose(0, 1),
        "last_dim_strided": torch.randn(8, 3, 12, 2, device=device)[..., 0],
        "fused_qkv": torch.randn(8, 3, 36, device=device)[..., 12:24],
    }
    for name, x in xs.items():
        got = torch_rope.apply(x, cos, sin, cu_seqlens=cu, seq_offsets=offsets)
        p = positions.view(-1, *([1] * (x.dim() - 2)))
        assert torch.equal(got, torch_rope.apply(x, cos, sin, p)), name
        y = x.clone()
        torch_rope.apply_(y, freqs=ref.inv_freq(8).to(device), cu_seqlens=cu, seq_offsets=offsets)
        want = torch_rope.apply(x, freqs=ref.inv_freq(8).to(device), positions=p)
        assert torch.equal(y, want), name


def test_worked_example_of_transformer_engine():
    """cu_seqlens [0, 8, 12], cp_size 2: rank 0 holds positions [0, 1, 6, 7 | 0, 3], rank 1
    [2, 3, 4, 5 | 1, 2] (the rule's worked example in /work notes, computed by hand)."""
    cu = torch.tensor([0, 8, 12], dtype=torch.int32)
    assert ref.packed_positions(cu, None, 2, 0).tolist() == [0, 1, 6, 7, 0, 3]
    assert ref.packed_positions(cu, None, 2, 1).tolist() == [2, 3, 4, 5, 1, 2]
    cos, sin = make_tables(64, 4, "cpu")
    x = torch.randn(6, 4)
    for rank, want in ((0, [0, 1, 6, 7, 0, 3]), (1, [2, 3, 4, 5, 1, 2])):
        got = torch_rope.apply(x, cos, sin, cu_seqlens=cu, cp_size=2, cp_rank=rank)
        assert torch.equal(got, torch_rope.apply(x, cos, sin, torch.tensor(want)))


@needs_cuda
def test_cuda_with_cpu_cu_seqlens_is_checked_on_the_host():
    x = torch.randn(8, 2, 8, device="cuda")
    cos, sin = make_tables(64, 8, "cuda")
    cu = torch.tensor([0, 3, 8])
    got = torch_rope.apply(x, cos, sin, cu_seqlens=cu)
    want = torch_rope.apply(x, cos, sin, ref.packed_positions(cu).cuda().view(8, 1))
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match=r"cu_seqlens\[-1\] must equal x\.size\(0\)"):
        torch_rope.apply(x, cos, sin, cu_seqlens=torch.tensor([0, 3, 9]))


# ---- the Python forms' argument rules (the ops' bad packings: test_errors.py) -----------------


def test_the_largest_offset_that_fits_int64():
    # (one more overflows: test_errors.py's seq_offsets_past_int64)
    x = torch.randn(6, 8)
    y = torch_rope.apply(x, freqs=ref.inv_freq(8), cu_seqlens=torch.tensor([0, 3, 6]),
                         seq_offsets=torch.tensor([0, 2**63 - 3]))  # fmt: skip
    assert torch.isfinite(y).all()


@pytest.mark.parametrize(
    "kwargs,pattern",
    [
        (dict(positions=torch.arange(6).view(6, 1)), "one position source"),
        (dict(mrope_section=[2, 2]), "cannot be combined with cu_seqlens"),
        (dict(attention_factor=2.0), "attention_factor goes with freqs"),
    ],
)
def test_python_forms_refuse_mixed_sources(kwargs, pattern):
    cos, sin = make_tables(64, 8, "cpu")
    x = torch.randn(6, 8)
    with pytest.raises(TypeError, match=pattern):
        torch_rope.apply(x, cos, sin, cu_seqlens=torch.tensor([0, 6]), **kwargs)


def test_python_forms_refuse_missing_or_double_sources():
    cos, sin = make_tables(64, 8, "cpu")
    x = torch.randn(6, 8)
    p = torch.arange(6).view(6, 1)
    with pytest.raises(TypeError, match="not both"):
        torch_rope.apply(x, cos, sin, p, freqs=ref.inv_freq(8))
    with pytest.raises(TypeError, match="give positions or cu_seqlens"):
        torch_rope.apply(x, freqs=ref.inv_freq(8))
    with pytest.raises(TypeError, match="they need cu_seqlens"):
        torch_rope.apply(x, cos, sin, p, seq_offsets=torch.tensor([0]))
    with pytest.raises(TypeError, match="give the cos and sin tables or freqs"):
        torch_rope.apply(x, cos, None, cu_seqlens=torch.tensor([0, 6]))
    with pytest.raises(TypeError, match="cp_size must be an int"):
        torch_rope.apply(x, cos, sin, cu_seqlens=torch.tensor([0, 6]), cp_size=2.0)
