#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Configures and builds librope, the Python extension (into python/torch_rope) and the C++ tests
# in build/, with the project's virtual environment. Concurrent runs wait for each other.
#
#   bash scripts/build.sh                         # configure once, then incremental builds
#   bash scripts/build.sh -DTORCH_ROPE_CUDA=OFF   # any arguments: (re)configure with them first
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
# The venv's own interpreter (not the one its symlink points to), so scripts that CMake and
# ctest run with it see the venv's packages.
PY_ABS="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"
# ccache, where installed (scripts/setup.sh installs it), with paths under the repository hashed
# relative to the build directory, and without the build directory itself (CCACHE_NOHASHDIR:
# ccache hashes it for nvcc's -lineinfo objects): the wheel smoke's build (build-wheel/, the same
# depth, the same compile lines) then compiles nothing again.
launcher=()
if command -v ccache >/dev/null; then
  export CCACHE_BASEDIR="$PWD"
  export CCACHE_NOHASHDIR=1
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
mkdir -p build
exec 9>build/.lock
flock 9
if [ ! -f build/CMakeCache.txt ] || [ $# -gt 0 ]; then
  torch_prefix=$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)')
  cmake -S . -B build -G Ninja \
    -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$torch_prefix" \
    -DPython3_EXECUTABLE="$PY_ABS" \
    -DTORCH_ROPE_BUILD_TESTS=ON \
    "${launcher[@]}" "$@"
fi
cmake --build build --parallel "${BUILD_JOBS:-$(nproc)}"
