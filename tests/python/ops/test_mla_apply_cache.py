# SPDX-License-Identifier: BSD-3-Clause
"""rope.mla_apply_cache: the cache rows of multi-head latent attention (DeepSeek-V2/V3). q_pe and
the single latent head k_pe rotate; ``[kv_c | k_pe]`` rows go into one cache of width
``kv_lora_rank + rope_dim`` (vLLM's layout) or into two caches ``(ckv, kpe)`` (FlashInfer's),
flat or paged, 16/32-bit or float8 with a per-tensor scale.

Its samples (samples.py's mla_cache family: the float64 oracle, every other cache byte kept,
opcheck, compile), bad calls (test_errors.py) and fuzzing (test_fuzz.py) are the shared
catalogue's. This file crosses the oracle with every dtype and cache layout, and holds the float8
bytes: bit for bit torch's own ``(value / scale).clamp(-max, max).to(fp8)`` wherever the quantized
value is known exactly (kv_c, copied; k_pe at position 0, which turns by nothing) for every 16-bit
pattern and both scale rules, and a duplicate slot refused whatever the rows."""

import pytest
import references as ref
import torch
from helpers import cpu_and_cuda, dtype_id, make_tables
from samples import mla_sample

import torch_rope

MAX_SEQ_LEN = 64
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def random_bits(shape, dtype, device):
    """A cache of random bytes: every byte the op must not write is distinct from what it
    would write."""
    numel = 1
    for s in shape:
        numel *= s
    size = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (numel * size,), dtype=torch.uint8)
    return raw.view(dtype).reshape(shape).to(device)


def make_call(
    device,
    dtype=torch.float32,
    *,
    T=7,
    H=4,
    L=40,
    R=16,
    num_slots=24,
    block_size=None,
    two_caches=False,
    cache_dtype=None,
    with_q_nope=True,
    padding=True,
):
    """One call's inputs: random rows, random slots (distinct, some negative: padding)."""
    table_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    cos, sin = make_tables(MAX_SEQ_LEN, R, device, table_dtype)

    def rnd(*shape):
        return (torch.randn(*shape, dtype=torch.float64) * 2).to(dtype=dtype, device=device)

    cache_dtype = cache_dtype or dtype
    lead = (num_slots,) if block_size is None else (num_slots // block_size, block_size)
    if two_caches:
        kv_cache = random_bits(lead + (L,), cache_dtype, device)
        kpe_cache = random_bits(lead + (R,), cache_dtype, device)
    else:
        kv_cache = random_bits(lead + (L + R,), cache_dtype, device)
        kpe_cache = None
    slots = torch.randperm(num_slots)[:T]
    if padding:
        slots[torch.rand(T) < 0.25] = -1
    positions = torch.randint(0, MAX_SEQ_LEN, (T, 1))
    return dict(
        q_pe=rnd(T, H, R),
        k_pe=rnd(T, R),
        kv_c=rnd(T, L),
        cos=cos,
        sin=sin,
        positions=positions.to(device),
        kv_cache=kv_cache,
        kpe_cache=kpe_cache,
        slot_mapping=slots.to(device),
        q_nope=rnd(T, H, 8) if with_q_nope else None,
    )


def call(c, **kw):
    return torch_rope.mla_apply_cache(
        c["q_pe"], c["k_pe"], c["kv_c"], c["cos"], c["sin"], c["positions"], c["kv_cache"],
        c["kpe_cache"], c["slot_mapping"], q_nope=c["q_nope"], **kw,
    )  # fmt: skip


def rotated(x, positions, interleaved):
    """float64 rotation of x (T, H, R) (all features rotate), positions (T, 1)."""
    x64 = x.detach().cpu().double()
    ang = ref.angles(positions.cpu(), x64.shape[:-1], x64.shape[-1])
    return ref.rope(x64, ang, interleaved=interleaved)


def slot_rows(cache, slots):
    """cache rows (num_rows, width) of `slots` (>= 0): flat (num_slots, W) or paged
    (num_blocks, block_size, W)."""
    if cache.dim() == 2:
        return cache[slots]
    bs = cache.size(1)
    return cache[slots // bs, slots % bs]


def untouched_mask(cache, slots):
    """True on every element of `cache` that a call writing `slots` must leave alone."""
    keep = torch.ones(cache.shape, dtype=torch.bool)
    flat = keep.view(-1, cache.size(-1))
    flat[slots.cpu()] = False  # the row index of slot s is s in both layouts
    return keep


def bits(t):
    return t.detach().cpu().contiguous().view(torch.uint8)


def check_untouched(after, before, slots):
    keep = untouched_mask(before, slots)
    width = before.element_size()
    keep_bytes = keep.unsqueeze(-1).expand(*keep.shape, width).reshape(*keep.shape[:-1], -1)
    assert torch.equal(bits(after)[keep_bytes], bits(before)[keep_bytes]), (
        "bytes outside the written rows changed"
    )


# ---- 16/32-bit caches --------------------------------------------------------------------------


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("two_caches", [False, True], ids=["vllm_one_cache", "flashinfer_two"])
@pytest.mark.parametrize("block_size", [None, 4], ids=["flat", "paged"])
@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "half_split"])
@pytest.mark.parametrize(
    "dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16], ids=dtype_id
)
def test_rows_match_reference(dtype, interleaved, block_size, two_caches, device):
    # samples.py's builder and check (q outputs and k_pe rows against the float64 rotation,
    # kv_c copied bit for bit, every other cache byte kept), crossed with every dtype, pair
    # layout, cache layout and paging.
    sample = mla_sample(
        dtype, dtype, "two" if two_caches else "one", block_size is not None, 4, None, 40, 16, 8,
        None, interleaved, "padding", None, None, False, False, 7, device,
    )  # fmt: skip
    before = sample.snapshot()
    sample.check(sample.call(), before)


# ---- float8 caches -----------------------------------------------------------------------------


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("multiply", [False, True], ids=["divide", "multiply"])
@pytest.mark.parametrize("two_caches", [False, True], ids=["vllm_one_cache", "flashinfer_two"])
@pytest.mark.parametrize("fp8", FP8, ids=dtype_id)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=dtype_id)
def test_fp8_cache_bits(dtype, fp8, two_caches, multiply, device):
    c = make_call(device, dtype, block_size=4, two_caches=two_caches, cache_dtype=fp8)
    # Half of the tokens at position 0: their k_pe turns by nothing, so its stored bytes are
    # known exactly (torch's quantization of the value itself).
    c["positions"][::2] = 0
    scale = 4.0 if multiply else 0.07
    before = c["kv_cache"].clone()
    q_pe_out, q_nope_out = call(
        c, kv_scale=scale, q_dtype=fp8, q_scale=scale, multiply_by_scale=multiply
    )
    slots = c["slot_mapping"].cpu()
    stored = slots >= 0
    pos = c["positions"].cpu()
    s = slots[stored]
    L = c["kv_c"].size(1)
    if two_caches:
        ckv, kpe = slot_rows(c["kv_cache"].cpu(), s), slot_rows(c["kpe_cache"].cpu(), s)
    else:
        rows = slot_rows(c["kv_cache"].cpu(), s)
        ckv, kpe = rows[:, :L], rows[:, L:]
    # kv_c: copied, so torch's quantization of the value, bit for bit.
    want = ref.quantize_fp8(c["kv_c"].cpu()[stored], scale, fp8, multiply=multiply)
    assert ref.same_bits(ckv, want)
    # k_pe: within one fp8 step of the float64 rotation, and exact at position 0.
    k_rot = rotated(c["k_pe"].unsqueeze(1), pos, True).squeeze(1)  # interleaved: the default
    ref.fp8_close(kpe, k_rot[stored], scale, fp8, multiply=multiply)
    at_zero = (pos[:, 0] == 0)[stored]
    want0 = ref.quantize_fp8(c["k_pe"].cpu()[stored][at_zero], scale, fp8, multiply=multiply)
    assert ref.same_bits(kpe[at_zero], want0)
    # q outputs in float8 with q_scale: q_nope bit for bit, q_pe within a step.
    assert q_pe_out.dtype == fp8 and q_nope_out.dtype == fp8
    assert ref.same_bits(q_nope_out, ref.quantize_fp8(c["q_nope"], scale, fp8, multiply=multiply))
    ref.fp8_close(q_pe_out, rotated(c["q_pe"], pos, True), scale, fp8, multiply=multiply)
    if not two_caches:
        check_untouched(c["kv_cache"], before, s)


@pytest.mark.parametrize("fp8", FP8, ids=dtype_id)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
def test_fp8_every_16bit_pattern_of_kv_c(dtype, fp8):
    """Every 16-bit pattern (zeros, subnormals, ties, saturating values, infinities, NaNs) stored
    into a float8 cache as torch's cast of the value, with both scale rules."""
    values = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype)
    L, R = 256, 16
    T = values.numel() // L
    kv_c = values.view(T, L)
    k_pe = torch.zeros(T, R, dtype=dtype)
    q_pe = torch.zeros(T, 0, R, dtype=dtype)
    cos, sin = make_tables(MAX_SEQ_LEN, R, "cpu")
    positions = torch.zeros(T, 1, dtype=torch.int64)
    for multiply, scale in ((False, 1.0), (False, 0.3), (True, 2.0**-4), (True, 7.1e-5)):
        cache = torch.zeros(T, L + R, dtype=fp8)
        torch_rope.mla_apply_cache(
            q_pe, k_pe, kv_c, cos, sin, positions, cache, None, torch.arange(T),
            kv_scale=scale, multiply_by_scale=multiply,
        )  # fmt: skip
        want = ref.quantize_fp8(kv_c, scale, fp8, multiply=multiply)
        assert ref.same_bits(cache[:, :L], want), f"scale {scale} multiply {multiply}"


# ---- a duplicate slot: refused before anything is written -------------------------------------


def test_duplicate_slot_refused_even_when_rows_agree():
    """Two tokens with one slot are refused on the CPU whatever their values: which token's row
    stays would otherwise depend on thread order."""
    c = make_call("cpu", padding=False)
    c["slot_mapping"][4] = c["slot_mapping"][0]
    c["kv_c"][4] = c["kv_c"][0]
    c["k_pe"][4] = c["k_pe"][0]
    c["positions"][4] = c["positions"][0]
    before = c["kv_cache"].clone()
    with pytest.raises(RuntimeError, match="slot_mapping"):
        call(c)
    assert torch.equal(bits(c["kv_cache"]), bits(before))


# ---- autograd and version counters ------------------------------------------------------------


def test_not_differentiable_and_version_counter():
    c = make_call("cpu")
    c["q_pe"].requires_grad_(True)
    with pytest.raises(RuntimeError, match="doesn't support automatic differentiation"):
        call(c)
    c["q_pe"] = c["q_pe"].detach()
    v = c["kv_cache"]._version
    call(c)
    assert c["kv_cache"]._version > v
