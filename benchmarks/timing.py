# SPDX-License-Identifier: BSD-3-Clause
"""Interleaved-round timing on the CPU: every figure is a ratio of medians taken in one run.

On a shared machine absolute times drift by tens of percent within a minute, so candidates are
never timed one after another. Each round runs every candidate once, in an order that rotates
from round to round, and each candidate's figure is the median over rounds. A sample is a loop of
`inner` calls, sized so that a sample lasts at least `min_sample_s` (timer resolution and Python
overhead then stay negligible); for calls slower than that, one call per sample.

Garbage collection is off while timing, as in timeit. write_results is the one writer of the
committed results (benchmarks/results/).
"""

import gc
import json
import statistics
import time
from pathlib import Path
from typing import Callable, Dict


def calibrate(fn: Callable[[], object], min_sample_s: float) -> int:
    """Calls per sample so that a sample lasts at least ``min_sample_s``."""
    fn()
    inner = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        elapsed = time.perf_counter() - t0
        if elapsed >= min_sample_s or inner >= 1 << 16:
            return inner
        inner = max(inner * 2, int(inner * min_sample_s / max(elapsed, 1e-9)))


def measure(
    candidates: Dict[str, Callable[[], object]], rounds: int = 21, min_sample_s: float = 2e-4
) -> Dict[str, dict]:
    """Median seconds per call of each candidate, over interleaved rounds.

    Returns {name: {"s": median seconds per call, "spread": (p75 - p25) / median, "inner": calls
    per sample, "rounds": rounds}}.
    """
    names = list(candidates)
    inners = {name: calibrate(candidates[name], min_sample_s) for name in names}
    samples = {name: [] for name in names}
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for r in range(rounds):
            shift = r % len(names)
            for name in names[shift:] + names[:shift]:
                fn, inner = candidates[name], inners[name]
                t0 = time.perf_counter()
                for _ in range(inner):
                    fn()
                samples[name].append((time.perf_counter() - t0) / inner)
    finally:
        if gc_was_enabled:
            gc.enable()
    out = {}
    for name in names:
        values = sorted(samples[name])
        median = statistics.median(values)
        q = statistics.quantiles(values, n=4) if len(values) >= 4 else [values[0], 0, values[-1]]
        out[name] = {
            "s": median,
            "spread": (q[2] - q[0]) / median if median else 0.0,
            "inner": inners[name],
            "rounds": rounds,
        }
    return out


def write_results(directory, name: str, result: dict, markdown: str) -> None:
    """Writes ``<directory>/<name>.json`` (``result``: the figures and the machine they came from)
    and ``<name>.md`` (``markdown``: the tables), the form of every file under
    benchmarks/results/, and says where."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    (directory / f"{name}.md").write_text(markdown.rstrip("\n") + "\n")
    print(f"wrote {directory / name}.json and .md")
