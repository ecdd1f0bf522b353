# SPDX-License-Identifier: BSD-3-Clause
"""GPU benchmark of torch-rope against x.clone(), eager, torch.compile and peers (CUDA events).

Every time is reported as a ratio to ``x.clone()`` of the same tensors in the same run. Writes
benchmarks/results/<gpu>.json and .md. scripts/gpu_check.sh runs it; the CPU benchmark is
bench_rope.py.

Cases on CUDA: prefill (B, S, H, D) = (4, 2048, 32, 128) in both pair layouts, forward and
forward + backward; a 32k-token prefill; apply_qk with GQA (32 query heads, 8 key heads), where
Liger-Kernel's Triton RoPE (``liger_kernel.ops.rope``, half layout, in place) is timed too when
it is installed; decode per call for B = 1 and 64, one token each, apply and apply_qk.
torch.compile of the eager formula is timed on the rows whose ``compile`` is set (compiling every
row would take minutes of a short GPU lease).
"""

import argparse
import platform
import statistics
import time
from dataclasses import asdict, dataclass, replace

import timing
import torch

import torch_rope
import torch_rope.eager  # the plain-PyTorch math


def _version(module: str):
    try:
        return __import__(module).__version__
    except Exception:
        try:
            from importlib.metadata import version

            return version(module.replace("_", "-"))
        except Exception:
            return None


@dataclass
class Case:
    name: str
    op: str  # "apply" or "apply_qk"
    batch: int
    seq: int
    q_heads: int
    k_heads: int  # only for apply_qk
    head_dim: int
    decode: bool = False  # one new token per sequence at a different offset per sequence
    interleaved: bool = False  # False: half split (HF rotate_half); True: adjacent pairs
    backward: bool = True  # also time forward + backward
    compile: bool = True  # also time torch.compile of the eager formula


def cases_for(device: str):
    cases = [
        Case("prefill", "apply", 4, 2048, 32, 0, 128),
        Case("prefill", "apply", 4, 2048, 32, 0, 128, interleaved=True),
        Case("prefill GQA q/k", "apply_qk", 4, 2048, 32, 8, 128),
        Case("decode B=1", "apply", 1, 1, 32, 0, 128, True, backward=False, compile=False),
        Case("decode B=64", "apply", 64, 1, 32, 0, 128, True, backward=False, compile=False),
        Case("decode q/k B=64", "apply_qk", 64, 1, 32, 8, 128, True, backward=False),
    ]
    if device == "cuda":
        cases.insert(
            2,
            Case(
                "long-context prefill", "apply", 1, 32768, 32, 0, 128, backward=False, compile=False
            ),
        )
    return cases


def liger_rope():
    """Liger-Kernel's RoPE forward (in place on q and k), or None where it is not installed."""
    try:
        from liger_kernel.ops.rope import LigerRopeFunction
    except Exception:  # pragma: no cover - depends on the environment
        return None
    return LigerRopeFunction


def make_inputs(case: Case, dtype, device, max_seq_len: int, requires_grad=False):
    """(B, S, H, D) tensors, the layout of a fused projection's output, and their positions."""
    gen = torch.Generator(device="cpu").manual_seed(0)

    def rand(heads):
        t = torch.randn(case.batch, case.seq, heads, case.head_dim, generator=gen, dtype=dtype)
        return t.to(device).requires_grad_(requires_grad)

    q = rand(case.q_heads)
    k = rand(case.k_heads) if case.op == "apply_qk" else None
    if case.decode:  # (B, 1, 1): each sequence at its own cache offset
        start = torch.randint(0, max_seq_len - 1, (case.batch, 1, 1), generator=gen)
        positions = start.to(device)
    else:  # (S, 1): shared by every sequence, broadcast over heads
        positions = torch.arange(case.seq, device=device).view(case.seq, 1)
    return q, k, positions


class Timer:
    """Median wall time of a callable; CUDA events on the GPU."""

    def __init__(self, device: str, min_time_s: float, warmup: int = 3):
        self.device = device
        self.min_time_s = min_time_s
        self.warmup = warmup

    def __call__(self, fn) -> float:
        for _ in range(self.warmup):
            fn()
        samples = []
        deadline = time.perf_counter() + self.min_time_s
        while len(samples) < 5 or (time.perf_counter() < deadline and len(samples) < 200):
            if self.device == "cuda":
                start, end = torch.cuda.Event(True), torch.cuda.Event(True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) * 1e-3)
            else:
                t0 = time.perf_counter()
                fn()
                samples.append(time.perf_counter() - t0)
        return statistics.median(samples)


def bench_case(
    case: Case, dtype, device: str, timer: Timer, compile_reference: bool, backward: bool
):
    max_seq_len = max(case.seq, 4096)
    cos, sin = torch_rope.rope_tables(10000.0, case.head_dim, max_seq_len, device=device)
    q, k, positions = make_inputs(case, dtype, device, max_seq_len, requires_grad=backward)
    tensors = [q] if k is None else [q, k]

    layout = {"interleaved": case.interleaved}
    if case.op == "apply":

        def ours(t=tensors):
            return torch_rope.apply(t[0], cos, sin, positions, **layout)

        def eager(t=tensors):
            return torch_rope.eager.apply(t[0], cos, sin, positions, **layout)
    else:

        def ours(t=tensors):
            return torch_rope.apply_qk(t[0], t[1], cos, sin, positions, **layout)

        def eager(t=tensors):
            return torch_rope.eager.apply_qk(t[0], t[1], cos, sin, positions, **layout)

    peers = {}
    liger = liger_rope()
    if (
        liger is not None
        and device == "cuda"
        and case.op == "apply_qk"
        and not case.interleaved
        and not case.decode
    ):
        # Liger takes HF's layout: (B, H, S, D) views (here of (B, S, H, D) memory, which it
        # reads without a copy) and full-width (S, D) cos/sin in the input's dtype, gathered
        # once as a model with cached tables does.
        rows = positions.reshape(-1)
        cos_full = torch.cat([cos[rows], cos[rows]], dim=-1).to(dtype).unsqueeze(0)
        sin_full = torch.cat([sin[rows], sin[rows]], dim=-1).to(dtype).unsqueeze(0)

        def liger_call(t=tensors):
            return liger.apply(t[0].transpose(1, 2), t[1].transpose(1, 2), cos_full, sin_full)

        peers["liger"] = liger_call

    def clone():
        return [t.clone() for t in tensors]

    compiled_reference = (
        torch.compile(eager, fullgraph=True) if compile_reference and case.compile else None
    )
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def timed(fn):
        # Forward only, or forward + backward of the output's sum (backward of clone is a copy).
        if not backward:
            with torch.no_grad():
                return timer(fn)
        grads = [torch.randn_like(t) for t in tensors]

        def fwd_bwd():
            outs = fn()
            outs = outs if isinstance(outs, (list, tuple)) else [outs]
            torch.autograd.backward(list(outs), grads)

        return timer(fwd_bwd)

    results = {"clone": timed(clone), "ours": timed(ours), "eager": timed(eager)}
    if compiled_reference is not None:
        timed(compiled_reference)  # compile outside the timing
        results["compiled"] = timed(compiled_reference)
    for name, fn in peers.items():
        if backward:
            continue  # the peers' rows are forward only (Liger's backward is its own autograd)
        results[name] = timed(fn)
    sync()

    elements = sum(t.numel() for t in tensors)
    moved_bytes = 2 * elements * tensors[0].element_size() * (2 if backward else 1)
    row = {
        "case": case.name,
        "op": case.op,
        "layout": "interleaved" if case.interleaved else "half",
        "shape": [case.batch, case.seq, case.q_heads, case.head_dim]
        + ([case.k_heads] if case.op == "apply_qk" else []),
        "case_fields": asdict(case),
        "dtype": str(dtype).replace("torch.", ""),
        "pass": "fwd+bwd" if backward else "fwd",
        "ms": {key: value * 1e3 for key, value in results.items()},
        "ours_GBps": moved_bytes / results["ours"] / 1e9,
        "clone_GBps": moved_bytes / results["clone"] / 1e9,
        "ours_over_clone": results["ours"] / results["clone"],
        "eager_over_ours": results["eager"] / results["ours"],
    }
    if "compiled" in results:
        row["compiled_over_ours"] = results["compiled"] / results["ours"]
    if case.decode:
        row["ours_us_per_call"] = results["ours"] * 1e6
    for name in peers:
        if name in results:
            row[f"{name}_over_ours"] = results[name] / results["ours"]
    return row


def markdown_table(rows) -> str:
    lines = [
        "| case | op | layout | dtype | pass | ours (ms) | clone (ms) | ours / clone "
        "| eager / ours | compiled / ours | Liger / ours | ours GB/s |",
        "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        compiled = f"{r['compiled_over_ours']:.2f}x" if "compiled_over_ours" in r else "n/a"
        liger = f"{r['liger_over_ours']:.2f}x" if "liger_over_ours" in r else "n/a"
        lines.append(
            f"| {r['case']} | {r['op']} | {r['layout']} | {r['dtype']} | {r['pass']} "
            f"| {r['ms']['ours']:.4f} | {r['ms']['clone']:.4f} | {r['ours_over_clone']:.2f} "
            f"| {r['eager_over_ours']:.1f}x | {compiled} | {liger} | {r['ours_GBps']:.1f} |"
        )
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--min-time",
        type=float,
        default=None,
        help="seconds of samples per measurement (default 2 on CPU, 0.5 on GPU)",
    )
    parser.add_argument(
        "--no-compile",
        action="store_true",
        help="skip torch.compile of the reference (compiling takes minutes)",
    )
    parser.add_argument("--output", default=None, help="results name (default: the device)")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny shapes, a few samples, nothing written: a check of this script (CPU or GPU)",
    )
    args = parser.parse_args()

    device = args.device
    on_gpu = device == "cuda"
    meta = timing.start_run(
        device=torch.cuda.get_device_name() if on_gpu else platform.processor() or "cpu",
        timing="median; CUDA events on GPU, perf_counter on CPU; ratios within one run",
        peers={"liger_kernel": _version("liger_kernel")},
    )
    timer = Timer(device, args.min_time if args.min_time is not None else (0.5 if on_gpu else 2.0))
    dtypes = [torch.bfloat16, torch.float32]
    passes = [False, True] if on_gpu else [False]

    cases = cases_for(device)
    if args.smoke:
        cases = [replace(c, batch=min(c.batch, 2), seq=min(c.seq, 16)) for c in cases]
        timer = Timer(device, 0.0, warmup=1)
    rows = []
    for case in cases:
        for dtype in dtypes:
            for backward in passes if case.backward else [False]:
                row = bench_case(case, dtype, device, timer, not args.no_compile, backward)
                rows.append(row)
                print(markdown_table([row]).splitlines()[-1], flush=True)

    if args.smoke:
        print(f"smoke run: {len(rows)} rows, nothing written")
        return
    name = args.output or (torch.cuda.get_device_name().replace(" ", "_") if on_gpu else "cpu")
    table = markdown_table(rows)
    print(f"\n{table}\n")
    timing.write_results(
        name,
        {"meta": meta, "rows": rows},
        f"Device: {meta['device']} ({meta['threads']} threads, {meta['torch_cpu_capability']}), "
        f"torch {meta['torch']}\n\n{table}\n",
    )


if __name__ == "__main__":
    main()
