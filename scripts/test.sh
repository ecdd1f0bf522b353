#!/usr/bin/env bash
# Every test: installs what is needed, builds, runs the GoogleTest suite (ctest) and pytest.
# CUDA tests run when a GPU is present and are reported as skipped otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
echo "== C++ tests (GoogleTest via ctest)"
ctest --test-dir build --output-on-failure --timeout 300
echo "== Python tests (pytest)"
PYTHONPATH="$PWD/python" .venv/bin/python -m pytest tests/python -ra -q "$@"
