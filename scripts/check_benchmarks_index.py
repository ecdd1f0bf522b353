#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""benchmarks/README.md lists every benchmark file, and nothing that is not one.

Every file under benchmarks/ (tracked, or new and not ignored), at any depth, except the README
itself and what the scripts wrote into results/, must be the first cell of a row of the README's
table (`| \\`name\\` | what |`, the path below benchmarks/), and each such row must name a file
or a folder (`results/`) that exists: a benchmark added without a line saying what it measures,
or removed without its line, fails here.

    python scripts/check_benchmarks_index.py    # exit 1 and say which names are missing or stale

Run by scripts/lint.sh, which scripts/test.sh runs first (the full and the --fast stage).
"""

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCHMARKS = REPO / "benchmarks"
README = BENCHMARKS / "README.md"
# What the scripts wrote: listed once, as the folder's own row.
OUTPUTS = "results/"


def listed_names(text: str) -> set:
    """The first cell of every table row, where it is one path in backticks."""
    return set(re.findall(r"^\| `([^`]+)` \|", text, flags=re.MULTILINE))


def benchmark_files() -> set:
    """The paths below benchmarks/ of its files, but the README and the results."""
    tracked = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "benchmarks"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    names = {Path(p).relative_to("benchmarks").as_posix() for p in tracked}
    return {n for n in names if n != README.name and not n.startswith(OUTPUTS)}


def main() -> int:
    listed = listed_names(README.read_text())
    files = benchmark_files()
    missing = sorted(files - listed)
    stale = sorted(n for n in listed - files if not (n.endswith("/") and (BENCHMARKS / n).is_dir()))
    for name in missing:
        print(
            f"benchmarks/README.md: no row for {name} under benchmarks/ "
            f"(add `| \\`{name}\\` | what |`)"
        )
    for name in stale:
        print(f"benchmarks/README.md: a row names {name}, which is not under benchmarks/")
    if missing or stale:
        return 1
    print(f"check_benchmarks_index: benchmarks/README.md lists all {len(files)} benchmark files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
