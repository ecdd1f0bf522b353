# SPDX-License-Identifier: BSD-3-Clause
"""rope.apply_qk_fp8_dynamic: q and k rotated and stored as float8 with scales computed from the
rotated rows, per (token, head) row or per token, optionally powers of two (UE8M0).

The bytes and the scales are held bit for bit against the independent reference of
tests/python/support/quant_reference.py (float64 numpy, written from the format's definition,
not from the library) applied to the float32 rotation ``apply_qk`` returns (the same fused
multiply-adds as the op's kernels; the rotation itself is tested in test_apply_qk.py), with the
reference's ``fp32_div`` arithmetic (the op divides in float32). Rows at position 0 turn by
nothing, so the edge rows (all zero, tiny, an infinity, a NaN) are quantized as written."""

import numpy as np
import pytest
import quant_reference as qref
import references as ref
import torch
from helpers import cpu_and_cuda, dtype_id, make_tables

import torch_rope

MAX_SEQ_LEN = 64
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def make_qk(device, dtype, T=5, Hq=4, Hk=2, D=80, seed=0):
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        x = torch.randn(*shape, generator=g, dtype=torch.float64)
        # Rows of very different sizes, so that the scales differ from row to row.
        x = x * torch.exp2(torch.randint(-6, 7, shape[:-1] + (1,), generator=g).double())
        return x.to(dtype=dtype, device=device)

    return rnd(T, Hq, D), rnd(T, Hk, D)


def reference(x32: torch.Tensor, fp8, per_token: bool, pow2: bool):
    """float8 codes and float32 scales of the float32 rotated rows ``x32`` (T, H, D)."""
    dims = (-2, -1) if per_token else -1
    if fp8 == E4M3:
        q, scale = qref.per_row_fp8(x32.cpu(), dim=dims, pow2=pow2, arithmetic="fp32_div")
        return q, scale
    # float8_e5m2: the same scale rule with e5m2's largest value; the element conversion is
    # torch's (e5m2 has an inf and a plain IEEE layout; the reference codecs are E4M3's).
    v = x32.cpu().double().numpy()
    amax = np.max(np.abs(v), axis=dims, keepdims=True)
    scale = qref.float32_scale(amax, 57344.0)
    if pow2:
        scale = qref.pow2_round_up(scale)
    scale_t = torch.from_numpy(np.ascontiguousarray(scale))
    q = (x32.cpu() / scale_t).clamp(-57344.0, 57344.0).to(E5M2)
    return q, scale_t


def same_codes(got: torch.Tensor, want: torch.Tensor, fp8) -> bool:
    """Equal float8 codes, any NaN equal to any NaN (NaN signs are not part of the contract)."""
    got, want = got.cpu(), want.cpu()
    nan_g, nan_w = torch.isnan(got.float()), torch.isnan(want.float())
    if not torch.equal(nan_g, nan_w):
        return False
    return torch.equal(got.view(torch.uint8)[~nan_g], want.view(torch.uint8)[~nan_w])


def same_scales(got: torch.Tensor, want: torch.Tensor) -> bool:
    got, want = got.cpu(), want.cpu().to(torch.float32)
    assert got.dtype == torch.float32 and got.shape == want.shape, (got.shape, want.shape)
    nan_g, nan_w = torch.isnan(got), torch.isnan(want)
    return torch.equal(nan_g, nan_w) and torch.equal(
        got[~nan_g].view(torch.int32), want[~nan_w].view(torch.int32)
    )


def rotate32(q, k, cos, sin, positions, interleaved, **kw):
    """The float32 rotation of q and k (16-bit inputs widened first, exactly)."""
    wide = torch.float64 if q.dtype == torch.float64 else torch.float32
    return torch_rope.apply_qk(
        q.to(wide), k.to(wide), cos, sin, positions, interleaved=interleaved, **kw
    )


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("pow2", [False, True], ids=["float_scale", "pow2"])
@pytest.mark.parametrize("per_token", [False, True], ids=["per_row", "per_token"])
@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "half_split"])
@pytest.mark.parametrize("fp8", [E4M3, E5M2], ids=dtype_id)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=dtype_id)
def test_matches_the_reference(dtype, fp8, interleaved, per_token, pow2, device):
    q, k = make_qk(device, dtype)
    cos, sin = make_tables(MAX_SEQ_LEN, 48, device)  # rotary_dim 48 of 80: a tail passes through
    positions = torch.randint(0, MAX_SEQ_LEN, (5, 1), device=device)
    q8, k8, qs, ks = torch_rope.apply_qk_fp8_dynamic(
        q, k, cos, sin, positions, dtype=None if fp8 == E4M3 else fp8,
        interleaved=interleaved, per_token=per_token, pow2_scale=pow2,
    )  # fmt: skip
    q32, k32 = rotate32(q, k, cos, sin, positions, interleaved)
    assert q8.dtype == fp8 and k8.dtype == fp8 and q8.shape == q.shape and k8.shape == k.shape
    assert qs.shape == ((5, 1, 1) if per_token else (5, 4, 1))
    assert ks.shape == ((5, 1, 1) if per_token else (5, 2, 1))
    for got, scale, x32 in ((q8, qs, q32), (k8, ks, k32)):
        want, want_scale = reference(x32, fp8, per_token, pow2)
        assert same_scales(scale, want_scale)
        assert same_codes(got, want, fp8)
    # The scales do their job: every row's largest value lands at (or, pow2, within 2x of) max.
    m = ref.FP8_MAX[fp8]
    top = q8.float().abs().amax(dim=(-2, -1) if per_token else -1)
    assert torch.all(top <= m) and torch.all(top >= (m / 2 if pow2 else m * 0.9))


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("per_token", [False, True], ids=["per_row", "per_token"])
@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "half_split"])
def test_inverse_rotation(interleaved, per_token, device):
    # inverse=True: the scales and codes of apply_qk's inverse rotation (the negated angle).
    q, k = make_qk(device, torch.bfloat16)
    cos, sin = make_tables(MAX_SEQ_LEN, 48, device)
    positions = torch.randint(1, MAX_SEQ_LEN, (5, 1), device=device)
    got = torch_rope.apply_qk_fp8_dynamic(
        q, k, cos, sin, positions, interleaved=interleaved, per_token=per_token, inverse=True
    )
    q32, k32 = rotate32(q, k, cos, sin, positions, interleaved, inverse=True)
    for codes, scale, x32 in ((got[0], got[2], q32), (got[1], got[3], k32)):
        want, want_scale = reference(x32, E4M3, per_token, False)
        assert same_scales(scale, want_scale)
        assert same_codes(codes, want, E4M3)
    forward = torch_rope.apply_qk_fp8_dynamic(
        q, k, cos, sin, positions, interleaved=interleaved, per_token=per_token
    )
    assert not same_codes(got[0], forward[0], E4M3)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("per_token", [False, True], ids=["per_row", "per_token"])
def test_float64_inputs(per_token, device):
    # float64 math: amax and the quotient in float64, the quotient rounded to float32 and then
    # to float8 (as torch's float64 -> float8 cast), the scale rounded once to float32.
    q, k = make_qk(device, torch.float64)
    cos, sin = make_tables(MAX_SEQ_LEN, 48, device, torch.float64)
    positions = torch.randint(0, MAX_SEQ_LEN, (5, 1), device=device)
    q8, _, qs, _ = torch_rope.apply_qk_fp8_dynamic(q, k, cos, sin, positions, per_token=per_token)
    q64, _ = rotate32(q, k, cos, sin, positions, True)
    dims = (-2, -1) if per_token else -1
    amax = q64.abs().amax(dim=dims, keepdim=True).cpu()
    want_scale = torch.from_numpy(qref.float32_scale(amax.numpy(), 448.0))
    assert same_scales(qs, want_scale)
    want = (q64.cpu() / want_scale.double()).clamp(-448, 448).to(torch.float32).to(E4M3)
    assert same_codes(q8, want, E4M3)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("pow2", [False, True], ids=["float_scale", "pow2"])
def test_edge_rows(pow2, device):
    # Position 0: cos 1, sin 0 exactly, so the rotated rows are the rows as written (the specials
    # sit in the tail, past rotary_dim: inf * sin(0) would be NaN).
    D, R = 32, 16
    rows = torch.randn(6, D, dtype=torch.float64)
    rows[0] = 0.0  # amax 0: scale 1, the row stores +-0
    rows[0, 25] = -0.0  # in the tail: the rotation turns a -0 paired with +0 into +0
    rows[1] = 1e-43  # float32 subnormal: the quotient underflows, scale 2^-149
    rows[2, 20] = float("inf")  # scale inf (2^127 with pow2)
    rows[3, 21] = float("nan")  # scale NaN, every value NaN
    rows[4] *= 1e30  # large, finite
    rows[5, 22] = -3e38
    x = rows.to(torch.float32).view(6, 1, D).to(device)
    cos, sin = make_tables(4, R, device)
    pos = torch.zeros(6, 1, dtype=torch.int64, device=device)
    q8, k8, qs, ks = torch_rope.apply_qk_fp8_dynamic(x, x, cos, sin, pos, pow2_scale=pow2)
    want, want_scale = reference(x.cpu(), E4M3, False, pow2)
    for got, scale in ((q8, qs), (k8, ks)):
        assert same_scales(scale, want_scale)
        assert same_codes(got, want, E4M3)
    s = qs.cpu().view(-1)
    assert s[0] == 1.0 and q8.cpu()[0].view(torch.uint8)[0, 25].item() == 0x80  # -0 kept
    assert s[1] == (2.0**-127 if pow2 else 2.0**-149)
    assert s[2] == (2.0**127 if pow2 else float("inf"))
    assert torch.isnan(s[3]) and torch.isnan(q8.cpu()[3].float()).all()
    if not pow2:
        # inf / inf is NaN: the row is flagged, not hidden.
        assert torch.isnan(q8.cpu()[2, 0, 20].float())
    if pow2:
        assert s[4] == 2.0 ** int(np.ceil(np.log2(s[4].item())))
        assert s[4] >= rows[4].abs().max() / 448


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_multi_axis_positions_and_per_head_positions(device):
    q, k = make_qk(device, torch.bfloat16, T=6, Hq=4, Hk=4, D=64)
    cos, sin = make_tables(MAX_SEQ_LEN, 64, device)
    pos3 = torch.randint(0, MAX_SEQ_LEN, (6, 1, 3), device=device)
    section = [8, 12, 12]
    q8, k8, qs, ks = torch_rope.apply_qk_fp8_dynamic(
        q, k, cos, sin, pos3, mrope_section=section, interleaved=False
    )
    q32, k32 = rotate32(q, k, cos, sin, pos3, False, mrope_section=section)
    for got, scale, x32 in ((q8, qs, q32), (k8, ks, k32)):
        want, want_scale = reference(x32, E4M3, False, False)
        assert same_scales(scale, want_scale) and same_codes(got, want, E4M3)
    per_head = torch.randint(0, MAX_SEQ_LEN, (6, 4), device=device)
    q8, _, qs, _ = torch_rope.apply_qk_fp8_dynamic(q, k, cos, sin, per_head, per_token=True)
    q32, _ = rotate32(q, k, cos, sin, per_head, True)
    want, want_scale = reference(q32, E4M3, True, False)
    assert same_scales(qs, want_scale) and same_codes(q8, want, E4M3)


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_strided_inputs_and_empty_calls(device):
    base, _ = make_qk(device, torch.bfloat16, T=4, Hq=3, Hk=1, D=96)
    q = base[..., :64]  # rows 96 apart, 64 wide
    k = base[:, :2, 32:]
    cos, sin = make_tables(MAX_SEQ_LEN, 32, device)
    positions = torch.randint(0, MAX_SEQ_LEN, (4, 1), device=device)
    q8, k8, qs, ks = torch_rope.apply_qk_fp8_dynamic(q, k, cos, sin, positions, per_token=True)
    q32, k32 = rotate32(q, k, cos, sin, positions, True)
    for got, scale, x32 in ((q8, qs, q32), (k8, ks, k32)):
        want, want_scale = reference(x32, E4M3, True, False)
        assert same_scales(scale, want_scale) and same_codes(got, want, E4M3)
    # No tokens: empty outputs of the right shapes.
    e = base[:0]
    out = torch_rope.apply_qk_fp8_dynamic(e, e, cos, sin, positions[:0])
    assert [tuple(t.shape) for t in out] == [(0, 3, 96), (0, 3, 96), (0, 3, 1), (0, 3, 1)]


def test_compile_meta_and_no_grad():
    q, k = make_qk("cpu", torch.bfloat16)
    cos, sin = make_tables(MAX_SEQ_LEN, 48, "cpu")
    positions = torch.randint(0, MAX_SEQ_LEN, (5, 1))

    def f(q, k, positions):
        return torch_rope.apply_qk_fp8_dynamic(q, k, cos, sin, positions, pow2_scale=True)

    eager = f(q, k, positions)
    compiled = torch.compile(f, fullgraph=True, dynamic=True)(q, k, positions)
    for a, b in zip(eager, compiled):
        assert ref.same_bits(a, b)
    meta = torch.ops.rope.apply_qk_fp8_dynamic(
        q.to("meta"), k.to("meta"), cos.to("meta"), sin.to("meta"), positions.to("meta"),
        per_token=True,
    )  # fmt: skip
    assert [tuple(t.shape) for t in meta] == [(5, 4, 80), (5, 2, 80), (5, 1, 1), (5, 1, 1)]
    assert [t.dtype for t in meta] == [E4M3, E4M3, torch.float32, torch.float32]
    with pytest.raises(RuntimeError, match="doesn't support automatic differentiation"):
        torch_rope.apply_qk_fp8_dynamic(q.requires_grad_(), k, cos, sin, positions)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("per_token", [False, True], ids=["per_row", "per_token"])
def test_out_writes_the_callers_rows_and_scales(per_token, device):
    # out=: the functional overload's bits in the caller's buffers (float8 rows of e5m2, the
    # format out= takes from q_out; scales as strided views), their version counters bumped, also
    # under inference_mode; the same under torch.compile(fullgraph=True).
    q, k = make_qk(device, torch.bfloat16)
    cos, sin = make_tables(MAX_SEQ_LEN, 48, device)
    positions = torch.randint(0, MAX_SEQ_LEN, (5, 1), device=device)
    kw = dict(per_token=per_token, pow2_scale=True)
    want = torch_rope.apply_qk_fp8_dynamic(q, k, cos, sin, positions, dtype=E5M2, **kw)

    def buffers():
        rows = [torch.empty(x.shape, dtype=E5M2, device=device) for x in (q, k)]
        scales = [torch.full((5, s.shape[1], 2), -1.0, device=device)[..., 1:] for s in want[2:]]
        return tuple(rows + scales)

    out = buffers()
    versions = [t._version for t in out]
    got = torch_rope.apply_qk_fp8_dynamic(q, k, cos, sin, positions, out=out, **kw)
    assert all(g is o for g, o in zip(got, out))
    assert all(t._version > v for t, v in zip(out, versions))
    assert all(ref.same_bits(g, w) for g, w in zip(got, want))
    assert torch.all(out[2]._base[..., 0] == -1.0), "a scale view's neighbours were written"
    with torch.inference_mode():
        out = buffers()
        torch_rope.apply_qk_fp8_dynamic(q, k, cos, sin, positions, out=out, **kw)
    assert all(ref.same_bits(g, w) for g, w in zip(out, want))

    def f(q, k, positions, out):
        torch_rope.apply_qk_fp8_dynamic(q, k, cos, sin, positions, out=out, **kw)
        return out

    out = buffers()
    torch.compile(f, fullgraph=True)(q, k, positions, out)
    assert all(ref.same_bits(g, w) for g, w in zip(out, want))
    with pytest.raises(ValueError, match="disagrees with q_out's dtype"):
        torch_rope.apply_qk_fp8_dynamic(q, k, cos, sin, positions, dtype=E4M3, out=buffers())
    # No tokens: nothing to write, the buffers are returned.
    empty = [t[:0] for t in buffers()]
    got = torch_rope.apply_qk_fp8_dynamic(q[:0], k[:0], cos, sin, positions[:0], out=empty, **kw)
    assert all(g is e for g, e in zip(got, empty))
