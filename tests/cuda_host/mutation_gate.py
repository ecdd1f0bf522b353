#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Runs the CUDA mutation check (mutation_check.py) in full whenever its inputs changed since the
last full run that caught every mutant, and says so plainly when they did not.

    python tests/cuda_host/mutation_gate.py [--build-dir build] [--full]

The mutation check plants bugs in the CUDA kernels and glue and requires the host run (and the
launch-plan and tuning checks) to catch each one: about fifteen minutes on two cores, a third of
the test command, and its verdict can only change when one of its inputs changes. Its inputs are
every file the host run, the mutants and their checks are built from: csrc/ (the kernels, the
glue, and the CPU backend the host run links and compares against; not csrc/python/), tests/
cuda_host/, the launch-plan tests, the SASS/tuning script and the CMake files. Their hashes are
kept, with the outcome of the last full run, in tests/cuda_host/mutation_record.json, which the
developer commits with the change (this script rewrites it after every full run in which every
mutant was caught).

- Inputs unchanged since the record: the check is not run, and the script prints the record it
  relies on (date, mutants caught, time) and exits 0.
- Any input changed, added or removed (a kernel edited, a planted bug in a submission): the full
  check runs, with the changed inputs listed first, and its exit status is this script's.
- ``--full`` or ``TORCH_ROPE_FULL_MUTATION_CHECK=1``: always the full check.
"""

import argparse
import datetime
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RECORD = REPO / "tests" / "cuda_host" / "mutation_record.json"
CHECK = REPO / "tests" / "cuda_host" / "mutation_check.py"

# The inputs of the mutation check's verdict, as repository paths: a directory means every file
# under it.
INPUTS = (
    "csrc",
    "tests/cuda_host",
    "tests/cpp/test_launch_plan.cpp",
    "tests/cpp/CMakeLists.txt",
    "scripts/sass_report.py",
    "CMakeLists.txt",
)
# Not inputs: the Python bindings (the host run does not link them) and the record itself.
EXCLUDED = ("csrc/python/", "tests/cuda_host/mutation_record.json")


def input_files() -> list:
    """The input files in the working tree: tracked, or new and not ignored (a fresh clone and a
    developer's tree with uncommitted files hash the same way)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *INPUTS],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split("\n")
    return sorted({p for p in listed if p and not p.startswith(EXCLUDED) and (REPO / p).is_file()})


def input_hashes() -> dict:
    return {p: hashlib.sha256((REPO / p).read_bytes()).hexdigest() for p in input_files()}


def fingerprint(hashes: dict) -> str:
    text = "".join(f"{path}\0{digest}\n" for path, digest in sorted(hashes.items()))
    return hashlib.sha256(text.encode()).hexdigest()


def changed_inputs(old: dict, new: dict) -> list:
    return sorted(
        [f"changed  {p}" for p in new if p in old and old[p] != new[p]]
        + [f"new      {p}" for p in new if p not in old]
        + [f"removed  {p}" for p in old if p not in new]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build-dir", default=str(REPO / "build"))
    parser.add_argument("--full", action="store_true", help="run the full check in any case")
    args, extra = parser.parse_known_args()
    full = args.full or os.environ.get("TORCH_ROPE_FULL_MUTATION_CHECK", "") not in ("", "0")

    hashes = input_hashes()
    record = json.loads(RECORD.read_text()) if RECORD.is_file() else None
    if record is not None and not full and record.get("fingerprint") == fingerprint(hashes):
        print(
            f"mutation check: NOT RUN — its {len(hashes)} input files are unchanged since the full "
            f"run recorded in {RECORD.relative_to(REPO)} ({record['date']}: {record['caught']} of "
            f"{record['mutants']} mutants caught in {record['seconds']} s). A change to csrc/, "
            "tests/cuda_host/ or the other inputs runs it in full; "
            "TORCH_ROPE_FULL_MUTATION_CHECK=1 forces it."
        )
        return 0

    if record is None:
        print(f"mutation check: no record ({RECORD.relative_to(REPO)}): running in full")
    elif full:
        print("mutation check: a full run was asked for")
    else:
        changes = changed_inputs(record.get("inputs", {}), hashes)
        print(f"mutation check: {len(changes)} input(s) changed since the recorded full run:")
        for line in changes[:40]:
            print(f"  {line}")
        if len(changes) > 40:
            print(f"  ... and {len(changes) - 40} more")

    # Streamed as it runs (a quarter of an hour), and kept to read the summary line.
    process = subprocess.Popen(
        [sys.executable, "-u", str(CHECK), "--build-dir", args.build_dir, *extra],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output = []
    for line in process.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        output.append(line)
    returncode = process.wait()
    summary = re.search(
        r"^(\d+) of (\d+) mutants caught in (\d+) s", "".join(output), flags=re.MULTILINE
    )
    # Only a complete run (no --only subset) that caught every mutant becomes the record.
    complete = not any(a.startswith("--only") for a in extra)
    if returncode == 0 and summary and summary.group(1) == summary.group(2) and complete:
        RECORD.write_text(
            json.dumps(
                {
                    "date": datetime.date.today().isoformat(),
                    "mutants": int(summary.group(2)),
                    "caught": int(summary.group(1)),
                    "seconds": int(summary.group(3)),
                    "fingerprint": fingerprint(hashes),
                    "inputs": hashes,
                },
                indent=1,
                sort_keys=True,
            )
            + "\n"
        )
        print(
            f"mutation check: recorded in {RECORD.relative_to(REPO)} (commit it with the change, "
            "so that the next run of the same inputs need not repeat it)"
        )
    return returncode


if __name__ == "__main__":
    sys.exit(main())
