#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Builds the wheel with `pip wheel .` (the main build's CUDA architectures), installs it into a
# fresh virtual environment and smoke-tests it there: Python (tests/wheel/smoke.py) and C++ (the
# LibTorch example configured against the CMake package inside the installed wheel). torch itself
# comes from the project's .venv through a .pth file, so only our wheel is installed into the new
# environment.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
out=build/wheel-smoke
rm -rf "$out"
mkdir -p "$out"
# The main build's CUDA architectures, so that ccache (CCACHE_BASEDIR, scripts/build.sh) serves
# every object from build/: build-wheel/ sits beside it at the same depth and its compile lines
# are the same. One architecture (90-real) compiled its CUDA code again: 131 s of the wheel
# step's 166 s from a cold cache on 2 cores (74 s in all now). The wheel is also the one a user
# gets. TORCH_ROPE_WHEEL_CUDA_ARCHITECTURES (CMake's form) still picks others.
rm -rf build-wheel
TORCH_ROPE_CUDA_ARCHITECTURES="${TORCH_ROPE_WHEEL_CUDA_ARCHITECTURES:-}" \
  TORCH_ROPE_CMAKE_BUILD_DIR="$PWD/build-wheel" \
  "$PY" -m pip wheel . --no-build-isolation --no-deps -q -w "$out/dist"
"$PY" -m venv "$out/venv"
project_site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
venv_site=$("$out/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$project_site" > "$venv_site/project_torch.pth"
"$out/venv/bin/python" -m pip install -q --no-deps "$out"/dist/torch_rope-*.whl
# Run outside the source tree so `import torch_rope` cannot pick up python/torch_rope.
smoke_log=$(cd /tmp && "$OLDPWD/$out/venv/bin/python" "$OLDPWD/tests/wheel/smoke.py")
echo "$smoke_log"
wheel_prefix=$(echo "$smoke_log" | sed -n 's/^cmake_prefix_path=//p')
torch_prefix=$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)')
cmake -S examples/cpp -B "$out/example" -G Ninja -DCMAKE_PREFIX_PATH="$wheel_prefix;$torch_prefix" > /dev/null
# Only the example that is run here: the other two link the same package, and the examples step
# of scripts/test.sh builds all three against the installed tree.
cmake --build "$out/example" --target attention_example
PYTHONPATH="$PWD/python" "$PY" tests/integration/check_example.py "$out/example/attention_example"
