# SPDX-License-Identifier: BSD-3-Clause
"""CPU benchmark of torch-rope: ratios to x.clone(), the alternatives users write, torch.compile.

Every figure is a ratio of medians measured in one run with interleaved rounds (timing.py):
``x.clone()`` of the same tensors for the out-of-place ops, ``x.mul_(1.0)`` for the in-place
``apply_``. Three parts:

  targets  the speed targets (decode, in cache, prefill, apply_, out=), each with its
           target ratio;
  sweep    time / clone against tensor size, prefill and decode, fp32 and bf16: torch_rope (both
           layouts), HF apply_rotary_pos_emb with gathered cos/sin, Meta's complex form,
           torchtune's module, the plain-PyTorch reference, each eager and compiled, and
           torch_rope's module call (decode);
  entry    the per-call cost of each Python entry (entry_cost.py).

The kernel copy is the widest the CPU and ATEN_CPU_CAPABILITY allow, so

    PYTHONPATH=python .venv/bin/python benchmarks/bench_rope.py                       # AVX512
    ATEN_CPU_CAPABILITY=avx2 PYTHONPATH=python .venv/bin/python benchmarks/bench_rope.py
    PYTHONPATH=python .venv/bin/python benchmarks/plot_rope.py                        # the plot

write benchmarks/results/cpu_<kernel>.json and .md (the compiled alternatives then use the same
instruction set). ``--device cuda`` runs the GPU benchmark (bench_gpu.py) instead.
"""

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

if "--device" in sys.argv and "cuda" in sys.argv:  # the GPU benchmark keeps its own CLI
    import bench_gpu  # noqa: E402

    bench_gpu.main()
    sys.exit(0)

import alternatives  # noqa: E402
import entry_cost  # noqa: E402
import timing  # noqa: E402
import torch  # noqa: E402

import torch_rope  # noqa: E402
from torch_rope import eager  # noqa: E402  (the plain-PyTorch math)

MAX_SEQ_LEN = 4096
DTYPES = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp64": torch.float64,
}


def rounds_for(nbytes, quick):
    """Fewer rounds for big tensors (each call takes milliseconds there)."""
    base = 7 if nbytes >= 32 << 20 else 15 if nbytes >= 4 << 20 else 31
    return max(5, base // 2) if quick else base


def problem(batch, heads, seq, dtype, k_heads=0, decode=False, seed=0):
    """(B, H, S, D=128) tensors; positions per sequence: a random cache offset when decoding,
    arange(S) otherwise."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, seq, 128, generator=gen).to(dtype)
    k = torch.randn(batch, k_heads, seq, 128, generator=gen).to(dtype) if k_heads else None
    if decode:
        ids = torch.randint(0, MAX_SEQ_LEN - 1, (batch, seq), generator=gen)
    else:
        ids = torch.arange(seq).expand(batch, seq).contiguous()
    cos, sin = torch_rope.rope_tables(10000.0, 128, MAX_SEQ_LEN)
    return alternatives.Problem(q, k, ids, cos, sin)


def ratios(res, base):
    return {name: r["s"] / res[base]["s"] for name, r in res.items()}


# ---- targets ---------------------------------------------------------------------------------


def target_rows(quick, compile_reference):
    rows = []

    def add(measure, shape, dtype, res, num, den, target, note=""):
        rows.append(
            {
                "measure": measure,
                "shape": shape,
                "dtype": dtype,
                "target": target,
                "ratio": res[num]["s"] / res[den]["s"],
                "numerator": num,
                "denominator": den,
                "us": {k: v["s"] * 1e6 for k, v in res.items()},
                "spread": {k: v["spread"] for k, v in res.items()},
                "note": note,
            }
        )
        r = rows[-1]
        flag = "ok" if r["ratio"] <= target else "MISSED"
        print(
            f"  {measure:44s} {shape:22s} {dtype:5s} {num} / {den} = {r['ratio']:.2f} "
            f"(target <= {target}) {flag}",
            flush=True,
        )

    with torch.inference_mode():
        # Decode: one token per sequence at its own cache offset, (B, 32, 1, 128).
        for batch, dtypes in [(1, ("fp32", "bf16")), (64, ("bf16", "fp32"))]:
            for dname in dtypes:
                p = problem(batch, 32, 1, DTYPES[dname], decode=True)
                module = torch_rope.RotaryPositionalEmbedding(10000.0, 128, MAX_SEQ_LEN)
                q, cos, sin, pos = p.q, p.cos, p.sin, p.positions
                fns = {
                    "clone": lambda: q.clone(),
                    "apply": lambda: torch_rope.apply(q, cos, sin, pos),
                    "module": lambda: module(q, pos),
                }
                res = timing.measure(fns, rounds_for(q.nbytes, quick))
                shape = f"({batch},32,1,128)"
                add(
                    f"decode B={batch}, apply / clone",
                    shape,
                    dname,
                    res,
                    "apply",
                    "clone",
                    1.5 if batch == 1 else 1.7,
                )
                if batch == 1:
                    add(
                        "decode B=1, module call / clone", shape, dname, res, "module", "clone", 2.0
                    )
        # In cache and prefill, (B, 32, S, 128) with positions arange(S), both layouts.
        for measure, shape, dtypes, target in [
            ("in cache, apply / clone", (1, 32, 64, 128), ("fp32", "bf16"), None),
            ("prefill, apply / clone", (4, 32, 2048, 128), ("bf16", "fp32"), 1.05),
        ]:
            for dname in dtypes:
                x = torch.randn(*shape).to(DTYPES[dname])
                cos, sin = torch_rope.rope_tables(10000.0, 128, MAX_SEQ_LEN)
                pos = torch.arange(shape[2])
                fns = {
                    "clone": lambda: x.clone(),
                    "interleaved": lambda: torch_rope.apply(x, cos, sin, pos),
                    "half-split": lambda: torch_rope.apply(x, cos, sin, pos, interleaved=False),
                }
                res = timing.measure(fns, rounds_for(x.nbytes, quick))
                t = target if target else (1.5 if dname == "fp32" else 2.0)
                for layout in ("interleaved", "half-split"):
                    add(
                        f"{measure} ({layout})",
                        str(shape).replace(" ", ""),
                        dname,
                        res,
                        layout,
                        "clone",
                        t,
                    )
        # Prefill q+k (GQA), fp32: against clone and against the compiled reference.
        p = problem(4, 32, 1024, torch.float32, k_heads=8)
        q, k, cos, sin, pos = p.q, p.k, p.cos, p.sin, p.positions
        fns = {
            "clone": lambda: (q.clone(), k.clone()),
            "interleaved": lambda: torch_rope.apply_qk(q, k, cos, sin, pos),
            "half-split": lambda: torch_rope.apply_qk(q, k, cos, sin, pos, interleaved=False),
        }
        if compile_reference:
            ref_i = torch.compile(eager.apply_qk)
            ref_h = torch.compile(lambda *a: eager.apply_qk(*a, interleaved=False))
            fns["compiled ref interleaved"] = lambda: ref_i(q, k, cos, sin, pos)
            fns["compiled ref half-split"] = lambda: ref_h(q, k, cos, sin, pos)
        res = timing.measure(fns, rounds_for(q.nbytes + k.nbytes, quick))
        shape = "(4,32,1024,128)+(4,8,1024,128)"
        for layout in ("interleaved", "half-split"):
            add(
                f"prefill q+k, apply_qk / clone ({layout})",
                shape,
                "fp32",
                res,
                layout,
                "clone",
                1.05,
            )
            if compile_reference:
                add(
                    f"prefill q+k, apply_qk / compiled reference ({layout})",
                    shape,
                    "fp32",
                    res,
                    layout,
                    f"compiled ref {layout}",
                    0.9,
                )
        # In place against mul_(1.0), every dtype and layout.
        for shape in [(1, 32, 64, 128), (4, 32, 2048, 128)]:
            for dname in ("fp32", "bf16", "fp16", "fp64"):
                if dname == "fp64" and shape[2] > 64 and quick:
                    continue
                x = torch.randn(*shape).to(DTYPES[dname])
                cos, sin = torch_rope.rope_tables(10000.0, 128, MAX_SEQ_LEN)
                pos = torch.arange(shape[2])
                fns = {
                    "mul_(1.0)": lambda: x.mul_(1.0),
                    "interleaved": lambda: torch_rope.apply_(x, cos, sin, pos),
                    "half-split": lambda: torch_rope.apply_(x, cos, sin, pos, interleaved=False),
                }
                res = timing.measure(fns, rounds_for(x.nbytes, quick))
                for layout in ("interleaved", "half-split"):
                    add(
                        f"apply_ / mul_(1.0) ({layout})",
                        str(shape).replace(" ", ""),
                        dname,
                        res,
                        layout,
                        "mul_(1.0)",
                        1.3,
                    )
        # out= into an existing buffer (a KV-cache slot, say).
        x = torch.randn(4, 32, 2048, 128)
        cos, sin = torch_rope.rope_tables(10000.0, 128, MAX_SEQ_LEN)
        pos = torch.arange(2048)
        buf = torch.empty_like(x)
        fns = {
            "clone": lambda: x.clone(),
            "out=": lambda: torch_rope.apply(x, cos, sin, pos, out=buf),
        }
        res = timing.measure(fns, rounds_for(x.nbytes, quick))
        add("prefill with out= / clone", "(4,32,2048,128)", "fp32", res, "out=", "clone", 0.5)
    return rows


# ---- sweep (the plot) ------------------------------------------------------------------------


def sweep_rows(quick, compile_alternatives):
    rows = []
    points = [("decode", dict(batch=b, heads=32, seq=1, decode=True)) for b in (1, 8, 64)]
    if not quick:
        points.insert(1, ("decode", dict(batch=4, heads=32, seq=1, decode=True)))
        points.insert(3, ("decode", dict(batch=16, heads=32, seq=1, decode=True)))
    points += [("prefill", dict(batch=1, heads=32, seq=s)) for s in (64, 512, 2048)]
    points += [("prefill", dict(batch=4, heads=32, seq=2048))]
    with torch.inference_mode():
        for dname in ("fp32", "bf16"):
            for kind, kw in points:
                for pair in (False, True) if kind == "decode" else (False,):
                    p = problem(dtype=DTYPES[dname], k_heads=8 if pair else 0, **kw)
                    fns = alternatives.build(p, compile_alternatives)
                    wrong = alternatives.check_agreement(p, fns)
                    for name, err in wrong.items():
                        print(f"  WRONG RESULT, not timed: {name} (max error {err:.3g})")
                        del fns[name]
                    if kind == "decode" and not pair:
                        module = torch_rope.RotaryPositionalEmbedding(10000.0, 128, MAX_SEQ_LEN)
                        q, pos = p.q, p.positions
                        fns["torch_rope module"] = lambda: module(q, pos)
                    nbytes = p.q.nbytes + (p.k.nbytes if pair else 0)
                    res = timing.measure(fns, rounds_for(nbytes, quick))
                    shape = f"({kw['batch']},32,{kw['seq']},128)" + ("+k(8 heads)" if pair else "")
                    rows.append(
                        {
                            "kind": kind,
                            "shape": shape,
                            "dtype": dname,
                            "pair": pair,
                            "bytes": nbytes,
                            "us": {k: v["s"] * 1e6 for k, v in res.items()},
                            "over_clone": ratios(res, "clone"),
                            "spread": {k: v["spread"] for k, v in res.items()},
                            "wrong_results": wrong,
                        }
                    )
                    r = rows[-1]["over_clone"]
                    print(
                        f"  {kind:7s} {shape:26s} {dname}: "
                        + "  ".join(f"{k}={v:.2f}" for k, v in r.items() if k != "clone"),
                        flush=True,
                    )
    return rows


# ---- report ----------------------------------------------------------------------------------


def markdown(result):
    m = result["meta"]
    out = [
        f"CPU: {m['cpu_model']} ({m['cpus']} CPUs), kernel **{m['kernel_variant']}** "
        f"(torch capability {m['torch_cpu_capability']}), {m['threads']} threads, torch "
        f"{m['torch']}, {m['date']}. Load average {m['loadavg_before']} before, "
        f"{m['loadavg_after']} after; spread = interquartile range / median per candidate.",
        "",
    ]
    if timing.simulated_note(m):
        out += [timing.simulated_note(m), ""]
    if result.get("targets"):
        out += [
            "## Targets",
            "",
            "| measure | shape | dtype | ratio | target | |",
            "|---|---|---|---:|---:|---|",
        ]
    for r in result.get("targets", []):
        if r["ratio"] is None:
            out.append(
                f"| {r['measure']} | {r['shape']} | {r['dtype']} | — | {r['target']} | "
                f"{r['note']} |"
            )
            continue
        ok = "ok" if r["ratio"] <= r["target"] else "**missed**"
        out.append(
            f"| {r['measure']} | {r['shape']} | {r['dtype']} | {r['ratio']:.2f} | "
            f"{r['target']} | {ok} |"
        )
    if result.get("sweep"):
        names = [n for n in result["sweep"][0]["over_clone"] if n != "clone"]
        extra = sorted(
            {n for r in result["sweep"] for n in r["over_clone"]} - set(names) - {"clone"}
        )
        names += extra
        out += [
            "",
            "## Time / clone by implementation",
            "",
            "| case | shape | dtype | clone (us) | " + " | ".join(names) + " |",
            "|---|---|---|---:|" + "---:|" * len(names),
        ]
        for r in result["sweep"]:
            cells = [
                f"{r['over_clone'][n]:.2f}"
                if n in r["over_clone"]
                else ("wrong result" if n in r.get("wrong_results", {}) else "")
                for n in names
            ]
            out.append(
                f"| {r['kind']} | {r['shape']} | {r['dtype']} | {r['us']['clone']:.1f} | "
                + " | ".join(cells)
                + " |"
            )
    if result.get("entry"):
        out += ["", "## Entry cost (float32, us per call; ratio to clone)", ""]
        for shape, res in result["entry"].items():
            clone = res["clone"]["s"]
            out.append(
                f"- x = {shape}: "
                + ", ".join(
                    f"{k} {v['s'] * 1e6:.2f} ({v['s'] / clone:.2f}x)" for k, v in res.items()
                )
            )
    return "\n".join(out) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="fewer rounds and sweep points")
    parser.add_argument(
        "--no-compile",
        action="store_true",
        help="skip the torch.compile baselines (compiling takes minutes)",
    )
    parser.add_argument(
        "--only",
        choices=("targets", "sweep", "entry"),
        action="append",
        help="run only these parts (repeatable)",
    )
    parser.add_argument(
        "--output", default=None, help="results name (default: cpu_<kernel variant>)"
    )
    args = parser.parse_args()
    parts = set(args.only or ("targets", "sweep", "entry"))
    meta = timing.start_run(
        args.threads,
        recompile_limit=64,
        alternatives={"HF": alternatives.HF_SOURCE, "torchtune": alternatives.TORCHTUNE_SOURCE},
    )
    result = {"meta": meta}
    if "targets" in parts:
        print("targets:")
        result["targets"] = target_rows(args.quick, not args.no_compile)
    if "sweep" in parts:
        print("sweep:")
        result["sweep"] = sweep_rows(args.quick, not args.no_compile)
    if "entry" in parts:
        result["entry"] = {shape: res for shape, res in entry_cost.measure_entry().items()}
    name = args.output or f"cpu_{meta['kernel_variant'].lower()}"
    print()
    timing.write_results(name, result, markdown)


if __name__ == "__main__":
    main()
