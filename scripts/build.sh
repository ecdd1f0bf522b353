#!/usr/bin/env bash
# Configures and builds librope, the Python extension (into python/torch_rope) and the C++ tests
# in build/, with the project's virtual environment. Concurrent runs wait for each other.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
mkdir -p build
exec 9>build/.lock
flock 9
torch_prefix=$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)')
if [ ! -f build/CMakeCache.txt ]; then
  cmake -S . -B build -G Ninja \
    -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$torch_prefix" \
    -DPython3_EXECUTABLE="$(realpath "$PY")" \
    -DTORCH_ROPE_BUILD_TESTS=ON \
    "$@"
fi
cmake --build build --parallel "${BUILD_JOBS:-$(nproc)}"
