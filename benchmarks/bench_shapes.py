# SPDX-License-Identifier: BSD-3-Clause
"""CPU shape scan of torch_rope.apply: time / x.clone() across head dims, rotary dims, layouts,
dtypes and two sizes, to show where the kernel is at the copy floor and where it is not.

bench_rope.py measures the target shapes (head_dim 128). This scan covers the others users
have: head_dim 64 to 256, partial rotary, x as (B, S, H, D) with positions (S, 1), at S=512
(0.5-8 MiB) and S=4096 (4-64 MiB). Every figure is a ratio of medians of interleaved rounds in
one run (timing.py).

    PYTHONPATH=python .venv/bin/python benchmarks/bench_shapes.py [--threads N]

writes benchmarks/results/cpu_shapes_<kernel>.json and .md.
"""

import argparse
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import timing  # noqa: E402

import torch_rope  # noqa: E402

MAX_SEQ_LEN = 4096
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
HEAD_DIMS = (64, 80, 96, 128, 256)
# S=4096 is 16-32 MiB: at 32 MiB and above a fresh clone() output page-faults 4 KiB at a time,
# while torch_rope's outputs get transparent huge pages (README, Speed), hence ratios below 1.
SIZES = {"(2,512,8,D)": (2, 512, 8), "(2,4096,8,D)": (2, 4096, 8)}


def scan(rounds):
    rows = []
    with torch.inference_mode():
        for size_name, (batch, seq, heads) in SIZES.items():
            positions = torch.arange(seq).view(seq, 1)
            for dname, dtype in DTYPES.items():
                for head_dim in HEAD_DIMS:
                    x = torch.randn(batch, seq, heads, head_dim, dtype=dtype)
                    for rotary_dim in (head_dim, head_dim // 2):
                        cos, sin = torch_rope.rope_tables(10000.0, rotary_dim, MAX_SEQ_LEN)
                        fns = {"clone": lambda: x.clone()}
                        for interleaved in (True, False):
                            fns["interleaved" if interleaved else "half split"] = (
                                lambda i=interleaved: torch_rope.apply(
                                    x, cos, sin, positions, interleaved=i
                                )
                            )
                        res = timing.measure(fns, rounds)
                        clone_s = res["clone"]["s"]
                        row = {
                            "size": size_name,
                            "dtype": dname,
                            "head_dim": head_dim,
                            "rotary_dim": rotary_dim,
                            "mib": x.nbytes / 2**20,
                            "clone_us": clone_s * 1e6,
                            "over_clone": {
                                k: v["s"] / clone_s for k, v in res.items() if k != "clone"
                            },
                            "spread": {k: v["spread"] for k, v in res.items()},
                        }
                        rows.append(row)
                        print(
                            f"{size_name:24s} {dname} D={head_dim:3d} R={rotary_dim:3d} "
                            f"clone={row['clone_us']:8.1f}us "
                            + " ".join(f"{k}={v:.2f}" for k, v in row["over_clone"].items()),
                            flush=True,
                        )
    return rows


def markdown(meta, rows):
    lines = [
        f"# CPU shape scan ({meta['kernel_variant']}, {meta['threads']} threads)",
        "",
        f"{meta['cpu_model']}, torch {meta['torch']}, {meta['date']}. Time of "
        "`torch_rope.apply` / `x.clone()` of the same x, x as (B, S, H, D), positions (S, 1).",
        "",
    ]
    if timing.simulated_note(meta):
        lines += [timing.simulated_note(meta), ""]
    lines += [
        "| size | dtype | head_dim | rotary_dim | MiB | clone us | interleaved | half split |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        o = r["over_clone"]
        lines.append(
            f"| {r['size']} | {r['dtype']} | {r['head_dim']} | {r['rotary_dim']} | "
            f"{r['mib']:.2f} | {r['clone_us']:.1f} | {o['interleaved']:.2f} | "
            f"{o['half split']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    meta = timing.start_run(args.threads)
    rows = scan(args.rounds)
    name = f"cpu_shapes_{meta['kernel_variant'].lower()}"
    timing.write_results(name, {"meta": meta, "rows": rows}, markdown(meta, rows))


if __name__ == "__main__":
    main()
