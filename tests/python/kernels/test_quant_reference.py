# SPDX-License-Identifier: BSD-3-Clause
"""The reference quantizers (tests/python/support/quant_reference.py) against torch
and torchao, so that the kernels can later be held against references that are themselves held.

* The codecs: every E4M3 / E8M0 / E2M1 code decoded as torch (and torchao) decode it; every
  bfloat16 and every float16 bit pattern, and float32 values on and one ulp beside every E4M3
  midpoint, encoded to E4M3 as torch's cast does (on the patterns in range; the overflowing ones
  against torch's ``clamp(-448, 448)`` then the cast, and torch's own cast beyond 448 against the
  reference's two overflow modes); every bfloat16 pattern and every E2M1 midpoint as torchao's
  E2M1 rounding; the nibble order of the float4 packing.
* per_row_fp8 bit for bit against torch's float32 sequences (``x / scale`` and
  ``x * (1 / scale)``), its exact arithmetic differing from them only beside rounding boundaries,
  and its UE8M0 variant against torchao's RCEIL MX scaling with a block the size of a row.
* mxfp8 against torchao's ``to_mx`` (FLOOR, the OCP MX v1.0 conversion) and nvfp4 against
  torchao's ``nvfp4_quantize`` (two-level scaling), on random and adversarial blocks: amax 0,
  subnormal amax, one huge value, inf, NaN. Where the references differ from torchao on purpose
  (docs/quant_formats.md, "Where torchao differs"), the test pins what torchao gives.
* dequantize(quantize(x)) within each format's bound, the bound reached (so it is not slack).
* to_blocked_scales against torchao's ``to_blocked`` and the swizzled scales torchao's own
  quantizers return.

The torchao comparisons skip, with the import error as the reason, where torchao does not import
with this torch. Everything runs on the CPU in a few seconds.
"""

import math

import numpy as np
import pytest
import quant_reference as qr
import torch

E4M3, E8M0, FP4X2 = torch.float8_e4m3fn, torch.float8_e8m0fnu, torch.float4_e2m1fn_x2


def _import_torchao():
    try:
        from torchao.prototype.mx_formats import kernels, mx_tensor, nvfp4_tensor, utils
        from torchao.prototype.mx_formats.config import ScaleCalculationMode
    except Exception as exc:  # any failure to import (ABI, missing symbols) is a skip reason
        return None, f"{type(exc).__name__}: {exc}"
    return dict(
        kernels=kernels,
        mx=mx_tensor,
        nv=nvfp4_tensor,
        utils=utils,
        mode=ScaleCalculationMode,
    ), None


@pytest.fixture(scope="module")
def ao():
    mods, why = _import_torchao()
    if mods is None:
        pytest.skip(
            f"torchao.prototype.mx_formats does not import with torch {torch.__version__}: {why}"
        )
    return mods


def codes(t):
    return t.contiguous().view(torch.uint8).numpy()


def every_pattern(dtype):
    """All 65,536 values of a 16-bit float dtype, in bit-pattern order."""
    return torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype)


def assert_codes(got, want, what, fmt="e4m3", where=None):
    got, want = np.asarray(got), np.asarray(want)
    ok = qr.codes_equal(got, want, fmt)
    if where is not None:
        ok = ok | ~np.broadcast_to(where, ok.shape)
    if not ok.all():
        bad = np.argwhere(~ok)[:8]
        detail = ", ".join(
            f"{tuple(i)}: {got[tuple(i)]:#04x} != {want[tuple(i)]:#04x}" for i in bad
        )
        raise AssertionError(f"{what}: {int((~ok).sum())} codes differ ({detail})")


# ---- inputs --------------------------------------------------------------------------------------


def random_rows(rng, n, d, dtype, lo=-30, hi=30):
    """Gaussian rows, each at its own power-of-two magnitude in [2**lo, 2**hi)."""
    mag = np.exp2(rng.integers(lo, hi, size=(n, 1)).astype(np.float64))
    return torch.from_numpy(rng.standard_normal((n, d)) * mag).to(dtype)


def adversarial_blocks(dtype, width):
    """Rows of ``width`` elements, one kind of block per row: the edge cases of the formats."""
    tiny = {torch.bfloat16: 2.0**-133, torch.float16: 2.0**-24, torch.float32: 2.0**-149}[dtype]
    big = {torch.bfloat16: 3.0e38, torch.float16: 6.0e4, torch.float32: 3.0e38}[dtype]
    ramp = np.linspace(-1.0, 1.0, width)
    rows = {
        "zeros": np.zeros(width),
        "negative zeros": -np.zeros(width),
        "subnormal amax": ramp * tiny * 4,
        "one subnormal": np.where(np.arange(width) == 3, tiny, 0.0),
        "one huge value": np.where(np.arange(width) == 5, big, ramp),
        "exact ties": np.resize([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0], width) * 1.0,
        "all equal": np.full(width, -3.0),
        "powers of two": np.exp2(np.arange(width) % 24 - 12.0),
    }
    out = {k: torch.tensor(v, dtype=torch.float64).to(dtype) for k, v in rows.items()}
    for name, bad in (("inf", math.inf), ("-inf", -math.inf), ("nan", math.nan)):
        row = torch.tensor(ramp, dtype=torch.float64).to(dtype)
        row[2] = bad
        out[name] = row
    return out


# ---- codecs --------------------------------------------------------------------------------------


def test_e4m3_and_e8m0_decode_every_code_as_torch():
    c = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    mine = qr.e4m3_decode(c.numpy())
    theirs = c.view(E4M3).to(torch.float64).numpy()
    assert np.array_equal(mine, theirs, equal_nan=True)
    assert np.isnan(mine).sum() == 2 and mine[0x7E] == 448.0 and mine[0x01] == 2.0**-9
    mine = qr.e8m0_decode(c.numpy())
    theirs = c.view(E8M0).to(torch.float64).numpy()
    assert np.array_equal(mine, theirs, equal_nan=True)
    assert mine[0] == 2.0**-127 and mine[254] == 2.0**127 and np.isnan(mine[255])


def test_e2m1_decode_every_code():
    spec = [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    assert qr.e2m1_decode(np.arange(16)).tolist() == spec + [-v for v in spec]


def test_e2m1_decode_every_code_as_torchao(ao):
    c = np.arange(16, dtype=np.uint8)
    mine = qr.e2m1_decode(c)
    theirs = ao["kernels"].f4_unpacked_to_f32(torch.from_numpy(c)).double().numpy()
    assert np.array_equal(mine, theirs)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_e4m3_encode_every_16bit_pattern(dtype):
    x = every_pattern(dtype)
    v = x.double().numpy()
    mine = qr.e4m3_encode(v)
    in_range = ~(np.abs(v) > qr.E4M3_MAX)  # NaN included: torch's cast keeps its sign
    # In range: torch's plain cast (RNE from the float32 the 16-bit value widens to, exactly).
    assert_codes(mine, codes(x.to(E4M3)), f"{dtype} in range", where=in_range)
    # Beyond 448 (and inf): torch's saturating sequence, whatever its cast does on its own.
    assert_codes(mine, codes(x.float().clamp(-448, 448).to(E4M3)), f"{dtype} overflow")
    # The sweep reaches every class: exact E4M3 midpoints (ties), subnormals, overflow, NaN.
    mids = (qr._E4M3_FINITE[:-1] + qr._E4M3_FINITE[1:]) / 2
    assert np.isin(np.abs(v), mids).sum() > 100
    assert ((np.abs(v) < 2.0**-6) & (v != 0)).sum() > 100
    assert (~in_range).sum() > 100 and np.isnan(v).sum() > 100


def test_e4m3_encode_float32_beside_every_midpoint():
    grid = qr._E4M3_EXTENDED  # finite values and 480, so 464 (448 | 480) is a midpoint too
    mids = ((grid[:-1] + grid[1:]) / 2).astype(np.float32)
    assert np.all(mids.astype(np.float64) == (grid[:-1] + grid[1:]) / 2)
    vals = np.concatenate(
        [mids, np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(0))]
    )
    vals = np.concatenate([vals, -vals, grid.astype(np.float32)])
    x = torch.from_numpy(vals)
    assert_codes(qr.e4m3_encode(vals), codes(x.clamp(-448, 448).to(E4M3)), "float32 midpoints")


def test_e4m3_overflow_modes_and_torchs_own_cast():
    sat = qr.e4m3_encode([448.0, 460.0, 464.0, 464.0001, 1e30, math.inf, -math.inf])
    assert sat.tolist() == [0x7E, 0x7E, 0x7E, 0x7E, 0x7E, 0x7E, 0xFE]
    non_sat = qr.e4m3_encode([448.0, 460.0, 464.0, 464.0001, 1e30, math.inf, -math.inf], False)
    assert non_sat.tolist() == [0x7E, 0x7E, 0x7E, 0x7F, 0x7F, 0x7F, 0xFF]
    # torch's own cast beyond 448 is one of the two modes on every overflowing bf16 pattern (it
    # saturates from torch 2.10 or so; older torch gave NaN beyond 464, the non-saturating mode).
    x = every_pattern(torch.bfloat16)
    v = x.double().numpy()
    over = np.abs(v) > 448
    theirs = codes(x.to(E4M3))[over]
    modes = {
        "saturating": qr.e4m3_encode(v[over]),
        "non-saturating": qr.e4m3_encode(v[over], saturate=False),
    }
    matching = [k for k, m in modes.items() if qr.codes_equal(m, theirs).all()]
    assert matching, "torch's float8_e4m3fn cast beyond 448 is neither mode"


def test_e2m1_encode_every_bf16_pattern_and_midpoint(ao):
    to_f4 = ao["kernels"].f32_to_f4_unpacked
    x = every_pattern(torch.bfloat16)
    v = x.double().numpy()
    keep = ~np.isnan(v)  # E2M1 has no NaN; torchao's bit trick gives garbage for one
    mine = qr.e2m1_encode(v[keep])
    assert_codes(mine, to_f4(x.float()[torch.from_numpy(keep)]).numpy(), "bf16", "e2m1")
    mids = ((qr._E2M1[:-1] + qr._E2M1[1:]) / 2).astype(np.float32)
    vals = np.concatenate(
        [mids, np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(0))]
    )
    vals = np.concatenate([vals, -vals])
    assert_codes(qr.e2m1_encode(vals), to_f4(torch.from_numpy(vals)).numpy(), "midpoints", "e2m1")


def test_e2m1_ties_to_even_and_saturation():
    # Ties to the even code (even mantissa) from the spec's list 0, .5, 1, 1.5, 2, 3, 4, 6.
    ties = qr.e2m1_decode(qr.e2m1_encode([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, -0.25]))
    assert ties.tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, -0.0]
    assert np.signbit(ties[-1])


def random_codes():
    return np.random.default_rng(1).integers(0, 16, size=(3, 5, 32), dtype=np.uint8)


def test_e2m1_packing_as_torchao(ao):
    c = random_codes()
    packed = qr.pack_e2m1(c)
    assert np.array_equal(packed, ao["kernels"].pack_uint4(torch.from_numpy(c)).numpy())
    assert np.array_equal(
        qr.unpack_e2m1(packed), ao["kernels"].unpack_uint4(torch.from_numpy(packed))
    )


def test_e2m1_packing_low_nibble_first():
    c = random_codes()
    packed = qr.pack_e2m1(c)
    assert packed.shape == (3, 5, 16)
    assert np.array_equal(qr.unpack_e2m1(packed), c)
    assert np.array_equal(packed & 0xF, c[..., 0::2]) and np.array_equal(packed >> 4, c[..., 1::2])
    # Through nvfp4: element 0 -> low nibble, element 1 -> high nibble.
    row = torch.zeros(1, 16)
    row[0, 0], row[0, 1] = 3.0, -6.0  # amax 6, tensor scale 1: block scale 1, codes 0x5, 0xF
    packed, _, _ = qr.nvfp4(row, tensor_scale=1.0)
    assert codes(packed)[0, 0] == 0x5 | (0xF << 4)


# ---- per-row / per-token fp8 ---------------------------------------------------------------------


def per_row_inputs(dtype, d=64):
    rng = np.random.default_rng(2)
    lo, hi = (-14, 14) if dtype == torch.float16 else (-100, 100)
    rows = [random_rows(rng, 64, d, dtype, lo, hi)]
    rows += [r[None] for r in adversarial_blocks(dtype, d).values()]
    if dtype == torch.float32:
        # Beside ties: x within a few float32 ulps of m * scale for E4M3 midpoints m (below 448),
        # so x / scale is near m without being on it, where the exact quotient and a float32 one
        # may round apart. Column 0 holds the row's amax, which sets the scale.
        mids = (qr._E4M3_FINITE[:-1] + qr._E4M3_FINITE[1:]) / 2
        for amax in rng.uniform(1.0, 2.0, size=4) * np.exp2(rng.integers(-20, 20, size=4)):
            a32 = np.float32(amax)
            s = np.float64(qr.float32_scale(np.float64(a32), 448.0))
            near = np.resize((mids * s).astype(np.float32), (8, d))
            for i in range(1, 8):  # row i: i // 2 ulps above or below
                step = np.float32(np.inf if i % 2 else 0)
                for _ in range(i // 2):
                    near[i] = np.nextafter(near[i], step)
            near[:, 0] = a32
            rows.append(torch.from_numpy(near))
    return torch.cat(rows)


def expected_float32_scale(x):
    amax = x.float().abs().amax(-1, keepdim=True)
    s = amax / 448
    s = torch.where(amax == 0, torch.ones_like(s), s)
    return torch.where((amax > 0) & (s == 0), torch.full_like(s, 2.0**-149), s)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_per_row_fp8_matches_torchs_float32_sequences(dtype):
    x = per_row_inputs(dtype)
    q, s = qr.per_row_fp8(x, arithmetic="fp32_div")
    assert s.dtype == torch.float32 and s.shape == (x.shape[0], 1) and q.dtype == E4M3
    assert np.array_equal(s.numpy(), expected_float32_scale(x).numpy(), equal_nan=True)
    want = (x.float() / s).clamp(-448, 448).to(E4M3)
    assert_codes(codes(q), codes(want), "x / scale")
    q, _ = qr.per_row_fp8(x, arithmetic="fp32_rcp")
    want = (x.float() * (1 / s)).clamp(-448, 448).to(E4M3)
    assert_codes(codes(q), codes(want), "x * (1 / scale)")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_per_row_fp8_exact_differs_from_float32_only_beside_boundaries(dtype):
    x = per_row_inputs(dtype)
    exact, s = qr.per_row_fp8(x)
    with np.errstate(invalid="ignore"):
        quotient = x.double().numpy() / s.double().numpy()
    near = qr.near_rounding_boundary(quotient, "e4m3")
    # 1 / scale overflows float32 below 2**-128: x * (1 / scale) is then ±inf (saturating to
    # ±448) or, for x = 0, NaN. A kernel that multiplies by the reciprocal has to handle it.
    with np.errstate(over="ignore"):
        rcp_overflow = np.broadcast_to(np.isinf(np.float32(1) / s.numpy()), near.shape)
    for arithmetic in ("fp32_div", "fp32_rcp"):
        other, s2 = qr.per_row_fp8(x, arithmetic=arithmetic)
        assert np.array_equal(s.numpy(), s2.numpy(), equal_nan=True)
        differ = ~qr.codes_equal(codes(exact), codes(other))
        if arithmetic == "fp32_rcp":
            assert rcp_overflow.any()
            c = codes(other)[rcp_overflow]
            assert np.all(((c & 0x7F) == 0x7E) | ((c & 0x7F) == 0x7F))
            differ &= ~rcp_overflow
        assert not (differ & ~near).any(), f"{arithmetic}: a difference away from a boundary"
        if dtype == torch.float32:  # the rows beside ties make the modes part
            assert differ.any(), f"{arithmetic}: the near-tie rows should round apart"
    assert near[:64].mean() < 0.01  # the random rows: rarely beside a boundary


def test_per_row_fp8_pow2_scales():
    x = per_row_inputs(torch.float32)
    q, s = qr.per_row_fp8(x, pow2=True)
    s_plain = qr.per_row_fp8(x)[1].double().numpy()
    p = s.double().numpy()
    fin = np.isfinite(s_plain)
    m, _ = np.frexp(p[fin])
    assert np.all(m == 0.5), "pow2 scales are powers of two"
    inside = fin & (s_plain >= 2.0**-127)
    assert np.all(p[inside] >= s_plain[inside]) and np.all(p[inside] < 2 * s_plain[inside])
    assert np.all(p[fin & (s_plain < 2.0**-127)] == 2.0**-127)
    # Rounding up: no element is above 448 before the cast, so none saturates on the way.
    v = x.double().numpy()
    ok = np.isfinite(v).all(-1, keepdims=True)
    assert np.all(np.abs(v / p)[np.broadcast_to(ok, v.shape)] <= 448)
    # The E8M0 codes of those scales.
    e = qr.e8m0_encode_pow2(p)
    assert np.array_equal(qr.e8m0_decode(e), p, equal_nan=True)


def test_per_row_fp8_pow2_matches_torchao_rceil(ao):
    # UE8M0 per row = torchao's RCEIL MX scaling with one block per row.
    x = per_row_inputs(torch.bfloat16)
    x = x[torch.isfinite(x).all(-1)]  # torchao's RCEIL leaves inf/NaN rows to a TODO
    d = x.shape[-1]
    ao_scale, ao_data = ao["mx"].to_mx(x, E4M3, d, ao["mode"].RCEIL)
    q, s = qr.per_row_fp8(x, pow2=True)
    amax = x.double().abs().amax(-1).numpy()
    tiny = amax < 448 * 2.0**-127  # torchao: code 0 but multiplies by 1, not 2**127
    zero = amax == 0  # torchao: 2**-127 (code 0), here 1.0 (code 127)
    mine = qr.e8m0_encode_pow2(s.double().numpy()[:, 0])
    theirs = codes(ao_scale)[:, 0]
    assert np.array_equal(mine[~zero], theirs[~zero])
    assert np.all(theirs[zero] == 0) and np.all(mine[zero] == 127)
    assert_codes(codes(q), codes(ao_data), "elements", where=~tiny[:, None])
    assert tiny.any() and (tiny & ~zero).any()
    # What torchao gives there: the elements unscaled, E4M3(x * 1).
    rows = tiny & ~zero
    unscaled = qr.e4m3_encode(x.double().numpy()[rows])
    assert_codes(codes(ao_data)[rows], unscaled, "torchao's tiny rows")


@pytest.mark.parametrize("pow2", [False, True], ids=["float32", "ue8m0"])
def test_per_row_fp8_edge_rows(pow2):
    blocks = adversarial_blocks(torch.float32, 16)
    got = {k: qr.per_row_fp8(v[None], pow2=pow2) for k, v in blocks.items()}
    for name in ("zeros", "negative zeros"):
        q, s = got[name]
        assert float(s) == 1.0
        assert np.all(codes(q) == (0x80 if name == "negative zeros" else 0x00))
    q, s = got["one subnormal"]  # amax 2**-149: amax / 448 underflows float32
    assert float(s) == (2.0**-127 if pow2 else 2.0**-149)
    q, s = got["subnormal amax"]
    want = qr.float32_scale(blocks["subnormal amax"].double().abs().max().item(), 448.0)
    assert float(s) == (2.0**-127 if pow2 else float(want))
    q, s = got["inf"]
    c = codes(q)[0]
    if pow2:  # UE8M0 has no inf: 2**127, inf saturates, the rest is divided by 2**127
        assert float(s) == 2.0**127 and c[2] == 0x7E
        assert np.all(qr.e4m3_decode(np.delete(c, 2)) == 0)
    else:  # scale inf: finite elements give 0, inf gives inf / inf = NaN; dequantized all NaN
        assert math.isinf(float(s)) and c[2] == 0x7F  # NaN with the element's sign
        assert codes(got["-inf"][0])[0, 2] == 0xFF
        assert np.all(qr.e4m3_decode(np.delete(c, 2)) == 0)
        assert torch.isnan(qr.dequantize_per_row_fp8(q, s)).all()
    q, s = got["nan"]
    assert math.isnan(float(s)) and np.all((codes(q) & 0x7F) == 0x7F)
    q, s = got["one huge value"]  # it sets the scale (448 or, rounded up, (224, 448] for it)
    big = blocks["one huge value"][5].item()
    assert abs(qr.e4m3_decode(codes(q)[0, 5]) * float(s) - big) <= big * 2.0**-4
    assert codes(q)[0, 5] == 0x7E or pow2


def test_per_row_fp8_dims_and_eps():
    rng = np.random.default_rng(3)
    x = random_rows(rng, 24, 32, torch.float32).view(6, 4, 32)
    q, s = qr.per_row_fp8(x, dim=(-2, -1))  # per token: all heads of a token together
    assert s.shape == (6, 1, 1)
    q2, s2 = qr.per_row_fp8(x.reshape(6, 128))
    assert torch.equal(s.view(6), s2.view(6)) and torch.equal(
        codes_t(q).reshape(6, 128), codes_t(q2)
    )
    q3, s3 = qr.per_row_fp8(x, dim=0)
    q4, s4 = qr.per_row_fp8(x.movedim(0, -1))
    assert torch.equal(s3.movedim(0, -1), s4) and torch.equal(
        codes_t(q3).movedim(0, -1), codes_t(q4)
    )
    z = torch.zeros(2, 8)
    z[1, 0] = 1e-12
    _, s = qr.per_row_fp8(z, eps=1e-4)
    assert np.allclose(s.double().numpy(), np.float32(1e-4 / 448), rtol=0)


def codes_t(t):
    return t.contiguous().view(torch.uint8)


def e4m3_error_bound(q, unit):
    """Round-to-nearest error of one E4M3 conversion of quotient q, in units of the scale: half
    a step (2**-4 relative for normals, 2**-10 absolute below 2**-6), and, above 448, the whole
    distance to 448 (saturation)."""
    q = np.abs(q)
    return unit * np.maximum(np.maximum(q * 2.0**-4, 2.0**-10), q - qr.E4M3_MAX)


@pytest.mark.parametrize("pow2", [False, True], ids=["float32", "ue8m0"])
def test_per_row_fp8_round_trip_bound(pow2):
    rng = np.random.default_rng(4)
    x = random_rows(rng, 256, 64, torch.bfloat16, -60, 60)
    q, s = qr.per_row_fp8(x, pow2=pow2)
    v, sc = x.double().numpy(), s.double().numpy()
    err = np.abs(qr.dequantize_per_row_fp8(q, s).numpy() - v)
    bound = e4m3_error_bound(v / sc, sc)
    assert np.all(err <= bound)
    assert (err / bound).max() > 0.9  # the bound is reached: it is not slack


# ---- MXFP8 ---------------------------------------------------------------------------------------


def mx_inputs(dtype):
    rng = np.random.default_rng(5)
    lo, hi = (-130, 120) if dtype != torch.float16 else (-20, 14)
    rand = random_rows(rng, 64, 128, dtype, lo, hi)
    adv = torch.stack(list(adversarial_blocks(dtype, 32).values()))  # one block per row
    return rand, adv


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_mxfp8_matches_torchao(ao, dtype):
    for x in mx_inputs(dtype):
        el, sc = qr.mxfp8(x)
        assert el.dtype == E4M3 and sc.dtype == E8M0 and sc.shape == (x.shape[0], x.shape[1] // 32)
        ao_sc, ao_el = ao["mx"].to_mx(x, E4M3, 32, ao["mode"].FLOOR)
        assert_codes(codes(sc), codes(ao_sc), "scales", "e8m0")
        s = codes(sc)
        nan_block = s == qr.E8M0_NAN
        floor_block = s == 0  # X = -127: torchao divides by 2**-126 (float32's smallest normal)
        per_elem = np.repeat(nan_block | floor_block, 32, axis=-1)
        assert_codes(codes(el), codes(ao_el), "elements", where=~per_elem)
        # NaN blocks: both decode to NaN whatever the element bytes (torchao writes x / inf).
        assert torch.isnan(
            qr.dequantize_mxfp8(el, sc)[torch.from_numpy(np.repeat(nan_block, 32, -1))]
        ).all()
        # The X = -127 blocks: torchao's elements are E4M3(x / 2**-126), half of the spec's.
        fb = np.repeat(floor_block, 32, axis=-1)
        assert_codes(
            codes(ao_el)[fb],
            qr.e4m3_encode(x.double().numpy()[fb] / 2.0**-126),
            "torchao at X=-127",
        )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_mxfp8_rceil_matches_torchao(ao, dtype):
    for x in mx_inputs(dtype):
        el, sc = qr.mxfp8(x, scale_mode="rceil")
        ao_sc, ao_el = ao["mx"].to_mx(x, E4M3, 32, ao["mode"].RCEIL)
        assert_codes(codes(sc), codes(ao_sc), "scales", "e8m0")
        s = codes(sc)
        skip = np.repeat((s == qr.E8M0_NAN) | (s == 0), 32, axis=-1)  # torchao: x * 1 at code 0
        assert_codes(codes(el), codes(ao_el), "elements", where=~skip)
        v = x.double().numpy().reshape(s.shape + (32,))
        top = np.abs(v).max(-1) / qr.e8m0_decode(s)
        ok = (s != 0) & (s != qr.E8M0_NAN) & np.isfinite(np.abs(v).max(-1))
        assert np.all((top[ok] > 224) & (top[ok] <= 448))  # no block maximum saturates
    # torchao takes ceil(log2(.)) in float32, which rounds amax / 448 = 2**k * (1 + 2**-23) to
    # k: its X is one short and the element saturates. The reference's X is k + 1.
    a = float(np.nextafter(np.float32(448 * 2.0**5), np.float32(np.inf)))
    x = torch.zeros(1, 32)
    x[0, 0] = a
    ao_sc, ao_el = ao["mx"].to_mx(x, E4M3, 32, ao["mode"].RCEIL)
    el, sc = qr.mxfp8(x, scale_mode="rceil")
    assert codes(sc)[0, 0] == 127 + 6 and codes(el)[0, 0] == qr.e4m3_encode(a / 64)
    assert codes(ao_sc)[0, 0] == 127 + 5 and codes(ao_el)[0, 0] == 0x7E


def test_mxfp8_shared_exponent_from_the_spec():
    rng = np.random.default_rng(6)
    x = random_rows(rng, 32, 64, torch.float32, -120, 120)
    _, sc = qr.mxfp8(x)
    v = x.double().numpy().reshape(32, 2, 32)
    for (i, j), code in np.ndenumerate(codes(sc)):
        amax = float(np.abs(v[i, j]).max())
        m, e = math.frexp(amax)
        x_exp = max(e - 1 - 8, -127)  # floor(log2(amax)) - emax(E4M3); E8M0 floor
        assert code == x_exp + 127
        if x_exp > -127:  # the block's largest lands in [256, 512)
            assert 256 <= amax / 2.0**x_exp < 512


def test_mxfp8_edge_blocks():
    blocks = adversarial_blocks(torch.float32, 32)
    got = {k: qr.mxfp8(v[None]) for k, v in blocks.items()}
    for name in ("zeros", "negative zeros", "one subnormal", "subnormal amax"):
        el, sc = got[name]
        assert codes(sc).tolist() == [[0]]  # 2**-127, E8M0's smallest
    assert np.all(codes(got["negative zeros"][0]) == 0x80)
    el, sc = got["subnormal amax"]  # x / 2**-127, exactly
    want = qr.e4m3_encode(blocks["subnormal amax"].double().numpy() / 2.0**-127)
    assert_codes(codes(el)[0], want, "subnormal amax")
    el, sc = got["one huge value"]  # 3e38: X = 127 - 8, 3e38 / 2**119 = 451.4 saturates
    assert codes(sc).tolist() == [[119 + 127]] and codes(el)[0, 5] == 0x7E
    assert np.all(qr.e4m3_decode(np.delete(codes(el)[0], 5)) == 0)  # the ramp flushes to 0
    for name, sign in (("inf", 0), ("-inf", 0x80)):
        el, sc = got[name]
        assert codes(sc).tolist() == [[120 + 127]]  # X = 128 - 8: inf's float32 exponent field
        assert codes(el)[0, 2] == (0x7E | sign)  # saturated
    el, sc = got["nan"]
    assert codes(sc).tolist() == [[qr.E8M0_NAN]] and np.all(codes(el) == qr.E4M3_NAN)


def mx_round_trip_case():
    x = random_rows(np.random.default_rng(7), 128, 128, torch.bfloat16, -100, 100)
    return (x,) + qr.mxfp8(x)


def test_mxfp8_round_trip_bound():
    x, el, sc = mx_round_trip_case()
    scale = np.repeat(qr.e8m0_decode(codes(sc)), 32, axis=-1)
    v = x.double().numpy()
    deq = qr.dequantize_mxfp8(el, sc).numpy()
    err = np.abs(deq - v)
    bound = e4m3_error_bound(v / scale, scale)
    assert np.all(err <= bound) and (err / bound).max() > 0.9
    assert (np.abs(v / scale) > 464).any()  # MX FLOOR saturates some block maxima


def test_mxfp8_decode_as_torchao(ao):
    x, el, sc = mx_round_trip_case()
    deq = qr.dequantize_mxfp8(el, sc).numpy()
    # The decoders agree: torchao's to_dtype of the reference's own elements and scales.
    theirs = ao["mx"].to_dtype(el, sc, E4M3, 32, torch.float32).double().numpy()
    assert np.array_equal(deq.astype(np.float32), theirs.astype(np.float32))


# ---- NVFP4 ---------------------------------------------------------------------------------------


def nv_inputs(dtype, finite=True):
    rng = np.random.default_rng(8)
    rand = random_rows(rng, 64, 64, dtype, -40, 40)
    adv = adversarial_blocks(dtype, 16)
    names = ["zeros", "negative zeros", "subnormal amax", "one subnormal", "exact ties"]
    names += ["all equal", "powers of two"] + ([] if finite else ["inf", "-inf"])
    kinds = [adv[k] for k in names]
    kinds += [torch.zeros(16, dtype=dtype)] * (-len(kinds) % 4)
    adv_rows = torch.stack(kinds).reshape(-1, 64)  # four kinds of block a row
    # a block far below the tensor's amax: its scale is an E4M3 subnormal (or 0)
    small = rand[:4] * 2.0**-16
    return torch.cat([rand, small]), adv_rows


def torchao_nvfp4(ao, x, ts):
    ts = torch.tensor(ts, dtype=torch.float32)
    sc, data = ao["nv"].nvfp4_quantize(x, 16, ts)
    return codes(sc), data.numpy()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("given", [False, True], ids=["dynamic", "given"])
def test_nvfp4_fp32_sequence_matches_torchao_bit_for_bit(ao, dtype, given):
    for x in nv_inputs(dtype, finite=not given):
        if given:
            ts = 0.37
        else:
            ts = float(ao["nv"].per_tensor_amax_to_scale(x.abs().max()))
            if ts == 0:
                continue  # torchao divides by 0 (test_nvfp4_where_torchao_differs)
        packed, sc, t = qr.nvfp4(
            x, tensor_scale=ts if given else None, min_block_scale=2.0**-6, arithmetic="fp32_rcp"
        )
        assert packed.dtype == FP4X2 and packed.shape == (x.shape[0], x.shape[1] // 2)
        assert sc.dtype == E4M3 and sc.shape == (x.shape[0], x.shape[1] // 16)
        assert float(t) == float(np.float32(ts))
        ao_sc, ao_data = torchao_nvfp4(ao, x, float(t))
        assert_codes(codes(sc), ao_sc, "block scales")
        assert np.array_equal(codes(packed), ao_data), "packed elements"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_nvfp4_exact_differs_from_torchao_only_beside_boundaries(ao, dtype):
    x = torch.cat(nv_inputs(dtype))
    packed, sc, ts = qr.nvfp4(x, min_block_scale=2.0**-6)
    ao_sc, ao_data = torchao_nvfp4(ao, x, float(ts))
    v = x.double().numpy().reshape(x.shape[0], -1, 16)
    raw = np.abs(v).max(-1) / (6 * float(ts))
    scale_differs = ~qr.codes_equal(codes(sc), ao_sc)
    assert not (scale_differs & ~qr.near_rounding_boundary(raw, "e4m3")).any()
    # Elements, in the blocks whose scales agree: the exact quotient x / (scale * ts).
    s_val = qr.e4m3_decode(codes(sc))[..., None] * float(ts)
    with np.errstate(invalid="ignore", divide="ignore"):
        q = v / s_val
    near = qr.near_rounding_boundary(q, "e2m1").reshape(x.shape)
    differ = qr.unpack_e2m1(codes(packed)) != qr.unpack_e2m1(ao_data)
    same_scale = np.repeat(~scale_differs, 16, axis=-1)
    assert not (differ & same_scale & ~near).any()
    assert near.mean() < 0.05


def test_nvfp4_subnormal_block_scales():
    # NVIDIA keeps E4M3 subnormal block scales; torchao raises them to 2**-6 first.
    x = torch.cat(nv_inputs(torch.float32))
    p0, s0, ts = qr.nvfp4(x)
    p1, s1, _ = qr.nvfp4(x, min_block_scale=2.0**-6)
    v = x.double().numpy().reshape(x.shape[0], -1, 16)
    raw = np.abs(v).max(-1) / (6 * float(ts))
    low = raw < 2.0**-6
    assert low.any() and (qr.e4m3_decode(codes(s0))[low] < 2.0**-6).all()
    assert_codes(codes(s0), codes(s1), "normal block scales", where=~low)
    el0 = qr.unpack_e2m1(codes(p0))
    el1 = qr.unpack_e2m1(codes(p1))
    assert np.array_equal(el0[np.repeat(~low, 16, -1)], el1[np.repeat(~low, 16, -1)])


def test_nvfp4_edges():
    blocks = adversarial_blocks(torch.float32, 16)
    for name in ("zeros", "negative zeros"):
        p, s, t = qr.nvfp4(blocks[name][None], tensor_scale=0.5)
        assert codes(s).tolist() == [[0]]
        want = 0x88 if name == "negative zeros" else 0x00
        assert np.all(codes(p) == want)
    p, s, t = qr.nvfp4(torch.zeros(2, 32))  # an all-zero tensor: tensor scale 1, scales 0
    assert float(t) == 1.0 and np.all(codes(s) == 0) and np.all(codes(p) == 0)
    p, s, t = qr.nvfp4(blocks["one subnormal"][None], tensor_scale=1.0)  # rounds to scale 0
    assert codes(s).tolist() == [[0]] and np.all(codes(p) == 0)
    assert np.all(qr.dequantize_nvfp4(p, s, t).numpy() == 0)
    row = blocks["one huge value"][None]
    p, s, t = qr.nvfp4(row)  # dynamic: the huge value sets the tensor and the block scale
    assert codes(s).tolist() == [[0x7E]] and qr.unpack_e2m1(codes(p))[0, 5] == 0x7
    assert np.all((qr.unpack_e2m1(codes(p))[0, np.arange(16) != 5] & 0x7) == 0)
    for name, sign in (("inf", 0), ("-inf", 8)):  # given finite tensor scale: saturation
        p, s, t = qr.nvfp4(blocks[name][None], tensor_scale=0.25)
        assert codes(s).tolist() == [[0x7E]] and qr.unpack_e2m1(codes(p))[0, 2] == 0x7 | sign
        p, s, t = qr.nvfp4(blocks[name][None])  # computed from x: inf, the block NaN
        assert math.isinf(float(t)) and codes(s).tolist() == [[qr.E4M3_NAN]]
        assert np.all(codes(p) == 0) and torch.isnan(qr.dequantize_nvfp4(p, s, t)).all()
    p, s, t = qr.nvfp4(blocks["nan"][None], tensor_scale=0.25)
    assert codes(s).tolist() == [[qr.E4M3_NAN]] and np.all(codes(p) == 0)
    assert torch.isnan(qr.dequantize_nvfp4(p, s, t)).all()
    p, s, t = qr.nvfp4(torch.cat([blocks["nan"], blocks["all equal"]])[None])
    assert math.isnan(float(t)) and np.all(codes(s) == qr.E4M3_NAN)
    with pytest.raises(ValueError):
        qr.nvfp4(blocks["zeros"][None], tensor_scale=0.0)


def test_nvfp4_where_torchao_differs(ao):
    # An all-zero tensor: torchao's tensor scale is 0 and its block scales 0 / 0 = NaN.
    z = torch.zeros(1, 16)
    ts = ao["nv"].per_tensor_amax_to_scale(z.abs().max())
    assert float(ts) == 0.0
    sc, _ = ao["nv"].nvfp4_quantize(z, 16, ts)
    assert np.all((codes(sc) & 0x7F) == qr.E4M3_NAN)
    _, s, t = qr.nvfp4(z)
    assert float(t) == 1.0 and np.all(codes(s) == 0)


def e2m1_error_bound(q, unit):
    """Half a step of E2M1 (0.25 below 2, q / 4 above), and above 6 the distance to 6."""
    q = np.abs(q)
    return unit * np.maximum(np.maximum(0.25, q / 4), q - qr.E2M1_MAX)


def nv_round_trip_case(arithmetic="exact"):
    x = random_rows(np.random.default_rng(9), 128, 64, torch.bfloat16, -6, 6)  # no scale is 0
    return (x,) + qr.nvfp4(x, arithmetic=arithmetic)


@pytest.mark.parametrize("arithmetic", ["exact", "fp32_rcp"])
def test_nvfp4_round_trip_bound(arithmetic):
    x, p, s, t = nv_round_trip_case(arithmetic)
    v = x.double().numpy()
    unit = np.repeat(qr.e4m3_decode(codes(s)), 16, axis=-1) * float(t)
    deq = qr.dequantize_nvfp4(p, s, t).numpy()
    err = np.abs(deq - v)
    bound = e2m1_error_bound(v / unit, unit) * (1 + 2.0**-20)  # float32 steps in fp32_rcp
    assert np.all(err <= bound) and (err / bound).max() > 0.9


def test_nvfp4_decode_as_torchao(ao):
    x, p, s, t = nv_round_trip_case()
    deq = qr.dequantize_nvfp4(p, s, t).numpy()
    # torchao's decoder reads the reference's bytes as the reference does.
    ao_t = ao["nv"].NVFP4Tensor(
        p.view(torch.uint8), s, 16, torch.float32, t, None, False, False, None
    )
    assert np.allclose(ao_t.dequantize(torch.float32).double().numpy(), deq, rtol=2.0**-22, atol=0)


# ---- scale layouts -------------------------------------------------------------------------------

BLOCKED_SHAPES = [(1, 1), (3, 5), (128, 4), (129, 7), (300, 8), (2, 70, 12)]


def scale_codes(shape):
    return torch.from_numpy(np.random.default_rng(10).integers(0, 255, size=shape, dtype=np.uint8))


@pytest.mark.parametrize("shape", BLOCKED_SHAPES)
def test_blocked_scales_as_torchs_test_helper(shape):
    # torch's own test helper reads the swizzled layout with the cuBLAS formula, element by
    # element in Python loops: a second implementation, written independently of torchao's.
    from torch.testing._internal.common_quantized import from_blocked

    c = scale_codes(shape)
    rows, cols = math.prod(shape[:-1]), shape[-1]
    blocked = qr.to_blocked_scales(c.view(E8M0))
    data = torch.empty(rows, cols * 32)  # only its shape is read
    theirs = from_blocked(data, codes_t(blocked), 32)
    assert torch.equal(theirs, c.reshape(rows, cols))
    back = qr.from_blocked_scales(blocked, rows, cols)
    assert torch.equal(codes_t(back), c.reshape(rows, cols))


@pytest.mark.parametrize("shape", BLOCKED_SHAPES)
def test_to_blocked_scales_matches_torchao(ao, shape):
    c = scale_codes(shape)
    for dtype in (E8M0, E4M3):
        s = c.view(dtype)
        mine = qr.to_blocked_scales(s)
        assert mine.dtype == dtype and mine.dim() == 1
        theirs = ao["utils"].to_blocked(c.reshape(-1, shape[-1]))
        assert torch.equal(codes_t(mine), theirs)
        rows = math.prod(shape[:-1])
        back = qr.from_blocked_scales(mine, rows, shape[-1])
        assert torch.equal(codes_t(back), c.reshape(rows, shape[-1]))
        ao_back = ao["utils"].from_blocked(theirs, rows, shape[-1])
        assert torch.equal(ao_back, c.reshape(rows, shape[-1]))


def test_swizzled_scales_of_torchaos_quantizers(ao):
    # The consumer layout round-trips: torchao's own swizzled scales are the reference's scales
    # through to_blocked_scales, and back.
    rng = np.random.default_rng(11)
    x = random_rows(rng, 200, 256, torch.bfloat16, -10, 10)
    _, sc = qr.mxfp8(x)
    ao_sc, _ = ao["mx"].to_mx(x, E4M3, 32, ao["mode"].FLOOR, is_swizzled_scales=True)
    blocked = qr.to_blocked_scales(sc)
    assert torch.equal(codes_t(blocked), codes_t(ao_sc).reshape(-1))
    assert torch.equal(codes_t(qr.from_blocked_scales(blocked, 200, 8)), codes_t(sc))
    ts = float(ao["nv"].per_tensor_amax_to_scale(x.abs().max()))
    nv = ao["nv"].NVFP4Tensor.to_nvfp4(
        x, per_tensor_scale=torch.tensor(ts), is_swizzled_scales=True
    )
    _, s, _ = qr.nvfp4(x, min_block_scale=2.0**-6, arithmetic="fp32_rcp")
    assert torch.equal(codes_t(qr.to_blocked_scales(s)), codes_t(nv.scale).reshape(-1))
