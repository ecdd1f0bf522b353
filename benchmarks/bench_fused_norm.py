#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""CPU benchmark of rope.rms_norm_apply_qk (fused QK-RMSNorm + RoPE), as ratios in one run.

For each shape and dtype, every candidate is timed in interleaved rounds (timing.py):
  - fused:           torch_rope.rms_norm_apply_qk(q, k, q_weight, k_weight, ...)
  - apply_qk:        torch_rope.apply_qk(q, k, ...) alone on the same shapes (the goal is
                     fused / apply_qk <= 1.15: the norm should cost little over the rotation)
  - unfused:         torch.nn.functional.rms_norm on q and on k, then torch_rope.apply_qk
  - unfused_compile: the unfused sequence under torch.compile (fullgraph)
  - fused_compile:   the fused op under torch.compile (fullgraph; the op is one graph node)
and the report gives fused / apply_qk, fused / unfused (eager and compiled), fused_compile /
unfused_compile. Shapes: decode, (B, 1, 32, 128) q and (B, 1, 8, 128) k for B = 1 and 64;
prefill, (1, 2048, 32, 128) q and (1, 2048, 8, 128) k; bf16 and fp32; half-split pairs (HF
layout). The machine is shared: the load average is recorded before and after.

    python benchmarks/bench_fused_norm.py [--threads 2] [--quick] [--no-compile]
"""

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import timing  # noqa: E402
import torch  # noqa: E402

import torch_rope  # noqa: E402

SHAPES = [
    ("decode B=1", (1, 1, 32, 128), (1, 1, 8, 128)),
    ("decode B=64", (64, 1, 32, 128), (64, 1, 8, 128)),
    ("prefill S=2048", (1, 2048, 32, 128), (1, 2048, 8, 128)),
]
EPS = 1e-6


def problem(q_shape, k_shape, dtype):
    torch.manual_seed(0)
    q = torch.randn(q_shape, dtype=dtype)
    k = torch.randn(k_shape, dtype=dtype)
    qw = (1 + 0.1 * torch.randn(q_shape[-1])).to(dtype)
    kw = (1 + 0.1 * torch.randn(k_shape[-1])).to(dtype)
    S = q_shape[1]
    cos, sin = torch_rope.rope_tables(1e6, q_shape[-1], 4096)
    positions = (torch.arange(S) + (100 if S == 1 else 0)).view(S, 1)  # (S, 1) for (B, S, H, D)
    return q, k, qw, kw, cos, sin, positions


def fused(q, k, qw, kw, cos, sin, positions):
    return torch_rope.rms_norm_apply_qk(
        q, k, qw, kw, cos, sin, positions, eps=EPS, interleaved=False
    )


def unfused(q, k, qw, kw, cos, sin, positions):
    d = q.shape[-1]
    q = torch.nn.functional.rms_norm(q, (d,), qw, eps=EPS)
    k = torch.nn.functional.rms_norm(k, (d,), kw, eps=EPS)
    return torch_rope.apply_qk(q, k, cos, sin, positions, interleaved=False)


def rows(quick, with_compile):
    out = []
    for dtype in (torch.bfloat16, torch.float32):
        for name, q_shape, k_shape in SHAPES:
            args = problem(q_shape, k_shape, dtype)
            q, k, _, _, cos, sin, positions = args
            cands = {
                "fused": lambda a=args: fused(*a),
                "apply_qk": lambda: torch_rope.apply_qk(
                    q, k, cos, sin, positions, interleaved=False
                ),
                "unfused": lambda a=args: unfused(*a),
            }
            if with_compile:
                torch._dynamo.reset()
                cu = torch.compile(unfused, fullgraph=True)
                cf = torch.compile(fused, fullgraph=True)
                for _ in range(3):  # compile and warm up outside the timed rounds
                    cu(*args)
                    cf(*args)
                cands["unfused_compile"] = lambda a=args, f=cu: f(*a)
                cands["fused_compile"] = lambda a=args, f=cf: f(*a)
            nbytes = 2 * (q.numel() + k.numel()) * q.element_size()
            rounds = 7 if quick else (31 if nbytes < (1 << 20) else 15)
            res = timing.measure(cands, rounds=rounds)
            s = {n: r["s"] for n, r in res.items()}
            row = {
                "shape": name,
                "q": list(q_shape),
                "k": list(k_shape),
                "dtype": str(dtype).replace("torch.", ""),
                "us": {n: round(v * 1e6, 2) for n, v in s.items()},
                "spread": {n: round(r["spread"], 3) for n, r in res.items()},
                "fused/apply_qk": round(s["fused"] / s["apply_qk"], 3),
                "fused/unfused": round(s["fused"] / s["unfused"], 3),
            }
            if with_compile:
                row["fused/unfused_compile"] = round(s["fused"] / s["unfused_compile"], 3)
                row["fused_compile/unfused_compile"] = round(
                    s["fused_compile"] / s["unfused_compile"], 3
                )
            print(json.dumps(row))
            out.append(row)
    return out


def markdown(result):
    m = result["meta"]
    lines = [
        "# Fused QK-RMSNorm + RoPE on the CPU (`rope.rms_norm_apply_qk`)",
        "",
        f"{m['cpu_model']}, {m['threads']} threads, kernel copy {m['kernel_variant']}, torch "
        f"{m['torch']}, {m['date']}. Load average {m['loadavg_before']} before, "
        f"{m['loadavg_after']} after (a shared machine: other builds ran). Ratios of medians "
        "over interleaved rounds (benchmarks/timing.py); half-split pairs, eps 1e-6.",
        "",
        *([m["note"], ""] if m.get("note") else []),
        "| shape | dtype | fused µs | fused / apply_qk | fused / unfused eager | "
        "fused / unfused compiled | fused compiled / unfused compiled |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['shape']} | {r['dtype']} | {r['us']['fused']} | {r['fused/apply_qk']} | "
            f"{r['fused/unfused']} | {r.get('fused/unfused_compile', '-')} | "
            f"{r.get('fused_compile/unfused_compile', '-')} |"
        )
    lines += [
        "",
        "Goal: fused / apply_qk <= 1.15 (the normalisation nearly free on top of the rotation).",
        "Unfused: `torch.nn.functional.rms_norm` on q and k, then `torch_rope.apply_qk`.",
        "",
    ]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--output", default=None, help="default: fused_norm_cpu_<kernel variant>")
    parser.add_argument("--note", default="", help="a line for the report (why these settings)")
    args = parser.parse_args()
    meta = timing.start_run(args.threads, note=args.note)
    result = {"meta": meta, "rows": rows(args.quick, not args.no_compile)}
    name = args.output or f"fused_norm_cpu_{meta['kernel_variant'].lower()}"
    timing.write_results(name, result, markdown)


if __name__ == "__main__":
    main()
