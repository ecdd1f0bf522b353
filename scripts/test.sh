#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The tests, in three stages:
#
#   bash scripts/test.sh             # everything (what .ci/run and the README run): install, lint,
#                                    # build,
#                                    # ctest (C++ tests, host run of the CUDA kernel, SASS check),
#                                    # the CUDA mutation check (in full when its inputs changed
#                                    # since its committed record), the GPU check's dry run and its
#                                    # CPU-side steps, the LibTorch examples against the
#                                    # installed CMake package, beside them the wheels (CPU-only
#                                    # and one CUDA architecture) in fresh venvs, and all of
#                                    # pytest, the `slow` marks included
#   bash scripts/test.sh --fast      # the development loop: lint, build, ctest, pytest -m "not slow"
#   bash scripts/test.sh --sanitize  # ASan + UBSan build and tests in build-asan/
#
# Extra arguments go to pytest. CUDA tests run when a GPU is present and are reported as skipped
# otherwise; TORCH_ROPE_REQUIRE_CUDA=1 turns those skips into failures (for a GPU machine).
set -euo pipefail
cd "$(dirname "$0")/.."
stage=full
case "${1:-}" in
  --fast) stage=fast; shift ;;
  --sanitize) stage=sanitize; shift ;;
esac
bash scripts/setup.sh
if [ "$stage" = sanitize ]; then
  exec bash scripts/sanitize.sh "$@"
fi
echo "== style: ruff and clang-format (bash scripts/lint.sh --fix rewrites)"
bash scripts/lint.sh
bash scripts/build.sh
PY=.venv/bin/python
# pytest runs one worker process per core (pytest-xdist, tests handed out one at a time), each with
# torch's default thread count; the tests that need a thread count set it. OMP_WAIT_POLICY=passive
# makes idle OpenMP threads sleep instead of spin: with two workers' threads sharing the cores,
# the spinning ate the whole gain. Four of the slowest test files on the 2-core VM: 187 s in one
# process, 196 s on 2 workers, 119 s on 2 workers with passive waits; all of pytest 246 s.
run_pytest() {
  OMP_WAIT_POLICY=passive PYTHONPATH="$PWD/python" "$PY" -m pytest tests/python -ra -q \
    -n auto --dist load "$@"
}

if [ "$stage" = full ]; then
  # The wheels are built and smoke-tested in the background from here to the examples: ctest,
  # the GPU check's CPU side and the examples are mostly one process at a time (one test, cmake, a
  # link, one compile, AOTInductor), so together they use the 2 cores. The CUDA wheel takes the
  # default architecture list, as build/ does, so ccache serves its kernels from build/'s
  # (scripts/wheel_smoke.sh; with a GPU it compiles for the GPUs present). Measured on the 2-core VM before that wheel: examples 45 s
  # and wheel 59 s one after the other, 75 s side by side. The wheels' output is printed after
  # the examples'; they run in a process group of their own (set -m) so that an interrupted test
  # command stops them too.
  echo "== wheels: a CPU-only and a CUDA pip wheel ., each installed into a fresh" \
    "venv and smoke-tested (in the background; their output follows the examples')"
  wheel_log=build/wheel_smoke.log
  set -m
  bash scripts/wheel_smoke.sh > "$wheel_log" 2>&1 &
  wheel_pid=$!
  set +m
  trap 'kill -- -"$wheel_pid" 2>/dev/null || true' EXIT
  trap 'exit 130' INT TERM
fi

echo "== C++ tests (GoogleTest via ctest; also the host run of the CUDA kernel and its SASS check)"
# Two tests at a time, the SASS check alone (RUN_SERIAL: it runs a process per core itself, and
# side by side with the host run and the wheels' build it passed its 300 s limit in a fresh
# clone). The host run of the kernels is one thread for about a minute: one test at a time, the
# second core idled once the wheels were built.
ctest --test-dir build --output-on-failure --timeout 600 -j 2

if [ "$stage" = fast ]; then
  echo "== Python tests (pytest, without the slow marks)"
  run_pytest -m "not slow" "$@"
  exit
fi

echo "== CUDA architectures of build/librope.so, read from the binary: the default list, all of it"
if grep -q '^TORCH_ROPE_BUILT_WITH_CUDA:INTERNAL=ON$' build/CMakeCache.txt; then
  "$PY" tests/integration/check_cuda_archs.py build/librope.so --expect default
else
  echo "SKIPPED: build/ has no CUDA kernels (no nvcc, or a torch without CUDA)"
fi

echo "== CUDA kernel mutation check: every planted bug must fail the host run"
# In full whenever its inputs (csrc/, tests/cuda_host/, ...) changed since the full run recorded
# in tests/cuda_host/mutation_record.json; otherwise it says it did not run and on what record.
"$PY" tests/cuda_host/mutation_gate.py --build-dir build

echo "== the GPU check, checked without a GPU: its plan (--dry-run), then its CPU-side steps"
bash scripts/gpu_check.sh --dry-run
FUZZ_EXAMPLES=50 bash scripts/gpu_check.sh --without-gpu --reuse-build build --out build/gpu_check

echo "== C++ example built against the installed package (find_package(TorchRope))"
rm -rf build/install build/example
cmake --install build --prefix build/install > /dev/null
torch_prefix=$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)')
cmake -S examples/cpp -B build/example -G Ninja \
  -DCMAKE_PREFIX_PATH="$PWD/build/install;$torch_prefix" > /dev/null
cmake --build build/example
PYTHONPATH="$PWD/python" "$PY" tests/integration/check_example.py build/example/attention_example
PYTHONPATH="$PWD/python" "$PY" tests/integration/check_torchscript.py build/example/run_scripted \
  build/example/run_aoti

echo "== wheels (their output, from $wheel_log)"
wheel_status=0
wait "$wheel_pid" || wheel_status=$?
cat "$wheel_log"
if [ "$wheel_status" != 0 ]; then
  echo "FAILED: scripts/wheel_smoke.sh (exit $wheel_status)"
  exit "$wheel_status"
fi

echo "== Python tests (pytest, all of it)"
run_pytest "$@"
