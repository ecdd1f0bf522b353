# SPDX-License-Identifier: BSD-3-Clause
"""Interleaved-round timing on the CPU: every figure is a ratio of medians taken in one run.

On a shared machine absolute times drift by tens of percent within a minute, so candidates are
never timed one after another. Each round runs every candidate once, in an order that rotates
from round to round, and each candidate's figure is the median over rounds. A sample is a loop of
`inner` calls, sized so that a sample lasts at least `min_sample_s` (timer resolution and Python
overhead then stay negligible); for calls slower than that, one call per sample.

Garbage collection is off while timing, as in timeit.

A run whose figures are committed (benchmarks/results/) begins with start_run, which records the
machine (machine(): the CPU model from lscpu, its ISA flags, the kernel copy, torch's capability,
the threads, the versions, the transparent-huge-page setting) with the date and the load average
before, and ends with write_results, the one writer of those files: the load average after, then
``<name>.json`` and ``<name>.md``. So every results file says the same things about where it ran.
BENCHMARK_RESULTS_DIR sends the files elsewhere (a check of a script that must not overwrite the
committed figures).
"""

import datetime
import gc
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path
from typing import Callable, Dict, Optional, Union


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


# ---- the machine and the results files ------------------------------------------------------

RESULTS_DIR = Path(__file__).resolve().parent / "results"

# The /proc/cpuinfo flags of each kernel copy (CMakeLists.txt), widest first.
KERNEL_FLAGS = [
    ("AVX512_BF16", {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq",
                     "avx512_bf16"}),
    ("AVX512", {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq"}),
    ("AVX2", {"avx2", "fma", "f16c"}),
]  # fmt: skip
ISA_FLAGS = set().union(*(needs for _, needs in KERNEL_FLAGS))
LSCPU_KEYS = ("Model name", "Vendor ID", "CPU family", "Model", "Stepping")
LSCPU_ISA = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile")


def widest_kernel(flags) -> str:
    """The widest kernel copy a CPU with these flags runs when nothing caps it."""
    return next((name for name, needs in KERNEL_FLAGS if needs <= flags), "DEFAULT")


def simulated_note(meta: dict) -> str:
    """One line for a report whose kernel copy is narrower than the CPU it ran on (reports from
    before the "simulated" field are judged by their recorded flags)."""
    widest = meta.get("cpu_widest_kernel") or widest_kernel(set(meta.get("isa_flags", [])))
    if meta["kernel_variant"].upper() == widest.upper():
        return ""
    return (
        f"**Simulated**: the {meta['kernel_variant']} kernel copy run on a CPU whose widest copy "
        f"is {widest}; not a measurement of a real {meta['kernel_variant']}-only machine."
    )


def lscpu_facts() -> dict:
    """lscpu's model name, vendor, family/model numbers and the ISA extensions that matter here."""
    facts = {}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return facts
    for line in out.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in LSCPU_KEYS:
            facts[key.strip()] = value.strip()
        elif key.strip() == "Flags":
            facts["isa"] = [f for f in value.split() if f in LSCPU_ISA]
    return facts


def _read(path: str, default: str = "unknown") -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return default


def _version(distribution: str):
    """The installed version, read from the package metadata: importing transformers or diffusers
    only to ask would cost seconds and load them into every benchmark."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine() -> dict:
    """Where a run ran: the CPU (lscpu's model name, else /proc/cpuinfo's), the kernel copy
    torch_rope picked and the widest this CPU runs, torch's capability, the threads, the versions,
    the transparent-huge-page setting, and the GPU when there is one."""
    import torch

    import torch_rope

    model, flags = "", set()
    for line in _read("/proc/cpuinfo", "").splitlines():
        if line.startswith("model name") and not model:
            model = line.split(":", 1)[1].strip()
        elif line.startswith("flags") and not flags:
            flags = set(line.split(":", 1)[1].split())
    lscpu = lscpu_facts()
    variant = torch_rope._C.cpu_kernel_variant()
    widest = widest_kernel(flags)
    meta = {
        "cpu_model": lscpu.get("Model name") or model or platform.processor() or "unknown",
        "cpus": os.cpu_count(),
        "lscpu": lscpu,
        # The widest kernel copy this CPU can run; a narrower copy timed here (e.g. AVX2 under
        # ATEN_CPU_CAPABILITY=avx2 on an AVX-512 CPU) is a simulation of a machine that lacks
        # the wider instructions, not a measurement of one: its caches, clocks and ports differ.
        "cpu_widest_kernel": widest,
        "simulated": variant.upper() != widest.upper(),
        "isa_flags": sorted(flags & ISA_FLAGS),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "ATEN_CPU_CAPABILITY": os.environ.get("ATEN_CPU_CAPABILITY"),
        "kernel_variant": variant,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "torch_rope": torch_rope.__version__,
        "python": platform.python_version(),
        "transparent_hugepage": _read("/sys/kernel/mm/transparent_hugepage/enabled"),
        "thp_defrag": _read("/sys/kernel/mm/transparent_hugepage/defrag"),
        "THP_MEM_ALLOC_ENABLE": os.environ.get("THP_MEM_ALLOC_ENABLE"),
        "versions": {m: _version(m) for m in ("transformers", "torchtune", "diffusers")},
    }
    if torch.cuda.is_available():
        meta["gpu"] = {
            "name": torch.cuda.get_device_name(),
            "capability": ".".join(map(str, torch.cuda.get_device_capability())),
            "cuda": torch.version.cuda,
        }
    return meta


def _loadavg() -> list:
    return [round(v, 2) for v in os.getloadavg()]


def start_run(
    threads: Optional[int] = None,
    *,
    grad: Optional[bool] = None,
    recompile_limit: Optional[int] = None,
    **extra,
) -> dict:
    """Begins a run whose results are written by write_results; returns its meta: machine(), the
    date, the load average before (the machine is shared), then ``extra``, the script's own fields.

    threads: torch's intra-op threads (None leaves them); grad: torch.set_grad_enabled (None leaves
    it); recompile_limit: dynamo's, for scripts that compile one function at many shapes.
    """
    import torch

    if threads is not None:
        torch.set_num_threads(threads)
    if grad is not None:
        torch.set_grad_enabled(grad)
    if recompile_limit is not None:
        if hasattr(torch._dynamo.config, "recompile_limit"):
            torch._dynamo.config.recompile_limit = recompile_limit
        else:  # older torch
            torch._dynamo.config.cache_size_limit = recompile_limit
    meta = machine()
    meta["date"] = datetime.datetime.now().isoformat(timespec="seconds")
    meta["loadavg_before"] = _loadavg()
    meta.update(extra)
    print(
        json.dumps(
            {k: meta[k] for k in ("cpu_model", "kernel_variant", "threads", "loadavg_before")}
        )
    )
    return meta


def results_dir() -> Path:
    """benchmarks/results/, or BENCHMARK_RESULTS_DIR when set."""
    return Path(os.environ.get("BENCHMARK_RESULTS_DIR") or RESULTS_DIR)


def write_results(
    name: str,
    result: dict,
    markdown: Union[str, Callable[[dict], str]],
    directory: Union[str, Path, None] = None,
) -> Path:
    """Writes ``<directory>/<name>.json`` (``result``: its ``meta`` from start_run, completed with
    the load average after, and the figures) and ``<name>.md`` (the tables: ``markdown``, or
    ``markdown(result)`` rendered once the meta is complete), the form of every file under
    benchmarks/results/; says where and returns the .json's path. directory: results_dir()."""
    meta = result.get("meta")
    if not isinstance(meta, dict) or "date" not in meta:
        raise ValueError("write_results: result['meta'] must come from timing.start_run()")
    meta["loadavg_after"] = _loadavg()
    text = markdown(result) if callable(markdown) else markdown
    directory = Path(directory) if directory is not None else results_dir()
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    (directory / f"{name}.md").write_text(text.rstrip("\n") + "\n")
    print(f"wrote {directory / name}.json and .md")
    return directory / f"{name}.json"
