# SPDX-License-Identifier: BSD-3-Clause
"""rope.apply_qk_fp8 (and .out): q and k rotated and stored as float8, with their no-RoPE parts
quantized alongside. Its samples (samples.py's qk_fp8 family: the float64 oracle, opcheck,
compile), bad calls (test_errors.py) and fuzzing (test_fuzz.py) are the shared catalogue's;
this file holds the float8 bytes: bit for bit against torch's own
``(x / scale).clamp(-max, max).to(fp8)`` wherever the value quantized is known exactly (positions
that turn by nothing, the float32 rotation apply_qk returns, every rounding and saturation case),
the scale rules and defaults, and the oracle crossed with every dtype, format, layout and rule."""

import pytest
import references as ref
import torch
from helpers import cpu_and_cuda, dtype_id, make_tables
from samples import qk_fp8_sample

import torch_rope

MAX_SEQ_LEN = 64
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def make_call(
    device,
    dtype=torch.float32,
    *,
    T=5,
    Hq=4,
    Hk=2,
    D=80,
    rotary_dim=48,
    Nq=16,
    Nk=8,
    per_head=False,
):
    table_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    cos, sin = make_tables(MAX_SEQ_LEN, rotary_dim, device, table_dtype)

    def rnd(*shape):
        return (torch.randn(*shape, dtype=torch.float64) * 3).to(dtype=dtype, device=device)

    positions = torch.randint(0, MAX_SEQ_LEN, (T, Hq if per_head else 1), device=device)
    return dict(
        q=rnd(T, Hq, D),
        k=rnd(T, Hk, D),
        cos=cos,
        sin=sin,
        positions=positions,
        q_nope=None if Nq is None else rnd(T, Hq, Nq),
        k_nope=None if Nk is None else rnd(T, Hk, Nk),
    )


def call(c, **kw):
    return torch_rope.apply_qk_fp8(
        c["q"], c["k"], c["cos"], c["sin"], c["positions"], q_nope=c["q_nope"],
        k_nope=c["k_nope"], **kw,
    )  # fmt: skip


# ---- correctness --------------------------------------------------------------------------------


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("multiply", [False, True], ids=["divide", "multiply"])
@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "half_split"])
@pytest.mark.parametrize("fp8", FP8, ids=dtype_id)
@pytest.mark.parametrize(
    "dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16], ids=dtype_id
)
def test_matches_reference(dtype, fp8, interleaved, multiply, device):
    # samples.py's builder and check (the float64 oracle within one fp8 step, copied features
    # and nope parts bit for bit as torch quantizes them), crossed with every dtype, format,
    # layout and scale rule.
    scales = ("float", 4.0, 8.0) if multiply else ("float", 0.05, 0.1)
    sample = qk_fp8_sample(
        "apply_qk_fp8", "contiguous", dtype, fp8, 5, 4, 2, 80, 48, 16, 8, interleaved, multiply,
        scales, "token", None, device,
    )  # fmt: skip
    before = sample.snapshot()
    sample.check(sample.call(), before)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("multiply", [False, True], ids=["divide", "multiply"])
@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "half_split"])
@pytest.mark.parametrize("rotary_dim", [64, 128])
def test_bit_exact_with_torch_quantization_of_the_float32_rotation(
    rotary_dim, interleaved, multiply, device
):
    # apply_qk returns the float32 rotation (the same fused multiply-adds); its torch
    # quantization must be the op's bytes. 16-bit inputs are rotated in float32 without a
    # rounding in between: the bytes of float32 inputs holding the same values.
    c = make_call(device, torch.float32, D=128, rotary_dim=rotary_dim, Nq=None, Nk=None)
    q32, k32 = torch_rope.apply_qk(
        c["q"], c["k"], c["cos"], c["sin"], c["positions"], interleaved=interleaved
    )
    for fp8 in FP8:
        outs = call(c, q_scale=0.02, k_scale=0.03, dtype=fp8, interleaved=interleaved,
                    multiply_by_scale=multiply)  # fmt: skip
        assert ref.same_bits(outs[0], ref.quantize_fp8(q32, 0.02, fp8, multiply=multiply))
        assert ref.same_bits(outs[1], ref.quantize_fp8(k32, 0.03, fp8, multiply=multiply))
        for dtype in (torch.bfloat16, torch.float16):
            c16 = dict(c, q=c["q"].to(dtype), k=c["k"].to(dtype))
            c32 = dict(c, q=c16["q"].float(), k=c16["k"].float())
            a = call(c16, q_scale=0.02, k_scale=0.03, dtype=fp8, interleaved=interleaved,
                     multiply_by_scale=multiply)  # fmt: skip
            b = call(c32, q_scale=0.02, k_scale=0.03, dtype=fp8, interleaved=interleaved,
                     multiply_by_scale=multiply)  # fmt: skip
            assert ref.same_bits(a[0], b[0]) and ref.same_bits(a[1], b[1]), dtype


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("fp8", FP8, ids=dtype_id)
def test_rounding_saturation_and_nan(fp8, device):
    # Position 0 turns by nothing (cos 1, sin 0 exactly): the bytes are torch's quantization of
    # the values themselves, every rounding case, saturation (e5m2: the largest finite value,
    # not inf) and NaN; the specials sit in the tails and nope parts (inf * sin(0) would be NaN).
    m = ref.FP8_MAX[fp8]
    finite = torch.cat(
        [
            torch.linspace(-1.2 * m, 1.2 * m, 4001, dtype=torch.float64),
            torch.logspace(-24, 0, 600, base=2.0, dtype=torch.float64) * m / 64,
            torch.tensor([1e30, -1e30, 5e-45, -5e-45]),
        ]
    )
    T = finite.numel() // 32
    x = finite[: T * 32].view(T, 1, 32).clone()
    x[:4, 0, 16:20] = torch.tensor([float("inf"), float("-inf"), float("nan"), -0.0])
    for dtype in (torch.float32, torch.float64):
        xd = x.to(dtype=dtype, device=device)
        cos, sin = make_tables(4, 16, device, dtype)
        pos = torch.zeros(T, 1, dtype=torch.int64, device=device)
        for multiply, scale in ((False, 0.75), (True, 1.25)):
            outs = torch_rope.apply_qk_fp8(
                xd, xd, cos, sin, pos, q_nope=xd, k_nope=xd, q_scale=scale, k_scale=scale,
                dtype=fp8, multiply_by_scale=multiply,
            )  # fmt: skip
            want = ref.quantize_fp8(xd, scale, fp8, multiply=multiply)
            for o in outs:
                assert ref.same_bits(o, want), (dtype, multiply)


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_flashinfer_multiplies_not_by_the_reciprocal(device):
    # peer_semantics.md FQ-1: value * quant_scale rounds differently from value / (1 / scale).
    cos, sin = make_tables(4, 16, device)
    x = torch.tensor([2.0**-10, 0.009765625], dtype=torch.bfloat16, device=device)
    x = x.view(2, 1, 1).expand(2, 1, 16).contiguous()
    pos = torch.zeros(2, 1, dtype=torch.int64, device=device)
    by_7 = torch_rope.apply_qk_fp8(x, x, cos, sin, pos, q_scale=7.0, multiply_by_scale=True)[0]
    by_17 = torch_rope.apply_qk_fp8(x, x, cos, sin, pos, q_scale=1.7, multiply_by_scale=True)[0]
    assert by_7.view(torch.uint8)[0, 0, 0].item() == 0x04  # 3.5 subnormal units: tie to even
    assert by_17.view(torch.uint8)[1, 0, 0].item() == 0x08
    reciprocal = torch_rope.apply_qk_fp8(x, x, cos, sin, pos, q_scale=1.0 / 7.0)[0]
    assert reciprocal.view(torch.uint8)[0, 0, 0].item() == 0x03


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_scale_forms_and_defaults(device):
    c = make_call(device, torch.bfloat16)
    forms = [0.5, torch.tensor(0.5, device=device), torch.tensor([0.5], device=device)]
    outs = [call(c, q_scale=s, k_scale=s) for s in forms]
    for o in outs[1:]:
        assert all(ref.same_bits(a, b) for a, b in zip(outs[0], o))
    # No scale is scale 1; e4m3fn is the default dtype.
    plain = call(c)
    ones = call(c, q_scale=1.0, k_scale=1.0, dtype=torch.float8_e4m3fn)
    assert all(a.dtype == torch.float8_e4m3fn for a in plain)
    assert all(ref.same_bits(a, b) for a, b in zip(plain, ones))
    # Absent nope parts give empty (T, H, 0) outputs.
    c = make_call(device, Nq=None, Nk=None)
    outs = call(c)
    assert outs[2].shape == (5, 4, 0) and outs[3].shape == (5, 2, 0)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("section,mrope_interleaved", [([8, 12, 12], False), ([8, 12, 12], True)])
def test_multi_axis_positions(section, mrope_interleaved, device):
    c = make_call(device, D=64, rotary_dim=64, Nq=None, Nk=None)
    T = c["q"].size(0)
    positions = torch.randint(0, MAX_SEQ_LEN, (3, T, 1), device=device).permute(1, 2, 0)
    outs = torch_rope.apply_qk_fp8(
        c["q"], c["k"], c["cos"], c["sin"], positions, q_scale=0.05, k_scale=0.05,
        interleaved=False, mrope_section=section, mrope_interleaved=mrope_interleaved,
    )  # fmt: skip
    # The same bytes as apply_qk's float32 multi-axis rotation, quantized by torch (the float64
    # oracle of multi-axis calls is the qk_fp8 samples').
    q32, _ = torch_rope.apply_qk(
        c["q"], c["k"], c["cos"], c["sin"], positions, interleaved=False, mrope_section=section,
        mrope_interleaved=mrope_interleaved,
    )  # fmt: skip
    assert ref.same_bits(outs[0], ref.quantize_fp8(q32, 0.05, torch.float8_e4m3fn))


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "half_split"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=dtype_id)
def test_inverse_quantizes_the_inverse_rotation(dtype, interleaved, device):
    # inverse=True: apply_qk's inverse rotation (the negated angle), then torch's quantization,
    # bit for bit: the functional overload (the eager fast path and the dispatcher's), out=, and
    # the tail and nope parts as without inverse. 16-bit inputs: the bytes of their float32 values.
    c = make_call(device, dtype, D=80, rotary_dim=48)
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    qi, ki = torch_rope.apply_qk(
        c["q"].to(wide), c["k"].to(wide), c["cos"], c["sin"], c["positions"],
        interleaved=interleaved, inverse=True,
    )  # fmt: skip
    kw = dict(q_scale=0.05, k_scale=0.1, interleaved=interleaved)
    outs = call(c, inverse=True, **kw)
    assert ref.same_bits(outs[0], ref.quantize_fp8(qi, 0.05, torch.float8_e4m3fn))
    assert ref.same_bits(outs[1], ref.quantize_fp8(ki, 0.1, torch.float8_e4m3fn))
    assert ref.same_bits(outs[2], ref.quantize_fp8(c["q_nope"], 0.05, torch.float8_e4m3fn))
    # The rotation really turned the other way (positions other than 0 move the rows).
    forward = call(c, **kw)
    assert not ref.same_bits(outs[0], forward[0])
    assert ref.same_bits(outs[2], forward[2]) and ref.same_bits(outs[3], forward[3])
    # The dispatcher's path and out= give the same bytes.
    scale = torch.tensor(0.05, device=device), torch.tensor(0.1, device=device)
    via_op = torch.ops.rope.apply_qk_fp8(
        c["q"], c["k"], c["cos"], c["sin"], c["positions"], q_nope=c["q_nope"],
        k_nope=c["k_nope"], q_scale=scale[0], k_scale=scale[1], interleaved=interleaved,
        inverse=True,
    )  # fmt: skip
    assert all(ref.same_bits(a, b) for a, b in zip(via_op, outs))
    _, views = padded_outputs(c, torch.float8_e4m3fn, device)
    call(c, inverse=True, out=views, **kw)
    assert all(ref.same_bits(v, o) for v, o in zip(views, outs))


# ---- out= ---------------------------------------------------------------------------------------


def padded_outputs(c, fp8, device):
    """fp8 buffers with padding around the views the op writes (filled with 0x55)."""
    bufs, views = [], []
    for name in ("q", "k", "q_nope", "k_nope"):
        x = c[name]
        if x is None:
            bufs.append(None)
            views.append(None)
            continue
        T, H, W = x.shape
        buf = torch.full((T + 1, H + 1, W + 16), 0x55, dtype=torch.uint8, device=device).view(fp8)
        bufs.append(buf)
        views.append(buf[1:, :H, 8 : 8 + W])
    return bufs, views


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("fp8", FP8, ids=dtype_id)
def test_out_writes_the_callers_buffers(fp8, device):
    c = make_call(device, torch.bfloat16)
    bufs, views = padded_outputs(c, fp8, device)
    got = call(c, q_scale=0.1, k_scale=0.2, out=views)
    assert all(g is v for g, v in zip(got, views))
    want = call(c, q_scale=0.1, k_scale=0.2, dtype=fp8)
    for v, w, b in zip(views, want, bufs):
        assert ref.same_bits(v, w)
        untouched = torch.ones(b.shape, dtype=torch.bool)
        untouched[1:, : v.size(1), 8 : 8 + v.size(2)] = False
        assert (b.cpu().view(torch.uint8)[untouched] == 0x55).all()
    # Two buffers are enough without the nope parts.
    c = make_call(device, Nq=None, Nk=None)
    bufs, views = padded_outputs(c, fp8, device)
    got = call(c, out=views[:2])
    assert ref.same_bits(got[0], call(c, dtype=fp8)[0])


# ---- autograd and version counters ------------------------------------------------------------


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_not_differentiable_and_version_counters(device):
    c = make_call(device)
    c["q"].requires_grad_(True)
    with pytest.raises(RuntimeError, match="doesn't support automatic differentiation"):
        call(c)
    with torch.no_grad():
        call(c)
    c = make_call(device)
    _, views = padded_outputs(c, torch.float8_e4m3fn, device)
    versions = [v._version for v in views]
    call(c, out=views)
    assert all(v._version > before for v, before in zip(views, versions))
