#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Mutation check of the host run of the CUDA kernel: plants realistic bugs, one at a time, in a
copy of the kernel headers (csrc/cuda/rope_kernel.cuh, csrc/cuda/launch_plan.h), builds the host
run against the copy and requires it to fail. A bug it misses is a hole in the tests.

    python tests/cuda_host/mutation_check.py [--build-dir build] [--cases N] [--only NAME]

The copies go to <build>/tests/cuda_host/mutant_overlay, which the `cuda_host_mutant` target
searches before csrc/; each mutant costs one compile of host_kernel.cpp, one link and a short
run. First the unmutated copy must pass with the same arguments, so a broken harness cannot pass
as "every mutant caught". Exit status 0 when every mutant was caught.
"""

import argparse
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOURCES = {  # overlay path -> source; the overlay mirrors csrc/ so relative includes resolve
    "cuda/rope_kernel.cuh": REPO / "csrc" / "cuda" / "rope_kernel.cuh",
    "cuda/launch_plan.h": REPO / "csrc" / "cuda" / "launch_plan.h",
    "kernel_args.h": REPO / "csrc" / "kernel_args.h",
}


@dataclass
class Mutant:
    name: str
    file: str  # overlay path
    before: str  # must occur exactly once
    after: str
    why: str


MUTANTS = [
    Mutant(
        "inverse-sign",
        "cuda/rope_kernel.cuh",
        "      if (inverse) {\n",
        "      if (!inverse) {\n",
        "inverse turns the wrong way",
    ),
    Mutant(
        "swapped-rotation-terms",
        "cuda/rope_kernel.cuh",
        "  rb = fused(a, s, b * c);",
        "  rb = fused(b, c, a * s);",
        "same value in exact arithmetic, different rounding: the bit-exactness claim",
    ),
    Mutant(
        "token-in-uses-out-stride",
        "cuda/rope_kernel.cuh",
        "    in_off += qr.rem * t.token_in_strides[d];",
        "    in_off += qr.rem * t.token_out_strides[d];",
        "a row stride of the wrong tensor",
    ),
    Mutant(
        "walker-in-uses-out-stride",
        "cuda/rope_kernel.cuh",
        "    in += t.shared_in_inner;",
        "    in += t.shared_out_inner;",
        "shared-row stepping with the output's stride",
    ),
    Mutant(
        "token-unravel-off-by-one",
        "cuda/rope_kernel.cuh",
        "for (int d = t.token_ndim - 1; d > 0; --d) {",
        "for (int d = t.token_ndim - 1; d > 1; --d) {",
        "one token dim left out of the unravel",
    ),
    Mutant(
        "walker-wrap-off-by-one",
        "cuda/rope_kernel.cuh",
        "if (++inner == t.shared_inner) {",
        "if (inner++ == t.shared_inner) {",
        "the inner shared dim wraps one row late",
    ),
    Mutant(
        "missing-tail-lane",
        "cuda/rope_kernel.cuh",
        "  if (scalar_copy < t.scalar_copy_lanes) {",
        "  if (scalar_copy + 1 < t.scalar_copy_lanes) {",
        "the last element of an odd tail is never copied",
    ),
    Mutant(
        "missing-vector-tail-lane",
        "cuda/rope_kernel.cuh",
        "  if (copy < t.vec_copy_lanes) {",
        "  if (copy + 1 < t.vec_copy_lanes) {",
        "the last 16-byte tail lane falls through to the scalar lanes",
    ),
    Mutant(
        "overlapping-tail-lane",
        "cuda/rope_kernel.cuh",
        "copy_lane<scalar_t, false>(t, t.rotary_dim + t.vec_copy_lanes * kVecElems + scalar_copy,",
        "copy_lane<scalar_t, false>(t, t.rotary_dim + t.vec_copy_lanes + scalar_copy,",
        "scalar tail lanes start inside the vector ones (a forgotten * elements)",
    ),
    Mutant(
        "overlapping-rotating-lane",
        "cuda/rope_kernel.cuh",
        "  const int64_t a_feature = kInterleaved ? lane * (2 * P) : lane * P;",
        "  const int64_t a_feature = kInterleaved ? lane * P : lane * P;",
        "interleaved lanes step by planes, not features: they overlap",
    ),
    Mutant(
        "position-range-off-by-one",
        "cuda/rope_kernel.cuh",
        "  return pos >= 0 && pos < tb.max_seq_len;",
        "  return pos >= 0 && pos <= tb.max_seq_len;",
        "position max_seq_len reads one row past the tables",
    ),
    Mutant(
        "no-position-check-without-rotation",
        "cuda/rope_kernel.cuh",
        "  if (t.rot_lanes == 0) {\n    int64_t pos;",
        "  if (false) {\n    int64_t pos;",
        "rotary_dim == 0 skips the range check of positions (issue 9, item 6)",
    ),
    Mutant(
        "int32-positions-read-as-int64",
        "cuda/rope_kernel.cuh",
        "  pos = t.positions_are_int64\n",
        "  pos = !t.positions_are_int64\n",
        "positions read with the wrong width",
    ),
    Mutant(
        "half-split-alignment",
        "cuda/launch_plan.h",
        "  const int64_t run = interleaved ? a.rotary_dim : half;",
        "  const int64_t run = a.rotary_dim;",
        "vector path for a half split whose b's are not 16-byte aligned",
    ),
    Mutant(
        "table-alignment",
        "cuda/launch_plan.h",
        "                               tables.table_stride % piece == 0;",
        "                               true;",
        "vector table loads on rows that are not aligned",
    ),
    Mutant(
        "row-groups-floor",
        "cuda/launch_plan.h",
        "  const int64_t row_groups = ceil_div(p.shared_rows, p.rows_per_thread);",
        "  const int64_t row_groups = p.shared_rows / p.rows_per_thread;",
        "the last, partial group of shared rows gets no thread",
    ),
    Mutant(
        "qk-block-split",
        "cuda/launch_plan.h",
        "  params.first_blocks = ceil_div(params.tensor[0].num_threads, kBlockThreads);",
        "  params.first_blocks = params.tensor[0].num_threads / kBlockThreads;",
        "q's last, partial block is handed to k",
    ),
    Mutant(
        "tail-lanes-count",
        "cuda/launch_plan.h",
        "  p.scalar_copy_lanes = tail - p.vec_copy_lanes * v.elems;",
        "  p.scalar_copy_lanes = tail - p.vec_copy_lanes * v.elems - (tail > v.elems);",
        "one tail lane too few when the tail is longer than a vector",
    ),
]


def write_overlay(overlay: Path, mutant=None):
    if overlay.exists():
        shutil.rmtree(overlay)
    for rel, src in SOURCES.items():
        dst = overlay / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        text = src.read_text()
        if mutant is not None and rel == mutant.file:
            count = text.count(mutant.before)
            if count != 1:
                raise SystemExit(
                    f"mutant {mutant.name}: its text occurs {count} times in "
                    f"{src} (expected once); update MUTANTS to the current code"
                )
            text = text.replace(mutant.before, mutant.after)
        dst.write_text(text)


def build(build_dir: Path):
    result = subprocess.run(
        ["cmake", "--build", str(build_dir), "--target", "cuda_host_mutant"],
        capture_output=True,
        text=True,
    )
    return result.returncode == 0, result.stdout + result.stderr


def run_host(binary: Path, cases: int, seed: int, timeout: float):
    try:
        result = subprocess.run(
            [
                str(binary),
                "--cases",
                str(cases),
                "--seed",
                str(seed),
                "--max-failures",
                "1",
                "--no-coverage-gate",
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return "timeout", ""
    out = result.stdout + result.stderr
    return ("passed" if result.returncode == 0 else "failed"), out


def first_failure(out: str) -> str:
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if (
            line.startswith("    ")
            and i > 0
            and any(prev.startswith("FAILED") for prev in lines[:i])
        ):
            return line.strip()
        if "runtime error" in line or "ERROR: AddressSanitizer" in line or "cuda host shim" in line:
            return line.strip()
    return next((text for text in lines if "FAILED" in text), lines[-1] if lines else "")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build-dir", default=str(REPO / "build"))
    parser.add_argument("--cases", type=int, default=600)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--only", help="run only the mutant of this name")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per run")
    args = parser.parse_args()
    build_dir = Path(args.build_dir)
    overlay = build_dir / "tests" / "cuda_host" / "mutant_overlay"
    binary = build_dir / "tests" / "cuda_host" / "cuda_host_mutant"
    if not overlay.parent.is_dir():
        print(
            f"mutation check: {overlay.parent} does not exist; build with "
            "TORCH_ROPE_BUILD_TESTS=ON first (scripts/build.sh)"
        )
        return 2

    mutants = [m for m in MUTANTS if args.only in (None, m.name)]
    start = time.time()
    try:
        write_overlay(overlay)
        ok, log = build(build_dir)
        if not ok:
            print(log)
            print("mutation check: the unmutated host run does not build")
            return 1
        status, out = run_host(binary, args.cases, args.seed, args.timeout)
        if status != "passed":
            print(out[-4000:])
            print("mutation check: the unmutated host run does not pass; fix that first")
            return 1
        print(f"unmutated: passed {args.cases} cases (seed {args.seed})")

        survived = []
        for m in mutants:
            t0 = time.time()
            write_overlay(overlay, m)
            ok, log = build(build_dir)
            if not ok:
                print(log[-3000:])
                print(f"mutant {m.name}: does not compile; a mutant must be a plausible program")
                return 1
            status, out = run_host(binary, args.cases, args.seed, args.timeout)
            caught = status != "passed"
            if not caught:
                survived.append(m)
            how = {"failed": first_failure(out), "timeout": "timed out", "passed": "NOT CAUGHT"}[
                status
            ]
            print(
                f"{'caught  ' if caught else 'SURVIVED'} {m.name:38s} {time.time() - t0:5.1f} s"
                f"  ({m.why})\n         {how[:200]}"
            )
    finally:
        write_overlay(overlay)  # leave the overlay unmutated

    print(
        f"\n{len(mutants) - len(survived)} of {len(mutants)} mutants caught in "
        f"{time.time() - start:.0f} s"
    )
    if survived:
        print("SURVIVED: " + ", ".join(m.name for m in survived))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
