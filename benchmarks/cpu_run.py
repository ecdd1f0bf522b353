# SPDX-License-Identifier: BSD-3-Clause
"""The frame of a CPU benchmark run that writes committed results (bench_kv_cache.py,
bench_serving_fusions.py): the threads, no autograd, the machine and the load before and after
(the machine is shared), and the results as JSON and Markdown in benchmarks/results/."""

import datetime
import json
import os
from pathlib import Path

import timing
import torch
from bench_rope import machine

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def start(threads: int) -> dict:
    """Sets up torch for the run; returns its meta (machine(), the date, the load before)."""
    torch.set_num_threads(threads)
    torch.set_grad_enabled(False)
    if hasattr(torch._dynamo.config, "recompile_limit"):
        torch._dynamo.config.recompile_limit = 64
    meta = machine()
    meta["date"] = datetime.datetime.now().isoformat(timespec="seconds")
    meta["loadavg_before"] = [round(v, 2) for v in os.getloadavg()]
    print(json.dumps({k: meta[k] for k in ("cpu_model", "kernel_variant", "loadavg_before")}))
    return meta


def finish(name: str, meta: dict, rows: list, markdown) -> None:
    """Writes results/<name>.json and .md (markdown(result) renders the table)."""
    meta["loadavg_after"] = [round(v, 2) for v in os.getloadavg()]
    result = {"meta": meta, "rows": rows}
    timing.write_results(RESULTS_DIR, name, result, markdown(result))
