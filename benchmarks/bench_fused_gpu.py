# SPDX-License-Identifier: BSD-3-Clause
"""The fused ops on a GPU (run by scripts/gpu_check.sh): rms_norm_apply_qk and apply_qk_cache.

    PYTHONPATH=python python benchmarks/bench_fused_gpu.py [--device cuda] [--output NAME]

For each shape and dtype, CUDA-event medians (bench_gpu.Timer) of:
  - fused:            the fused op
  - apply_qk:         torch_rope.apply_qk alone on the same q/k (the target: fused within 1.15x)
  - unfused:          the sequence it replaces, eager (F.rms_norm then apply_qk; apply_qk then
                      index_copy_ of k and v into the cache slots)
  - unfused_compile:  that sequence under torch.compile(fullgraph=True)
  - clone:            q.clone() and k.clone(): the memory floor of the shape
Shapes: decode B = 1 and 64 (q (B, 1, 32, 128), k and v (B, 1, 8, 128)) and a 2048-token
prefill; bf16 and fp32 (and an fp8 e4m3 cache for apply_qk_cache). Results go to
benchmarks/results/fused_<NAME>.json / .md (NAME: the GPU's name by default).

``--device cpu`` runs the same code on the CPU with wall-clock timing: a check of this script on
a machine without a GPU, not a benchmark (the CPU figures are bench_fused_norm.py's and
bench_kv_cache.py's).
"""

import argparse
import json
import re
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import timing  # noqa: E402
from bench_gpu import Timer  # noqa: E402

import torch_rope  # noqa: E402

SHAPES = [("decode B=1", 1, 1), ("decode B=64", 64, 1), ("prefill S=2048", 1, 2048)]
HQ, HKV, D = 32, 8, 128
EPS = 1e-6


def norm_candidates(B, S, dtype, device):
    g = torch.Generator(device="cpu").manual_seed(0)
    q = torch.randn(B, S, HQ, D, generator=g).to(device, dtype)
    k = torch.randn(B, S, HKV, D, generator=g).to(device, dtype)
    qw = (1 + 0.1 * torch.randn(D, generator=g)).to(device, dtype)
    kw = (1 + 0.1 * torch.randn(D, generator=g)).to(device, dtype)
    cos, sin = torch_rope.rope_tables(1e6, D, 4096, device=device)
    positions = (torch.arange(S, device=device) + (100 if S == 1 else 0)).view(S, 1)

    def fused():
        return torch_rope.rms_norm_apply_qk(
            q, k, qw, kw, cos, sin, positions, eps=EPS, interleaved=False
        )

    def unfused(q, k):
        q = F.rms_norm(q, (D,), qw, eps=EPS)
        k = F.rms_norm(k, (D,), kw, eps=EPS)
        return torch_rope.apply_qk(q, k, cos, sin, positions, interleaved=False)

    # The fused op must agree with the sequence it replaces before it is timed.
    want = unfused(q.float(), k.float())
    for got, ref in zip(fused(), want):
        torch.testing.assert_close(got.float(), ref, rtol=2e-2, atol=2e-2)
    compiled = torch.compile(unfused, fullgraph=True)
    return {
        "fused": fused,
        "apply_qk": lambda: torch_rope.apply_qk(q, k, cos, sin, positions, interleaved=False),
        "unfused": lambda: unfused(q, k),
        "unfused_compile": lambda: compiled(q, k),
        "clone": lambda: (q.clone(), k.clone()),
    }


def cache_candidates(B, S, dtype, cache_dtype, device):
    g = torch.Generator(device="cpu").manual_seed(0)
    T = B * S
    qkv = torch.randn(T, (HQ + 2 * HKV) * D, generator=g).to(device, dtype)
    q = qkv[:, : HQ * D].view(T, HQ, D)
    k = qkv[:, HQ * D : (HQ + HKV) * D].view(T, HKV, D)
    v = qkv[:, (HQ + HKV) * D :].view(T, HKV, D)
    cos, sin = torch_rope.rope_tables(1e6, D, 4096, device=device)
    positions = (torch.arange(T, device=device) % 4096).view(T, 1)
    num_slots = max(4096, 2 * T)
    k_cache = torch.zeros(num_slots, HKV, D, device=device, dtype=cache_dtype)
    v_cache = torch.zeros_like(k_cache)
    slots = torch.randperm(num_slots, generator=g)[:T].to(device)
    fp8 = cache_dtype not in (torch.float32, torch.bfloat16, torch.float16)
    scale = 0.05 if fp8 else None

    def fused():
        return torch_rope.apply_qk_cache(
            q, k, v, cos, sin, positions, k_cache, v_cache, slots,
            interleaved=False, k_scale=scale, v_scale=scale,
        )  # fmt: skip

    def unfused(q, k, v):
        q_out, k_out = torch_rope.apply_qk(q, k, cos, sin, positions, interleaved=False)
        if fp8:
            k_out = (k_out.float() / scale).clamp(-448.0, 448.0)
            v = (v.float() / scale).clamp(-448.0, 448.0)
        if fp8:  # index_copy_ has no float8 kernels: copy the bytes
            k_cache.view(torch.uint8).index_copy_(0, slots, k_out.to(cache_dtype).view(torch.uint8))
            v_cache.view(torch.uint8).index_copy_(0, slots, v.to(cache_dtype).view(torch.uint8))
        else:
            k_cache.index_copy_(0, slots, k_out.to(cache_dtype))
            v_cache.index_copy_(0, slots, v.to(cache_dtype))
        return q_out

    compiled = torch.compile(unfused, fullgraph=True)
    return {
        "fused": fused,
        "apply_qk": lambda: torch_rope.apply_qk(q, k, cos, sin, positions, interleaved=False),
        "unfused": lambda: unfused(q, k, v),
        "unfused_compile": lambda: compiled(q, k, v),
        "clone": lambda: (q.clone(), k.clone(), v.clone()),
    }


def run(device, min_time_s):
    timer = Timer(device, min_time_s)
    rows = []
    plans = []
    for dtype in (torch.bfloat16, torch.float32):
        for name, B, S in SHAPES:
            plans.append(("rms_norm_apply_qk", name, dtype, None, B, S))
            plans.append(("apply_qk_cache", name, dtype, dtype, B, S))
        for name, B, S in SHAPES if dtype == torch.bfloat16 else []:
            plans.append(("apply_qk_cache", name, dtype, torch.float8_e4m3fn, B, S))
    for op, name, dtype, cache_dtype, B, S in plans:
        torch._dynamo.reset()
        if op == "rms_norm_apply_qk":
            cands = norm_candidates(B, S, dtype, device)
        else:
            cands = cache_candidates(B, S, dtype, cache_dtype, device)
        us = {n: timer(fn) * 1e6 for n, fn in cands.items()}
        best_unfused = min(us["unfused"], us["unfused_compile"])
        row = {
            "op": op,
            "shape": name,
            "dtype": str(dtype).replace("torch.", ""),
            "cache": str(cache_dtype).replace("torch.", "") if cache_dtype else None,
            "us": {n: round(v, 2) for n, v in us.items()},
            "fused/apply_qk": round(us["fused"] / us["apply_qk"], 3),
            "fused/best_unfused": round(us["fused"] / best_unfused, 3),
            "fused/clone": round(us["fused"] / us["clone"], 3),
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def markdown(result):
    m = result["meta"]
    lines = [
        f"# The fused ops on {m['device_name']}",
        "",
        f"torch {m['torch']}, {m['date']}; medians of bench_gpu.Timer (CUDA events on a GPU, wall "
        "clock on a CPU). Goal: fused /",
        "apply_qk <= 1.15 and fused faster than the best unfused sequence (eager or compiled).",
        "",
        "| op | shape | dtype | cache | fused µs | fused / apply_qk | fused / best unfused | "
        "fused / clone |",
        "|---|---|---|---|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['op']} | {r['shape']} | {r['dtype']} | {r['cache'] or '-'} | "
            f"{r['us']['fused']} | {r['fused/apply_qk']} | {r['fused/best_unfused']} | "
            f"{r['fused/clone']} |"
        )
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--min-time", type=float, default=0.5, help="seconds per candidate")
    parser.add_argument("--output", default=None, help="results name (default: the device)")
    parser.add_argument("--results-dir", default=None, help="default: benchmarks/results/")
    args = parser.parse_args()
    if args.device == "cuda":
        name = torch.cuda.get_device_name()
    else:
        name = "cpu (a check of this script: wall-clock timing, not a benchmark)"
    meta = timing.start_run(device_name=name)
    result = {"meta": meta, "rows": run(args.device, args.min_time)}
    slug = args.output or re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
    timing.write_results(f"fused_{slug}", result, markdown, args.results_dir)


if __name__ == "__main__":
    main()
