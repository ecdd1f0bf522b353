# SPDX-License-Identifier: BSD-3-Clause
"""rope.apply_qk_fp8 (and .out): q and k rotated and stored as float8, with their no-RoPE parts
quantized alongside. Checked against the float64 oracle of references.py (within one fp8 step),
and bit for bit against torch's own ``(x / scale).clamp(-max, max).to(fp8)`` wherever the value
quantized is known exactly: copied features (partial rotary, the nope parts), positions that turn
by nothing, and the float32 rotation apply_qk returns."""

import pytest
import references as ref
import torch
from helpers import cpu_and_cuda, dtype_id, make_tables, needs_torch

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


def rotated(x, positions, rotary_dim, interleaved):
    """The float64 oracle's rotation of x (T, H, D); positions broadcast to (T, H)."""
    ang = ref.angles(positions, x.shape[:-1], rotary_dim)
    return ref.rope(x.detach().cpu().double(), ang, interleaved=interleaved)


# ---- correctness --------------------------------------------------------------------------------


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("multiply", [False, True], ids=["divide", "multiply"])
@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "half_split"])
@pytest.mark.parametrize("fp8", FP8, ids=dtype_id)
@pytest.mark.parametrize(
    "dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16], ids=dtype_id
)
def test_matches_reference(dtype, fp8, interleaved, multiply, device):
    c = make_call(device, dtype)
    q_scale, k_scale = (4.0, 8.0) if multiply else (0.05, 0.1)
    outs = call(
        c, q_scale=q_scale, k_scale=k_scale, dtype=fp8, interleaved=interleaved,
        multiply_by_scale=multiply,
    )  # fmt: skip
    q_out, k_out, qn_out, kn_out = outs
    for o, x in zip(outs, (c["q"], c["k"], c["q_nope"], c["k_nope"])):
        assert o.dtype == fp8 and o.shape == x.shape and o.is_contiguous() and o.device == x.device
    pos = c["positions"].cpu()
    ref.fp8_close(q_out, rotated(c["q"], pos, 48, interleaved), q_scale, fp8, multiply=multiply)
    ref.fp8_close(k_out, rotated(c["k"], pos, 48, interleaved), k_scale, fp8, multiply=multiply)
    # Copied features are quantized exactly as torch quantizes them: the tails and the nope parts.
    for got, x, s in ((q_out, c["q"], q_scale), (k_out, c["k"], k_scale)):
        want = ref.quantize_fp8(x[..., 48:], s, fp8, multiply=multiply)
        assert ref.same_bits(got[..., 48:], want)
    assert ref.same_bits(qn_out, ref.quantize_fp8(c["q_nope"], q_scale, fp8, multiply=multiply))
    assert ref.same_bits(kn_out, ref.quantize_fp8(c["k_nope"], k_scale, fp8, multiply=multiply))


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
def test_gqa_mla_key_and_per_head_positions(device):
    # One key head (MLA's shared k_pe as (T, 1, R)) and positions per (token, head).
    c = make_call(device, Hq=3, Hk=3, per_head=True, D=64, rotary_dim=64)
    q_out, k_out, _, _ = call(c, q_scale=0.05, k_scale=0.05)
    pos = c["positions"].cpu()
    ref.fp8_close(q_out, rotated(c["q"], pos, 64, True), 0.05, torch.float8_e4m3fn)
    ref.fp8_close(k_out, rotated(c["k"], pos, 64, True), 0.05, torch.float8_e4m3fn)
    c = make_call(device, Hq=8, Hk=1, D=64, rotary_dim=64, Nk=None)
    q_out, k_out, _, _ = call(c, q_scale=0.05, k_scale=0.05)
    ref.fp8_close(k_out, rotated(c["k"], c["positions"].cpu(), 64, True), 0.05,
                  torch.float8_e4m3fn)  # fmt: skip


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
    for got, x in zip(outs[:2], (c["q"], c["k"])):
        ang = ref.angles(positions.cpu(), x.shape[:-1], 64, mrope_section=section,
                         mrope_interleaved=mrope_interleaved)  # fmt: skip
        want = ref.rope(x.cpu().double(), ang, interleaved=False)
        ref.fp8_close(got, want, 0.05, torch.float8_e4m3fn)
    # The same bytes as apply_qk's float32 multi-axis rotation, quantized by torch.
    q32, _ = torch_rope.apply_qk(
        c["q"], c["k"], c["cos"], c["sin"], positions, interleaved=False, mrope_section=section,
        mrope_interleaved=mrope_interleaved,
    )  # fmt: skip
    assert ref.same_bits(outs[0], ref.quantize_fp8(q32, 0.05, torch.float8_e4m3fn))


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


# ---- bad input ----------------------------------------------------------------------------------


def bad_calls():
    """(name, change, message): the checks; every buffer must stay unwritten."""
    return [
        ("q_2d", dict(q_2d=True), "q must be 3-D"),
        ("k_tokens", dict(k_tokens=4), r"k.size\(0\) \(tokens\) must equal q.size\(0\)"),
        ("q_nope_heads", dict(q_nope_heads=3), "q_nope must have q's head count"),
        ("k_nope_dtype", dict(k_nope_dtype=torch.float64), "k_nope must have k's dtype"),
        ("dtype_not_fp8", dict(dtype=torch.float16), "dtype must be a float8 dtype"),
        ("scale_dtype", dict(q_scale=torch.tensor(1.0, dtype=torch.float64)), "q_scale must be a"),
        ("scale_numel", dict(k_scale=torch.ones(2)), "k_scale must hold one value"),
        ("scale_zero", dict(k_scale=torch.tensor(0.0)), "k_scale must be a finite number > 0"),
        ("scale_nan", dict(q_scale=torch.tensor(float("nan"))), "q_scale must be a finite"),
        ("position_out_of_range", dict(bad_position=True), "positions must be in"),
        ("out_dtype", dict(out_dtype=torch.float16), "q_out must be float8"),
        ("out_mixed_dtypes", dict(out_k_e5m2=True), "k_out must be Float8_e4m3fn"),
        ("out_shape", dict(out_shape=True), "k_out must have k's shape"),
        ("out_missing_nope", dict(out_no_nope=True), "q_nope_out goes with q_nope"),
        ("out_aliases_q", dict(out_is_q=True), "shares memory with q"),
        ("outs_overlap", dict(outs_overlap=True), "shares memory with"),
        ("out_overlapping", dict(out_expanded=True), "q_out has overlapping memory"),
    ]


def build_bad(device, change):
    c = make_call(device)
    ch = dict(change)
    kw = {}
    out = None
    if ch.get("q_2d"):
        c["q"] = c["q"][:, 0]
    if "k_tokens" in ch:
        c["k"] = c["k"][: ch["k_tokens"]]
    if "q_nope_heads" in ch:
        c["q_nope"] = torch.randn(5, ch["q_nope_heads"], 16, device=device)
    if "k_nope_dtype" in ch:
        c["k_nope"] = c["k_nope"].to(ch["k_nope_dtype"])
    for name in ("dtype", "q_scale", "k_scale"):
        if name in ch:
            kw[name] = ch[name].to(device) if isinstance(ch[name], torch.Tensor) else ch[name]
    if ch.get("bad_position"):
        c["positions"][2, 0] = MAX_SEQ_LEN
    fp8 = torch.float8_e4m3fn
    if any(n.startswith("out") for n in ch):
        out = [torch.zeros(x.shape, device=device).to(fp8) for x in
               (c["q"], c["k"], c["q_nope"], c["k_nope"])]  # fmt: skip
        if "out_dtype" in ch:
            out[0] = out[0].to(ch["out_dtype"])
        if ch.get("out_k_e5m2"):
            out[1] = out[1].to(torch.float8_e5m2)
        if ch.get("out_shape"):
            out[1] = torch.zeros(5, 3, 80, device=device).to(fp8)
        if ch.get("out_no_nope"):
            out[2] = None
        if ch.get("out_is_q"):
            c["q"] = torch.randn(5, 4, 80, device=device)
            out[0] = c["q"].view(torch.uint8)[..., :80].view(fp8)
        if ch.get("outs_overlap"):
            out[1] = out[0][:, :2]
        if ch.get("out_expanded"):
            out[0] = torch.zeros(5, 1, 80, device=device).to(fp8).expand(5, 4, 80)
    return c, kw, out


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("case", bad_calls(), ids=lambda c: c[0])
def test_bad_input_names_the_argument_and_writes_nothing(case, device):
    name, change, message = case
    if device == "cuda" and name in ("position_out_of_range", "scale_zero", "scale_nan"):
        pytest.skip("on CUDA: a device assert, or a scale read by the kernel alone (documented)")
    c, kw, out = build_bad(device, change)
    written = [t for t in (out or []) if t is not None]
    before = [t.clone() for t in written]
    with pytest.raises((RuntimeError, IndexError, ValueError), match=message):
        call(c, out=out, **kw)
    for t, b in zip(written, before):
        assert ref.same_bits(t, b), f"{name} wrote"


def to_meta(t):
    return None if t is None else torch.empty_strided(t.shape, t.stride(), dtype=t.dtype,
                                                     device="meta")  # fmt: skip


@pytest.mark.parametrize("case", bad_calls(), ids=lambda c: c[0])
def test_meta_rejects_what_cpu_rejects(case):
    name, change, message = case
    if name in ("position_out_of_range", "scale_zero", "scale_nan"):
        pytest.skip("needs the values: left to the real kernels")
    if name in ("out_aliases_q", "outs_overlap"):
        pytest.skip("meta tensors have no memory to share")
    c, kw, out = build_bad("cpu", change)
    meta = {n: to_meta(t) for n, t in c.items()}
    kw = {n: to_meta(t) if isinstance(t, torch.Tensor) else t for n, t in kw.items()}
    with pytest.raises((RuntimeError, IndexError, ValueError), match=message):
        call(meta, out=None if out is None else [to_meta(t) for t in out], **kw)


def test_meta_shapes():
    c = make_call("meta")
    outs = call(c, dtype=torch.float8_e5m2)
    assert [o.shape for o in outs] == [(5, 4, 80), (5, 2, 80), (5, 4, 16), (5, 2, 8)]
    assert all(o.dtype == torch.float8_e5m2 and o.device.type == "meta" for o in outs)


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


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_empty(device):
    c = make_call(device, T=0)
    outs = call(c)
    assert [o.shape[0] for o in outs] == [0, 0, 0, 0]


# ---- torch.compile and opcheck ------------------------------------------------------------------


@needs_torch("2.5", "torch.library.opcheck of ops with optional mutable args")
@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("overload", ["functional", "out"])
def test_opcheck(overload, device):
    c = make_call(device, torch.bfloat16)
    args = (c["q"], c["k"], c["cos"], c["sin"], c["positions"])
    kw = dict(q_nope=c["q_nope"], k_nope=c["k_nope"], q_scale=torch.tensor(0.1, device=device))
    # opcheck's schema test compares mutated outputs with arithmetic that float8 lacks.
    utils = ("test_faketensor", "test_aot_dispatch_dynamic", "test_autograd_registration")
    if overload == "functional":
        torch.library.opcheck(torch.ops.rope.apply_qk_fp8.default, args, kw, test_utils=utils)
    else:
        _, views = padded_outputs(c, torch.float8_e4m3fn, device)
        kw.update(q_out=views[0], k_out=views[1], q_nope_out=views[2], k_nope_out=views[3])
        torch.library.opcheck(torch.ops.rope.apply_qk_fp8.out, args, kw, test_utils=utils)


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_compile_fullgraph(device):
    import torch._dynamo

    torch._dynamo.reset()

    def step(q, k, cos, sin, positions, q_nope, k_nope, scale, outs):
        a = torch_rope.apply_qk_fp8(q, k, cos, sin, positions, q_nope=q_nope, k_nope=k_nope,
                                    q_scale=scale, k_scale=scale)  # fmt: skip
        torch_rope.apply_qk_fp8(q, k, cos, sin, positions, q_nope=q_nope, k_nope=k_nope,
                                q_scale=scale, k_scale=scale, out=outs)  # fmt: skip
        return a

    compiled = torch.compile(step, fullgraph=True)
    c = make_call(device, torch.bfloat16)
    scale = torch.tensor(0.25, device=device)
    _, views = padded_outputs(c, torch.float8_e4m3fn, device)
    _, eager_views = padded_outputs(c, torch.float8_e4m3fn, device)
    args = (c["q"], c["k"], c["cos"], c["sin"], c["positions"], c["q_nope"], c["k_nope"], scale)
    got = compiled(*args, views)
    want = step(*args, eager_views)
    assert all(ref.same_bits(a, b) for a, b in zip(got, want))
    assert all(ref.same_bits(a, b) for a, b in zip(views, eager_views))
