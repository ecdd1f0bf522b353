# SPDX-License-Identifier: BSD-3-Clause
"""rope.apply_qk_cache: q and k rotated, the rotated k and v written into rows of a KV cache
(flat or paged; 16/32-bit or fp8 with a scale), q returned. Checked against a reference written
here (rotation in float64 from the definition, index writes into a copy of the cache), and for
fp8 against torch's own ``(x / scale).clamp(-max, max).to(fp8)`` bit for bit."""

import re

import pytest
import torch
from helpers import cpu_and_cuda, dtype_id, make_tables, needs_torch

import torch_rope

MAX_SEQ_LEN = 96
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
# One fp8 step relative to the value (3 / 2 mantissa bits) and the smallest subnormal.
FP8_STEP = {torch.float8_e4m3fn: (2.0**-3, 2.0**-9), torch.float8_e5m2: (2.0**-2, 2.0**-16)}
TOL = {
    torch.float64: dict(rtol=1e-12, atol=1e-12),
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    torch.float16: dict(rtol=1e-3, atol=1e-3),
    torch.bfloat16: dict(rtol=1e-2, atol=1e-2),
}


# ---- the reference ------------------------------------------------------------------------------


def rotate_ref(x, positions, rotary_dim, interleaved, theta=10000.0):
    """x (T, H, D) rotated in float64 from the definition; positions broadcast to (T, H)."""
    x = x.detach().to("cpu", torch.float64)
    half = rotary_dim // 2
    inv_freq = theta ** (-2.0 * torch.arange(half, dtype=torch.float64) / rotary_dim)
    pos = positions.to("cpu", torch.float64).expand(x.shape[:-1])
    ang = pos[..., None] * inv_freq
    c, s = ang.cos(), ang.sin()
    out = x.clone()
    if interleaved:
        a, b = x[..., 0:rotary_dim:2], x[..., 1:rotary_dim:2]
        out[..., 0:rotary_dim:2] = a * c - b * s
        out[..., 1:rotary_dim:2] = a * s + b * c
    else:
        a, b = x[..., :half], x[..., half:rotary_dim]
        out[..., :half] = a * c - b * s
        out[..., half:rotary_dim] = a * s + b * c
    return out


def cache_rows(cache, slots):
    """The rows of `slots` of a flat (S, H, D) or paged (N, B, H, D) cache, as (len, H, D)."""
    if cache.dim() == 3:
        return cache[slots]
    block_size = cache.size(1)
    return cache[slots // block_size, slots % block_size]


def quantize(x, scale, dtype):
    """torch's own fp8 quantization: (x / scale).clamp(-max, max).to(fp8)."""
    m = FP8_MAX[dtype]
    return (x / scale).clamp(-m, m).to(dtype)


def assert_fp8_close(got, want_value, scale, dtype):
    """got (fp8) decodes to want_value / scale within one fp8 step."""
    rel, tiny = FP8_STEP[dtype]
    want = (want_value / scale).clamp(-FP8_MAX[dtype], FP8_MAX[dtype])
    torch.testing.assert_close(got.double(), want.double(), rtol=rel, atol=tiny)


def same_bits(a, b):
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def make_call(
    device,
    dtype=torch.float32,
    cache_dtype=None,
    *,
    T=6,
    Hq=8,
    Hkv=2,
    D=64,
    rotary_dim=64,
    Dv=None,
    paged=True,
    num_blocks=5,
    block_size=4,
    with_v=True,
    slots=None,
):
    cache_dtype = cache_dtype or dtype
    Dv = Dv or D
    cos, sin = make_tables(
        MAX_SEQ_LEN, rotary_dim, device, torch.float64 if dtype == torch.float64 else torch.float32
    )
    q = torch.randn(T, Hq, D, dtype=torch.float64).to(dtype=dtype, device=device)
    k = torch.randn(T, Hkv, D, dtype=torch.float64).to(dtype=dtype, device=device)
    v = torch.randn(T, Hkv, Dv, dtype=torch.float64).to(dtype=dtype, device=device)
    positions = torch.randint(0, MAX_SEQ_LEN, (T, 1), device=device)
    num_slots = num_blocks * block_size
    if slots is None:
        slots = torch.randperm(num_slots)[:T]
        slots[T // 2] = -1  # one padding token
    slot_mapping = torch.as_tensor(slots, dtype=torch.int64).to(device)
    lead = (num_blocks, block_size) if paged else (num_slots,)
    k_cache = torch.full((*lead, Hkv, D), 3.0, device=device).to(cache_dtype)
    v_cache = torch.full((*lead, Hkv, Dv), 3.0, device=device).to(cache_dtype)
    return dict(
        q=q,
        k=k,
        v=v if with_v else None,
        cos=cos,
        sin=sin,
        positions=positions,
        k_cache=k_cache,
        v_cache=v_cache if with_v else None,
        slot_mapping=slot_mapping,
    )


def call(c, **kw):
    return torch_rope.apply_qk_cache(
        c["q"],
        c["k"],
        c["v"],
        c["cos"],
        c["sin"],
        c["positions"],
        c["k_cache"],
        c["v_cache"],
        c["slot_mapping"],
        **kw,
    )


def check_against_reference(c, q_out, interleaved, rotary_dim, k_scale=None, v_scale=None):
    """q_out, the written rows and the untouched rows, against the reference."""
    q, k, v = c["q"], c["k"], c["v"]
    pos = c["positions"].cpu()
    tol = TOL[q.dtype]
    torch.testing.assert_close(
        q_out.cpu(), rotate_ref(q, pos, rotary_dim, interleaved).to(q.dtype), **tol
    )
    slots = c["slot_mapping"].cpu()
    real = slots >= 0
    k_want = rotate_ref(k, pos, rotary_dim, interleaved)[real]
    kc, vc = c["k_cache"].cpu(), None if c["v_cache"] is None else c["v_cache"].cpu()
    got_k = cache_rows(kc, slots[real])
    if kc.dtype in FP8:
        assert_fp8_close(got_k, k_want, k_scale, kc.dtype)
    else:
        torch.testing.assert_close(got_k, k_want.to(kc.dtype), **tol)
    if vc is not None:
        got_v = cache_rows(vc, slots[real])
        v_real = v.cpu()[real]
        if vc.dtype in FP8:
            assert same_bits(got_v, quantize(v_real.float(), v_scale, vc.dtype))
        else:
            assert torch.equal(got_v, v_real)
    # Every other row still holds the fill value.
    for cache in (kc, vc):
        if cache is None:
            continue
        flat = cache.reshape(-1, *cache.shape[-2:]).double()
        untouched = torch.ones(flat.size(0), dtype=torch.bool)
        untouched[slots[real]] = False
        assert (flat[untouched] == 3.0).all(), "a row outside slot_mapping was written"


# ---- correctness --------------------------------------------------------------------------------


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "half_split"])
@pytest.mark.parametrize("paged", [True, False], ids=["paged", "flat"])
@pytest.mark.parametrize(
    "dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16], ids=dtype_id
)
def test_matches_reference(dtype, paged, interleaved, device):
    c = make_call(device, dtype, paged=paged, D=80, rotary_dim=48, Dv=40)
    q_out = call(c, interleaved=interleaved)
    assert q_out.shape == c["q"].shape and q_out.dtype == dtype and q_out.is_contiguous()
    check_against_reference(c, q_out, interleaved, 48)
    # q_out is exactly what apply_qk returns, and the cache rows its k.
    q_ref, k_ref = torch_rope.apply_qk(
        c["q"], c["k"], c["cos"], c["sin"], c["positions"], interleaved=interleaved
    )
    assert torch.equal(q_out, q_ref)
    slots = c["slot_mapping"]
    assert torch.equal(cache_rows(c["k_cache"], slots[slots >= 0]), k_ref[slots >= 0])


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("Hq,Hkv", [(8, 8), (8, 2), (4, 1)], ids=["mha", "gqa", "mqa"])
def test_head_counts_and_no_v(Hq, Hkv, device):
    c = make_call(device, Hq=Hq, Hkv=Hkv, with_v=False, paged=False)
    q_out = call(c)
    check_against_reference(c, q_out, True, 64)


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_all_padding_writes_nothing_and_rotates_q(device):
    c = make_call(device, slots=[-1, -1, -5, -1, -1, -2])
    before = c["k_cache"].clone(), c["v_cache"].clone()
    q_out = call(c)
    assert torch.equal(c["k_cache"], before[0]) and torch.equal(c["v_cache"], before[1])
    torch.testing.assert_close(
        q_out.cpu(),
        rotate_ref(c["q"], c["positions"].cpu(), 64, True).float(),
        **TOL[torch.float32],
    )


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_strided_slices_of_a_fused_qkv_and_strided_caches(dtype, device):
    T, Hq, Hkv, D = 5, 4, 2, 64
    qkv = torch.randn(T, (Hq + 2 * Hkv) * D + 8, device=device).to(dtype)
    q = qkv[:, : Hq * D].view(T, Hq, D)
    k = qkv[:, Hq * D : (Hq + Hkv) * D].view(T, Hkv, D)
    v = qkv[:, (Hq + Hkv) * D : (Hq + 2 * Hkv) * D].view(T, Hkv, D)
    assert not q.is_contiguous()
    # One (2, num_blocks, block_size, Hkv, D + 16) buffer: k and v caches are its halves, with
    # padded rows, so neither is contiguous.
    kv = torch.full((2, 3, 4, Hkv, D + 16), 3.0, device=device).to(dtype)
    k_cache, v_cache = kv[0, ..., :D], kv[1, ..., 16:]
    cos, sin = make_tables(MAX_SEQ_LEN, D, device)
    positions = torch.arange(10, 10 + T, device=device).view(T, 1)
    slots = torch.tensor([11, 0, 5, -1, 7], device=device)
    c = dict(
        q=q,
        k=k,
        v=v,
        cos=cos,
        sin=sin,
        positions=positions,
        k_cache=k_cache,
        v_cache=v_cache,
        slot_mapping=slots,
    )
    q_out = call(c)
    real = slots.cpu() >= 0
    torch.testing.assert_close(
        q_out.cpu(), rotate_ref(q, positions.cpu(), D, True).to(dtype), **TOL[dtype]
    )
    torch.testing.assert_close(
        cache_rows(k_cache.cpu(), slots.cpu()[real]),
        rotate_ref(k, positions.cpu(), D, True)[real].to(dtype),
        **TOL[dtype],
    )
    assert torch.equal(cache_rows(v_cache.cpu(), slots.cpu()[real]), v.cpu()[real])
    # The padding of the rows is untouched.
    assert (kv[0, ..., D:] == 3.0).all() and (kv[1, ..., :16] == 3.0).all()


# ---- fp8 ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("fp8", FP8, ids=dtype_id)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=dtype_id)
def test_fp8_caches_against_reference(dtype, fp8, device):
    c = make_call(device, dtype, fp8, D=64, rotary_dim=32)
    k_scale, v_scale = 0.05, 0.02  # values up to ~4 / 0.02 = 200: within e4m3's range
    q_out = call(c, k_scale=k_scale, v_scale=v_scale)
    check_against_reference(c, q_out, True, 32, k_scale=k_scale, v_scale=v_scale)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("fp8", FP8, ids=dtype_id)
@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "half_split"])
def test_fp8_bit_exact_with_torch(interleaved, fp8, device):
    # With k == q (float32, as many heads), q_out is the float32 rotation of k: the cache must be
    # torch's quantization of it, bit for bit. bfloat16 / float16 k are rotated in float32 with no
    # rounding in between: the same bytes as float32 k holding the same values.
    c = make_call(device, torch.float32, fp8, Hq=2, Hkv=2, D=64, rotary_dim=48)
    c["k"] = c["q"].clone()
    scale = torch.tensor(0.01, device=device)
    q_out = call(c, k_scale=scale, v_scale=scale)
    slots = c["slot_mapping"]
    real = slots >= 0
    want = quantize(q_out[real], scale, fp8)
    assert same_bits(cache_rows(c["k_cache"], slots[real]), want)
    assert same_bits(cache_rows(c["v_cache"], slots[real]), quantize(c["v"][real], scale, fp8))
    for dtype in (torch.bfloat16, torch.float16):
        c16 = dict(
            c, k_cache=torch.zeros_like(c["k_cache"]), v_cache=torch.zeros_like(c["v_cache"])
        )
        c16.update(q=c["q"].to(dtype), k=c["k"].to(dtype), v=c["v"].to(dtype))
        c32 = dict(
            c, k_cache=torch.zeros_like(c["k_cache"]), v_cache=torch.zeros_like(c["v_cache"])
        )
        c32.update(q=c16["q"].float(), k=c16["k"].float(), v=c16["v"].float())
        call(c16, k_scale=scale, v_scale=scale)
        call(c32, k_scale=scale, v_scale=scale)
        assert same_bits(c16["k_cache"], c32["k_cache"]), dtype
        assert same_bits(c16["v_cache"], c32["v_cache"]), dtype


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("fp8", FP8, ids=dtype_id)
def test_fp8_rounding_saturation_and_nan(fp8, device):
    # Position 0 rotates by nothing (cos 1, sin 0, exactly), so the stored bytes are torch's
    # quantization of k itself: every rounding case of the format, overflow saturating to the
    # largest finite value, and NaN staying NaN. float64 k is divided in float64 as torch does.
    m = FP8_MAX[fp8]
    finite = torch.cat(
        [
            torch.linspace(-1.2 * m, 1.2 * m, 4001, dtype=torch.float64),
            torch.logspace(-24, 0, 600, base=2.0, dtype=torch.float64) * m / 64,
            torch.tensor([1e30, -1e30, 5e-45, -5e-45]),
        ]
    )
    T = finite.numel() // 16
    k = finite[: T * 16].view(T, 1, 16).clone()
    # Specials in the tail features only (not rotated: inf * sin(0) would be NaN).
    k[:4, 0, 8:12] = torch.tensor([float("inf"), float("-inf"), float("nan"), -0.0])
    for dtype in (torch.float32, torch.float64):
        kd = k.to(dtype=dtype, device=device)
        cos, sin = make_tables(4, 8, device, dtype)
        k_cache = torch.zeros(T, 1, 16, device=device).to(fp8)
        v_cache = torch.zeros(T, 1, 16, device=device).to(fp8)
        scale = torch.tensor([0.75], device=device)
        torch_rope.apply_qk_cache(
            kd, kd, kd, cos, sin, torch.zeros(T, 1, dtype=torch.int64, device=device),
            k_cache, v_cache, torch.arange(T, device=device), k_scale=scale, v_scale=scale,
        )  # fmt: skip
        want = quantize(kd, scale.to(dtype), fp8)
        assert same_bits(k_cache, want), dtype
        assert same_bits(v_cache, want), dtype


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_scale_forms(device):
    # A Python float, a 0-d and a 1-element float32 tensor give the same bytes.
    caches = []
    for scale in (0.5, torch.tensor(0.5, device=device), torch.tensor([0.5], device=device)):
        torch.manual_seed(1)
        c = make_call(device, torch.float32, torch.float8_e4m3fn)
        call(c, k_scale=scale, v_scale=scale)
        caches.append(torch.cat([c["k_cache"].view(torch.uint8), c["v_cache"].view(torch.uint8)]))
    assert torch.equal(caches[0], caches[1]) and torch.equal(caches[0], caches[2])
    # Python-float scales, one after another (CPU reuses one tensor per value): each call
    # quantizes with its own scale, as a tensor of that scale does.
    for scale in (0.25, 0.5, 0.25, 2.0):
        calls = []
        for _ in range(2):
            torch.manual_seed(1)
            calls.append(make_call(device, torch.float32, torch.float8_e4m3fn))
        by_float, by_tensor = calls
        call(by_float, k_scale=scale, v_scale=scale / 2)
        t = torch.tensor(scale, device=device)
        call(by_tensor, k_scale=t, v_scale=t / 2)
        for name in ("k_cache", "v_cache"):
            assert torch.equal(by_float[name].view(torch.uint8), by_tensor[name].view(torch.uint8))
    # 16/32-bit caches: no scale, or 1.
    c = make_call(device)
    call(c, k_scale=1.0, v_scale=1)
    with pytest.raises(ValueError, match="k_scale=2.0 applies to float8 caches only"):
        call(c, k_scale=2.0)
    with pytest.raises(RuntimeError, match="v_scale applies to float8 caches only"):
        call(c, v_scale=torch.tensor(1.0, device=device))
    c = make_call(device, with_v=False)
    with pytest.raises(ValueError, match="v_scale given without its cache"):
        call(c, v_scale=0.5)


BAD_SCALES = [0.0, -0.5, float("nan"), float("inf"), float("-inf")]


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("form", ["python_float", "tensor_0d", "tensor_1"])
@pytest.mark.parametrize("which", ["k_scale", "v_scale"])
@pytest.mark.parametrize("value", BAD_SCALES, ids=str)
@pytest.mark.parametrize("cache_dtype", FP8, ids=dtype_id)
def test_a_scale_that_quantizes_nothing_is_refused_before_any_write(
    cache_dtype, value, which, form, device
):
    # 0 would store +-max (NaN for a zero value), a negative scale flipped signs, NaN NaN and
    # inf zeros. Python numbers are checked on every device, CPU tensors by the CPU kernel; a
    # CUDA tensor scale is read by the kernel alone (no host sync), as docs/api.md says.
    if form != "python_float" and device != "cpu":
        pytest.skip("a CUDA tensor scale is not read on the host (documented)")
    c = make_call(device, torch.float32, cache_dtype)
    scale = {
        "python_float": value,
        "tensor_0d": torch.tensor(value, device=device),
        "tensor_1": torch.tensor([value], device=device),
    }[form]
    kw = dict(k_scale=0.5, v_scale=0.5)
    kw[which] = scale
    before = {name: c[name].clone() for name in ("k_cache", "v_cache")}
    with pytest.raises(
        ValueError,
        match=rf"rope\.apply_qk_cache: {which} must be a finite number > 0 \(stored = "
        rf"saturate\(value / {which}\)\), got -?(0|0\.0|0\.5|nan|inf)$",
    ):
        call(c, **kw)
    for name, b in before.items():
        assert same_bits(c[name], b), f"{name} written by a call that raised"
    # The raw op takes the same tensor scales (the Python-number form is the wrapper's).
    if form != "python_float":
        kw = {n: torch.tensor(0.5) if n != which else scale for n in ("k_scale", "v_scale")}
        with pytest.raises(ValueError, match=rf"{which} must be a finite number > 0"):
            torch.ops.rope.apply_qk_cache(
                c["q"], c["k"], c["v"], c["cos"], c["sin"], c["positions"], c["k_cache"],
                c["v_cache"], c["slot_mapping"], **kw,
            )  # fmt: skip
        for name, b in before.items():
            assert same_bits(c[name], b), f"{name} written by a call that raised"


# ---- bad input ----------------------------------------------------------------------------------


def bad_calls(device):
    """(name, change to a good call, message) for the checks; the caches must stay unwritten."""
    g = lambda **kw: kw  # noqa: E731
    return [
        ("slot_out_of_range", g(slot_mapping=[0, 1, 2, 20, 4, 5]), "slot_mapping must be <"),
        ("slot_repeated", g(slot_mapping=[0, 1, 2, 3, 4, 2]), "holds slot 2 twice"),
        ("slot_int32", g(slot_dtype=torch.int32), "slot_mapping must be int64"),
        ("slot_wrong_length", g(slot_mapping=[0, 1, 2]), "slot_mapping must have one entry"),
        ("slot_2d", g(slot_2d=True), "slot_mapping must be 1-D"),
        ("position_out_of_range", g(bad_position=True), "positions must be in"),
        ("k_cache_heads", g(k_cache_shape=(5, 4, 3, 64)), r"k_cache.size\(-2\) \(heads\)"),
        ("k_cache_head_dim", g(k_cache_shape=(5, 4, 2, 32)), r"k_cache.size\(-1\) \(head_dim\)"),
        ("k_cache_dtype", g(k_cache_dtype=torch.float16), "k_cache must have k's dtype"),
        ("v_cache_dtype", g(v_cache_dtype=torch.float64), "v_cache must have v's dtype"),
        ("k_cache_5d", g(k_cache_shape=(1, 5, 4, 2, 64)), "k_cache must be"),
        ("v_cache_slots", g(v_cache_shape=(4, 4, 2, 64)), "v_cache must have k_cache's slots"),
        ("k_cache_strided_last", g(k_cache_strided_last=True), "k_cache must have a unit last"),
        ("fp8_without_scale", g(k_cache_dtype=torch.float8_e4m3fn), "k_scale is required"),
        ("fp8_scale_dtype", g(fp8_scale=torch.tensor(1.0, dtype=torch.float64)), "k_scale must"),
        ("fp8_scale_numel", g(fp8_scale=torch.ones(2)), "k_scale must hold one value"),
        ("v_without_v_cache", g(no_v_cache=True), "v and v_cache go together"),
        ("v_dtype", g(v_dtype=torch.float64), "v must have k's dtype"),
        ("v_heads", g(v_heads=3), "v must have k's head count"),
        ("q_2d", g(q_2d=True), "q must be 3-D"),
        ("k_tokens", g(k_tokens=5), r"k.size\(0\) \(tokens\)"),
        ("k_cache_aliases_k", g(cache_is_k=True), "k_cache shares memory with k"),
        ("v_cache_aliases_k_cache", g(v_cache_in_k_cache=True), "shares memory with v_cache"),
        ("k_cache_overlapping", g(k_cache_expanded=True), "k_cache has overlapping memory"),
    ]


def build_bad(device, change):
    c = make_call(device)
    ch = dict(change)
    if "slot_mapping" in ch:
        c["slot_mapping"] = torch.tensor(ch["slot_mapping"], device=device)
    if ch.get("slot_dtype"):
        c["slot_mapping"] = c["slot_mapping"].to(ch["slot_dtype"])
    if ch.get("slot_2d"):
        c["slot_mapping"] = c["slot_mapping"].view(6, 1)
    if ch.get("bad_position"):
        c["positions"][2, 0] = MAX_SEQ_LEN
    if "k_cache_shape" in ch:
        c["k_cache"] = torch.full(ch["k_cache_shape"], 3.0, device=device)
    if "v_cache_shape" in ch:
        c["v_cache"] = torch.full(ch["v_cache_shape"], 3.0, device=device)
    if "k_cache_dtype" in ch:
        c["k_cache"] = c["k_cache"].to(ch["k_cache_dtype"])
    if "v_cache_dtype" in ch:
        c["v_cache"] = c["v_cache"].to(ch["v_cache_dtype"])
    if ch.get("k_cache_strided_last"):
        c["k_cache"] = torch.full((5, 4, 2, 128), 3.0, device=device)[..., ::2]
    kw = {}
    if "fp8_scale" in ch:
        c["k_cache"] = c["k_cache"].to(torch.float8_e4m3fn)
        kw["k_scale"] = ch["fp8_scale"].to(device)
    if ch.get("no_v_cache"):
        c["v_cache"] = None
    if "v_dtype" in ch:
        c["v"] = c["v"].to(ch["v_dtype"])
    if "v_heads" in ch:
        c["v"] = torch.randn(6, ch["v_heads"], 64, device=device)
    if ch.get("q_2d"):
        c["q"] = c["q"][:, 0]
    if "k_tokens" in ch:
        c["k"] = c["k"][: ch["k_tokens"]]
    if ch.get("cache_is_k"):
        c["k_cache"] = c["k"]
        c["v"] = c["v_cache"] = None
        c["slot_mapping"] = torch.tensor([0, 1, 2, 3, 4, 5], device=device)
    if ch.get("v_cache_in_k_cache"):
        c["v_cache"] = c["k_cache"]
    if ch.get("k_cache_expanded"):
        c["k_cache"] = torch.full((5, 4, 1, 64), 3.0, device=device).expand(5, 4, 2, 64)
    return c, kw


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("case", bad_calls("cpu"), ids=lambda c: c[0])
def test_bad_input_names_the_argument_and_writes_nothing(case, device):
    name, change, message = case
    if device == "cuda" and name in ("slot_out_of_range", "slot_repeated", "position_out_of_range"):
        pytest.skip("on CUDA: a device assert (out of range) or unspecified (repeated slot)")
    c, kw = build_bad(device, change)
    written = [t for t in (c["k_cache"], c["v_cache"], c["k"], c["v"]) if t is not None]
    before = [t.clone() for t in written]
    with pytest.raises((RuntimeError, IndexError, ValueError), match=message):
        call(c, **kw)
    for t, b in zip(written, before):
        assert same_bits(t, b) if t.dtype in FP8 else torch.equal(t, b), f"{name} wrote"


@pytest.mark.parametrize("case", bad_calls("cpu"), ids=lambda c: c[0])
def test_meta_rejects_what_cpu_rejects(case):
    name, change, message = case
    if name in ("slot_out_of_range", "slot_repeated", "position_out_of_range"):
        pytest.skip("needs the values: left to the real kernels")
    if name in ("k_cache_aliases_k", "v_cache_aliases_k_cache"):
        pytest.skip("meta tensors have no memory to share")
    c, kw = build_bad("cpu", change)
    meta = {n: None if t is None else to_meta(t) for n, t in c.items()}
    kw = {n: to_meta(t) for n, t in kw.items()}
    with pytest.raises((RuntimeError, IndexError, ValueError), match=message):
        call(meta, **kw)


def to_meta(t):
    """t on the meta device with its strides (``.to("meta")`` makes expanded views dense)."""
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def _interleaved_cache(device, n):
    """(n, 2, 2) rows at 6 s + 8 h + d: no two elements share an address, but the strides
    interleave, so only listing the addresses could prove it."""
    return torch.empty(6 * n + 10, device=device).as_strided((n, 2, 2), (6, 8, 1))


@pytest.mark.parametrize(
    "layout,device,what",
    [
        ("expanded", "cpu", r"has overlapping memory \(e\.g\. a result of expand\(\)\)"),
        ("heads_share_memory", "cpu", r"has overlapping memory: two of its elements share"),
        ("too_large_to_list", "meta", r"may have overlapping memory: its strides"),
    ],
)
def test_an_overlapping_cache_is_told_what_to_pass(layout, device, what):
    # apply_qk_cache has no out-of-place form: the message must not recommend one, but a cache
    # of its own. (apply_ and out= do have the out-of-place op to recommend: test_errors.py.)
    n = (1 << 20) + 1 if layout == "too_large_to_list" else 5
    cos, sin = make_tables(MAX_SEQ_LEN, 2, device)
    q, k = torch.randn(1, 2, 2, device=device), torch.randn(1, 2, 2, device=device)
    k_cache = {
        "expanded": lambda: torch.zeros(n, 1, 2).expand(n, 2, 2),
        "heads_share_memory": lambda: torch.zeros(4 * n).as_strided((n, 2, 2), (2, 1, 1)),
        "too_large_to_list": lambda: _interleaved_cache(device, n),
    }[layout]()
    if device == "cpu":
        before = k_cache.clone()
    with pytest.raises(RuntimeError) as info:
        torch_rope.apply_qk_cache(
            q, k, None, cos, sin, torch.zeros(1, 1, dtype=torch.long, device=device), k_cache,
            None, torch.zeros(1, dtype=torch.long, device=device),
        )  # fmt: skip
    message = str(info.value).split("\n")[0]
    assert re.search(r"rope\.apply_qk_cache: k_cache " + what, message), message
    assert "out-of-place" not in message
    assert message.endswith(
        "allocate k_cache as a buffer of its own (e.g. torch.zeros of its shape), whose elements "
        "do not share memory"
    ), message
    if device == "cpu":
        assert torch.equal(k_cache, before)


def test_meta_shapes():
    c = make_call("meta")
    q_out = call(c)
    assert q_out.device.type == "meta" and q_out.shape == c["q"].shape


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_not_differentiable(device):
    c = make_call(device)
    c["q"].requires_grad_(True)
    before = c["k_cache"].clone()
    with pytest.raises(RuntimeError, match="doesn't support automatic differentiation"):
        call(c)
    assert torch.equal(c["k_cache"], before)
    with torch.no_grad():
        call(c)
    with torch.inference_mode():
        call(c)


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_empty_and_version_counter(device):
    c = make_call(device, T=0, slots=torch.zeros(0, dtype=torch.int64))
    assert call(c).shape == (0, 8, 64)
    c = make_call(device)
    version = c["k_cache"]._version
    call(c)
    assert c["k_cache"]._version > version


# ---- torch.compile and opcheck ------------------------------------------------------------------


@needs_torch("2.5", "torch.library.opcheck of a mutating op with optional mutable args")
@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16_cache", "fp8_cache"])
def test_opcheck(fp8, device):
    c = make_call(device, torch.bfloat16, torch.float8_e4m3fn if fp8 else None)
    kw = {}
    if fp8:
        kw = dict(
            k_scale=torch.tensor(0.1, device=device), v_scale=torch.tensor(0.1, device=device)
        )
    args = (c["q"], c["k"], c["v"], c["cos"], c["sin"], c["positions"], c["k_cache"])
    args += (c["v_cache"], c["slot_mapping"])
    # opcheck's schema test compares mutated inputs with arithmetic that float8 lacks (mul is not
    # implemented for Float8_e4m3fn); every other test runs on the fp8 call too.
    utils = ("test_faketensor", "test_aot_dispatch_dynamic", "test_autograd_registration")
    torch.library.opcheck(
        torch.ops.rope.apply_qk_cache.default, args, kw, **({"test_utils": utils} if fp8 else {})
    )


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_compile_with_tensor_scales(device):
    # Scales as graph inputs: one graph for any scale value (no recompile per value).
    import torch._dynamo
    import torch._dynamo.testing

    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounter()

    @torch.compile(fullgraph=True, backend=counter)
    def step(c, scale):
        return call(c, k_scale=scale, v_scale=scale)

    for value in (0.5, 0.25):
        c = make_call(device, torch.bfloat16, torch.float8_e4m3fn)
        eager = dict(c, k_cache=c["k_cache"].clone(), v_cache=c["v_cache"].clone())
        scale = torch.tensor(value, device=device)
        assert torch.equal(step(c, scale), call(eager, k_scale=scale, v_scale=scale))
        assert same_bits(c["k_cache"], eager["k_cache"])
        assert same_bits(c["v_cache"], eager["v_cache"])
    assert counter.frame_count == 1


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("fp8", [False, True], ids=["fp32_cache", "fp8_cache"])
def test_compile_fullgraph(fp8, device):
    import torch._dynamo

    torch._dynamo.reset()
    cache_dtype = torch.float8_e5m2 if fp8 else None
    scale = 0.25 if fp8 else None

    def step(q, k, v, cos, sin, positions, k_cache, v_cache, slot_mapping):
        q = torch_rope.apply_qk_cache(
            q, k, v, cos, sin, positions, k_cache, v_cache, slot_mapping,
            k_scale=scale, v_scale=scale,
        )  # fmt: skip
        return q * 2

    compiled = torch.compile(step, fullgraph=True)
    c = make_call(device, torch.float32, cache_dtype)
    eager = dict(c, k_cache=c["k_cache"].clone(), v_cache=c["v_cache"].clone())
    got = compiled(**c)
    want = step(**eager)
    assert torch.equal(got, want)
    for n in ("k_cache", "v_cache"):
        assert same_bits(c[n], eager[n]) if fp8 else torch.equal(c[n], eager[n])


# ---- the example --------------------------------------------------------------------------------


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("cache_dtype", ["float32", "bfloat16"])
def test_paged_decode_example(cache_dtype, device, capsys):
    import runpy
    from pathlib import Path

    example = Path(__file__).resolve().parents[3] / "examples" / "paged_decode.py"
    main = runpy.run_path(str(example))["main"]
    main(["--device", device, "--steps", "6", "--cache-dtype", cache_dtype])
    out = capsys.readouterr().out
    assert "max |attention difference| = 0," in out, out
