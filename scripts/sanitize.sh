#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# ASan + UBSan build of librope, the Python extension and the GoogleTest suite (CPU backend), in
# build-asan/, then the C++ tests and the Python tests (minus the slow and compile-heavy ones)
# against it. Run through `bash scripts/test.sh --sanitize`, or directly after scripts/setup.sh.
#
# The extension is loaded into an uninstrumented Python, so libasan/libubsan are preloaded;
# leak checking is off (libtorch keeps allocations alive until exit by design) and the vptr
# check is off (it needs RTTI from libtorch, which is not instrumented).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
out=build-asan
pkg="$out/python/torch_rope"
mkdir -p "$pkg"
# The Python sources beside the instrumented _C, so this tree imports nothing from python/.
cp python/torch_rope/*.py "$pkg/"
torch_prefix=$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)')
flags="-fsanitize=address,undefined -fno-sanitize=vptr -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
if [ ! -f "$out/CMakeCache.txt" ]; then
  cmake -S . -B "$out" -G Ninja \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_PREFIX_PATH="$torch_prefix" \
    -DPython3_EXECUTABLE="$(realpath "$PY")" \
    -DTORCH_ROPE_CUDA=OFF \
    -DTORCH_ROPE_BUILD_TESTS=ON \
    -DTORCH_ROPE_PYTHON_PACKAGE_DIR="$PWD/$pkg" \
    -DCMAKE_CXX_FLAGS="$flags" \
    -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" \
    -DCMAKE_MODULE_LINKER_FLAGS="-fsanitize=address,undefined" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" > /dev/null
fi
cmake --build "$out" --parallel "${BUILD_JOBS:-$(nproc)}"

export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
echo "== sanitized C++ tests"
ctest --test-dir "$out" --output-on-failure --timeout 600 -j "$(nproc)"

echo "== sanitized Python tests"
preload="$(g++ -print-file-name=libasan.so):$(g++ -print-file-name=libubsan.so)"
# torch.compile's generated code and subprocess-based tests are out of scope here: Inductor
# compiles C++ with its own flags, and child interpreters would need the preload too.
LD_PRELOAD="$preload" PYTHONPATH="$PWD/$out/python" "$PY" -m pytest tests/python -q -p no:cacheprovider \
  -m "not slow" -k "not compile and not capability and not distributed and not export and not example" "$@"
