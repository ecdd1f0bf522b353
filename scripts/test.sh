#!/usr/bin/env bash
# Every test: installs what is needed, builds, runs the GoogleTest suite (ctest), builds and checks
# the LibTorch example and a TorchScript round trip against the *installed* CMake package, then
# runs pytest.
# CUDA tests run when a GPU is present and are reported as skipped otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
PY=.venv/bin/python

echo "== C++ tests (GoogleTest via ctest)"
ctest --test-dir build --output-on-failure --timeout 300

echo "== C++ example built against the installed package (find_package(TorchRope))"
rm -rf build/install build/example
cmake --install build --prefix build/install > /dev/null
torch_prefix=$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)')
cmake -S examples/cpp -B build/example -G Ninja \
  -DCMAKE_PREFIX_PATH="$PWD/build/install;$torch_prefix" > /dev/null
cmake --build build/example
PYTHONPATH="$PWD/python" "$PY" examples/cpp/check_example.py build/example/attention_example
PYTHONPATH="$PWD/python" "$PY" examples/cpp/check_torchscript.py build/example/run_scripted

echo "== Python tests (pytest)"
PYTHONPATH="$PWD/python" "$PY" -m pytest tests/python -ra -q "$@"
