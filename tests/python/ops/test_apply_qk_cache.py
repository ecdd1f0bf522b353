# SPDX-License-Identifier: BSD-3-Clause
"""rope.apply_qk_cache: q and k rotated, the rotated k and v written into rows of a KV cache
(flat or paged; 16/32-bit or fp8 with a scale), q returned: what the shared machinery does not
already run. The sample matrix (samples.py, test_samples.py: the float64 oracle and the float8
rule of references.py, every other cache byte unchanged, opcheck, torch.compile), the bad-call
catalogue (test_errors.py: slots, shapes, dtypes, overlapping caches, scales) and the fuzz
(test_fuzz.py) take this op like every other; here: every dtype, cache layout and pair layout
through the same builder and check, the contract with apply_qk, the float8 bytes bit for bit
against torch's own quantization (every rounding case, saturation, NaN; 16-bit sources), the
forms of a scale, autograd, compile with tensor scales and inductor, and the example."""

import pytest
import references as ref
import torch
from helpers import (
    FLOAT_DTYPES,
    LAYOUT_IDS,
    LAYOUTS,
    cpu_and_cuda,
    dtype_id,
    make_tables,
    same_bits,
)
from samples import kv_cache_sample

import torch_rope

FP8 = ref.FP8_DTYPES


def make_sample(
    device,
    dtype=torch.float32,
    cache_dtype=None,
    *,
    geometry="contiguous",
    layout="paged",
    D=64,
    rotary_dim=64,
    Dv=64,
    hq=8,
    hkv=2,
    interleaved=True,
    with_v=True,
    slots="padding",
    scales=None,
):
    """An apply_qk_cache sample from samples.py's builder: 5 tokens into 12 slots of caches of
    ``cache_dtype`` (default: the sources' dtype), real tables."""
    cache_dtype = cache_dtype or dtype
    return kv_cache_sample(
        geometry, dtype, cache_dtype, cache_dtype if with_v else None, layout, D, rotary_dim, Dv,
        hq, hkv, interleaved, "real", False, slots, scales, device,
    )  # fmt: skip


def run_and_check(sample):
    before = sample.snapshot()
    results = sample.call()
    sample.check(results, before)
    return results


# ---- every dtype, cache layout and pair layout ---------------------------------------------------


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("layout", ["paged", "flat", "halves"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
def test_matches_reference(dtype, layout, interleaved, device):
    # head_dim 80 with rotary_dim 48 and a v head_dim of 40; "halves": q, k, v sliced out of one
    # fused projection into caches that are the two halves of one padded buffer.
    geometry = "fused_qkv" if layout == "halves" else "contiguous"
    sample = make_sample(
        device, dtype, geometry=geometry, layout=layout, D=80, rotary_dim=48, Dv=40,
        interleaved=interleaved,
    )  # fmt: skip
    (q_out,) = run_and_check(sample)
    # q_out is exactly what apply_qk returns, and the cache rows its k.
    q, k = sample.inputs[:2]
    q_ref, k_ref = torch_rope.apply_qk(
        q, k, sample.cos, sample.sin, sample.positions, interleaved=interleaved
    )
    assert torch.equal(q_out, q_ref)
    slots = sample.slot_mapping
    stored = slots >= 0
    assert torch.equal(
        sample.k_cache[ref.cache_row_index(sample.k_cache, slots[stored])], k_ref[stored]
    )


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("hq,hkv", [(8, 8), (8, 2), (4, 1)], ids=["mha", "gqa", "mqa"])
def test_head_counts_and_no_v(hq, hkv, device):
    run_and_check(make_sample(device, hq=hq, hkv=hkv, with_v=False, layout="flat"))


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("fp8", FP8, ids=dtype_id)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
def test_fp8_caches_match_reference(dtype, fp8, device):
    # Values up to ~4 / 0.02 = 200: within e4m3's range.
    sample = make_sample(device, dtype, fp8, rotary_dim=32, scales=("float", 0.05, 0.02))
    run_and_check(sample)


# ---- float8 bytes against torch's own quantization -----------------------------------------------


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("fp8", FP8, ids=dtype_id)
@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
def test_fp8_bit_exact_with_torch(interleaved, fp8, device):
    # With k == q (float32, as many heads), q_out is the float32 rotation of k: the cache must be
    # torch's quantization of it, bit for bit. bfloat16 / float16 k are rotated in float32 with no
    # rounding in between: the same bytes as float32 k holding the same values.
    def fp8_sample(dtype):
        return make_sample(
            device, dtype, fp8, hq=2, hkv=2, rotary_dim=48, interleaved=interleaved,
            scales=("tensor_0d", 0.01, 0.01),
        )  # fmt: skip

    sample = fp8_sample(torch.float32)
    q, k, v = sample.inputs
    k.copy_(q)
    (q_out,) = sample.call()
    stored = sample.slot_mapping >= 0
    index = ref.cache_row_index(sample.k_cache, sample.slot_mapping[stored])
    scale = sample.k_scale
    assert same_bits(sample.k_cache[index].cpu(), ref.quantize_fp8(q_out[stored], scale, fp8))
    assert same_bits(sample.v_cache[index].cpu(), ref.quantize_fp8(v[stored], scale, fp8))
    for dtype in (torch.bfloat16, torch.float16):
        narrow, wide = fp8_sample(dtype), fp8_sample(torch.float32)
        narrow.inputs[1].copy_(narrow.inputs[0])
        for x, x_narrow in zip(wide.inputs, narrow.inputs):
            x.copy_(x_narrow)  # the same values, widened exactly
        wide.positions, wide.slot_mapping = narrow.positions, narrow.slot_mapping
        for cache in (*narrow.written(), *wide.written()):
            cache.view(torch.uint8).zero_()
        narrow.call()
        wide.call()
        for a, b in zip(narrow.written(), wide.written()):
            assert same_bits(a, b), dtype


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("fp8", FP8, ids=dtype_id)
def test_fp8_rounding_saturation_and_nan(fp8, device):
    # Position 0 rotates by nothing (cos 1, sin 0, exactly), so the stored bytes are torch's
    # quantization of k itself: every rounding case of the format, overflow saturating to the
    # largest finite value, and NaN staying NaN. float64 k is divided in float64 as torch does.
    m = ref.FP8_MAX[fp8]
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
        want = ref.quantize_fp8(kd, scale, fp8)
        assert same_bits(k_cache.cpu(), want), dtype
        assert same_bits(v_cache.cpu(), want), dtype


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_scale_forms(device):
    # A Python float, a 0-d and a 1-element float32 tensor give the same bytes (their misuse is
    # in test_errors.py).
    caches = []
    for form in ("float", "tensor_0d", "tensor_1"):
        torch.manual_seed(1)
        sample = make_sample(device, torch.float32, torch.float8_e4m3fn, scales=(form, 0.5, 0.5))
        sample.call()
        caches.append(torch.cat([c.view(torch.uint8) for c in sample.written()]))
    assert torch.equal(caches[0], caches[1]) and torch.equal(caches[0], caches[2])
    # Python-float scales, one after another (CPU reuses one tensor per value): each call
    # quantizes with its own scale, as a tensor of that scale does.
    for scale in (0.25, 0.5, 0.25, 2.0):
        calls = []
        for form in ("float", "tensor_0d"):
            torch.manual_seed(1)
            scales = (form, scale, scale / 2)
            calls.append(make_sample(device, torch.float32, torch.float8_e4m3fn, scales=scales))
        for sample in calls:
            sample.call()
        by_float, by_tensor = calls
        for a, b in zip(by_float.written(), by_tensor.written()):
            assert same_bits(a, b)
    # 16/32-bit caches: no scale, or 1.
    sample = make_sample(device)
    sample.k_scale, sample.v_scale = 1.0, 1
    run_and_check(sample)


# ---- autograd and compile ------------------------------------------------------------------------


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_not_differentiable(device):
    sample = make_sample(device)
    sample.inputs[0].requires_grad_(True)
    before = sample.k_cache.clone()
    with pytest.raises(RuntimeError, match="doesn't support automatic differentiation"):
        sample.call()
    assert torch.equal(sample.k_cache, before)
    with torch.no_grad():
        sample.call()
    with torch.inference_mode():
        sample.call()


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_compile_with_tensor_scales(device):
    # Scales as graph inputs: one graph for any scale value (no recompile per value).
    import torch._dynamo
    import torch._dynamo.testing

    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounter()

    @torch.compile(fullgraph=True, backend=counter)
    def step(q, k, v, cos, sin, positions, k_cache, v_cache, slot_mapping, scale):
        return torch_rope.apply_qk_cache(
            q, k, v, cos, sin, positions, k_cache, v_cache, slot_mapping,
            k_scale=scale, v_scale=scale,
        )  # fmt: skip

    for value in (0.5, 0.25):
        samples = []
        for _ in range(2):
            torch.manual_seed(1)
            samples.append(make_sample(device, torch.bfloat16, torch.float8_e4m3fn))
        compiled, eager = samples
        scale = torch.tensor(value, device=device)
        args, _ = compiled.op_args()
        eager_args, _ = eager.op_args()
        got = step(*args, scale)
        want = torch_rope.apply_qk_cache(*eager_args, k_scale=scale, v_scale=scale)
        assert torch.equal(got, want)
        for a, b in zip(compiled.written(), eager.written()):
            assert same_bits(a, b)
    assert counter.frame_count == 1


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("fp8", [False, True], ids=["fp32_cache", "fp8_cache"])
def test_compile_inductor_fullgraph(fp8, device):
    # test_samples.py compiles every sample with aot_eager; this one goes through inductor (its
    # handling of the mutated caches), with an op after it in the graph.
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

    samples = []
    for _ in range(2):
        torch.manual_seed(1)
        samples.append(make_sample(device, torch.float32, cache_dtype))
    compiled, eager = samples
    got = torch.compile(step, fullgraph=True)(*compiled.op_args()[0])
    assert torch.equal(got, step(*eager.op_args()[0]))
    for a, b in zip(compiled.written(), eager.written()):
        assert same_bits(a, b)


# ---- the example ---------------------------------------------------------------------------------


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
