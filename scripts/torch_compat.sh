#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Builds and tests this checkout against another torch, apart from the project's own .venv and
# build/: a clean copy of the tracked tree in $WORK (default /tmp/torch-rope-compat-<version>),
# its own virtual environment, CMake, ctest and pytest (slow tests included). Not part of the test
# command: each torch is an 800 MB download and a full build.
#
#   bash scripts/torch_compat.sh 2.4.1                  # oldest supported; CPU kernels only
#   bash scripts/torch_compat.sh 2.11.0 -DTORCH_ROPE_CUDA=AUTO
#
# The default is -DTORCH_ROPE_CUDA=OFF: CUDA kernels built with nvcc 13 must not be loaded next to
# a torch built for CUDA 12 (PyPI's torch 2.4.1 is; its 2.11 is built for 13.0). Tests that need
# a newer torch skip, naming what is missing.
set -euo pipefail
version=${1:?usage: torch_compat.sh TORCH_VERSION [cmake args...]}
shift
cmake_args=("$@")
[ ${#cmake_args[@]} -gt 0 ] || cmake_args=(-DTORCH_ROPE_CUDA=OFF)
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${WORK:-/tmp/torch-rope-compat-$version}

mkdir -p "$work"
[ -x "$work/venv/bin/python" ] || python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q "torch==$version" numpy pytest pybind11 expecttest \
  hypothesis "setuptools>=70.1" cmake ninja
rm -rf "$work/src"
git -C "$repo" archive --format=tar HEAD | (mkdir -p "$work/src" && tar -x -C "$work/src")
cd "$work/src"
PYTHON="$work/venv/bin/python" bash scripts/build.sh "${cmake_args[@]}"
(cd build && ctest --output-on-failure)
"$work/venv/bin/python" -m pytest -q -p no:cacheprovider -rs tests/python
