#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Style checks with the pinned tools that scripts/setup.sh installs into .venv: ruff (lint and
# format) on Python, clang-format (.clang-format) on C++ and CUDA. scripts/test.sh runs this, so
# style cannot drift; .pre-commit-config.yaml runs the same checks before each commit.
#
#   bash scripts/lint.sh          # check
#   bash scripts/lint.sh --fix    # rewrite the files instead
set -euo pipefail
cd "$(dirname "$0")/.."
ruff=.venv/bin/ruff
clang_format=.venv/bin/clang-format
mapfile -t cxx < <(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh')
if [ "${1:-}" = "--fix" ]; then
  "$ruff" check --fix .
  "$ruff" format .
  "$clang_format" -i "${cxx[@]}"
  exit 0
fi
echo "lint: ruff $("$ruff" --version | cut -d' ' -f2), clang-format $("$clang_format" --version | sed -n 's/.*version \([0-9.]*\).*/\1/p')"
"$ruff" check .
"$ruff" format --check .
"$clang_format" --dry-run -Werror "${cxx[@]}"
# Every repository path that a comment or a document names exists (stale comments after a move).
.venv/bin/python scripts/check_paths.py
# benchmarks/README.md lists every benchmark script.
.venv/bin/python scripts/check_benchmarks_index.py
# No user-facing text cites a tracker number (scripts/check_issue_refs.py says which files).
.venv/bin/python scripts/check_issue_refs.py
