#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The demo: installs what it runs, builds what it runs, and runs examples/attention_demo.py.
#
# It builds in build-demo/, never in build/ (the test command's): the CPU library with DEFAULT
# and the widest CPU kernel copy this CPU runs (the one an every-copy build would run here, so
# the speed is the same), the Python extension, and, when torch sees a GPU and nvcc is there,
# the CUDA kernels for that GPU's architecture only; never the C++ tests. Its Python package,
# build-demo/python/torch_rope, links to python/torch_rope's sources beside the extension built
# here, so the test command's extension in python/torch_rope is never replaced.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
BUILD=build-demo
PKG="$BUILD/python/torch_rope"

# Python writes the .pyc files of what the demo imports, once, into .venv (scripts/setup.sh
# --minimal does not compile them all), even where PYTHONDONTWRITEBYTECODE is set: without them
# every process compiled torch's modules again (import torch 9 s instead of 4 s).
unset PYTHONDONTWRITEBYTECODE

echo "== demo [1/3]: install (scripts/setup.sh --minimal: the build tools, torch, numpy)"
bash scripts/setup.sh --minimal

# The GPUs torch can use (the demo runs on what torch sees), as "9.0" or "8.6;9.0", and the name
# of the first; "-" for none.
probe=$("$PY" - <<'EOF'
import torch

print(torch.utils.cmake_prefix_path)
n = torch.cuda.device_count() if torch.cuda.is_available() else 0
caps = sorted({torch.cuda.get_device_capability(i) for i in range(n)})
print(";".join(f"{a}.{b}" for a, b in caps) or "-")
print(torch.cuda.get_device_name(0) if n else "-")
EOF
)
torch_prefix=$(sed -n 1p <<< "$probe")
gpu_arches=$(sed -n 2p <<< "$probe")
gpu_name=$(sed -n 3p <<< "$probe")
have_nvcc=0
{ command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; } && have_nvcc=1

cmake_args=(-DTORCH_ROPE_BUILD_TESTS=OFF -DTORCH_ROPE_CPU_KERNELS=native
  -DTORCH_ROPE_PYTHON_PACKAGE_DIR="$PWD/$PKG")
if [ "$gpu_arches" != - ] && [ "$have_nvcc" = 1 ]; then
  sm=$(echo "$gpu_arches" | sed 's/\.//g; s/^/sm_/; s/;/, sm_/g')
  cmake_args+=(-DTORCH_ROPE_CUDA=ON -DTORCH_CUDA_ARCH_LIST="$gpu_arches"
    -DCMAKE_CUDA_ARCHITECTURES=OFF)
  cuda_what="and the CUDA kernels for $sm only (the GPU here: $gpu_name)"
elif [ "$gpu_arches" != - ]; then
  cmake_args+=(-DTORCH_ROPE_CUDA=OFF)
  cuda_what="and no CUDA kernels (a GPU, $gpu_name, but no nvcc to compile them)"
else
  cmake_args+=(-DTORCH_ROPE_CUDA=OFF)
  cuda_what="and no CUDA kernels (no GPU here: torch.cuda.is_available() is False)"
fi

# ccache as scripts/build.sh sets it up: the CPU kernel copies and torch_rope._C compile with the
# same lines here as in build/, so each build serves the other's objects.
launcher=()
if command -v ccache >/dev/null; then
  export CCACHE_BASEDIR="$PWD"
  export CCACHE_NOHASHDIR=1
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
mkdir -p "$BUILD"
configured="${cmake_args[*]} ${launcher[*]} $torch_prefix"
if [ ! -f "$BUILD/CMakeCache.txt" ] ||
   [ "$(cat "$BUILD/.demo-configure" 2>/dev/null)" != "$configured" ]; then
  rm -f "$BUILD/.demo-configure"
  if ! cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$torch_prefix" -DPython3_EXECUTABLE="$PWD/$PY" \
      "${launcher[@]}" "${cmake_args[@]}" > "$BUILD/configure.log" 2>&1; then
    cat "$BUILD/configure.log"
    echo "demo: cmake failed (its output is above, and in $BUILD/configure.log)" >&2
    exit 1
  fi
  echo "$configured" > "$BUILD/.demo-configure"
fi
copies=$(sed -n 's/^-- torch-rope: CPU kernel copies: \([^ ]*\) .*/\1/p' "$BUILD/configure.log")
widest=${copies##*;}
echo "== demo [2/3]: build in $BUILD/ the CPU library (CPU kernels: $widest, this CPU's widest," \
  "and DEFAULT), the Python extension $cuda_what; no C++ tests (the demo runs none)"
cmake --build "$BUILD" --parallel "${BUILD_JOBS:-$(nproc)}"
# The package: python/torch_rope's sources (not the build outputs of build/ kept there) beside
# this build's extension and librope.
find "$PKG" -maxdepth 1 -type l -delete
for entry in python/torch_rope/*; do
  case "${entry##*/}" in *.so | *.so.* | lib | include | __pycache__) continue ;; esac
  ln -s "$PWD/$entry" "$PKG/${entry##*/}"
done

echo "== demo [3/3]: run examples/attention_demo.py"
PYTHONPATH="$PWD/$BUILD/python" "$PY" examples/attention_demo.py

default_arches=$(sed -n 's/^set(TORCH_ROPE_DEFAULT_CUDA_ARCH_LIST "\(.*\)")$/\1/p' CMakeLists.txt)
echo
echo "demo: $BUILD/ holds only what the demo ran. For the rest:"
echo "  bash scripts/test.sh    # builds build/ (every CPU kernel copy, the CUDA kernels for" \
  "$default_arches, the C++ tests) and runs every test"
echo "  bash scripts/build.sh   # that build alone; add -DTORCH_CUDA_ARCH_LIST=\"8.0;9.0+PTX\"" \
  "(say) for other CUDA architectures"
echo "  pip install --no-build-isolation .   # into your environment, for the GPUs present" \
  "(README.md)"
