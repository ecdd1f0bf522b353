#!/usr/bin/env bash
# Every test: installs what is needed, builds, runs the GoogleTest suite (ctest, which includes the
# host run of the CUDA kernel and its SASS check) and the CUDA mutation check, builds and checks
# the LibTorch examples (attention model; TorchScript and AOTInductor loaders) against the
# *installed* CMake package, smoke-tests the wheel in a fresh venv, then runs pytest.
# CUDA tests run when a GPU is present and are reported as skipped otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--sanitize" ]; then
  # ASan + UBSan build and tests in build-asan/ (scripts/sanitize.sh): a separate command, not
  # part of the default run.
  shift
  bash scripts/setup.sh
  exec bash scripts/sanitize.sh "$@"
fi
bash scripts/setup.sh
bash scripts/build.sh
PY=.venv/bin/python

echo "== C++ tests (GoogleTest via ctest; also the host run of the CUDA kernel and its SASS check)"
ctest --test-dir build --output-on-failure --timeout 300

echo "== CUDA kernel mutation check: every planted bug must fail the host run"
"$PY" tests/cuda_host/mutation_check.py --build-dir build

echo "== C++ example built against the installed package (find_package(TorchRope))"
rm -rf build/install build/example
cmake --install build --prefix build/install > /dev/null
torch_prefix=$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)')
cmake -S examples/cpp -B build/example -G Ninja \
  -DCMAKE_PREFIX_PATH="$PWD/build/install;$torch_prefix" > /dev/null
cmake --build build/example
PYTHONPATH="$PWD/python" "$PY" examples/cpp/check_example.py build/example/attention_example
PYTHONPATH="$PWD/python" "$PY" examples/cpp/check_torchscript.py build/example/run_scripted \
  build/example/run_aoti

echo "== wheel: pip wheel ., installed into a fresh venv, smoke-tested from Python and C++"
bash scripts/wheel_smoke.sh

echo "== Python tests (pytest)"
PYTHONPATH="$PWD/python" "$PY" -m pytest tests/python -ra -q "$@"
