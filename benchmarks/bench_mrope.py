# SPDX-License-Identifier: BSD-3-Clause
"""CPU benchmark of multi-axis RoPE (M-RoPE, Qwen2-VL / Qwen3-VL text towers).

For each shape (prefill (4, 32, 2048, 128) and decode (64, 32, 1, 128), rotate_half layout as
these models use), dtype (bf16, fp32) and section layout (contiguous [16, 24, 24], Qwen3-VL's
interleaved rule over [24, 20, 20]), one interleaved-round run (timing.py) times:

  clone        x.clone(): the memory floor
  one-axis     torch_rope.apply with (B, 1, S) positions: the same op without axes
  mrope        torch_rope.apply with (B, 1, S, 3) positions and mrope_section
  hf eager     transformers' path written out: the rotary module's per-axis frequencies
               (3, B, S, 64), recomposed into one (B, S, 64) plane set by the section rule,
               cos/sin of it (doubled to head_dim), then q * cos + rotate_half(q) * sin
  hf compiled  the same under torch.compile

and reports mrope / clone, mrope / one-axis and hf / mrope. Targets: mrope within 1.1x of
one-axis, and at least 3x faster than transformers' eager path.

    PYTHONPATH=python .venv/bin/python benchmarks/bench_mrope.py \
        [--quick] [--no-compile] [--threads N]

writes benchmarks/results/mrope_cpu_<kernel>.json and .md.
"""

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import timing  # noqa: E402
import torch  # noqa: E402

import torch_rope  # noqa: E402

MAX_SEQ_LEN = 4096
THETA = 1e6
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
SECTIONS = {
    "contiguous": ([16, 24, 24], False),  # Qwen2-VL, Qwen2.5-VL
    "interleaved": ([24, 20, 20], True),  # Qwen3-VL
}


def hf_mrope(q, inv_freq, position_ids, section, interleaved):
    """transformers' M-RoPE (Qwen2-VL's and Qwen3-VL's rotary module + apply_rotary_pos_emb),
    as one function of q: position_ids (3, B, S) -> q rotated (B, H, S, D)."""
    # float32 angles as transformers computes them (float64 only for the float64 check).
    angle_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    freqs = position_ids[..., None].to(angle_dtype) * inv_freq.to(angle_dtype)  # (3, B, S, 64)
    if interleaved:  # Qwen3-VL: apply_interleaved_mrope
        mixed = freqs[0].clone()
        for axis, offset in ((1, 1), (2, 2)):
            length = section[axis] * 3
            idx = slice(offset, length, 3)
            mixed[..., idx] = freqs[axis, ..., idx]
    else:  # Qwen2-VL: the sections of each axis, concatenated
        mixed = torch.cat(
            [chunk[i] for i, chunk in enumerate(freqs.split(section, dim=-1))], dim=-1
        )
    emb = torch.cat((mixed, mixed), dim=-1)
    cos = emb.cos().to(q.dtype).unsqueeze(1)
    sin = emb.sin().to(q.dtype).unsqueeze(1)
    half = q.shape[-1] // 2
    rotated = torch.cat((-q[..., half:], q[..., :half]), dim=-1)
    return q * cos + rotated * sin


def problem(batch, seq, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 32, seq, 128, generator=gen).to(dtype)
    start = torch.randint(0, MAX_SEQ_LEN // 2, (batch, 1), generator=gen)
    t = start + torch.arange(seq)
    # Three axes that differ, as over image tokens: time, row, column.
    axes = torch.stack([t, t // 3 + 5, (t * 7) % 61 + 2])  # (3, B, S), HF's layout
    return x, axes


def run(quick, compile_hf):
    inv_freq = torch_rope.rope_frequencies(THETA, 128)[0]
    cos, sin = torch_rope.rope_tables(THETA, 128, MAX_SEQ_LEN)
    rows = []
    with torch.inference_mode():
        for shape_name, batch, seq in [("prefill", 4, 2048), ("decode", 64, 1)]:
            for dname, dtype in DTYPES.items():
                x, axes = problem(batch, seq, dtype)
                positions = axes.movedim(0, -1).unsqueeze(1).contiguous()  # (B, 1, S, 3)
                one_axis = axes[0].unsqueeze(1).contiguous()  # (B, 1, S)
                for layout, (section, inter) in SECTIONS.items():
                    ours = torch_rope.apply(
                        x,
                        cos,
                        sin,
                        positions,
                        interleaved=False,
                        mrope_section=section,
                        mrope_interleaved=inter,
                    )
                    ref = hf_mrope(x.double(), inv_freq, axes, section, inter)
                    err = (ours.double() - ref).abs().max().item()
                    assert err < (1e-4 if dtype == torch.float32 else 5e-2), err

                    fns = {
                        "clone": lambda: x.clone(),
                        "one-axis": lambda: torch_rope.apply(
                            x, cos, sin, one_axis, interleaved=False
                        ),
                        "mrope": lambda s=section, i=inter: torch_rope.apply(
                            x,
                            cos,
                            sin,
                            positions,
                            interleaved=False,
                            mrope_section=s,
                            mrope_interleaved=i,
                        ),
                        "hf eager": lambda s=section, i=inter: hf_mrope(x, inv_freq, axes, s, i),
                    }
                    if compile_hf:
                        compiled = torch.compile(hf_mrope, dynamic=False)
                        fns["hf compiled"] = lambda s=section, i=inter, c=compiled: c(
                            x, inv_freq, axes, s, i
                        )
                    base = 7 if x.nbytes >= 32 << 20 else 31
                    res = timing.measure(fns, max(5, base // 2) if quick else base)
                    row = {
                        "shape": f"{shape_name} ({batch},32,{seq},128)",
                        "dtype": dname,
                        "sections": layout,
                        "us": {k: v["s"] * 1e6 for k, v in res.items()},
                        "spread": {k: v["spread"] for k, v in res.items()},
                        "mrope/clone": res["mrope"]["s"] / res["clone"]["s"],
                        "mrope/one-axis": res["mrope"]["s"] / res["one-axis"]["s"],
                        "hf eager/mrope": res["hf eager"]["s"] / res["mrope"]["s"],
                    }
                    if compile_hf:
                        row["hf compiled/mrope"] = res["hf compiled"]["s"] / res["mrope"]["s"]
                    rows.append(row)
                    print(
                        f"  {row['shape']:26s} {dname:5s} {layout:11s} "
                        + " ".join(f"{k}={v:.2f}" for k, v in row.items() if "/" in k),
                        flush=True,
                    )
    return rows


def markdown(result):
    meta, rows = result["meta"], result["rows"]
    kernel = meta["kernel_variant"]
    cols = ["mrope/clone", "mrope/one-axis", "hf eager/mrope"]
    if any("hf compiled/mrope" in r for r in rows):
        cols.append("hf compiled/mrope")
    lines = [
        f"# M-RoPE on the CPU ({kernel} kernel, {meta['cpu_model']}, {meta['threads']} threads)",
        "",
        f"{meta['date']}, torch {meta['torch']}, load average {meta['loadavg_before']} before, "
        f"{meta['loadavg_after']} after. "
        "Ratios of medians from one interleaved run (benchmarks/bench_mrope.py). Goals: "
        "mrope/one-axis <= 1.1, hf eager/mrope >= 3.",
        "",
        "| shape | dtype | sections | " + " | ".join(cols) + " |",
        "|---|---|---|" + "---:|" * len(cols),
    ]
    for r in rows:
        lines.append(
            f"| {r['shape']} | {r['dtype']} | {r['sections']} | "
            + " | ".join(f"{r[c]:.2f}" for c in cols)
            + " |"
        )
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile of HF's path")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="intra-op threads (default: torch's); 1 keeps a loaded 2-core VM's scheduler out",
    )
    args = parser.parse_args()
    meta = timing.start_run(args.threads or None, quick=args.quick)
    rows = run(args.quick, not args.no_compile)
    name = f"mrope_cpu_{meta['kernel_variant']}"
    timing.write_results(name, {"meta": meta, "rows": rows}, markdown)


if __name__ == "__main__":
    main()
