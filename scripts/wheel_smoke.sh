#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Builds two wheels with `pip wheel .`, the two installs that do not build every architecture,
# installs each into a fresh virtual environment and smoke-tests it there:
#
#   cpu    TORCH_ROPE_CUDA=OFF: the CPU-only install; its librope must hold no device code.
#   cuda   the install with CUDA kernels, TORCH_CUDA_ARCH_LIST unset as a user's pip install has
#          it: with a GPU, setup.py takes the GPUs present (the newest with PTX); without one, the
#          default list, the one build/ was compiled for, so that ccache serves every CUDA object
#          from build/'s (the same compile lines) and this wheel compiles no kernel again (with
#          TORCH_CUDA_ARCH_LIST=8.0, as before, it compiled all of them for sm_80 beside ctest).
#          Its librope must hold exactly those architectures, read from the binary
#          (tests/integration/check_cuda_archs.py). The TORCH_CUDA_ARCH_LIST rules themselves are
#          unit tests (tests/python/packaging/test_cuda_arch_list.py).
#
# Each is checked from Python (tests/wheel/smoke.py), and the cuda one also from C++ (the LibTorch
# example configured against the CMake package inside the installed wheel). torch itself comes
# from the project's .venv through a .pth file, so only our wheel is installed into the new
# environments. Without nvcc, or with a torch without CUDA, the cuda wheel cannot be built: it is
# reported as skipped.
#
# The C++ objects come from ccache: build-wheel-cpu/ and build-wheel/ sit beside build/ at the
# same depth (CCACHE_BASEDIR, scripts/build.sh) and compile the same lines, so only what differs
# is compiled: build_info.cpp and the one unity batch that holds the CUDA glue (CPU-only); with
# a GPU present, the CUDA kernels for its architectures.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
out=build/wheel-smoke
rm -rf "$out"
mkdir -p "$out"
project_site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

# wheel_venv NAME: a fresh venv for the wheel $out/NAME/dist/*.whl, installed, seeing .venv's torch.
wheel_venv() {
  local venv="$out/$1/venv"
  "$PY" -m venv "$venv"
  local venv_site
  venv_site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$project_site" > "$venv_site/project_torch.pth"
  "$venv/bin/python" -m pip install -q --no-deps "$out/$1"/dist/torch_rope-*.whl
}

# smoke NAME yes|no EXPECTED_ARCHES: Python checks from outside the source tree (so that
# `import torch_rope` cannot pick up python/torch_rope), then the architectures in the binary.
smoke() {
  local venv="$PWD/$out/$1/venv"
  (cd /tmp && "$venv/bin/python" "$OLDPWD/tests/wheel/smoke.py" --cuda "$2") |
    tee "$out/$1/smoke.log"
  local lib
  lib=$(find "$venv"/lib/python3*/site-packages/torch_rope/lib -name 'librope.so*' -type f |
    head -n 1)
  "$venv/bin/python" tests/integration/check_cuda_archs.py "$lib" --expect "$3"
}

echo "-- wheel cpu: TORCH_ROPE_CUDA=OFF pip wheel ."
rm -rf build-wheel-cpu
TORCH_ROPE_CUDA=OFF TORCH_ROPE_CMAKE_BUILD_DIR="$PWD/build-wheel-cpu" \
  "$PY" -m pip wheel . --no-build-isolation --no-deps -q -w "$out/cpu/dist"
wheel_venv cpu
smoke cpu no none

if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "-- wheel cuda: SKIPPED (no nvcc: a CUDA wheel cannot be built here)"
  exit 0
fi
if [ "$("$PY" -c 'import torch; print(torch.version.cuda is not None)')" != True ]; then
  echo "-- wheel cuda: SKIPPED (this torch has no CUDA: a CUDA wheel cannot be built against it)"
  exit 0
fi
# The architectures the cuda wheel must hold, from the GPUs torch sees (setup.py's rule, restated).
gpu_arches=$("$PY" -c '
import torch
n = torch.cuda.device_count() if torch.cuda.is_available() else 0
caps = sorted({torch.cuda.get_device_capability(i) for i in range(n)})
print(";".join(f"{a}.{b}" for a, b in caps))')
rm -rf build-wheel
if [ -n "$gpu_arches" ]; then
  expect="${gpu_arches}+PTX"
  echo "-- wheel cuda: pip wheel . for the GPUs present (TORCH_CUDA_ARCH_LIST unset);" \
    "expecting $expect"
  env -u TORCH_CUDA_ARCH_LIST TORCH_ROPE_CUDA=ON TORCH_ROPE_CMAKE_BUILD_DIR="$PWD/build-wheel" \
    "$PY" -m pip wheel . --no-build-isolation --no-deps -q -w "$out/cuda/dist"
else
  expect="default"
  echo "-- wheel cuda: pip wheel . with no GPU here (TORCH_CUDA_ARCH_LIST unset): the default list"
  env -u TORCH_CUDA_ARCH_LIST TORCH_ROPE_CUDA=ON TORCH_ROPE_CMAKE_BUILD_DIR="$PWD/build-wheel" \
    "$PY" -m pip wheel . --no-build-isolation --no-deps -q -w "$out/cuda/dist"
fi
wheel_venv cuda
smoke cuda yes "$expect"

wheel_prefix=$(sed -n 's/^cmake_prefix_path=//p' "$out/cuda/smoke.log")
torch_prefix=$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)')
cmake -S examples/cpp -B "$out/example" -G Ninja -DCMAKE_PREFIX_PATH="$wheel_prefix;$torch_prefix" > /dev/null
# Only the example that is run here: the other two link the same package, and the examples step
# of scripts/test.sh builds all three against the installed tree.
cmake --build "$out/example" --target attention_example
PYTHONPATH="$PWD/python" "$PY" tests/integration/check_example.py "$out/example/attention_example"
