# SPDX-License-Identifier: BSD-3-Clause
"""The serving fusions under the names engines call (torch_rope.compat): vLLM's
``concat_and_cache_mla`` and FlashInfer's ``rope_quantize_fp8`` / ``mla_rope_quantize_fp8``.
Each reference is written here from the peer's documented semantics, in float64:

* vLLM ``concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale)``:
  ``kv_cache[slot] = [kv_c | k_pe]`` (no rotation), a negative slot skipped, only the first
  ``slot_mapping.size(0)`` tokens; ``"auto"`` copies, ``"fp8"`` stores
  ``(value / scale).clamp(+-448).to(float8_e4m3fn)`` into a uint8 cache.
* FlashInfer ``rope_quantize_fp8``: ``cos_sin_cache`` ``(max_pos, R)`` float32 with cos in the
  first half of each row and sin in the second; ``is_neox=True`` rotates the two halves
  (``x1 c - x2 s``, ``x2 c + x1 s``), ``False`` adjacent pairs; the nope parts pass through;
  every output is ``(value * quant_scale).clamp(+-max).to(fp8)`` (the scale multiplies).
"""

import inspect
import json
import re
from pathlib import Path

import pytest
import references as ref
import torch
from helpers import cpu_and_cuda, dtype_id

from torch_rope import compat

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def cos_sin_cache(max_pos, R, device):
    inv = 1.0 / (10000.0 ** (torch.arange(0, R, 2, dtype=torch.float64) / R))
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv
    return torch.cat([ang.cos(), ang.sin()], dim=-1).float().to(device)


def flashinfer_rotation(x, cache, pos_ids, is_neox):
    """float64 rotation of x (T, H, R) with the cache's own float32 cos/sin at pos_ids."""
    x64 = x.detach().cpu().double()
    R = x64.size(-1)
    cs = cache.cpu().double()[pos_ids.cpu().long()]
    c, s = cs[:, None, : R // 2], cs[:, None, R // 2 :]
    if is_neox:
        x1, x2 = x64[..., : R // 2], x64[..., R // 2 :]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)
    x1, x2 = x64[..., 0::2], x64[..., 1::2]
    out = torch.empty_like(x64)
    out[..., 0::2] = x1 * c - x2 * s
    out[..., 1::2] = x2 * c + x1 * s
    return out


# ---- vLLM concat_and_cache_mla -----------------------------------------------------------------


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_concat_and_cache_mla(kv_cache_dtype, dtype, device):
    T_rows, T, L, R, blocks, bs = 9, 7, 32, 16, 4, 4
    kv_c = (torch.randn(T_rows, L, dtype=torch.float64) * 3).to(dtype=dtype, device=device)
    k_pe = (torch.randn(T_rows, 1, R, dtype=torch.float64) * 3).to(dtype=dtype, device=device)
    cache_dtype = dtype if kv_cache_dtype == "auto" else torch.uint8
    nbytes = blocks * bs * (L + R) * torch.empty((), dtype=cache_dtype).element_size()
    raw = torch.randint(0, 256, (nbytes,), dtype=torch.uint8)
    cache = raw.view(cache_dtype).view(blocks, bs, L + R).to(device)
    slots = torch.randperm(blocks * bs)[:T]
    slots[2] = -1
    slots = slots.to(device)
    scale = torch.tensor([0.04], dtype=torch.float32, device=device)
    before = cache.clone()
    assert compat.concat_and_cache_mla(kv_c, k_pe, cache, slots, kv_cache_dtype, scale) is None
    s = slots.cpu()
    stored = s >= 0
    rows = torch.cat([kv_c[:T].cpu(), k_pe[:T, 0].cpu()], dim=-1)[stored]
    if kv_cache_dtype == "fp8":
        want = ref.quantize_fp8(rows, 0.04, torch.float8_e4m3fn).view(torch.uint8)
    else:
        want = rows
    got = cache.cpu().view(-1, L + R)
    assert ref.same_bits(got[s[stored]], want)
    keep = torch.ones(blocks * bs, dtype=torch.bool)
    keep[s[stored]] = False
    assert ref.same_bits(got[keep], before.cpu().view(-1, L + R)[keep])


def test_concat_and_cache_mla_refuses_a_cache_of_another_dtype():
    kv_c, k_pe = torch.randn(2, 8), torch.randn(2, 4)
    cache = torch.zeros(2, 2, 12, dtype=torch.float16)
    with pytest.raises(ValueError, match="kv_cache must have it"):
        compat.concat_and_cache_mla(kv_c, k_pe, cache, torch.arange(2), "auto", torch.ones(1))


# ---- FlashInfer rope_quantize_fp8 / mla_rope_quantize_fp8 --------------------------------------


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("fp8", FP8, ids=dtype_id)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
def test_rope_quantize_fp8(dtype, fp8, is_neox, device):
    T, Hq, Hk, R, N, max_pos = 6, 4, 2, 32, 24, 50
    g = torch.Generator().manual_seed(0)

    def rnd(*shape):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * 2).to(dtype).to(device)

    q_rope, k_rope, q_nope, k_nope = rnd(T, Hq, R), rnd(T, Hk, R), rnd(T, Hq, N), rnd(T, Hk, N)
    cache = cos_sin_cache(max_pos, R, device)
    pos = torch.tensor([0, 5, 0, 17, 49, 3], device=device)
    sq, sk = 2.0, 0.5
    q_o, k_o, qn_o, kn_o = compat.rope_quantize_fp8(
        q_rope, k_rope, q_nope, k_nope, cache, pos, is_neox=is_neox, quantize_dtype=fp8,
        quant_scale_q=sq, quant_scale_kv=sk,
    )  # fmt: skip
    assert all(o.dtype == fp8 for o in (q_o, k_o, qn_o, kn_o))
    assert ref.same_bits(qn_o, ref.quantize_fp8(q_nope, sq, fp8, multiply=True))
    assert ref.same_bits(kn_o, ref.quantize_fp8(k_nope, sk, fp8, multiply=True))
    for got, x, s in ((q_o, q_rope, sq), (k_o, k_rope, sk)):
        want = flashinfer_rotation(x, cache, pos, is_neox)
        ref.fp8_close(got, want, s, fp8, multiply=True)
        at0 = pos.cpu() == 0
        assert ref.same_bits(got.cpu()[at0], ref.quantize_fp8(x.cpu()[at0], s, fp8, multiply=True))


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_mla_rope_quantize_fp8_with_out_buffers(device):
    T, H, R, L, max_pos = 5, 8, 64, 128, 40
    q_rope = torch.randn(T, H, R, dtype=torch.bfloat16, device=device)
    k_rope = torch.randn(T, R, dtype=torch.bfloat16, device=device)
    q_nope = torch.randn(T, H, L, dtype=torch.bfloat16, device=device)
    k_nope = torch.randn(T, L, dtype=torch.bfloat16, device=device)
    cache = cos_sin_cache(max_pos, R, device)
    pos = torch.arange(T, device=device) * 7
    fp8 = torch.float8_e4m3fn
    outs = [
        torch.empty(x.shape, dtype=fp8, device=device) for x in (q_rope, k_rope, q_nope, k_nope)
    ]
    got = compat.mla_rope_quantize_fp8(
        q_rope, k_rope, q_nope, k_nope, cache, pos, is_neox=False, quant_scale_q=1.5,
        quant_scale_kv=0.75, q_rope_out=outs[0], k_rope_out=outs[1], q_nope_out=outs[2],
        k_nope_out=outs[3],
    )  # fmt: skip
    for g_, o in zip(got, outs):
        assert g_.data_ptr() == o.data_ptr()
    assert got[1].shape == (T, R) and got[3].shape == (T, L)
    assert ref.same_bits(outs[3], ref.quantize_fp8(k_nope, 0.75, fp8, multiply=True))
    want = flashinfer_rotation(k_rope.unsqueeze(1), cache, pos, False).squeeze(1)
    ref.fp8_close(outs[1], want, 0.75, fp8, multiply=True)


def test_rope_quantize_fp8_refuses_a_cache_of_another_width():
    q = torch.randn(2, 2, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="cos_sin_cache must be"):
        compat.rope_quantize_fp8(q, q, None, None, cos_sin_cache(8, 32, "cpu"), torch.zeros(2))


# ---- the peers' own signatures, where their packages import ------------------------------------


FLASHINFER_NAMES = [
    "rope_quantize_fp8",
    "mla_rope_quantize_fp8",
    "rope_quantize_fp8_append_paged_kv_cache",
]
# Recorded from flashinfer-python itself by scripts/record_peer_signatures.py (the package is too
# large for the test command to install; it imports without a GPU).
RECORDED = json.loads(
    (Path(__file__).resolve().parents[1] / "support" / "peer_signatures.json").read_text()
)


def parameters(fn):
    """[(name, repr of the default or None)], as the recorder writes them."""
    return [
        [p.name, None if p.default is inspect.Parameter.empty else repr(p.default)]
        for p in inspect.signature(fn).parameters.values()
    ]


@pytest.mark.parametrize("name", FLASHINFER_NAMES)
def test_signature_equals_the_recorded_flashinfer(name):
    recorded = RECORDED["flashinfer-python"]
    assert parameters(getattr(compat, name)) == recorded["functions"][name], (
        f"compat.{name} differs from flashinfer-python {recorded['version']}'s"
    )


@pytest.mark.parametrize("name", FLASHINFER_NAMES)
def test_signature_equals_flashinfer(name):
    rope = pytest.importorskip("flashinfer.rope", reason="flashinfer-python not installed")
    theirs = inspect.signature(getattr(rope, name))
    ours = inspect.signature(getattr(compat, name))
    assert list(ours.parameters) == list(theirs.parameters)
    for p in theirs.parameters.values():
        assert ours.parameters[p.name].default == p.default, p.name


def test_signature_equals_vllm():
    ops = pytest.importorskip("vllm._custom_ops", reason="vllm not installed")
    theirs = inspect.signature(ops.concat_and_cache_mla)
    ours = inspect.signature(compat.concat_and_cache_mla)
    assert list(ours.parameters)[: len(theirs.parameters)] == list(theirs.parameters)


# ---- FlashInfer rope_quantize_fp8_append_paged_kv_cache ---------------------------------------
# Two requests: request 0 owns pages kv_indices[0:2] = (3, 0), request 1 page kv_indices[2] = 2,
# page_size 4; `positions` are the tokens' places in their request's KV sequence, `pos_ids` their
# RoPE positions; the last token is padding (batch_indices -1).
PAGE, PAGES = 4, 4
KV_INDPTR = [0, 2, 3]
KV_INDICES = [3, 0, 2]
BATCH = [0, 0, 0, 1, 1, -1]
KV_POS = [4, 5, 6, 1, 2, 0]
POS_IDS = [0, 9, 6, 0, 13, 3]


def paged_slot(b, p):
    """FlashInfer's paged addressing, written out per token."""
    g = KV_INDPTR[b] * PAGE + p
    return KV_INDICES[g // PAGE] * PAGE + g % PAGE


def random_fp8(shape, fp8, device):
    n = 1
    for s in shape:
        n *= s
    return torch.randint(0, 256, (n,), dtype=torch.uint8).view(fp8).view(shape).to(device)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
@pytest.mark.parametrize("fp8", FP8, ids=dtype_id)
def test_append_paged_kv_cache_gqa(fp8, kv_layout, device):
    T, Hq, Hk, R, N = 6, 4, 2, 16, 16
    g = torch.Generator().manual_seed(1)

    def rnd(*shape):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * 2).to(torch.bfloat16)

    q_rope, k_rope, q_nope, k_nope = rnd(T, Hq, R), rnd(T, Hk, R), rnd(T, Hq, N), rnd(T, Hk, N)
    v = rnd(T, Hk, R + N)
    cache = cos_sin_cache(20, R, "cpu")
    shape = (PAGES, PAGE, Hk, R + N) if kv_layout == "NHD" else (PAGES, Hk, PAGE, R + N)
    k_cache, v_cache = random_fp8(shape, fp8, device), random_fp8(shape, fp8, device)
    before = [k_cache.clone(), v_cache.clone()]
    sq, skv = 1.5, 0.5
    dev = [t.to(device) for t in (q_rope, k_rope, q_nope, k_nope, v)]
    q_o, qn_o = compat.rope_quantize_fp8_append_paged_kv_cache(
        *dev[:4], dev[4], cache.to(device), torch.tensor(POS_IDS, device=device),
        (k_cache, v_cache), torch.tensor(KV_INDICES, dtype=torch.int32, device=device),
        torch.tensor(KV_INDPTR, dtype=torch.int32, device=device),
        torch.tensor(BATCH, dtype=torch.int32, device=device),
        torch.tensor(KV_POS, dtype=torch.int32, device=device), is_neox=True,
        quantize_dtype=fp8, quant_scale_q=sq, quant_scale_kv=skv, page_size=PAGE,
        kv_layout=kv_layout,
    )  # fmt: skip
    pos = torch.tensor(POS_IDS)
    # q outputs for every token (a superset of FlashInfer's, which skips padding tokens).
    assert ref.same_bits(qn_o, ref.quantize_fp8(q_nope, sq, fp8, multiply=True))
    ref.fp8_close(q_o, flashinfer_rotation(q_rope, cache, pos, True), sq, fp8, multiply=True)

    def rows(c):  # (PAGES * PAGE, Hk, D) in slot order, whatever the layout
        c = c.cpu()
        return (c if kv_layout == "NHD" else c.transpose(1, 2)).reshape(PAGES * PAGE, Hk, R + N)

    k_rows, v_rows = rows(k_cache), rows(v_cache)
    k_rot = flashinfer_rotation(k_rope, cache, pos, True)
    written = set()
    for t, (b, p) in enumerate(zip(BATCH, KV_POS)):
        if b < 0:
            continue
        s = paged_slot(b, p)
        written.add(s)
        assert ref.same_bits(k_rows[s, :, R:], ref.quantize_fp8(k_nope[t], skv, fp8, multiply=True))
        assert ref.same_bits(v_rows[s], ref.quantize_fp8(v[t], skv, fp8, multiply=True))
        ref.fp8_close(k_rows[s, :, :R], k_rot[t], skv, fp8, multiply=True)
        if POS_IDS[t] == 0:  # turns by nothing: torch's cast of the value, bit for bit
            want = ref.quantize_fp8(k_rope[t], skv, fp8, multiply=True)
            assert ref.same_bits(k_rows[s, :, :R], want)
    keep = [s for s in range(PAGES * PAGE) if s not in written]
    assert ref.same_bits(k_rows[keep], rows(before[0])[keep])
    assert ref.same_bits(v_rows[keep], rows(before[1])[keep])


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_append_paged_kv_cache_mla(device):
    T, H, R, L = 6, 4, 16, 32
    fp8 = torch.float8_e4m3fn
    q_rope = torch.randn(T, H, R, dtype=torch.float16)
    k_rope = torch.randn(T, R, dtype=torch.float16)
    q_nope = torch.randn(T, H, L, dtype=torch.float16)
    k_nope = torch.randn(T, L, dtype=torch.float16)
    cache = cos_sin_cache(20, R, "cpu")
    ckv = random_fp8((PAGES, PAGE, L), fp8, device)
    kpe = random_fp8((PAGES, PAGE, R), fp8, device)
    before = [ckv.clone(), kpe.clone()]
    q_out = torch.empty(T, H, R, dtype=fp8, device=device)
    got = compat.rope_quantize_fp8_append_paged_kv_cache(
        q_rope.to(device), k_rope.to(device), q_nope.to(device), k_nope.to(device), None,
        cache.to(device), torch.tensor(POS_IDS, device=device), (ckv, kpe),
        torch.tensor(KV_INDICES, device=device), torch.tensor(KV_INDPTR, device=device),
        torch.tensor(BATCH, device=device), torch.tensor(KV_POS, device=device), is_neox=False,
        quant_scale_kv=2.0, page_size=PAGE, q_rope_out=q_out,
    )  # fmt: skip
    assert got[0].data_ptr() == q_out.data_ptr()
    pos = torch.tensor(POS_IDS)
    k_rot = flashinfer_rotation(k_rope.unsqueeze(1), cache, pos, False).squeeze(1)
    ckv_rows, kpe_rows = ckv.cpu().view(-1, L), kpe.cpu().view(-1, R)
    written = []
    for t, (b, p) in enumerate(zip(BATCH, KV_POS)):
        if b < 0:
            continue
        s = paged_slot(b, p)
        written.append(s)
        assert ref.same_bits(ckv_rows[s], ref.quantize_fp8(k_nope[t], 2.0, fp8, multiply=True))
        ref.fp8_close(kpe_rows[s], k_rot[t], 2.0, fp8, multiply=True)
    keep = [s for s in range(PAGES * PAGE) if s not in written]
    assert ref.same_bits(ckv_rows[keep], before[0].cpu().view(-1, L)[keep])
    assert ref.same_bits(kpe_rows[keep], before[1].cpu().view(-1, R)[keep])


def _paged_call(device, kv_pos, batch=BATCH, **changes):
    """A GQA call of rope_quantize_fp8_append_paged_kv_cache with the module's pages; returns
    (run, the caches) so that a test can check what a refused call left."""
    T, Hq, Hk, R, N = 6, 2, 2, 16, 16
    fp8 = torch.float8_e4m3fn
    g = torch.Generator().manual_seed(2)
    q_rope, k_rope = torch.randn(T, Hq, R, generator=g), torch.randn(T, Hk, R, generator=g)
    q_nope, k_nope = torch.randn(T, Hq, N, generator=g), torch.randn(T, Hk, N, generator=g)
    v = torch.randn(T, Hk, R + N, generator=g)
    caches = (random_fp8((PAGES, PAGE, Hk, R + N), fp8, device),
              random_fp8((PAGES, PAGE, Hk, R + N), fp8, device))  # fmt: skip
    args = dict(
        q_rope=q_rope, k_rope=k_rope, q_nope=q_nope, k_nope=k_nope, v=v,
        cos_sin_cache=cos_sin_cache(20, R, "cpu"), pos_ids=torch.tensor(POS_IDS),
        paged_kv_cache=caches, kv_indices=torch.tensor(KV_INDICES, dtype=torch.int32),
        kv_indptr=torch.tensor(KV_INDPTR, dtype=torch.int32),
        batch_indices=torch.tensor(batch, dtype=torch.int32),
        positions=torch.tensor(kv_pos, dtype=torch.int32), quantize_dtype=fp8, page_size=PAGE,
    )  # fmt: skip
    args.update(changes)
    args = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    args["paged_kv_cache"] = caches

    def run():
        return compat.rope_quantize_fp8_append_paged_kv_cache(**args)

    return run, caches


@pytest.mark.parametrize(
    "kv_pos,batch,match",
    [
        # A negative position would index kv_indices from its end: request 0's token into
        # request 1's page 2.
        ([4, -1, 6, 1, 2, 0], BATCH, r"positions\[1\] = -1 must be in \[0, 8\)"),
        # One past the last request's one page: torch's bare IndexError before.
        ([4, 5, 6, 1, 4, 0], BATCH, r"positions\[4\] = 4 must be in \[0, 4\): the entries of "
         r"request batch_indices\[4\] = 1's 1 pages"),
        # Past request 0's two pages, inside kv_indices: request 1's page.
        ([4, 5, 8, 1, 2, 0], BATCH, r"positions\[2\] = 8 must be in \[0, 8\)"),
        ([4, 5, 6, 1, 2, 0], [0, 0, 0, 2, 1, -1], r"batch_indices\[3\] = 2 must be < the number "
         r"of requests, kv_indptr.size\(0\) - 1 = 2"),
    ],
    ids=["negative", "past_the_last_page", "into_the_next_request", "batch_index"],
)  # fmt: skip
def test_append_paged_kv_cache_refuses_a_token_outside_its_pages(kv_pos, batch, match):
    run, caches = _paged_call("cpu", kv_pos, batch)
    before = [c.clone() for c in caches]
    with pytest.raises(ValueError, match="rope_quantize_fp8_append_paged_kv_cache: " + match):
        run()
    for c, b in zip(caches, before):
        assert ref.same_bits(c, b), "a refused call wrote the cache"


def test_append_paged_kv_cache_padding_with_no_pages_writes_nothing():
    # Every token padding and no pages at all: nothing to read in kv_indices, nothing written.
    run, caches = _paged_call(
        "cpu", [0] * 6, [-1] * 6, kv_indices=torch.zeros(0, dtype=torch.int32),
        kv_indptr=torch.tensor([0, 0], dtype=torch.int32),
    )  # fmt: skip
    before = [c.clone() for c in caches]
    run()
    for c, b in zip(caches, before):
        assert ref.same_bits(c, b)


# ---- errors in the peer's words -----------------------------------------------------------------


def test_peer_errors_name_the_peers_arguments():
    # The ops check torch-rope's arguments (cu_seqlens, positions, x, q_scale); a caller of a
    # peer's entry point reads the names it passed.
    q, k = torch.randn(5, 2, 16), torch.randn(5, 1, 16)
    bad_indptr = torch.tensor([0, 2, 6])  # nnz is 5
    cases = [
        (lambda: compat.apply_rope(q, k, bad_indptr, torch.tensor([0, 0])),
         r"^apply_rope: indptr\[-1\] must equal", r"cu_seqlens"),
        (lambda: compat.apply_rope_inplace(q.clone(), k.clone(), bad_indptr, torch.tensor([0, 0])),
         r"^apply_rope_inplace: indptr\[-1\] must equal", r"cu_seqlens"),
        (lambda: compat.apply_rope(q, k, torch.tensor([0, 2, 5]), torch.tensor([0, -3])),
         r"^apply_rope: offsets", r"seq_offsets"),
        (lambda: compat.apply_rope_pos_ids(q, k, torch.tensor([0, 1, -2, 3, 4])),
         r"^apply_rope_pos_ids: pos_ids", r"\bpositions\b"),
        (lambda: compat.apply_llama31_rope_pos_ids_inplace(q.clone(), k.clone(),
                                                           torch.tensor([0, 1, -2, 3, 4])),
         r"^apply_llama31_rope_pos_ids_inplace: pos_ids", r"\bpositions\b"),
        (lambda: compat.rope_quantize_fp8(q.bfloat16(), k.bfloat16(), None, None,
                                          cos_sin_cache(4, 16, "cpu"), torch.arange(5)),
         r"^rope_quantize_fp8: pos_ids must be in \[0, max_seq_len\) with max_seq_len = "
         r"cos_sin_cache.size\(0\) = 4", r"\bpositions\b|cos\.size"),
        (lambda: compat.rope_quantize_fp8(q.bfloat16(), k.bfloat16(), None, None,
                                          cos_sin_cache(8, 16, "cpu"), torch.arange(5),
                                          quant_scale_q=0.0),
         r"^rope_quantize_fp8: quant_scale_q must be a finite number > 0", r"\bq_scale\b"),
    ]  # fmt: skip
    for call, want, absent in cases:
        with pytest.raises((ValueError, RuntimeError, IndexError)) as info:
            call()
        message = str(info.value)
        assert re.search(want, message), message
        assert not re.search(absent, message), message


def test_paged_append_errors_name_pos_ids():
    run, caches = _paged_call("cpu", KV_POS, pos_ids=torch.tensor([0, 9, 6, 0, 25, 3]))
    with pytest.raises(IndexError) as info:
        run()
    message = str(info.value)
    assert message.startswith("rope_quantize_fp8_append_paged_kv_cache: pos_ids"), message
    assert "cos_sin_cache.size(0) = 20" in message, message
