#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Every repository path that a comment, a docstring or a document names must exist.

Comments go stale when files move; a path that no longer exists is the cheapest staleness to
catch. This scans the tracked text files for tokens that start with a top-level directory of the
repository (csrc/, python/, tests/, docs/, ...) and checks each against the tree. Brace lists
(`cpu_{avx2,avx512}.md`) are expanded, `*` is a glob, and a token with a placeholder (`<name>`,
`NAME`, `...`) is checked up to the placeholder only.

Comments mostly name a file by itself (`rope_rows.cpp`, `common_glue.h`), so a source file
name standing alone (.h, .cpp, .cu, .cuh, .py, .sh; not after a `/`, a `.` or a `<`) must be the
name of a tracked file somewhere in the tree, unless it is one of the few outside files listed in
EXTERNAL_NAMES: a file renamed without its mentions fails here.

    python scripts/check_paths.py        # exit 1 and list each missing path with file:line

Run by scripts/lint.sh.
"""

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TEXT_SUFFIXES = {".py", ".cpp", ".h", ".cu", ".cuh", ".md", ".sh", ".txt", ".cmake", ".in", ".toml"}
# Paths that the build or the tests create; naming them is not a stale reference.
GENERATED = (
    "build",
    "build-asan",
    "build-demo",
    "build-wheel",
    "build-wheel-cpu",
    ".venv",
    "dist",
    "python/torch_rope/lib",
)
# A path token: a top-level directory, then path characters (braces and globs included).
TOP_LEVEL = sorted(p.name for p in REPO.iterdir() if p.is_dir() and not p.name.startswith(".git"))
PATH_RE = re.compile(
    r"(?<![\w./-])((?:" + "|".join(re.escape(d) for d in TOP_LEVEL) + r")/[\w./{},*<>-]*)"
)
PLACEHOLDER_RE = re.compile(r"<[^>]*>?|\.\.\.|\b[A-Z][A-Z_]{2,}\b")
# A source file named by itself (not the tail of a path, an #include <...> or a dotted name).
NAME_RE = re.compile(r"(?<![\w./<*-])([A-Za-z_][\w-]*\.(?:h|cpp|cu|cuh|py|sh)(?:\.in)?)\b(?![\w(])")
# Files of other projects that comments name by themselves.
EXTERNAL_NAMES = {
    "Python.h",  # CPython's header (scripts/gpu_check.sh checks that it is installed)
    "Float8_e5m2.h",  # c10/util/, the fp8 rounding the KV cache follows
    "driver_types.h",  # the CUDA runtime's, whose error values the host shim copies
    "modeling_rope_utils.py",  # transformers', whose RoPE scaling formulas csrc/scaling.cpp follows
}


def expand_braces(token):
    match = re.search(r"\{([^{}]*)\}", token)
    if not match:
        return [token]
    head, tail = token[: match.start()], token[match.end() :]
    return [p for alt in match.group(1).split(",") for p in expand_braces(head + alt + tail)]


def exists(path):
    path = path.rstrip(".,:;)/")
    if not path or any(path == g or path.startswith(g + "/") for g in GENERATED):
        return True
    placeholder = PLACEHOLDER_RE.search(path)
    if placeholder:  # check the directory before the placeholder
        path = path[: placeholder.start()].rsplit("/", 1)[0]
    if "*" in path:
        return any(REPO.glob(path))
    return (REPO / path).exists()


def main():
    files = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    basenames = {Path(name).name for name in files}
    missing = []
    for name in files:
        path = REPO / name
        if not (path.suffix in TEXT_SUFFIXES or path.name in {"CMakeLists.txt", "run"}):
            continue
        if not path.is_file():
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for token in PATH_RE.findall(line):
                for candidate in expand_braces(token):
                    if not exists(candidate):
                        missing.append(f"{name}:{number}: {candidate}")
            for file_name in NAME_RE.findall(line):
                if file_name not in basenames and file_name not in EXTERNAL_NAMES:
                    missing.append(f"{name}:{number}: {file_name} (no tracked file of that name)")
    for entry in missing:
        print(f"check_paths: no such path: {entry}")
    if missing:
        print(f"check_paths: {len(missing)} stale path(s)")
        return 1
    print(f"check_paths: every path named in {len(files)} tracked files exists")
    return 0


if __name__ == "__main__":
    sys.exit(main())
