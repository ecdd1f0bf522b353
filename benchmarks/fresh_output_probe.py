# SPDX-License-Identifier: BSD-3-Clause
"""Why a large output is sometimes slow: the same rotation into a reused buffer
(``out=``: no page faults), into a fresh output (huge-page advised, as torch-rope's are), and the
cost of faulting the same bytes in with 4 KiB pages (``torch.empty_like(x).fill_(1)``, what
``clone`` pays), call by call, in one fresh process. Then the demo's fp32 ``apply_qk`` and its
clone round by round, with each output's place (glibc's heap or a mapping of its own) and the
page faults of the call: glibc serves a block of the same size from either, depending on what
was freed before (its mmap threshold moves up to 32 MiB), which is what made the first rounds of
a process slow before torch-rope's large outputs got mappings of their own.

    PYTHONPATH=python .venv/bin/python benchmarks/fresh_output_probe.py [--threads 2] [--calls 20]

Prints one line of milliseconds per call for each; nothing is written (the findings are in
docs/performance.md, "Large tensors: why some rounds are slow").
"""

import argparse
import resource
import time

import torch

import torch_rope


def calls(fn, n):
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        result = fn()
        out.append((time.perf_counter() - t0) * 1e3)
        del result
    return " ".join(f"{t:.0f}" for t in out)


def heap_range():
    for line in open("/proc/self/maps"):
        if line.rstrip().endswith("[heap]"):
            lo, hi = line.split()[0].split("-")
            return int(lo, 16), int(hi, 16)
    return 0, 0


def placement(tensors):
    lo, hi = heap_range()
    return "+".join("heap" if lo <= t.data_ptr() < hi else "map" for t in tensors)


def rounds(fns, n):
    for r in range(n):
        line = []
        for name, fn in fns:
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t0 = time.perf_counter()
            result = fn()
            ms = (time.perf_counter() - t0) * 1e3
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
            line.append(f"{name} {ms:5.1f} ms {faults:5d} faults ({placement(result)})")
            del result
        print(f"  round {r}: " + "   ".join(line))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    cos, sin = torch_rope.rope_tables(10000.0, 128, 4096)
    x = torch.randn(4, 32, 2048, 128).to(torch.bfloat16)  # 64 MiB
    p = torch.arange(2048)
    buffer = torch.empty_like(x)
    print(f"{args.threads} threads, bf16 (4, 32, 2048, 128), ms per call:")
    print(
        "  out= (reused)   ",
        calls(lambda: torch_rope.apply(x, cos, sin, p, out=buffer), args.calls),
    )
    print("  fresh output    ", calls(lambda: torch_rope.apply(x, cos, sin, p), args.calls))
    print("  4 KiB faults    ", calls(lambda: torch.empty_like(x).fill_(1), args.calls))
    print("  x.clone()       ", calls(x.clone, args.calls))
    q = torch.randn(4, 1024, 32, 128)  # the demo's prefill q and k, fp32: 64 + 16 MiB
    k = torch.randn(4, 1024, 8, 128)
    pos = torch.arange(1024).view(1024, 1)
    print("the demo's apply_qk (fp32) and the clone of q and k, round by round (q + k outputs):")
    rounds(
        [
            ("apply_qk", lambda: torch_rope.apply_qk(q, k, cos, sin, pos, interleaved=False)),
            ("clone", lambda: (q.clone(), k.clone())),
        ],
        8,
    )


if __name__ == "__main__":
    main()
