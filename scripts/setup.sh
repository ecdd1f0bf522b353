#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Installs what the build needs, idempotently: Debian packages (cmake, ninja, GoogleTest, g++)
# when missing, and a project-local virtual environment (.venv) with the CUDA build of torch whose
# CUDA major version matches /usr/local/cuda's nvcc, plus the Python tools. Safe to re-run.
#
#   bash scripts/setup.sh             # everything the tests need (scripts/test.sh)
#   bash scripts/setup.sh --minimal   # what the demo runs (scripts/demo.sh): the build tools,
#                                     # torch and numpy; no GoogleTest, no test or lint tools, no
#                                     # integrations. A later full run adds the rest.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=full
if [ "${1:-}" = --minimal ]; then
  mode=minimal
fi

need_apt=()
command -v cmake >/dev/null || need_apt+=(cmake)
command -v ninja >/dev/null || need_apt+=(ninja-build)
command -v g++ >/dev/null || need_apt+=(g++)
# ccache: the wheel smoke's build reuses the main build's objects (scripts/build.sh, setup.py),
# and the demo's build (build-demo/) the CPU kernel copies of build/ and the other way round.
command -v ccache >/dev/null || need_apt+=(ccache)
if [ "$mode" = full ]; then
  [ -f /usr/include/gtest/gtest.h ] || need_apt+=(libgtest-dev)
fi
command -v python3 >/dev/null || need_apt+=(python3 python3-venv python3-dev)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}"
fi

# torch 2.13.x is the PyPI build for CUDA 13.0; pick the series that matches nvcc's major.
if [ -z "${TORCH_SPEC:-}" ]; then
  TORCH_SPEC="torch==2.13.*"
  if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
    nvcc_bin=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
    cuda_major=$("$nvcc_bin" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
    if [ "$cuda_major" != "13" ]; then
      echo "setup: warning: nvcc is CUDA $cuda_major; torch 2.13 wheels are CUDA 13. Set TORCH_SPEC to override." >&2
    fi
  fi
fi
# gmpy2: mpmath's integer backend (mpmath comes with torch, through sympy). The exact-angle tests
# check the kernels against mpmath at 200 to 400 bits; with gmpy2 the same results come a third
# faster (three of them: 39 s in pure Python, 27 s with gmpy2, on the 2-core VM, 2026-12-03).
requirements="$TORCH_SPEC numpy pytest pytest-xdist pybind11 expecttest matplotlib hypothesis==6.170.15 gmpy2==2.3.2 ruff==0.17.6 clang-format==23.1.5"
stamp=.venv/.torch-rope-requirements
# The demo's: what examples/attention_demo.py imports (torch; numpy, which torch warns without).
minimal_requirements="$TORCH_SPEC numpy"
minimal_stamp=.venv/.torch-rope-minimal-requirements
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
# The packages go in with uv (pinned, from PyPI), pip's drop-in installer: it fetches and unpacks
# torch's CUDA libraries in parallel. Both sets below took 38 s with uv and an empty uv cache, and
# 95 s with pip and a warm pip cache, on the 2-core VM (2026-11-28). --compile-bytecode writes the
# .pyc files at install, as pip does: without them, where PYTHONDONTWRITEBYTECODE is set (as on
# this VM), every process compiled torch's Python again (import torch 9 s instead of 4 s; pytest
# 457 s instead of 257 s in fresh clones). pip stays in .venv for `pip wheel`
# (scripts/wheel_smoke.sh) and installs when uv is not there.
uv_pin="uv==0.13.9"
# The minimal set shows its progress (uv's: the packages resolved, downloaded, installed, with a
# bar on a terminal): torch and its CUDA libraries are the demo's longest wait. It leaves the .pyc
# files to Python, which writes those of the modules a process imports (scripts/demo.sh lets it):
# compiling all 5,600 files of the set took 37 s of the demo's install, what the demo imports
# about 20 s once, and the full set compiles them all anyway.
quiet=(-q)
bytecode=(--compile-bytecode)
if [ "$mode" = minimal ]; then
  quiet=()
  bytecode=()
fi
venv_install() {
  if [ -x .venv/bin/uv ]; then
    .venv/bin/uv pip install "${quiet[@]}" "${bytecode[@]}" --python .venv/bin/python "$@"
  else
    .venv/bin/python -m pip install "${quiet[@]}" "$@"
  fi
}
install_uv() {
  local version
  version=$(.venv/bin/uv --version 2>/dev/null | cut -d' ' -f2 || true)
  if [ "$version" != "${uv_pin#uv==}" ]; then
    .venv/bin/python -m pip install -q --upgrade pip "$uv_pin" ||
      echo "setup: warning: could not install $uv_pin; installing with pip" >&2
  fi
}
if [ "$mode" = minimal ]; then
  # The full set holds the minimal one.
  if [ "$(cat "$stamp" 2>/dev/null)" != "$requirements" ] &&
     [ "$(cat "$minimal_stamp" 2>/dev/null)" != "$minimal_requirements" ]; then
    echo "setup: installing into .venv: $minimal_requirements (torch with its CUDA libraries:" \
      "about 4 GB installed, the longest step)"
    install_uv
    # shellcheck disable=SC2086
    venv_install $minimal_requirements
    echo "$minimal_requirements" > "$minimal_stamp"
  fi
  exit 0
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$requirements" ]; then
  echo "setup: installing into .venv: $requirements"
  install_uv
  # shellcheck disable=SC2086
  venv_install $requirements
  echo "$requirements" > "$stamp"
fi

# Optional integrations (torch_rope.hf, torch_rope.hf_kernel, torch_rope.diffusers,
# torch_rope.torchtune): torch_rope never needs them, but their tests run against the real
# libraries, so the test environment has them. Pinned to versions that install with torch 2.13:
# torchtune 0.6.1 imports torchao.dtypes.nf4tensor, which torchao 0.18 no longer has. kernels
# (transformers' kernel hook) 0.17.2 is the newest on PyPI here, below the 0.18.2 transformers
# 5.23 asks for: the hook's tests say how they cope. diffusers 0.42.1 brings no package the others
# do not already install at the same version. Set TORCH_ROPE_NO_INTEGRATIONS=1 to skip (their
# tests then skip).
integrations="transformers==5.23.0 diffusers==0.42.1 torchtune==0.6.1 torchao==0.17.0 kernels==0.17.2"
integrations_stamp=.venv/.torch-rope-integrations
if [ -z "${TORCH_ROPE_NO_INTEGRATIONS:-}" ] &&
   [ "$(cat "$integrations_stamp" 2>/dev/null)" != "$integrations" ]; then
  echo "setup: installing into .venv: $integrations"
  # shellcheck disable=SC2086
  venv_install $integrations
  echo "$integrations" > "$integrations_stamp"
fi
