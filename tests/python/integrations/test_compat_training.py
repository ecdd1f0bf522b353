# SPDX-License-Identifier: BSD-3-Clause
"""torch_rope.compat's training entry points under their peers' names, against float64
references written here from each peer's documented semantics (never torch_rope itself):

* TransformerEngine's ``apply_rotary_pos_emb(t, freqs, tensor_format, start_positions,
  interleaved, fused, cu_seqlens, cp_size, cp_rank)``: ``freqs`` are per-feature angles
  ``(s2, 1, 1, d2)`` (each plane's angle twice: ``cat(a, a)`` for the half split, each angle
  repeated in place for adjacent pairs), feature ``i`` of a token at position ``p`` becomes
  ``x[i] cos f[p, i] + rotate_half(x)[i] sin f[p, i]``; the features past ``d2`` pass through.
  Positions: the token's index in its sequence plus ``start_positions[b]``; with context
  parallelism the zigzag rule of TE's kernel, ``j + (j < c ? r c : L cp - (r + 1) c - c)`` for
  local index ``j`` of a local length ``L = 2c``.
* flash-attn's ``apply_rotary_emb(x, cos, sin, interleaved, inplace, seqlen_offsets, cu_seqlens,
  max_seqlen)``: ``cos``/``sin`` ``(seqlen_ro, R/2)`` read at ``p = s + offset`` (varlen: the
  index in the sequence plus the sequence's offset); planes ``(k, k + R/2)`` or ``(2k, 2k + 1)``,
  both reading column ``k``; ``inplace`` returns ``x`` itself.

Gradients: the reference is differentiable, so ``torch.autograd.grad`` of both is compared."""

import math

import pytest
import torch
from helpers import TOLERANCES, cpu_and_cuda, dtype_id

import torch_rope.compat as compat

DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
LAYOUTS = pytest.mark.parametrize("interleaved", [False, True], ids=["half_split", "adjacent"])


def assert_close_to(got, want):
    """``got`` equals the float64 ``want`` rounded to ``got``'s dtype, within a unit or so."""
    assert got.dtype in DTYPES
    torch.testing.assert_close(got.detach().cpu(), want.to(got.dtype), **TOLERANCES[got.dtype])


def rotate_half_features(x, interleaved):
    """The partner of each feature with its sign: (-x2, x1) for the half split, (-x[2k+1], x[2k])
    for adjacent pairs."""
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack([-x2, x1], dim=-1).flatten(-2)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


# --------------------------------------------------------------------------------------------
# TransformerEngine
# --------------------------------------------------------------------------------------------


def te_freqs(s2, d2, interleaved, base=10000.0, device="cpu"):
    """TE's RotaryPositionEmbedding output: float32 angles (s2, 1, 1, d2), each plane's angle
    duplicated in the layout ``interleaved`` asks for."""
    inv_freq = 1.0 / base ** (torch.arange(0, d2, 2, dtype=torch.float32) / d2)
    angles = torch.outer(torch.arange(s2, dtype=torch.float32), inv_freq)
    if interleaved:
        angles = angles.repeat_interleave(2, dim=-1)
    else:
        angles = torch.cat([angles, angles], dim=-1)
    return angles.view(s2, 1, 1, d2).to(device)


def te_position(j, seq_len, start, cp_size, cp_rank):
    """The position of local index ``j`` of a sequence whose local length is ``seq_len``: TE's
    kernel expression."""
    if cp_size == 1:
        return j + start
    c = seq_len // 2
    return j + start + (cp_rank * c if j < c else seq_len * cp_size - (cp_rank + 1) * c - c)


def te_rotate_tokens(x, angles, positions, interleaved):
    """x (..., d) float64 at per-token positions (x.shape[:-1] broadcast); angles (s2, d2)."""
    d2 = angles.size(-1)
    f = angles.double()[positions]  # (..., d2)
    rot, rest = x[..., :d2], x[..., d2:]
    out = rot * torch.cos(f) + rotate_half_features(rot, interleaved) * torch.sin(f)
    return torch.cat([out, rest], dim=-1)


def te_reference(
    t,
    freqs,
    tensor_format="sbhd",
    start_positions=None,
    interleaved=False,
    cu_seqlens=None,
    cp_size=1,
    cp_rank=0,
):
    """TE's apply_rotary_pos_emb in float64 on the CPU (differentiable in ``t``)."""
    x = t.cpu().double()
    angles = freqs.detach().cpu().view(freqs.size(0), freqs.size(-1))
    starts = [0] * 4096 if start_positions is None else start_positions.tolist()
    if tensor_format == "thd":
        cu = cu_seqlens.tolist()
        pos = []
        for b in range(len(cu) - 1):
            seq_len = (cu[b + 1] - cu[b]) // cp_size
            pos += [te_position(j, seq_len, starts[b], cp_size, cp_rank) for j in range(seq_len)]
        positions = torch.tensor(pos, dtype=torch.long).view(-1, 1)  # over the heads
        return te_rotate_tokens(x, angles, positions, interleaved)
    s = x.size(0) if tensor_format == "sbhd" else x.size(1)
    b = x.size(1) if tensor_format == "sbhd" else x.size(0)
    positions = torch.tensor(
        [[te_position(j, s, starts[i], cp_size, cp_rank) for j in range(s)] for i in range(b)]
    )  # (b, s)
    if tensor_format == "sbhd":
        positions = positions.t()
    return te_rotate_tokens(x, angles, positions.unsqueeze(-1), interleaved)


TE_FORMAT_SHAPES = {"sbhd": (5, 3, 2, 16), "bshd": (3, 5, 2, 16)}


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@LAYOUTS
@pytest.mark.parametrize("tensor_format", ["sbhd", "bshd"])
@pytest.mark.parametrize("d2", [16, 8], ids=["full", "partial"])
@pytest.mark.parametrize("with_start", [False, True], ids=["no_start", "start_positions"])
def test_te_sbhd_bshd(tensor_format, interleaved, dtype, d2, with_start, device):
    t = torch.randn(TE_FORMAT_SHAPES[tensor_format], dtype=dtype, device=device)
    batch = t.size(1) if tensor_format == "sbhd" else t.size(0)
    start = torch.tensor([0, 7, 2], device=device)[:batch] if with_start else None
    freqs = te_freqs(16, d2, interleaved, device=device)
    out = compat.apply_rotary_pos_emb(
        t, freqs, tensor_format=tensor_format, start_positions=start, interleaved=interleaved
    )
    assert out.shape == t.shape and out.device == t.device
    want = te_reference(t, freqs, tensor_format, start, interleaved)
    assert_close_to(out, want)
    torch.testing.assert_close(out[..., d2:], t[..., d2:], rtol=0, atol=0)  # passed through


@pytest.mark.parametrize("device", cpu_and_cuda())
@LAYOUTS
def test_te_layout_of_freqs_small_case(interleaved, device):
    # s=4, b=1, h=1, d=8 with d2=4 (peer_semantics TE-1/TE-2), angles p * (0.5, 0.05): a wrapper
    # that read freqs as [cos | sin] or took the wrong column as a plane's angle fails here.
    theta = torch.tensor([0.5, 0.05])
    a = torch.outer(torch.arange(16.0), theta)
    a = a.repeat_interleave(2, dim=-1) if interleaved else torch.cat([a, a], dim=-1)
    freqs = a.view(16, 1, 1, 4).to(device)
    t = torch.randn(4, 1, 1, 8, dtype=torch.float64, device=device)
    out = compat.apply_rotary_pos_emb(t, freqs, interleaved=interleaved).cpu()
    x = t.cpu()
    for p in range(4):
        for k in range(2):
            ia, ib = (2 * k, 2 * k + 1) if interleaved else (k, k + 2)
            c, s = math.cos(p * theta[k].item()), math.sin(p * theta[k].item())
            xa, xb = x[p, 0, 0, ia].item(), x[p, 0, 0, ib].item()
            assert out[p, 0, 0, ia].item() == pytest.approx(xa * c - xb * s, abs=1e-6)
            assert out[p, 0, 0, ib].item() == pytest.approx(xa * s + xb * c, abs=1e-6)
    assert torch.equal(out[..., 4:], x[..., 4:])


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_te_bshd_equals_sbhd_transposed_and_fused_changes_nothing(device):
    t = torch.randn(2, 3, 1, 4, device=device)
    start = torch.tensor([0, 5], device=device)
    freqs = te_freqs(16, 4, False, device=device)
    bshd = compat.apply_rotary_pos_emb(t, freqs, "bshd", start)
    sbhd = compat.apply_rotary_pos_emb(t.transpose(0, 1), freqs, "sbhd", start, fused=True)
    torch.testing.assert_close(bshd, sbhd.transpose(0, 1), rtol=0, atol=0)
    unfused = compat.apply_rotary_pos_emb(t.transpose(0, 1), freqs, "sbhd", start, fused=False)
    torch.testing.assert_close(sbhd, unfused, rtol=0, atol=0)


# Global (padded) lengths of packed sequences: an empty one, one of length 1 (cp_size 1 only),
# and lengths divisible by 2 cp_size for the CP ranks.
THD_PACKINGS = {
    1: [3, 0, 1, 6, 2],
    2: [8, 0, 4, 12],
    4: [16, 8, 0, 24],
}


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@LAYOUTS
@pytest.mark.parametrize(
    "cp_size,cp_rank", [(1, 0), (2, 0), (2, 1), (4, 0), (4, 1), (4, 2), (4, 3)]
)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
def test_te_thd_packed_and_context_parallel(
    cp_size, cp_rank, interleaved, dtype, index_dtype, device
):
    lengths = THD_PACKINGS[cp_size]
    cu = torch.tensor([0] + lengths, dtype=index_dtype).cumsum(0).to(index_dtype).to(device)
    start = torch.tensor([4, 0, 9, 1], dtype=index_dtype, device=device)[: len(lengths)]
    if cp_size == 1:
        start = torch.tensor([4, 0, 9, 1, 2], dtype=index_dtype, device=device)
    total = sum(lengths) // cp_size
    t = torch.randn(total, 3, 16, dtype=dtype, device=device)
    freqs = te_freqs(48, 12, interleaved, device=device)  # partial: 12 of 16
    for start_positions in (None, start):
        out = compat.apply_rotary_pos_emb(
            t,
            freqs,
            "thd",
            start_positions,
            interleaved,
            cu_seqlens=cu,
            cp_size=cp_size,
            cp_rank=cp_rank,
        )
        want = te_reference(t, freqs, "thd", start_positions, interleaved, cu, cp_size, cp_rank)
        assert_close_to(out, want)


def test_te_thd_worked_zigzag_positions():
    # peer_semantics 3.4: cu_seqlens [0, 8, 12], cp 2: rank 0 holds positions [0,1,6,7 | 0,3],
    # rank 1 [2,3,4,5 | 1,2]; with start_positions [10, 20] rank 0 is [10,11,16,17 | 20,23].
    # Angles p * 1 on one plane: the rotation of (1, 0) is (cos p, sin p).
    freqs = torch.arange(32.0).view(32, 1, 1, 1).repeat(1, 1, 1, 2)
    t = torch.tensor([1.0, 0.0], dtype=torch.float64).repeat(6, 1, 1)
    cu = torch.tensor([0, 8, 12], dtype=torch.int32)
    cases = [
        (0, None, [0, 1, 6, 7, 0, 3]),
        (1, None, [2, 3, 4, 5, 1, 2]),
        (0, torch.tensor([10, 20], dtype=torch.int32), [10, 11, 16, 17, 20, 23]),
    ]
    for rank, start, positions in cases:
        out = compat.apply_rotary_pos_emb(t, freqs, "thd", start, cu_seqlens=cu, cp_size=2,
                                          cp_rank=rank)  # fmt: skip
        p = torch.tensor(positions, dtype=torch.float64)
        want = torch.stack([torch.cos(p), torch.sin(p)], dim=-1).view(6, 1, 2)
        torch.testing.assert_close(out, want, rtol=0, atol=1e-6)


def test_te_cp_ranks_reassemble_the_whole_sequence():
    # Every rank of cp_size 4 rotates its two chunks; put back in order, they equal the
    # cp_size 1 rotation of the whole sequence (bshd, s = 16 global, 4 local per rank).
    full = torch.randn(2, 16, 2, 8, dtype=torch.float64)
    freqs = te_freqs(16, 8, False)
    want = compat.apply_rotary_pos_emb(full, freqs, "bshd")
    torch.testing.assert_close(want, te_reference(full, freqs, "bshd"))
    chunks = full.chunk(8, dim=1)
    got = [None] * 8
    for r in range(4):
        local = torch.cat([chunks[r], chunks[7 - r]], dim=1)
        out = compat.apply_rotary_pos_emb(local, freqs, "bshd", cp_size=4, cp_rank=r)
        got[r], got[7 - r] = out.chunk(2, dim=1)
    torch.testing.assert_close(torch.cat(got, dim=1), want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@LAYOUTS
@pytest.mark.parametrize("tensor_format", ["sbhd", "bshd", "thd"])
def test_te_gradient(tensor_format, interleaved, dtype, device):
    freqs = te_freqs(32, 12, interleaved, device=device).requires_grad_()
    kw = {}
    if tensor_format == "thd":
        shape = (12, 2, 16)
        kw = dict(cu_seqlens=torch.tensor([0, 8, 8, 24], device=device), cp_size=2, cp_rank=1)
        kw["start_positions"] = torch.tensor([1, 0, 3], device=device)
    else:
        shape = TE_FORMAT_SHAPES[tensor_format][:3] + (16,)
        batch = shape[1 if tensor_format == "sbhd" else 0]
        kw["start_positions"] = torch.tensor([2, 0, 5], device=device)[:batch]
    t = torch.randn(shape, dtype=dtype, device=device, requires_grad=True)
    g = torch.randn(shape, dtype=dtype, device=device)
    out = compat.apply_rotary_pos_emb(t, freqs, tensor_format, interleaved=interleaved, **kw)
    (grad,) = torch.autograd.grad(out, t, g)
    t64 = t.detach().cpu().double().requires_grad_()
    want = te_reference(t64, freqs, tensor_format, interleaved=interleaved, **kw)
    (want_grad,) = torch.autograd.grad(want, t64, g.cpu().double())
    assert grad.dtype == dtype
    assert_close_to(grad, want_grad)
    # No gradient to the angles, as TE's fused path: they are detached, not differentiated.
    assert freqs.grad is None


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda t, f: compat.apply_rotary_pos_emb(t, f, "hbsd"), "tensor_format"),
        (lambda t, f: compat.apply_rotary_pos_emb(t, f.view(16, 8)), "freqs"),
        (lambda t, f: compat.apply_rotary_pos_emb(t, f.view(16, 1, 1, 8)[:, :, :, :7]), "freqs"),
        (lambda t, f: compat.apply_rotary_pos_emb(t[0], f), r"t must be 4-D"),
        (lambda t, f: compat.apply_rotary_pos_emb(t, f[:4]), "freqs"),  # 4 rows < s = 5
        (lambda t, f: compat.apply_rotary_pos_emb(t[..., :6], f), "freqs"),  # d2 = 8 > d = 6
        (lambda t, f: compat.apply_rotary_pos_emb(t[:, 0], f, "thd"), "cu_seqlens"),
        (
            lambda t, f: compat.apply_rotary_pos_emb(t, f, start_positions=torch.tensor([1, 2])),
            "start_positions",
        ),
        (
            lambda t, f: compat.apply_rotary_pos_emb(
                t, f, start_positions=torch.tensor([1.0, 2, 3])
            ),
            "start_positions",
        ),
        (lambda t, f: compat.apply_rotary_pos_emb(t[:4], f, cp_size=2, cp_rank=2), "cp_rank"),
        (lambda t, f: compat.apply_rotary_pos_emb(t, f, cp_size=2), "even"),  # s = 5
        (lambda t, f: compat.apply_rotary_pos_emb(t, f, cp_size=0), "cp_size"),
        (
            lambda t, f: compat.apply_rotary_pos_emb(
                t[:, 0],
                f,
                "thd",
                cu_seqlens=torch.tensor([0, 2, 4]),  # 5 rows, not 4
            ),
            "cu_seqlens",
        ),
    ],
    ids=[
        "format",
        "freqs_2d",
        "odd_d2",
        "t_3d",
        "freqs_too_short",
        "d2_over_d",
        "thd_without_cu_seqlens",
        "start_wrong_length",
        "start_float",
        "cp_rank_out_of_range",
        "cp_odd_length",
        "cp_size_zero",
        "cu_seqlens_wrong_end",
    ],
)
def test_te_bad_arguments(call, match):
    t = torch.randn(5, 3, 2, 8)
    freqs = te_freqs(16, 8, False)
    with pytest.raises((ValueError, TypeError, RuntimeError), match=match):
        call(t, freqs)


def test_te_refuses_angles_that_are_not_duplicated():
    # TE's kernel turns each feature by its own angle; only duplicated angles are a rotation,
    # and the wrapper reads one angle per plane, so it refuses others (checked on the CPU).
    t = torch.randn(4, 1, 1, 4)
    freqs = torch.rand(8, 1, 1, 4)
    with pytest.raises(ValueError, match="freqs"):
        compat.apply_rotary_pos_emb(t, freqs)


# --------------------------------------------------------------------------------------------
# flash-attn
# --------------------------------------------------------------------------------------------


def fa_tables(seqlen_ro, rotary_dim, dtype=torch.float32, device="cpu", base=10000.0):
    inv_freq = 1.0 / base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    angles = torch.outer(torch.arange(seqlen_ro, dtype=torch.float64), inv_freq)
    return torch.cos(angles).to(dtype).to(device), torch.sin(angles).to(dtype).to(device)


def fa_rotate(x, cos, sin, positions, interleaved):
    """x (..., D) float64, positions broadcast over x.shape[:-1]; planes read column k."""
    half = cos.size(-1)
    c, s = cos.double().cpu()[positions], sin.double().cpu()[positions]
    rot, rest = x[..., : 2 * half], x[..., 2 * half :]
    if interleaved:
        c, s = c.repeat_interleave(2, dim=-1), s.repeat_interleave(2, dim=-1)
    else:
        c, s = torch.cat([c, c], dim=-1), torch.cat([s, s], dim=-1)
    out = rot * c + rotate_half_features(rot, interleaved) * s
    return torch.cat([out, rest], dim=-1)


def fa_reference(x, cos, sin, interleaved=False, seqlen_offsets=0, cu_seqlens=None):
    x64 = x.cpu().double()
    if cu_seqlens is None:
        batch, seqlen = x.shape[:2]
        offsets = (
            [seqlen_offsets] * batch if isinstance(seqlen_offsets, int) else seqlen_offsets.tolist()
        )
        positions = torch.tensor([[s + offsets[b] for s in range(seqlen)] for b in range(batch)])
        return fa_rotate(x64, cos, sin, positions.unsqueeze(-1), interleaved)
    cu = cu_seqlens.tolist()
    count = len(cu) - 1
    offsets = (
        [seqlen_offsets] * count if isinstance(seqlen_offsets, int) else seqlen_offsets.tolist()
    )
    positions = [t - cu[b] + offsets[b] for b in range(count) for t in range(cu[b], cu[b + 1])]
    return fa_rotate(x64, cos, sin, torch.tensor(positions).view(-1, 1), interleaved)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@LAYOUTS
@pytest.mark.parametrize("rotary_dim", [16, 10], ids=["full", "partial"])
@pytest.mark.parametrize("offsets", ["zero", "int", "tensor"])
@pytest.mark.parametrize("inplace", [False, True], ids=["out_of_place", "inplace"])
def test_fa_batched(dtype, interleaved, rotary_dim, offsets, inplace, device):
    x = torch.randn(3, 5, 2, 16, dtype=dtype, device=device)
    seqlen_offsets = {
        "zero": 0,
        "int": 4,
        "tensor": torch.tensor([0, 6, 2], dtype=torch.int32, device=device),
    }[offsets]
    cos, sin = fa_tables(12, rotary_dim, dtype, device)  # in x's dtype, as flash-attn's callers
    want = fa_reference(x, cos, sin, interleaved, seqlen_offsets)
    before = x.clone()
    out = compat.apply_rotary_emb(x, cos, sin, interleaved, inplace, seqlen_offsets)
    if inplace:
        assert out is x
    else:
        assert out is not x and torch.equal(x, before)
    assert_close_to(out, want)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@LAYOUTS
@pytest.mark.parametrize("offsets", ["zero", "int", "tensor"])
@pytest.mark.parametrize("inplace", [False, True], ids=["out_of_place", "inplace"])
def test_fa_varlen(dtype, interleaved, offsets, inplace, device):
    cu = torch.tensor([0, 2, 2, 3, 8], dtype=torch.int32, device=device)  # an empty sequence
    x = torch.randn(8, 3, 16, dtype=dtype, device=device)
    seqlen_offsets = {
        "zero": 0,
        "int": 4,
        "tensor": torch.tensor([1, 0, 7, 3], device=device),
    }[offsets]
    cos, sin = fa_tables(16, 12, device=device)  # partial: 12 of 16
    want = fa_reference(x, cos, sin, interleaved, seqlen_offsets, cu)
    out = compat.apply_rotary_emb(
        x, cos, sin, interleaved, inplace, seqlen_offsets, cu_seqlens=cu, max_seqlen=5
    )
    assert (out is x) == inplace
    assert_close_to(out, want)


def test_fa_worked_varlen_positions():
    # peer_semantics FA-2: cu_seqlens [0, 2, 5], seqlen_offsets 4: positions [4, 5, 4, 5, 6].
    cos = torch.cos(torch.arange(16.0)).view(16, 1)
    sin = torch.sin(torch.arange(16.0)).view(16, 1)
    x = torch.tensor([1.0, 0.0]).repeat(5, 1, 1)
    out = compat.apply_rotary_emb(x, cos, sin, seqlen_offsets=4,
                                  cu_seqlens=torch.tensor([0, 2, 5]), max_seqlen=3)  # fmt: skip
    p = torch.tensor([4.0, 5, 4, 5, 6])
    torch.testing.assert_close(out, torch.stack([p.cos(), p.sin()], -1).view(5, 1, 2))


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@LAYOUTS
@pytest.mark.parametrize("varlen", [False, True], ids=["batched", "varlen"])
def test_fa_gradient(dtype, interleaved, varlen, device):
    cos, sin = fa_tables(16, 12, device=device)
    cos.requires_grad_()
    if varlen:
        cu = torch.tensor([0, 3, 3, 7], device=device)
        kw = dict(seqlen_offsets=torch.tensor([2, 0, 5], device=device), cu_seqlens=cu,
                  max_seqlen=4)  # fmt: skip
        shape = (7, 2, 16)
    else:
        kw = dict(seqlen_offsets=3)
        shape = (2, 4, 2, 16)
    x = torch.randn(shape, dtype=dtype, device=device, requires_grad=True)
    g = torch.randn(shape, dtype=dtype, device=device)
    (grad,) = torch.autograd.grad(compat.apply_rotary_emb(x, cos, sin, interleaved, **kw), x, g)
    x64 = x.detach().cpu().double().requires_grad_()
    offsets, cu = kw["seqlen_offsets"], kw.get("cu_seqlens")
    want = fa_reference(x64, cos.detach(), sin, interleaved, offsets, cu)
    (want_grad,) = torch.autograd.grad(want, x64, g.cpu().double())
    assert_close_to(grad, want_grad)
    assert cos.grad is None  # no gradient to the tables, as flash-attn


def test_fa_inplace_on_a_non_leaf_keeps_the_gradient():
    cos, sin = fa_tables(8, 8)
    leaf = torch.randn(1, 4, 2, 8, dtype=torch.float64, requires_grad=True)
    x = leaf * 1.0
    out = compat.apply_rotary_emb(x, cos, sin, inplace=True)
    assert out is x
    g = torch.randn_like(out)
    (grad,) = torch.autograd.grad(out, leaf, g)
    l64 = leaf.detach().clone().requires_grad_()
    (want,) = torch.autograd.grad(fa_reference(l64, cos, sin), l64, g)
    torch.testing.assert_close(grad, want)


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda x, c, s: compat.apply_rotary_emb(x[0], c, s), "x must be"),
        (lambda x, c, s: compat.apply_rotary_emb(x, c, s[:, :2]), "sin"),
        (lambda x, c, s: compat.apply_rotary_emb(x, c.view(-1), s.view(-1)), "cos"),
        (lambda x, c, s: compat.apply_rotary_emb(x[..., :4], c, s), "cos"),  # R = 8 > D = 4
        (lambda x, c, s: compat.apply_rotary_emb(x, c, s, seqlen_offsets=8), "seqlen_offsets"),
        (
            lambda x, c, s: compat.apply_rotary_emb(x, c, s, seqlen_offsets=torch.tensor([1, 2])),
            "seqlen_offsets",
        ),
        (
            lambda x, c, s: compat.apply_rotary_emb(x, c, s, seqlen_offsets=torch.tensor([1.0])),
            "seqlen_offsets",
        ),
        (
            lambda x, c, s: compat.apply_rotary_emb(x[0], c, s, cu_seqlens=torch.tensor([0, 4])),
            "max_seqlen",
        ),
        (
            lambda x, c, s: compat.apply_rotary_emb(
                x[0], c, s, cu_seqlens=torch.tensor([0, 4]), max_seqlen=20
            ),
            "max_seqlen",
        ),
        (
            lambda x, c, s: compat.apply_rotary_emb(
                x, c, s, cu_seqlens=torch.tensor([0, 4]), max_seqlen=4
            ),
            "x must be",
        ),
        (
            lambda x, c, s: compat.apply_rotary_emb(
                x[0],
                c,
                s,
                cu_seqlens=torch.tensor([0, 3]),
                max_seqlen=4,  # 4 rows, not 3
            ),
            "cu_seqlens",
        ),
    ],
    ids=[
        "x_3d",
        "sin_shape",
        "cos_1d",
        "rotary_over_head_dim",
        "int_offset_past_table",
        "offsets_wrong_length",
        "offsets_float",
        "varlen_without_max_seqlen",
        "max_seqlen_past_table",
        "varlen_x_4d",
        "cu_seqlens_wrong_end",
    ],
)
def test_fa_bad_arguments(call, match):
    x = torch.randn(1, 4, 2, 8)
    cos, sin = fa_tables(10, 8)
    before = x.clone()
    with pytest.raises((ValueError, TypeError, RuntimeError), match=match):
        call(x, cos, sin)
    assert torch.equal(x, before)


def test_fa_tensor_offset_past_the_table_is_refused_in_place_untouched():
    # flash-attn silently leaves such tokens unrotated (cos 1, sin 0); torch_rope refuses the call
    # and writes nothing.
    x = torch.randn(2, 4, 1, 8)
    before = x.clone()
    cos, sin = fa_tables(8, 8)
    with pytest.raises((ValueError, IndexError, RuntimeError), match="positions"):
        compat.apply_rotary_emb(x, cos, sin, inplace=True, seqlen_offsets=torch.tensor([0, 6]))
    assert torch.equal(x, before)


def test_compile_fullgraph():
    # Both entry points trace without a graph break (TE's angle check reads values: skipped while
    # tracing) and give the eager result.
    freqs = te_freqs(16, 8, False)
    t = torch.randn(4, 2, 8)
    cu = torch.tensor([0, 4, 8])
    cos, sin = fa_tables(16, 8)
    x = torch.randn(2, 4, 2, 8)
    offsets = torch.tensor([0, 3])
    calls = [
        lambda: compat.apply_rotary_pos_emb(t, freqs, "thd", cu_seqlens=cu, cp_size=2, cp_rank=1),
        lambda: compat.apply_rotary_emb(x, cos, sin, seqlen_offsets=offsets),
    ]
    for call in calls:
        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(call, fullgraph=True)(), call())


def test_te_angles_written_in_place_are_read_again():
    # The tables of the last freqs are reused while freqs is unchanged; an in-place write must
    # not leave the old angles in use.
    t = torch.randn(4, 1, 1, 8, dtype=torch.float64)
    freqs = te_freqs(8, 8, False)
    first = compat.apply_rotary_pos_emb(t, freqs)
    torch.testing.assert_close(first, te_reference(t, freqs))
    freqs.mul_(3.0)
    second = compat.apply_rotary_pos_emb(t, freqs)
    torch.testing.assert_close(second, te_reference(t, freqs))
    assert not torch.allclose(first, second)


@pytest.mark.parametrize("tensor_format", ["sbhd", "bshd"])
@pytest.mark.parametrize("cp_size,cp_rank", [(2, 0), (2, 1), (4, 0), (4, 1), (4, 2), (4, 3)])
@LAYOUTS
def test_te_sbhd_bshd_context_parallel(tensor_format, cp_size, cp_rank, interleaved):
    shape = (4, 3, 2, 16) if tensor_format == "sbhd" else (3, 4, 2, 16)
    t = torch.randn(shape, dtype=torch.float32)
    start = torch.tensor([0, 3, 11])
    freqs = te_freqs(32, 12, interleaved)
    for start_positions in (None, start):
        out = compat.apply_rotary_pos_emb(t, freqs, tensor_format, start_positions, interleaved,
                                          cp_size=cp_size, cp_rank=cp_rank)  # fmt: skip
        want = te_reference(t, freqs, tensor_format, start_positions, interleaved,
                            cp_size=cp_size, cp_rank=cp_rank)  # fmt: skip
        assert_close_to(out, want)


def test_te_tables_first_built_under_inference_mode_still_train():
    freqs = te_freqs(8, 8, False)
    with torch.inference_mode():
        compat.apply_rotary_pos_emb(torch.randn(4, 1, 1, 8), freqs)
    t = torch.randn(4, 1, 1, 8, requires_grad=True)
    (grad,) = torch.autograd.grad(compat.apply_rotary_pos_emb(t, freqs).sum(), t)
    assert grad.shape == t.shape


# ---- TE: tables computed from freqs on every call ----------------------------------------------


@pytest.mark.parametrize("tensor_format", ["sbhd", "bshd", "thd"])
def test_te_under_inference_mode(tensor_format):
    # TE supports inference in all three formats; here freqs and t are inference tensors (made
    # under inference_mode), which have no version counter to read.
    with torch.inference_mode():
        freqs = te_freqs(16, 8, False)
        if tensor_format == "thd":
            t = torch.randn(8, 2, 8)
            kw = dict(cu_seqlens=torch.tensor([0, 5, 8]))
        else:
            t = torch.randn(TE_FORMAT_SHAPES[tensor_format][:3] + (8,))
            kw = {}
        out = compat.apply_rotary_pos_emb(t, freqs, tensor_format, **kw)
        again = compat.apply_rotary_pos_emb(t, freqs, tensor_format, **kw)
    want = te_reference(t, freqs, tensor_format, **kw)
    assert_close_to(out, want)
    assert_close_to(again, want)


def _write_through_data(freqs, new):
    freqs.data.copy_(new)


def _write_through_numpy(freqs, new):
    freqs.numpy()[...] = new.numpy()


def _write_through_dlpack(freqs, new):
    torch.from_dlpack(freqs).copy_(new)


@pytest.mark.parametrize(
    "write", [_write_through_data, _write_through_numpy, _write_through_dlpack],
    ids=["data", "numpy", "dlpack"],
)  # fmt: skip
@pytest.mark.parametrize("tensor_format", ["sbhd", "thd"])
def test_te_angles_written_without_a_version_bump_are_read_again(write, tensor_format):
    # A write that moves no version counter must not leave the old angles in use: TE reads
    # freqs on every call.
    t = torch.randn(4, 1, 2, 8, dtype=torch.float64)
    kw = {}
    if tensor_format == "thd":
        t, kw = t[:, 0], dict(cu_seqlens=torch.tensor([0, 4]))
    freqs = te_freqs(8, 8, False)
    first = compat.apply_rotary_pos_emb(t, freqs, tensor_format, **kw)
    assert_close_to(first, te_reference(t, freqs, tensor_format, **kw))
    version = freqs._version
    write(freqs, te_freqs(8, 8, False) * 3.0)
    assert freqs._version == version  # the write is invisible to the version counter
    second = compat.apply_rotary_pos_emb(t, freqs, tensor_format, **kw)
    assert_close_to(second, te_reference(t, freqs, tensor_format, **kw))
    assert not torch.allclose(first, second)


@pytest.mark.parametrize("tensor_format", ["sbhd", "bshd"])
@pytest.mark.parametrize("with_start", [False, True], ids=["no_start", "start_positions"])
def test_te_cu_seqlens_is_ignored_with_sbhd_and_bshd(tensor_format, with_start):
    # TE ignores cu_seqlens outside thd (its own test_unfused_rope_thd_vs_bshd passes it with
    # both formats).
    t = torch.randn(TE_FORMAT_SHAPES[tensor_format])
    batch = t.size(1) if tensor_format == "sbhd" else t.size(0)
    start = torch.tensor([0, 7, 2])[:batch] if with_start else None
    freqs = te_freqs(16, 16, False)
    cu = torch.tensor([0, 5, 10, 15])
    out = compat.apply_rotary_pos_emb(t, freqs, tensor_format, start, cu_seqlens=cu)
    assert_close_to(out, te_reference(t, freqs, tensor_format, start))


@pytest.mark.parametrize("tensor_format", ["sbhd", "bshd"])
@pytest.mark.parametrize(
    "start,match",
    [([0, 12, 2], r"freqs has 16 positions; start_positions\[1\] = 12 puts a token of that "
                  r"sequence at position 16"),
     ([0, -1, 2], r"start_positions must be >= 0, got start_positions\[1\] = -1")],
    ids=["past_freqs", "negative"],
)  # fmt: skip
def test_te_start_positions_outside_freqs_are_refused(tensor_format, start, match):
    t = torch.randn(TE_FORMAT_SHAPES[tensor_format])  # s = 5
    batch = t.size(1) if tensor_format == "sbhd" else t.size(0)
    freqs = te_freqs(16, 16, False)
    with pytest.raises(ValueError, match="apply_rotary_pos_emb: " + match):
        compat.apply_rotary_pos_emb(t, freqs, tensor_format, torch.tensor(start[:batch]))


# ---- flash-attn: inplace=True on a leaf that requires grad --------------------------------------


@pytest.mark.parametrize("varlen", [False, True], ids=["batched", "varlen"])
@LAYOUTS
def test_fa_inplace_on_a_leaf_that_requires_grad(interleaved, varlen):
    # flash-attn's own test_rotary_emb_func / test_rotary_emb_varlen_func: a leaf x that requires
    # grad, rotated in place, then out.backward(g); x holds the rotated values and x.grad the
    # inverse rotation of g.
    cos, sin = fa_tables(16, 8, torch.float64)
    if varlen:
        x = torch.randn(7, 2, 12, dtype=torch.float64, requires_grad=True)
        kw = dict(cu_seqlens=torch.tensor([0, 3, 7]), max_seqlen=4, seqlen_offsets=2)
        ref_kw = dict(seqlen_offsets=2, cu_seqlens=kw["cu_seqlens"])
    else:
        x = torch.randn(2, 5, 2, 12, dtype=torch.float64, requires_grad=True)
        kw = dict(seqlen_offsets=3)
        ref_kw = dict(seqlen_offsets=3)
    x64 = x.detach().clone().requires_grad_()
    want = fa_reference(x64, cos, sin, interleaved, **ref_kw)
    out = compat.apply_rotary_emb(x, cos, sin, interleaved, inplace=True, **kw)
    assert out.data_ptr() == x.data_ptr()  # in place
    torch.testing.assert_close(x.detach(), want.detach())
    torch.testing.assert_close(out.detach(), want.detach())
    g = torch.randn_like(want)
    out.backward(g)
    (want_grad,) = torch.autograd.grad(want, x64, g)
    torch.testing.assert_close(x.grad, want_grad)
    assert cos.grad is None
