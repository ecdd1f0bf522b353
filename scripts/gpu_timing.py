#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Quick GPU timing of the main RoPE shapes, as a ratio to x.clone() of the same tensors.

Used by scripts/gpu_check.sh to compare builds of the kernel with different tuning knobs (rows in
flight, register budget) side by side, and as the workload of its Nsight Compute summary. The
full benchmark, with eager and torch.compile baselines, is benchmarks/bench_gpu.py.

    python scripts/gpu_timing.py [--json FILE] [--label NAME] [--once]

--once runs every shape a few times without timing (for ncu). Needs a CUDA GPU.
"""

import argparse
import json
import sys

import torch

import torch_rope

# (name, op, batch, seq, q_heads, k_heads, head_dim, interleaved, decode): the shapes of
# benchmarks/bench_gpu.py, in (B, S, H, D) as a fused projection lays them out.
SHAPES = [
    ("prefill", "apply", 4, 2048, 32, 0, 128, True, False),
    ("prefill half-split", "apply", 4, 2048, 32, 0, 128, False, False),
    ("long-context prefill", "apply", 1, 32768, 32, 0, 128, True, False),
    ("prefill GQA q/k", "apply_qk", 4, 2048, 32, 8, 128, True, False),
    ("decode q/k", "apply_qk", 64, 1, 32, 8, 128, True, True),
]
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def inputs(shape, dtype):
    name, op, b, s, hq, hk, d, interleaved, decode = shape
    gen = torch.Generator(device="cpu").manual_seed(0)
    q = torch.randn(b, s, hq, d, generator=gen).to(dtype).cuda()
    k = torch.randn(b, s, hk, d, generator=gen).to(dtype).cuda() if op == "apply_qk" else None
    max_seq_len = max(s, 4096)
    cos, sin = torch_rope.rope_tables(10000.0, d, max_seq_len, device="cuda")
    if decode:
        positions = torch.randint(0, max_seq_len, (b, 1, 1), generator=gen).cuda()
    else:
        positions = torch.arange(s, device="cuda").view(s, 1)
    return q, k, cos, sin, positions


def median_ms(fn, repeats=50):
    for _ in range(5):
        fn()
    times = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--label", default="", help="name of this build, for the table")
    parser.add_argument("--once", action="store_true", help="run each shape untimed (ncu)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_timing: no CUDA GPU", file=sys.stderr)
        return 2

    rows = []
    print(
        "| build | shape | dtype | ours ms | clone ms | ours / clone |\n|---|---|---|---|---|---|"
    )
    for shape in SHAPES:
        for dtype in DTYPES:
            q, k, cos, sin, positions = inputs(shape, dtype)
            interleaved = shape[7]
            if shape[1] == "apply_qk":

                def ours():
                    torch_rope.apply_qk(q, k, cos, sin, positions, interleaved=interleaved)

                def clone():
                    q.clone()
                    k.clone()
            else:

                def ours():
                    torch_rope.apply(q, cos, sin, positions, interleaved=interleaved)

                def clone():
                    q.clone()

            if args.once:
                for _ in range(3):
                    ours()
                torch.cuda.synchronize()
                continue
            ours_ms = median_ms(ours)
            clone_ms = median_ms(clone)
            row = {
                "build": args.label,
                "shape": shape[0],
                "dtype": str(dtype).replace("torch.", ""),
                "ours_ms": ours_ms,
                "clone_ms": clone_ms,
                "ours_over_clone": ours_ms / clone_ms,
            }
            rows.append(row)
            print(
                f"| {args.label} | {row['shape']} | {row['dtype']} | {ours_ms:.4f} | "
                f"{clone_ms:.4f} | {row['ours_over_clone']:.3f} |",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows},
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
