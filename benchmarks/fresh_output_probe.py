# SPDX-License-Identifier: BSD-3-Clause
"""Why a large output is sometimes slow (issue 36): the same rotation into a reused buffer
(``out=``: no page faults), into a fresh output (huge-page advised, as torch-rope's are), and the
cost of faulting the same bytes in with 4 KiB pages (``torch.empty_like(x).fill_(1)``, what
``clone`` pays), call by call, in one fresh process.

    PYTHONPATH=python .venv/bin/python benchmarks/fresh_output_probe.py [--threads 2] [--calls 20]

Prints one line of milliseconds per call for each; nothing is written (the findings are in
docs/performance.md, "Large tensors: why some rounds are slow").
"""

import argparse
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


if __name__ == "__main__":
    main()
