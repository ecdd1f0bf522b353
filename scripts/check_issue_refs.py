#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""No text a user reads cites a tracker number (the word issue and a number, or # and one): a
reader has no tracker, so the text says what the number stood for (the feature's name) instead.

Checked: the README, docs/, csrc/ and CMakeLists.txt, the Python package, the benchmarks and
scripts, the examples and every test, each tracked file in full.

    python scripts/check_issue_refs.py    # exit 1 and print each citation with its line

Run by scripts/lint.sh.
"""

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHECKED = (
    "README.md",
    "docs",
    "python",
    "csrc",
    "CMakeLists.txt",
    "tests",
    "benchmarks",
    "scripts",
    "examples",
    "pyproject.toml",
    "setup.py",
)
# "issue N", "issues N and M", "issue #N"; "#N" standing alone (not an HTML entity "&#N;", a
# URL's fragment or part of an identifier).
CITATION = re.compile(r"\bissues?\s+#?\d+|(?:^|[^&\w/])#\d{1,4}\b", re.IGNORECASE)


def checked_files() -> list:
    """The tracked text files under CHECKED, less the results the benchmarks wrote."""
    names = subprocess.run(
        ["git", "ls-files", "--", *CHECKED],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return [n for n in names if not n.startswith("benchmarks/results/")]


def main() -> int:
    found = 0
    files = checked_files()
    for name in files:
        try:
            text = (REPO / name).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary (a plot) or gone from the work tree
        for number, line in enumerate(text.splitlines(), 1):
            match = CITATION.search(line)
            if match:
                found += 1
                print(f"{name}:{number}: cites {match.group(0).strip()!r}: name what it meant")
    if found:
        return 1
    print(f"check_issue_refs: no tracker number in {len(files)} tracked files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
