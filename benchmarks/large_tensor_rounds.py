# SPDX-License-Identifier: BSD-3-Clause
"""Large-tensor CPU speed, round by round: is the op at or below ``x.clone()`` in every
round, and what does each call cost in page faults?

A large output is fresh memory: glibc maps every allocation above its mmap threshold (at most
32 MiB) anew and unmaps it when freed, so each call's first write to each page faults. torch-rope
advises its large outputs to be backed by transparent huge pages (one fault per 2 MiB instead of
one per 4 KiB); ``clone`` is not advised. Each round times one call of each candidate (the order
alternates), and counts, around that call, the minor page faults of the process
(``getrusage``) and the kernel's huge-page events (``/proc/vmstat``: huge pages faulted in,
fallbacks to small pages, synchronous compaction stalls), so that a slow round shows its cause.

Cases: the demo's prefill ``apply_qk`` (q (4, 1024, 32, 128), k (4, 1024, 8, 128)) and ``apply``
of (4, 32, 2048, 128), both pair layouts, fp32 and bf16.

    PYTHONPATH=python .venv/bin/python benchmarks/large_tensor_rounds.py [--rounds 10] [--threads 2]

writes benchmarks/results/large_rounds_cpu_<kernel>.json and .md.
"""

import argparse
import gc
import resource
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import timing  # noqa: E402
import torch  # noqa: E402

import torch_rope  # noqa: E402

VMSTAT_KEYS = ("thp_fault_alloc", "thp_fault_fallback", "compact_stall")


def vmstat():
    out = {}
    try:
        for line in open("/proc/vmstat"):
            key, value = line.split()
            if key in VMSTAT_KEYS:
                out[key] = int(value)
    except OSError:
        pass
    return out


def one_call(fn):
    """(seconds, minor faults, vmstat deltas) of one call; the result is freed after timing."""
    before_faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    before_vm = vmstat()
    t0 = time.perf_counter()
    result = fn()
    elapsed = time.perf_counter() - t0
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before_faults
    after_vm = vmstat()
    del result
    return elapsed, faults, {k: after_vm.get(k, 0) - before_vm.get(k, 0) for k in before_vm}


def cases():
    cos, sin = torch_rope.rope_tables(10000.0, 128, 4096)
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).replace("torch.", "")
        q = torch.randn(4, 1024, 32, 128, generator=g).to(dtype)
        k = torch.randn(4, 1024, 8, 128, generator=g).to(dtype)
        pos = torch.arange(1024).view(1024, 1)
        yield (
            f"apply_qk prefill (demo) {name}",
            lambda q=q, k=k, pos=pos: torch_rope.apply_qk(q, k, cos, sin, pos, interleaved=False),
            lambda q=q, k=k: (q.clone(), k.clone()),
            q.nbytes + k.nbytes,
        )
        x = torch.randn(4, 32, 2048, 128, generator=g).to(dtype)
        p = torch.arange(2048)
        for interleaved in (True, False):
            layout = "interleaved" if interleaved else "half split"
            yield (
                f"apply (4,32,2048,128) {layout} {name}",
                lambda x=x, p=p, i=interleaved: torch_rope.apply(x, cos, sin, p, interleaved=i),
                lambda x=x: x.clone(),
                x.nbytes,
            )


def run_case(name, ours, clone, nbytes, rounds):
    for fn in (ours, clone):  # warm: first-call costs (dispatch caches, the tables' pages)
        fn()
    rows = []
    gc.disable()
    try:
        for r in range(rounds):
            order = [("ours", ours), ("clone", clone)]
            if r % 2:
                order.reverse()
            row = {}
            for label, fn in order:
                seconds, faults, vm = one_call(fn)
                row[label] = {"ms": seconds * 1e3, "minor_faults": faults, "vmstat": vm}
            row["ratio"] = row["ours"]["ms"] / row["clone"]["ms"]
            rows.append(row)
    finally:
        gc.enable()
    ratios = [r["ratio"] for r in rows]
    summary = {
        "case": name,
        "mib": nbytes / 2**20,
        "rounds": rows,
        "ratio": {"min": min(ratios), "median": statistics.median(ratios), "max": max(ratios)},
        "rounds_at_or_below_clone": sum(x <= 1.0 for x in ratios),
        "ours_ms": spread([r["ours"]["ms"] for r in rows]),
        "clone_ms": spread([r["clone"]["ms"] for r in rows]),
        "faults_per_call": {
            "ours": statistics.median(r["ours"]["minor_faults"] for r in rows),
            "clone": statistics.median(r["clone"]["minor_faults"] for r in rows),
        },
    }
    print(
        f"  {name:42s} ours/clone min {summary['ratio']['min']:.2f} median "
        f"{summary['ratio']['median']:.2f} max {summary['ratio']['max']:.2f}  "
        f"({summary['rounds_at_or_below_clone']}/{rounds} rounds <= clone; faults per call "
        f"ours {summary['faults_per_call']['ours']:.0f}, clone "
        f"{summary['faults_per_call']['clone']:.0f})",
        flush=True,
    )
    return summary


def spread(values):
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def markdown(result):
    m = result["meta"]
    out = [
        "# Large tensors on the CPU, round by round",
        "",
        f"CPU: {m['cpu_model']} ({m['cpus']} CPUs), kernel **{m['kernel_variant']}**"
        f"{' (simulated)' if m.get('simulated') else ''}, {m['threads']} threads, torch "
        f"{m['torch']}, {m['date']}. Transparent huge pages: "
        f"`{m.get('transparent_hugepage', 'unknown')}`, defrag `{m.get('thp_defrag', 'unknown')}`. "
        f"Load average {m['loadavg_before']} before, "
        f"{m['loadavg_after']} after. {m['note']}",
        "",
        "One call of each per round, order alternating; ratio = ours / clone of the same round. "
        "Faults: minor page faults of the process during the call (median over rounds).",
        "",
        "| case | MiB | ours/clone min | median | max | rounds <= clone | ours ms (min/med/max) "
        "| clone ms (min/med/max) | faults ours / clone | huge pages faulted, fallbacks, "
        "compaction stalls (ours, all rounds) |",
        "|---|---:|---:|---:|---:|---:|---|---|---|---|",
    ]
    for c in result["cases"]:
        vm = {k: sum(r["ours"]["vmstat"].get(k, 0) for r in c["rounds"]) for k in VMSTAT_KEYS}
        out.append(
            f"| {c['case']} | {c['mib']:.0f} | {c['ratio']['min']:.2f} | "
            f"{c['ratio']['median']:.2f} | {c['ratio']['max']:.2f} | "
            f"{c['rounds_at_or_below_clone']}/{len(c['rounds'])} | "
            f"{c['ours_ms']['min']:.1f} / {c['ours_ms']['median']:.1f} / "
            f"{c['ours_ms']['max']:.1f} | "
            f"{c['clone_ms']['min']:.1f} / {c['clone_ms']['median']:.1f} / "
            f"{c['clone_ms']['max']:.1f} | {c['faults_per_call']['ours']:.0f} / "
            f"{c['faults_per_call']['clone']:.0f} | {vm['thp_fault_alloc']}, "
            f"{vm['thp_fault_fallback']}, {vm['compact_stall']} |"
        )
    return "\n".join(out) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--note", default="", help="when it ran (e.g. right after test.sh)")
    parser.add_argument("--output", default=None, help="results name")
    args = parser.parse_args()
    meta = timing.start_run(args.threads, grad=False, note=args.note)
    result = {"meta": meta, "cases": [run_case(*c, args.rounds) for c in cases()]}
    name = args.output or f"large_rounds_cpu_{meta['kernel_variant'].lower()}"
    timing.write_results(name, result, markdown)


if __name__ == "__main__":
    main()
