#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""benchmarks/README.md lists every benchmark file, and nothing that is not one.

Each tracked script or source directly under benchmarks/ (.py, .cpp, .sh) must be the first cell
of a row of the README's table (`| \\`name\\` | what |`), and each such row must name a file that
exists: a benchmark added without a line saying what it measures, or removed without its line,
fails here.

    python scripts/check_benchmarks_index.py    # exit 1 and say which names are missing or stale

Run by scripts/lint.sh.
"""

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README = REPO / "benchmarks" / "README.md"
SUFFIXES = (".py", ".cpp", ".sh")


def listed_names(text: str) -> set:
    """The first cell of every table row, where it is one name in backticks."""
    return set(re.findall(r"^\| `([^`/]+)` \|", text, flags=re.MULTILINE))


def benchmark_files() -> set:
    tracked = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "benchmarks"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return {
        Path(p).name
        for p in tracked
        if Path(p).parent.name == "benchmarks" and p.endswith(SUFFIXES)
    }


def main() -> int:
    listed = listed_names(README.read_text())
    files = benchmark_files()
    missing = sorted(files - listed)
    stale = sorted(n for n in listed - files if n.endswith(SUFFIXES))
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
