# SPDX-License-Identifier: BSD-3-Clause
"""rope.rms_norm_apply_qk_cache: QK-RMSNorm + RoPE + the KV-cache write in one pass, and
apply_qk_cache with multi-axis positions (both run on the row streams). Its samples (samples.py's
norm_cache family: the float64 oracle, every other cache byte kept, opcheck, compile), bad calls
(test_errors.py) and fuzzing (test_fuzz.py) are the shared catalogue's. This file crosses the
oracle with every dtype, paging and pair layout, and holds what needs the unfused ops: q and the
k rows bit for bit (or within a rounding) the unfused ops' where they round the same value once,
the float8 bytes as torch's own cast of the op's float32 values, and a compile through
inductor."""

import pytest
import references as ref
import torch
from helpers import cpu_and_cuda, dtype_id, make_tables
from samples import norm_cache_sample

import torch_rope

MAX_SEQ_LEN = 48
NUM_SLOTS = 24
FP8 = ref.FP8_DTYPES
TOL = {
    torch.float64: dict(rtol=1e-12, atol=1e-12),
    torch.float32: dict(rtol=2e-5, atol=2e-5),
    torch.float16: dict(rtol=2e-3, atol=2e-3),
    torch.bfloat16: dict(rtol=1.6e-2, atol=1.6e-2),
}


def make_call(
    device,
    dtype=torch.float32,
    cache_dtype=None,
    *,
    T=6,
    Hq=4,
    Hkv=2,
    D=80,
    rotary_dim=48,
    Dv=40,
    paged=True,
    with_v=True,
    mrope_section=None,
    seed=0,
):
    """One call's arguments: T tokens (one of them padding) into caches of NUM_SLOTS slots."""
    g = torch.Generator().manual_seed(seed)
    cache_dtype = cache_dtype or dtype
    table_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    cos, sin = make_tables(MAX_SEQ_LEN, rotary_dim, device, table_dtype)

    def rnd(*shape, scale=2.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype).to(device)

    if mrope_section is None:
        positions = torch.randint(0, MAX_SEQ_LEN, (T, 1), generator=g)
    else:
        positions = torch.randint(0, MAX_SEQ_LEN, (T, 1, len(mrope_section)), generator=g)
    slots = torch.randperm(NUM_SLOTS, generator=g)[:T]
    if T > 1:
        slots[T // 2] = -1  # padding: q only
    shape = (NUM_SLOTS // 4, 4) if paged else (NUM_SLOTS,)
    # Caches start as a known pattern, so that every byte the op must not write can be compared.
    k_cache = torch.arange(NUM_SLOTS * Hkv * D, dtype=torch.float32).reshape(*shape, Hkv, D) % 7
    v_cache = torch.arange(NUM_SLOTS * Hkv * Dv, dtype=torch.float32).reshape(*shape, Hkv, Dv) % 5
    return dict(
        q=rnd(T, Hq, D),
        k=rnd(T, Hkv, D),
        v=rnd(T, Hkv, Dv) if with_v else None,
        q_weight=(torch.rand(D, generator=g, dtype=torch.float64) + 0.5).to(dtype).to(device),
        k_weight=(torch.rand(D, generator=g, dtype=torch.float64) + 0.5).to(dtype).to(device),
        cos=cos,
        sin=sin,
        positions=positions.to(device),
        k_cache=k_cache.to(cache_dtype).to(device),
        v_cache=v_cache.to(cache_dtype).to(device) if with_v else None,
        slot_mapping=slots.to(device),
        mrope_section=mrope_section,
    )


def call(c, **kw):
    args = [c[n] for n in ("q", "k", "v", "q_weight", "k_weight", "cos", "sin", "positions")]
    args += [c["k_cache"], c["v_cache"], c["slot_mapping"]]
    if c["mrope_section"] is not None:
        kw.setdefault("mrope_section", c["mrope_section"])
    return torch_rope.rms_norm_apply_qk_cache(*args, **kw)


def oracle(c, x, weight, *, eps=1e-6, weight_offset=0.0, interleaved=True):
    """float64 norm then rotation of x (T, H, D)."""
    return ref.rms_norm_rope_with_tables(
        x, weight, c["cos"].cpu().double(), c["sin"].cpu().double(), c["positions"].cpu(),
        eps=eps, weight_offset=weight_offset, interleaved=interleaved,
        mrope_section=c["mrope_section"],
    )  # fmt: skip


def assert_within_one_rounding(got, want):
    """``got`` and ``want`` (the unfused op's output) differ by at most a couple of roundings of
    their dtype: both compute the norm in the math type, but sum the squares in different orders
    (the fused op in the fixed order of csrc/common_row_streams.h), so the last bit may differ."""
    eps = torch.finfo(want.dtype).eps
    scale = want.detach().abs().double().max().item() if want.numel() else 0.0
    torch.testing.assert_close(got.double(), want.double(), rtol=2 * eps, atol=4 * eps * scale)


def stored_rows(cache, slots):
    """The rows of the non-negative ``slots`` of ``cache``, and a mask of every other row."""
    idx = ref.cache_row_index(cache, slots)
    untouched = torch.ones(cache.shape[: cache.dim() - 2], dtype=torch.bool, device=cache.device)
    untouched[idx] = False
    return cache[idx], untouched


# ---- correctness --------------------------------------------------------------------------------


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "half_split"])
@pytest.mark.parametrize("paged", [True, False], ids=["paged", "flat"])
@pytest.mark.parametrize(
    "dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16], ids=dtype_id
)
def test_matches_reference(dtype, paged, interleaved, device):
    # samples.py's builder and check (q and the k rows against the float64 norm and rotation, v
    # copied bit for bit, every other cache byte kept), crossed with every dtype, paging and pair
    # layout, with eps and Gemma's offset.
    sample = norm_cache_sample(
        "contiguous", dtype, dtype, dtype, "paged" if paged else "flat", 80, 48, 40, 4, 2,
        interleaved, "real", False, "padding", None, 1e-5, 0.5, "own", None, None, device, T=6,
    )  # fmt: skip
    before = sample.snapshot()
    sample.check(sample.call(), before)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=dtype_id)
def test_agrees_with_the_unfused_ops(dtype, device):
    # rms_norm_apply_qk computes the same norm and rotation and rounds once: the fused op's q and
    # its k rows agree with it to the last bit or two, and v is the copy index_copy_ makes.
    c = make_call(device, dtype, paged=False)
    q_out = call(c, eps=1e-6, weight_offset=1.0)
    q_ref, k_ref = torch_rope.rms_norm_apply_qk(
        c["q"], c["k"], c["q_weight"], c["k_weight"], c["cos"], c["sin"], c["positions"],
        eps=1e-6, weight_offset=1.0,
    )  # fmt: skip
    assert_within_one_rounding(q_out, q_ref)
    slots = c["slot_mapping"]
    stored = slots >= 0
    assert_within_one_rounding(c["k_cache"][slots[stored]], k_ref[stored])
    assert ref.same_bits(c["v_cache"][slots[stored]], c["v"][stored])


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("fp8", FP8, ids=dtype_id)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=dtype_id)
def test_fp8_caches_and_q_bit_exact_with_torch(dtype, fp8, device):
    # float8 q and caches hold torch's cast of the float32 value the op computes: the op's own
    # float32 result on float32 copies of the sources (16-bit sources are widened exactly and
    # rounded once, to float8), v torch's cast of itself.
    c = make_call(device, dtype, fp8)
    before_k = c["k_cache"].clone()
    q_out = call(c, q_dtype=fp8, q_scale=0.05, k_scale=0.1, v_scale=0.02)
    assert q_out.dtype == fp8
    c32 = make_call(device, dtype)  # the same values, into a float32 k cache
    c32.update(q=c["q"].float(), k=c["k"].float(), v=c["v"].float(),
               k_cache=c32["k_cache"].float(), v_cache=c32["v_cache"].float())  # fmt: skip
    q32 = call(c32)
    k32 = c32["k_cache"][ref.cache_row_index(c32["k_cache"], c["slot_mapping"])]
    assert ref.same_bits(q_out, ref.quantize_fp8(q32, 0.05, fp8))
    slots = c["slot_mapping"]
    stored = slots >= 0
    rows, untouched = stored_rows(c["k_cache"], slots[stored])
    assert ref.same_bits(rows, ref.quantize_fp8(k32[stored], 0.1, fp8))
    # (the float32 run agrees with rms_norm_apply_qk, as test_agrees_with_the_unfused_ops holds)
    assert ref.same_bits(c["k_cache"][untouched], before_k[untouched])
    v_rows, _ = stored_rows(c["v_cache"], slots[stored])
    assert ref.same_bits(v_rows, ref.quantize_fp8(c["v"][stored], 0.02, fp8))
    # And within one float8 step of the float64 oracle.
    ref.fp8_close(q_out, oracle(c, c["q"], c["q_weight"]), 0.05, fp8)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "half_split"])
@pytest.mark.parametrize("mrope_interleaved", [False, True], ids=["runs", "mrope_interleaved"])
def test_multi_axis_positions(mrope_interleaved, interleaved, device):
    c = make_call(device, torch.float32, mrope_section=[8, 8, 8])
    before_k = c["k_cache"].clone()
    kw = dict(interleaved=interleaved, mrope_interleaved=mrope_interleaved)
    q_out = call(c, **kw)
    q_ref, k_ref = torch_rope.rms_norm_apply_qk(
        c["q"], c["k"], c["q_weight"], c["k_weight"], c["cos"], c["sin"], c["positions"],
        mrope_section=c["mrope_section"], **kw,
    )  # fmt: skip
    assert_within_one_rounding(q_out, q_ref)
    slots = c["slot_mapping"]
    rows, untouched = stored_rows(c["k_cache"], slots[slots >= 0])
    assert_within_one_rounding(rows, k_ref[slots >= 0])
    assert ref.same_bits(c["k_cache"][untouched], before_k[untouched])
    want = ref.rms_norm_rope_with_tables(
        c["q"], c["q_weight"], c["cos"].cpu().double(), c["sin"].cpu().double(),
        c["positions"].cpu(), eps=1e-6, mrope_section=[8, 8, 8], **kw,
    )  # fmt: skip
    torch.testing.assert_close(q_out.cpu().double(), want, **TOL[torch.float32])


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16],
                         ids=dtype_id)  # fmt: skip
@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "half_split"])
@pytest.mark.parametrize("T, Hq, Hkv", [(1, 8, 2), (7, 4, 4), (20, 16, 2)])
def test_apply_qk_cache_multi_axis_bits_every_dtype(T, Hq, Hkv, interleaved, dtype, device):
    # The docs say q and the cached k rows of a multi-axis apply_qk_cache are apply_qk's, bit for
    # bit: in every dtype, both pair layouts, at decode and prefill sizes, with axis-first
    # positions (as transformers hands them: a transposed view) and a partial rotary run.
    c = make_call(device, dtype, T=T, Hq=Hq, Hkv=Hkv, D=128, rotary_dim=96, Dv=64,
                  mrope_section=[16, 16, 16], seed=T)  # fmt: skip
    positions = c["positions"][:, 0, :].t().contiguous().t().unsqueeze(1)  # axis-first memory
    q_out = torch_rope.apply_qk_cache(
        c["q"], c["k"], c["v"], c["cos"], c["sin"], positions, c["k_cache"], c["v_cache"],
        c["slot_mapping"], interleaved=interleaved, mrope_section=c["mrope_section"],
    )  # fmt: skip
    q_ref, k_ref = torch_rope.apply_qk(
        c["q"], c["k"], c["cos"], c["sin"], positions, interleaved=interleaved,
        mrope_section=c["mrope_section"],
    )  # fmt: skip
    assert ref.same_bits(q_out, q_ref)
    stored = c["slot_mapping"] >= 0
    rows, _ = stored_rows(c["k_cache"], c["slot_mapping"][stored])
    assert ref.same_bits(rows, k_ref[stored])


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("cache", ["same", "fp8"])
@pytest.mark.parametrize("mrope_interleaved", [False, True], ids=["runs", "mrope_interleaved"])
def test_apply_qk_cache_with_multi_axis_positions(mrope_interleaved, cache, device):
    # apply_qk_cache took no mrope_section before; now its q is apply_qk's with the same
    # positions, bit for bit, and its cache rows apply_qk's k (or torch's cast of it).
    fp8 = torch.float8_e4m3fn
    cache_dtype = fp8 if cache == "fp8" else None
    c = make_call(device, torch.bfloat16, cache_dtype, mrope_section=[4, 10, 10])
    before_k = c["k_cache"].clone()
    scales = dict(k_scale=0.1, v_scale=0.05) if cache == "fp8" else {}
    q_out = torch_rope.apply_qk_cache(
        c["q"], c["k"], c["v"], c["cos"], c["sin"], c["positions"], c["k_cache"], c["v_cache"],
        c["slot_mapping"], mrope_section=c["mrope_section"], mrope_interleaved=mrope_interleaved,
        **scales,
    )  # fmt: skip
    q_ref, k_ref = torch_rope.apply_qk(
        c["q"], c["k"], c["cos"], c["sin"], c["positions"], mrope_section=c["mrope_section"],
        mrope_interleaved=mrope_interleaved,
    )  # fmt: skip
    assert ref.same_bits(q_out, q_ref)
    slots = c["slot_mapping"]
    stored = slots >= 0
    rows, untouched = stored_rows(c["k_cache"], slots[stored])
    assert ref.same_bits(c["k_cache"][untouched], before_k[untouched])
    if cache == "fp8":
        q32, k32 = torch_rope.apply_qk(
            c["q"].float(), c["k"].float(), c["cos"], c["sin"], c["positions"],
            mrope_section=c["mrope_section"], mrope_interleaved=mrope_interleaved,
        )  # fmt: skip
        assert ref.same_bits(rows, ref.quantize_fp8(k32[stored], 0.1, fp8))
    else:
        assert ref.same_bits(rows, k_ref[stored])
    # A position out of range on any axis is refused before anything is written.
    if torch.device(device).type == "cpu":
        bad = c["positions"].clone()
        bad[0, 0, 2] = MAX_SEQ_LEN
        snapshot = c["k_cache"].clone()
        with pytest.raises((IndexError, RuntimeError), match="positions"):
            torch_rope.apply_qk_cache(
                c["q"], c["k"], c["v"], c["cos"], c["sin"], bad, c["k_cache"], c["v_cache"],
                c["slot_mapping"], mrope_section=c["mrope_section"], **scales,
            )  # fmt: skip
        assert ref.same_bits(c["k_cache"], snapshot)


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_no_v_gqa_and_decode(device):
    for T, Hq, Hkv in ((1, 8, 1), (3, 4, 4), (17, 6, 2)):
        c = make_call(device, torch.bfloat16, T=T, Hq=Hq, Hkv=Hkv, D=64, rotary_dim=64,
                      with_v=False, seed=T)  # fmt: skip
        before = c["k_cache"].clone()
        q_out = call(c)
        q_ref, k_ref = torch_rope.rms_norm_apply_qk(
            c["q"], c["k"], c["q_weight"], c["k_weight"], c["cos"], c["sin"], c["positions"]
        )
        assert_within_one_rounding(q_out, q_ref)
        slots = c["slot_mapping"]
        rows, untouched = stored_rows(c["k_cache"], slots[slots >= 0])
        assert_within_one_rounding(rows, k_ref[slots >= 0])
        assert ref.same_bits(c["k_cache"][untouched], before[untouched])


# ---- autograd ----------------------------------------------------------------------------------


def test_grad_is_refused():
    c = make_call("cpu", torch.float32, torch.float8_e5m2)
    c["q"].requires_grad_(True)
    before = c["k_cache"].clone()
    with pytest.raises(RuntimeError, match="doesn't support automatic differentiation"):
        call(c, k_scale=1.0, v_scale=1.0)
    assert ref.same_bits(c["k_cache"], before)
    with torch.no_grad():
        call(c, k_scale=1.0, v_scale=1.0)


# ---- compile ------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_compile_fullgraph_with_inductor(device):
    import torch._dynamo

    torch._dynamo.reset()
    compiled_call, eager_call = make_call(device, seed=3), make_call(device, seed=3)

    def step(c):
        q = call(c, q_dtype=torch.float8_e4m3fn, q_scale=torch.tensor(0.25, device=device))
        # Another op in the graph, not on q: inductor's own float8-to-float32 kernel (torch 2.13,
        # CPU) loads 8 float8 values per step and stores a whole float vector (16 on AVX-512),
        # past the end of its output, which corrupted the heap here; and under
        # ATEN_CPU_CAPABILITY=avx2 its uint8-to-int32 kernel gave other values than eager's.
        return q, c["k"] * 2

    got = torch.compile(step, fullgraph=True)(compiled_call)
    want = step(eager_call)
    assert ref.same_bits(got[0], want[0]) and torch.equal(got[1], want[1])
    assert ref.same_bits(compiled_call["k_cache"], eager_call["k_cache"])
    assert ref.same_bits(compiled_call["v_cache"], eager_call["v_cache"])
