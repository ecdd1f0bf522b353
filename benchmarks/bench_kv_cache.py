# SPDX-License-Identifier: BSD-3-Clause
"""CPU benchmark of rope.apply_qk_cache: RoPE into a paged KV cache.

For decode (B = 1 and B = 64 tokens) and a prefill chunk (T = 2048), q (T, 32, 128) and k, v
(T, 8, 128), a paged cache (num_blocks, 16, 8, 128) and shuffled slots, with bf16, fp32 and
fp8 (e4m3fn, bf16 inputs, scale 0.05) caches. Every figure is a ratio of medians from one run with
interleaved rounds (timing.py):

  fused / apply_qk     the fused op against apply_qk alone on the same q and k (target <= 1.15):
                       what writing the cache costs on top of the rotation;
  fused / unfused      against apply_qk followed by index_copy_ of k and v into the cache (fp8:
                       after torch's (x / scale).clamp(-max, max).to(fp8));
  compiled             the same two functions under torch.compile (fullgraph), and the eager
                       fused op against the compiled unfused path.

    PYTHONPATH=python .venv/bin/python benchmarks/bench_kv_cache.py [--no-compile] [--quick]

writes benchmarks/results/kv_cache_cpu_<kernel>.json and .md, with the load average before and
after (the machine is shared).
"""

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import timing  # noqa: E402
import torch  # noqa: E402

import torch_rope  # noqa: E402

HQ, HKV, D = 32, 8, 128
BLOCK_SIZE, NUM_BLOCKS = 16, 256  # 4096 slots
MAX_SEQ_LEN = 8192
FP8 = torch.float8_e4m3fn
FP8_SCALE = 0.05
CACHES = {"bf16": (torch.bfloat16, torch.bfloat16), "fp32": (torch.float32, torch.float32)}
CACHES["fp8_e4m3"] = (torch.bfloat16, FP8)
SHAPES = {"decode B=1": 1, "decode B=64": 64, "prefill T=2048": 2048}


def problem(T, dtype, cache_dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(T, (HQ + 2 * HKV) * D, generator=g).to(dtype)  # fused projection output
    q = qkv[:, : HQ * D].view(T, HQ, D)
    k = qkv[:, HQ * D : (HQ + HKV) * D].view(T, HKV, D)
    v = qkv[:, (HQ + HKV) * D :].view(T, HKV, D)
    cos, sin = torch_rope.rope_tables(10000.0, D, MAX_SEQ_LEN)
    positions = torch.randint(0, MAX_SEQ_LEN, (T, 1), generator=g)
    slots = torch.randperm(NUM_BLOCKS * BLOCK_SIZE, generator=g)[:T]
    k_cache = torch.zeros(NUM_BLOCKS, BLOCK_SIZE, HKV, D).to(cache_dtype)
    v_cache = torch.zeros(NUM_BLOCKS, BLOCK_SIZE, HKV, D).to(cache_dtype)
    return q, k, v, cos, sin, positions, k_cache, v_cache, slots


def fused(q, k, v, cos, sin, positions, k_cache, v_cache, slots, scale):
    return torch_rope.apply_qk_cache(
        q, k, v, cos, sin, positions, k_cache, v_cache, slots, k_scale=scale, v_scale=scale
    )


def unfused(q, k, v, cos, sin, positions, k_cache, v_cache, slots, scale):
    q_rot, k_rot = torch_rope.apply_qk(q, k, cos, sin, positions)
    if scale is not None:  # fp8: torch's own quantization
        k_rot = (k_rot.float() / scale).clamp(-448.0, 448.0).to(FP8)
        v = (v.float() / scale).clamp(-448.0, 448.0).to(FP8)
    # (index_copy_ has no float8 kernel on the CPU: fp8 caches are copied as bytes)
    as_rows = (
        (lambda t: t.view(-1, HKV, D).view(torch.uint8))
        if scale is not None
        else (lambda t: t.view(-1, HKV, D))
    )
    as_rows(k_cache).index_copy_(0, slots, as_rows(k_rot))
    as_rows(v_cache).index_copy_(0, slots, as_rows(v))
    return q_rot


def run_case(shape_name, T, cache_name, compile_too, quick):
    dtype, cache_dtype = CACHES[cache_name]
    args = problem(T, dtype, cache_dtype)
    q, k, v, cos, sin, positions, k_cache, v_cache, slots = args
    scale = FP8_SCALE if cache_dtype == FP8 else None
    # The two paths write the same bytes (checked once, on separate caches). fp8 k differs where
    # the unfused path's k, rounded to bf16 before its quantization, rounds differently: the
    # fused op rounds the float32 rotation once; the share of such k bytes is recorded.
    check = [a.clone() if a is k_cache or a is v_cache else a for a in args]
    fused(*args, scale)
    unfused(*check, scale)
    k_diff = (k_cache.view(torch.uint8) != check[6].view(torch.uint8)).float().mean().item()
    same = torch.equal(v_cache.view(torch.uint8), check[7].view(torch.uint8)) and (
        scale is not None or k_diff == 0
    )
    candidates = {
        "apply_qk": lambda: torch_rope.apply_qk(q, k, cos, sin, positions),
        "fused": lambda: fused(*args, scale),
        "unfused": lambda: unfused(*args, scale),
    }
    if compile_too:
        torch._dynamo.reset()
        fused_c = torch.compile(fused, fullgraph=True, dynamic=False)
        unfused_c = torch.compile(unfused, fullgraph=True, dynamic=False)
        candidates["fused compiled"] = lambda: fused_c(*args, scale)
        candidates["unfused compiled"] = lambda: unfused_c(*args, scale)
    rounds = 9 if quick else (15 if T >= 2048 else 31)
    res = timing.measure(candidates, rounds=rounds)
    s = {n: r["s"] for n, r in res.items()}
    ratios = {
        "fused / apply_qk": s["fused"] / s["apply_qk"],
        "fused / unfused": s["fused"] / s["unfused"],
    }
    if compile_too:
        ratios["fused compiled / unfused compiled"] = s["fused compiled"] / s["unfused compiled"]
        ratios["fused eager / unfused compiled"] = s["fused"] / s["unfused compiled"]
    row = {
        "shape": shape_name,
        "tokens": T,
        "cache": cache_name,
        "dtype": str(dtype).replace("torch.", ""),
        "same_bytes_as_unfused": same,
        "k_cache_bytes_differing": k_diff,
        "us": {n: v * 1e6 for n, v in s.items()},
        "spread": {n: r["spread"] for n, r in res.items()},
        "ratios": ratios,
    }
    print(
        f"  {shape_name:15s} {cache_name:9s} "
        + "  ".join(f"{n} {v:.2f}" for n, v in ratios.items())
        + f"  (fused {s['fused'] * 1e6:.1f} us, apply_qk {s['apply_qk'] * 1e6:.1f} us)",
        flush=True,
    )
    return row


def markdown(result):
    m = result["meta"]
    names = list(result["rows"][0]["ratios"])
    for r in result["rows"]:
        names += [n for n in r["ratios"] if n not in names]
    out = [
        "# rope.apply_qk_cache on the CPU",
        "",
        f"CPU: {m['cpu_model']} ({m['cpus']} CPUs), kernel **{m['kernel_variant']}**, "
        f"{m['threads']} threads, torch {m['torch']}, {m['date']}. Load average "
        f"{m['loadavg_before']} before, {m['loadavg_after']} after. q (T, {HQ}, {D}), k and v "
        f"(T, {HKV}, {D}) sliced from a fused qkv; paged cache ({NUM_BLOCKS}, {BLOCK_SIZE}, "
        f"{HKV}, {D}); fp8: e4m3fn from bf16 with scale {FP8_SCALE}. Target: fused / apply_qk "
        "<= 1.15.",
        "",
        "| shape | cache | fused (us) | apply_qk (us) | " + " | ".join(names) + " |",
        "|---|---|---:|---:|" + "---:|" * len(names),
    ]
    for r in result["rows"]:
        cells = [f"{r['ratios'][n]:.2f}" if n in r["ratios"] else "" for n in names]
        out.append(
            f"| {r['shape']} | {r['cache']} | {r['us']['fused']:.1f} | "
            f"{r['us']['apply_qk']:.1f} | " + " | ".join(cells) + " |"
        )
    return "\n".join(out) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # One thread by default: on the shared 2-core VM a 2-thread region waits a scheduler slice
    # (8-12 ms) whenever another process holds the other core (benchmarks/README.md).
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--output", default=None, help="results name")
    args = parser.parse_args()
    meta = timing.start_run(args.threads, grad=False, recompile_limit=64)
    rows = []
    for shape_name, T in SHAPES.items():
        for cache_name in CACHES:
            rows.append(run_case(shape_name, T, cache_name, not args.no_compile, args.quick))
    name = args.output or f"kv_cache_cpu_{meta['kernel_variant'].lower()}"
    timing.write_results(name, {"meta": meta, "rows": rows}, markdown)


if __name__ == "__main__":
    main()
