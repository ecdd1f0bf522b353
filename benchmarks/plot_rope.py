# SPDX-License-Identifier: BSD-3-Clause
"""Plot time / clone against tensor size from bench_rope.py's results (one PNG per results file).

    PYTHONPATH=python .venv/bin/python benchmarks/plot_rope.py [results/cpu_avx2.json ...]

Without arguments, every bench_rope.py results file in benchmarks/results/ (cpu_<kernel>.json;
BENCHMARK_RESULTS_DIR, as in timing.py, names another folder). Panels: prefill and decode (q
only), for float32 and bfloat16; one line per implementation, eager solid, torch.compile dashed.
"""

import json
import sys
from pathlib import Path

import matplotlib
import timing

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STYLE = {  # implementation -> colour; "compiled" variants share it, dashed
    "torch_rope": "black",
    "torch_rope half-split": "dimgray",
    "torch_rope module": "silver",
    "HF": "tab:orange",
    "Meta complex": "tab:blue",
    "torchtune": "tab:green",
    "reference": "tab:red",
}


def plot(path: Path) -> Path:
    result = json.loads(path.read_text())
    meta, rows = result["meta"], [r for r in result.get("sweep", []) if not r["pair"]]
    if not rows:
        raise SystemExit(f"{path}: no sweep rows (run bench_rope.py without --only)")
    dtypes = sorted({r["dtype"] for r in rows}, key=["fp32", "bf16"].index)
    fig, axes = plt.subplots(len(dtypes), 2, figsize=(12, 4.2 * len(dtypes)), squeeze=False)
    for i, dtype in enumerate(dtypes):
        for j, kind in enumerate(("prefill", "decode")):
            ax = axes[i][j]
            points = sorted(
                (r for r in rows if r["dtype"] == dtype and r["kind"] == kind),
                key=lambda r: r["bytes"],
            )
            names = list(dict.fromkeys(n for r in points for n in r["over_clone"] if n != "clone"))
            for name in names:
                base = name.replace(" compiled", "")
                # A point the benchmark did not time (a wrong result) is left out of its line.
                timed = [r for r in points if name in r["over_clone"]]
                ax.plot(
                    [r["bytes"] / 2**20 for r in timed],
                    [r["over_clone"][name] for r in timed],
                    marker="o",
                    ms=3,
                    color=STYLE.get(base, "tab:purple"),
                    linestyle="--" if name.endswith("compiled") else "-",
                    linewidth=2.2 if base == "torch_rope" else 1.2,
                    label=name,
                )
            ax.axhline(1.0, color="gray", linewidth=0.8, linestyle=":")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("tensor size (MiB)")
            ax.set_ylabel("time / x.clone()")
            ax.set_title(
                f"{kind}, {dtype}: "
                + ", ".join(r["shape"] for r in points[:1])
                + (" ... " + points[-1]["shape"] if len(points) > 1 else ""),
                fontsize=9,
            )
            ax.grid(True, which="both", alpha=0.3)
            if i == 0:
                ax.legend(fontsize=7, ncol=2)
    fig.suptitle(
        f"torch-rope on {meta['cpu_model']}, kernel {meta['kernel_variant']}, "
        f"{meta['threads']} threads, torch {meta['torch']} (lower is better; 1 = clone)",
        fontsize=10,
    )
    fig.tight_layout()
    out = path.with_suffix(".png")
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main():
    # cpu_shapes_*.json (bench_shapes.py) shares the prefix and has no sweep to plot.
    paths = [Path(p) for p in sys.argv[1:]] or sorted(
        p for p in timing.results_dir().glob("cpu_*.json") if "sweep" in json.loads(p.read_text())
    )
    for path in paths:
        print("wrote", plot(path))


if __name__ == "__main__":
    main()
