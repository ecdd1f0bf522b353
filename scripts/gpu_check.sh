#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Validates and measures the CUDA kernels in one command, on a machine with a GPU and a torch
# already installed (any torch >= 2.4 with CUDA, e.g. 2.11 with Python 3.12). Downloads nothing.
#
#   bash scripts/gpu_check.sh [--out DIR] [--python PY] [--jobs N] [--arch LIST] [--budget SECONDS]
#                             [--skip-tuning] [--without-gpu] [--reuse-build DIR] [--dry-run]
#
# Steps, in order of value (each logs to DIR/<step>.log; DIR/summary.txt lists them as they end):
#   build        configure and build with CUDA on (DIR/build) for the GPU's own architecture only
#                (--arch overrides), with the GoogleTest suite (installed, or built from the
#                sources in .gtest/ or /usr/src/googletest)
#   ctest        the GoogleTest suite, CUDA cases included (TORCH_ROPE_REQUIRE_CUDA=1: none skips)
#   pytest-cuda  the pytest cases that run on CUDA (device-parametrised ones, test_cuda.py, the
#                >2^31-element and 65,536-block launches, graph capture), TORCH_ROPE_REQUIRE_CUDA=1
#   fuzz         CUDA against CPU on random calls (test_cuda_fuzz.py, ROPE_CUDA_FUZZ_EXAMPLES)
#   memcheck     compute-sanitizer memcheck on a subset, caching allocator off
#   initcheck    compute-sanitizer initcheck on the same subset
#   benchmark    benchmarks/bench_gpu.py --device cuda -> benchmarks/results/<gpu>.json, + plot
#   fused-benchmark  benchmarks/bench_fused_gpu.py: rms_norm_apply_qk and apply_qk_cache against
#                apply_qk alone and the unfused sequences -> benchmarks/results/fused_<gpu>.json
#   pytest-integrations  the integration tests' CUDA cases (HF kernel hook, compat entry points)
#   ncu          Nsight Compute summary of the main shapes (scripts/gpu_timing.py --once)
#   sass         registers, spills, occupancy, store widths (scripts/sass_report.py --check; CI
#                reads the SASS of every architecture too, so it comes late here)
#   tuning       the kernel rebuilt with other rows-in-flight / register budgets, timed side by
#                side (TUNE_VARIANTS, see below)
# A missing optional tool (GoogleTest, hypothesis, matplotlib, compute-sanitizer, ncu, cuobjdump)
# makes its step a visible SKIP. Without a GPU the script stops at once. Exit status: 0 when no
# step failed; otherwise 1, naming the failed steps.
#
# --budget SECONDS (default 480) bounds the whole run: each step runs under `timeout` with what is
# left (a step cut off FAILs, naming the budget), and a step that starts with nothing left is a
# visible SKIP. The summary and logs are written as each step ends, so a cut-off run still tells
# what ran.
#
# --without-gpu runs what needs no GPU (build, ctest, the CPU half of the fuzz, sass) and skips
# the rest: a check of this script itself on a CPU-only machine. --reuse-build DIR takes an
# existing build instead of building (its ctest already ran: that step is skipped).
# --wheels DIR installs the wheels in DIR (peers for the benchmark; the GPU machine cannot download)
# into a private folder on PYTHONPATH. --collect DIR copies the summary, the benchmark results and
# a tarball of every log into DIR when the run ends, however it ends (the device tool's $OUT).
# --dry-run prints exactly what the GPU run will do, what travels to the GPU machine and a time
# estimate per step, and runs nothing (no torch needed).
#
# Environment: FUZZ_EXAMPLES (default 1000); TUNE_VARIANTS, space-separated NAME=FLAGS entries
# (default below); BENCH_ARGS, extra arguments for bench_gpu.py.
# shellcheck disable=SC2317  # the run_* functions are called through step()
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
REPO=$PWD

OUT="$REPO/build/gpu_check"
PY="${PYTHON:-}"
JOBS="$(nproc 2>/dev/null || echo 4)"
SKIP_TUNING=0
WITHOUT_GPU=0
ARCH=""
BUDGET=480
REUSE_BUILD=""
DRY_RUN=0
WHEELS=""
COLLECT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --python) PY="$2"; shift 2 ;;
    --jobs) JOBS="$2"; shift 2 ;;
    --skip-tuning) SKIP_TUNING=1; shift ;;
    --without-gpu) WITHOUT_GPU=1; shift ;;
    --arch) ARCH="$2"; shift 2 ;;
    --budget) BUDGET="$2"; shift 2 ;;
    --reuse-build) REUSE_BUILD="$2"; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    --wheels) WHEELS="$2"; shift 2 ;;
    --collect) COLLECT="$2"; shift 2 ;;
    -h|--help) sed -n '2,44p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
# An absolute path that keeps a virtual environment's own interpreter (no symlink resolution).
case "$PY" in
  */*) [ -e "$PY" ] && PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")" ;;
  *) PY="$(command -v "$PY" || echo "$PY")" ;;
esac
FUZZ_EXAMPLES="${FUZZ_EXAMPLES:-1000}"
# Rows in flight per thread (ROPE_CUDA_ROW_BATCH) trade latency hiding for registers; a register
# budget (ROPE_CUDA_MIN_BLOCKS_PER_SM, the __launch_bounds__ minimum) trades them back.
TUNE_VARIANTS="${TUNE_VARIANTS:-default= rows2=-DROPE_CUDA_ROW_BATCH=2 rows8=-DROPE_CUDA_ROW_BATCH=8 blocks4=-DROPE_CUDA_MIN_BLOCKS_PER_SM=4}"

# ---- the plan: what the GPU run does, in order, with an estimate of each step ---------------------
# Seconds on an H100 machine (16 cores): measured on the first run there (2026-11-27, summary in
# benchmarks/results/gpu_check_h100/); memcheck and initcheck stopped early on that run, so theirs
# are estimates, and sass ran into its cap.
STEPS=(build ctest pytest-cuda fuzz memcheck initcheck benchmark fused-benchmark
       pytest-integrations ncu sass tuning)
declare -A ESTIMATE=([build]=95 [ctest]=10 [pytest-cuda]=135 [fuzz]=20 [memcheck]=60
  [initcheck]=40 [sass]=90 [benchmark]=75 [fused-benchmark]=35 [pytest-integrations]=25
  [ncu]=40 [tuning]=300)
# Each step's cap in seconds, inside the budget: the sanitizers and the integration tests are
# cut (and say so) rather than crowd out the benchmarks.
declare -A STEP_CAP=([build]=330 [ctest]=100 [pytest-cuda]=150 [fuzz]=60 [memcheck]=70
  [initcheck]=40 [sass]=90 [benchmark]=150 [fused-benchmark]=80 [pytest-integrations]=50
  [ncu]=45)
# The one command the device tool runs (scripts/gpu_check.sh --dry-run prints it; < 2,000 chars).
# .whl/ carries the peers' wheels (Liger-Kernel), .gtest/ GoogleTest's sources; both are ignored
# through .git/info/exclude and named in the tool's `carry`.
DEVICE_BUDGET=550
DEVICE_COMMAND="export PYTHONUNBUFFERED=1; timeout -k 10 590 bash scripts/gpu_check.sh --python python3 --out /tmp/gpu_check --budget $DEVICE_BUDGET --skip-tuning --wheels .whl --collect \"\$OUT\""

if [ "$DRY_RUN" = 1 ]; then
  echo "gpu_check --dry-run: what the GPU run will do (nothing is run now)"
  echo
  echo "device command (carry: .whl .gtest):"
  echo "  $DEVICE_COMMAND"
  echo
  # What travels: tracked and untracked-but-not-ignored files, and the carried folders.
  tree_bytes=$(git ls-files -z -co --exclude-standard | xargs -0 du -cb 2>/dev/null | tail -n 1 | cut -f1)
  carried=0
  for d in .whl .gtest; do
    if [ -d "$d" ]; then
      b=$(du -sb "$d" | cut -f1); carried=$((carried + b))
      echo "carried $d: $((b / 1024)) KiB ($(find "$d" -type f | wc -l) files)"
    else
      echo "carried $d: MISSING (see docs/gpu.md: how to prepare it)"
    fi
  done
  total=$((tree_bytes + carried))
  echo "working tree: $((tree_bytes / 1024)) KiB; with the carried folders: $((total / 1048576)) MiB of the 64 MiB limit"
  [ "$total" -lt $((64 * 1048576)) ] || { echo "gpu_check: over the 64 MiB limit" >&2; exit 1; }
  echo
  printf '%-20s %8s %6s %10s\n' step "est. s" "cap" cumulative
  sum=0
  for name in "${STEPS[@]}"; do
    est=${ESTIMATE[$name]}
    note=""
    if [ "$name" = tuning ] && [[ "$DEVICE_COMMAND" == *--skip-tuning* ]]; then
      note="(skipped: --skip-tuning)"; est=0
    fi
    sum=$((sum + est))
    flag=""; [ "$sum" -gt "$DEVICE_BUDGET" ] && flag="(past the --budget $DEVICE_BUDGET s: skipped if the estimates hold)"
    printf '%-20s %8d %6s %10d %s %s\n' "$name" "$est" "${STEP_CAP[$name]:--}" "$sum" "$note" "$flag"
  done
  echo
  echo "budget: ${DEVICE_BUDGET} s for the steps, inside the device command's 590 s timeout; the machine's"
  echo "start (1-2 min) and give-back come on top: about 12 of the session's 15 device minutes."
  exit 0
fi

# ---- no GPU: stop before anything is built or written -------------------------------------------
if [ "$WITHOUT_GPU" = 0 ] &&
   ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  if ! "$PY" -c 'import torch' 2>/dev/null; then
    echo "gpu_check: $PY cannot import torch; install torch (with CUDA) first, or pass --python." >&2
  else
    echo "gpu_check: no CUDA GPU is visible to torch ($PY: torch.cuda.is_available() is False)." >&2
    echo "gpu_check: this script validates and measures the CUDA kernels on a machine with a GPU;" >&2
    echo "gpu_check: nothing was run. Without a GPU, 'ctest --test-dir build -L cuda-host' runs the" >&2
    echo "gpu_check: kernel on the host and 'python scripts/sass_report.py --check' reads its SASS." >&2
  fi
  exit 2
fi

mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
FAILED=()
CURRENT_STEP_PID=""

# --collect: whatever happens (a failure, the budget, an outer timeout's TERM), the logs come back.
collect() {
  [ -n "$COLLECT" ] || return 0
  [ -n "$CURRENT_STEP_PID" ] && kill_tree KILL "$CURRENT_STEP_PID"
  mkdir -p "$COLLECT"
  cp "$SUMMARY" "$COLLECT/" 2>/dev/null
  mkdir -p "$OUT/results"
  local f
  for f in "$REPO"/benchmarks/results/*"${GPU_SLUG:-none}"*; do
    [ -f "$f" ] || continue
    cp "$f" "$OUT/results/"
    case "$f" in *.json) cp "$f" "$COLLECT/" ;; esac
  done
  tar czf "$COLLECT/gpu_check_logs.tgz" -C "$OUT" --exclude=./build --exclude=./tune \
    --exclude=./site .
  echo "gpu_check: collected into $COLLECT:"
  find "$COLLECT" -maxdepth 1 -type f -printf '  %f %s bytes\n'
}
trap collect EXIT
trap 'echo "gpu_check: terminated"; exit 143' TERM INT

# --wheels: the packages the GPU machine lacks, installed privately (it cannot download).
if [ -n "$WHEELS" ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$OUT/site" "$WHEELS"/*.whl || echo "gpu_check: installing $WHEELS/*.whl failed"
  export PYTHONPATH="$OUT/site${PYTHONPATH:+:$PYTHONPATH}"
fi
PYPATH="$REPO/python${PYTHONPATH:+:$PYTHONPATH}"
GPU_NAME="$("$PY" -c 'import torch; print(torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU")')"
GPU_SLUG="$(echo "$GPU_NAME" | tr ' /' '__')"
{
  echo "gpu_check $(date -u +%Y-%m-%dT%H:%MZ) on $GPU_NAME"
  "$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "| torch", torch.__version__, "| CUDA", torch.version.cuda)'
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
} | tee -a "$SUMMARY"

# step NAME CMD...: runs CMD with its output in $OUT/NAME.log, under what is left of --budget;
# exit 77 means a visible skip. The summary line is written as soon as the step ends.
RUN_START=$SECONDS
# A step's whole process tree, children first (pytest and its workers, compute-sanitizer and its
# target). Not job control (`set -m`): a background job of a shell with job control could stop on
# SIGTTOU and hang its step until the deadline (seen in the test command).
kill_tree() {
  local sig="$1" pid="$2" child
  for child in $(pgrep -P "$pid" 2>/dev/null); do
    kill_tree "$sig" "$child"
  done
  kill -"$sig" "$pid" 2>/dev/null
}
step() {
  local name="$1"; shift
  local log="$OUT/$name.log"
  echo "== $name"
  local start=$SECONDS
  local left=$((BUDGET - (SECONDS - RUN_START)))
  # A step's own cap (STEP_CAP) keeps a slow step (a sanitizer) from eating the later ones.
  local cap="${STEP_CAP[$name]:-$left}" capped=0
  if [ "$cap" -lt "$left" ]; then left=$cap; capped=1; fi
  if [ "$left" -le 5 ]; then
    printf '%-20s SKIP  %4ds  the --budget of %ss was spent before it could start\n' \
      "$name" 0 "$BUDGET" | tee -a "$SUMMARY"
    return 77
  fi
  "$@" > "$log" 2>&1 &
  local pid=$!
  CURRENT_STEP_PID=$pid
  local why_stopped="the --budget of ${BUDGET}s ran out"
  [ "$capped" = 1 ] && why_stopped="its cap of ${left}s ran out (STEP_CAP; what ran is above)"
  ( sleep "$left"; echo "gpu_check: stopped: $why_stopped" >> "$log"
    kill_tree TERM "$pid"; sleep 10; kill_tree KILL "$pid" ) &
  local watchdog=$!
  wait "$pid"
  local rc=$?
  CURRENT_STEP_PID=""
  kill_tree TERM "$watchdog"
  wait "$watchdog" 2>/dev/null
  local took=$((SECONDS - start))
  if [ $rc -eq 0 ]; then
    printf '%-20s PASS  %4ds  %s\n' "$name" "$took" "$log" | tee -a "$SUMMARY"
  elif [ $rc -eq 77 ]; then
    printf '%-20s SKIP  %4ds  %s\n' "$name" "$took" "$(tail -n 1 "$log")" | tee -a "$SUMMARY"
  else
    if grep -q "gpu_check: stopped: its cap" "$log" && ! grep -qE "^(FAILED|ERROR) |[0-9]+ failed" "$log"; then
      # Cut off by its own cap with no failure so far: partial, not failed (the log says how far).
      printf '%-20s CUT   %4ds  %s (its cap ran out before the end; no failure up to there)\n' \
        "$name" "$took" "$log" | tee -a "$SUMMARY"
      return 0
    fi
    local why=""
    grep -q "gpu_check: stopped:" "$log" && why=", $(grep -o "stopped: .*" "$log" | tail -n 1)"
    printf '%-20s FAIL  %4ds  %s (exit %d%s)\n' "$name" "$took" "$log" "$rc" "$why" |
      tee -a "$SUMMARY"
    tail -n 20 "$log" | sed 's/^/    /'
    FAILED+=("$name")
  fi
  return $rc
}

# A visible skip: callers write `... || { skip "why"; return 77; }`.
skip() { echo "SKIPPED: $*"; }
# For the steps that cannot run at all without a GPU.
needs_gpu() { [ "$WITHOUT_GPU" = 0 ] || { skip "no GPU (--without-gpu)"; return 77; }; }

have_python_module() { "$PY" -c "import $1" 2>/dev/null; }

find_cuda_tool() {
  command -v "$1" 2>/dev/null && return 0
  for d in "${CUDA_HOME:-}" /usr/local/cuda /opt/cuda; do
    [ -n "$d" ] && [ -x "$d/bin/$1" ] && { echo "$d/bin/$1"; return 0; }
  done
  return 1
}

TORCH_PREFIX="$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)')"
GENERATOR=()
command -v ninja >/dev/null && GENERATOR=(-G Ninja)
HAVE_GTEST=0
GTEST_ARGS=()
# (In a scratch directory: the probe leaves a CMakeFiles/ behind.)
PROBE_DIR="$(mktemp -d)"
if (cd "$PROBE_DIR" && cmake --find-package -DNAME=GTest -DCOMPILER_ID=GNU -DLANGUAGE=CXX \
      -DMODE=EXIST 2>/dev/null) | grep -q "GTest found"; then
  HAVE_GTEST=1
elif [ -f /usr/include/gtest/gtest.h ] || [ -f /usr/local/include/gtest/gtest.h ]; then
  HAVE_GTEST=1
else
  # No GoogleTest installed (the GPU machine): build it from carried or Debian sources.
  for src in "$REPO/.gtest" /usr/src/googletest; do
    if [ -f "$src/CMakeLists.txt" ]; then
      HAVE_GTEST=1; GTEST_ARGS=(-DTORCH_ROPE_GTEST_SOURCE_DIR="$src"); break
    fi
  done
fi
rm -rf "$PROBE_DIR"

# The GPU's own architecture only (a build for every supported one takes several times longer):
# compute capability 9.0 -> CMAKE_CUDA_ARCHITECTURES=90-real. --arch overrides; without a GPU the
# CMake default list stands.
if [ -z "$ARCH" ] && [ "$WITHOUT_GPU" = 0 ]; then
  ARCH="$("$PY" -c 'import torch; a, b = torch.cuda.get_device_capability(); print(f"{a}{b}-real")')"
fi
ARCH_ARGS=()
[ -n "$ARCH" ] && ARCH_ARGS=(-DCMAKE_CUDA_ARCHITECTURES="$ARCH")
BUILD_DIR="${REUSE_BUILD:-$OUT/build}"
[ "$WITHOUT_GPU" = 0 ] && export TORCH_ROPE_REQUIRE_CUDA=1  # a CUDA case that skips fails

# configure_and_build DIR [EXTRA CMAKE ARGS...]
configure_and_build() {
  local dir="$1"; shift
  cmake -S "$REPO" -B "$dir" "${GENERATOR[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" -DPython3_EXECUTABLE="$PY" \
    -DTORCH_ROPE_CUDA=ON "${ARCH_ARGS[@]}" "$@" &&
  cmake --build "$dir" --parallel "$JOBS"
}

build_main() {
  if [ -n "$REUSE_BUILD" ]; then
    [ -f "$REUSE_BUILD/librope.so" ] || { echo "--reuse-build $REUSE_BUILD: no librope.so there"; return 1; }
    skip "--reuse-build $REUSE_BUILD: built already"; return 77
  fi
  local tests=OFF
  [ "$HAVE_GTEST" = 1 ] && tests=ON
  echo "GoogleTest: $HAVE_GTEST ${GTEST_ARGS[*]}; CUDA architectures: ${ARCH:-the CMake default}"
  # Without Python's headers the extension cannot be built; the C++ library and its GoogleTest
  # suite (the CUDA cases included) still can, so build those and say so.
  local python_args=()
  if ! "$PY" -c 'import os, sys, sysconfig
sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")) else 1)'; then
    echo "gpu_check: $PY has no Python.h: torch_rope._C is not built, the pytest steps will fail"
    python_args=(-DTORCH_ROPE_BUILD_PYTHON=OFF)
  fi
  # The host run of the kernels (tests/cuda_host) is every CI run's; here the GPU runs them.
  configure_and_build "$BUILD_DIR" -DTORCH_ROPE_BUILD_TESTS="$tests" "${GTEST_ARGS[@]}" \
    -DTORCH_ROPE_CUDA_HOST_TESTS=OFF "${python_args[@]}"
}

run_ctest() {
  [ -z "$REUSE_BUILD" ] || { skip "--reuse-build: the test command ran this build's ctest"; return 77; }
  [ "$HAVE_GTEST" = 1 ] || { skip "GoogleTest not found: no C++ test suite was built"; return 77; }
  ctest --test-dir "$BUILD_DIR" --output-on-failure --timeout 900 || return 1
  # A GPU is present, so no CUDA case may skip for want of one.
  if [ "$WITHOUT_GPU" = 0 ] &&
     grep -q "CUDA not available" "$BUILD_DIR/Testing/Temporary/LastTest.log"; then
    echo "CUDA GoogleTest cases skipped although a GPU is present"; return 1
  fi
}

# pytest-xdist, where installed, runs the cases on several processes (one GPU, many cores).
xdist_args() {
  if have_python_module xdist; then echo "-n 8"; fi
}

run_pytest_cuda() {
  needs_gpu || return 77
  # shellcheck disable=SC2046
  PYTHONPATH="$PYPATH" "$PY" -m pytest "$REPO/tests/python/ops" "$REPO/tests/python/kernels" \
    "$REPO/tests/python/module" -q -ra -k cuda -p no:cacheprovider $(xdist_args) || return 1
}

run_pytest_integrations() {
  needs_gpu || return 77
  # shellcheck disable=SC2046
  PYTHONPATH="$PYPATH" "$PY" -m pytest "$REPO/tests/python/integrations" -q -ra -k cuda \
    -p no:cacheprovider $(xdist_args) || return 1
}

run_fuzz() {
  have_python_module hypothesis || { skip "hypothesis not installed"; return 77; }
  ROPE_CUDA_FUZZ_EXAMPLES="$FUZZ_EXAMPLES" PYTHONPATH="$PYPATH" "$PY" -m pytest \
    "$REPO/tests/python/kernels/test_cuda_fuzz.py" -q -ra -p no:cacheprovider
}

run_sanitizer() {
  local tool="$1"
  needs_gpu || return 77
  local cs
  cs="$(find_cuda_tool compute-sanitizer)" || { skip "compute-sanitizer not found"; return 77; }
  # Only our kernel is judged where this compute-sanitizer can filter (torch's own kernels are
  # not this project's to fix).
  local filter=()
  # (memcheck judges every kernel, torch's too; initcheck only rope_kernel, as torch's own
  # kernels are not this project's to fix.)
  if [ "$tool" = initcheck ] && "$cs" --help 2>&1 | grep -q -- "--kernel-name "; then
    filter=(--kernel-name kns=rope_kernel)
  fi
  # The caching allocator would hide out-of-bounds accesses inside its blocks. The test that
  # counts launches with torch.profiler is left out: CUPTI refuses a second subscriber
  # (CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED under compute-sanitizer, first H100 run);
  # test_apply_qk_of_inputs_made_on_the_device_matches_the_cpu keeps its apply_qk call in.
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 ROPE_CUDA_FUZZ_EXAMPLES=30 ROPE_CPU_FUZZ_EXAMPLES=1 \
  PYTHONPATH="$PYPATH" "$cs" --tool "$tool" --error-exitcode 3 "${filter[@]}" \
    "$PY" -m pytest -q -p no:cacheprovider -x \
      "$REPO/tests/python/kernels/test_cuda.py" "$REPO/tests/python/kernels/test_cuda_fuzz.py" \
      -k "not device_assert and not current_stream and not one_kernel_launch"
}

run_sass() {
  [ -z "$REUSE_BUILD" ] || { skip "--reuse-build: the test command's ctest (cuda_sass_check) read this build's SASS"; return 77; }
  "$PY" "$REPO/scripts/sass_report.py" --check --markdown "$OUT/sass.md" --json "$OUT/sass.json" \
    "$BUILD_DIR/librope.so"
}

run_fused_benchmark() {
  needs_gpu || return 77
  PYTHONPATH="$PYPATH" "$PY" "$REPO/benchmarks/bench_fused_gpu.py" --device cuda \
    --output "$GPU_SLUG" || return 1
  cp "$REPO/benchmarks/results/fused_$GPU_SLUG".{json,md} "$OUT/" 2>/dev/null
  return 0
}

run_benchmark() {
  needs_gpu || return 77
  local args=(--device cuda)
  args+=(--output "$GPU_SLUG")
  # shellcheck disable=SC2206
  args+=(${BENCH_ARGS:-})
  PYTHONPATH="$PYPATH" "$PY" "$REPO/benchmarks/bench_gpu.py" "${args[@]}" || return 1
  local results
  # shellcheck disable=SC2012  # the newest file; the names are the benchmark's own
  results="$(ls -t "$REPO"/benchmarks/results/*.json | head -n 1)"
  echo "results: $results"
  cp "$results" "${results%.json}.md" "$OUT/" 2>/dev/null
  if ! have_python_module matplotlib; then
    echo "SKIPPED the plot: matplotlib not installed"; return 0
  fi
  "$PY" - "$results" "${results%.json}.png" <<'PLOT'
import json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
src, dst = sys.argv[1], sys.argv[2]
rows = json.load(open(src)).get("rows", [])
rows = [r for r in rows if "ours_over_clone" in r]
if not rows:
    sys.exit("no rows with ours_over_clone in " + src)
labels = [f"{r.get('case')} {r.get('dtype')} {r.get('pass', '')}".strip() for r in rows]
fig, ax = plt.subplots(figsize=(10, 0.32 * len(rows) + 1.5))
y = range(len(rows))
ax.barh(y, [r["ours_over_clone"] for r in rows], label="torch-rope / clone")
if all("eager_over_ours" in r for r in rows):
    ax.barh(y, [r["ours_over_clone"] * r["eager_over_ours"] for r in rows], alpha=0.3,
            label="eager / clone")
ax.axvline(1.0, color="k", lw=0.8)
ax.set_yticks(list(y), labels, fontsize=7)
ax.set_xlabel("time / x.clone() time (lower is better)")
ax.set_title(json.load(open(src)).get("meta", {}).get("device", ""))
ax.legend()
fig.tight_layout()
fig.savefig(dst, dpi=120)
print("plot:", dst)
PLOT
  cp "${results%.json}.png" "$OUT/" 2>/dev/null
  return 0
}

run_ncu() {
  needs_gpu || return 77
  local ncu
  ncu="$(find_cuda_tool ncu)" || { skip "ncu (Nsight Compute) not found"; return 77; }
  PYTHONPATH="$PYPATH" "$ncu" --kernel-name regex:rope_kernel --launch-count 30 \
    --section SpeedOfLight --section Occupancy --section LaunchStats \
    --section MemoryWorkloadAnalysis --csv --page details \
    "$PY" "$REPO/scripts/gpu_timing.py" --once > "$OUT/ncu.csv" || return 1
  echo "ncu details: $OUT/ncu.csv"
  # One line per profiled launch: the kernel, its duration, DRAM throughput, occupancy.
  "$PY" - "$OUT/ncu.csv" <<'NCU'
import collections, csv, sys
rows = list(csv.reader(line for line in open(sys.argv[1]) if line.startswith('"')))
if not rows:
    sys.exit("no ncu rows")
head = rows[0]
col = {name: head.index(name) for name in ("ID", "Kernel Name", "Metric Name", "Metric Unit", "Metric Value")}
want = ("Duration", "DRAM Throughput", "Achieved Occupancy", "Registers Per Thread", "Grid Size")
launches = collections.OrderedDict()
for r in rows[1:]:
    if len(r) > col["Metric Value"] and r[col["Metric Name"]] in want:
        d = launches.setdefault(r[col["ID"]], {"kernel": r[col["Kernel Name"]][:60]})
        d[f'{r[col["Metric Name"]]} ({r[col["Metric Unit"]]})'] = r[col["Metric Value"]]
for launch_id, d in launches.items():
    print(launch_id, " | ".join(f"{k}: {v}" for k, v in d.items()))
NCU
}

run_tuning() {
  [ "$SKIP_TUNING" = 0 ] || { skip "--skip-tuning"; return 77; }
  needs_gpu || return 77
  local pkg_src="$REPO/python/torch_rope"
  for entry in $TUNE_VARIANTS; do
    local name="${entry%%=*}" flags="${entry#*=}"
    local dir="$OUT/tune/$name"
    echo "--- $name: CMAKE_CUDA_FLAGS='$flags'"
    mkdir -p "$dir/pkg"
    # A private copy of the Python package, so each build's _C and librope load side by side.
    rm -rf "$dir/pkg/torch_rope" && cp -r "$pkg_src" "$dir/pkg/torch_rope"
    rm -f "$dir/pkg/torch_rope"/_C*.so "$dir/pkg/torch_rope"/librope.so*
    configure_and_build "$dir/build" -DTORCH_ROPE_BUILD_TESTS=OFF \
      -DCMAKE_CUDA_FLAGS="$flags" -DTORCH_ROPE_PYTHON_PACKAGE_DIR="$dir/pkg/torch_rope" \
      > "$dir/build.log" 2>&1 || { echo "build of $name failed: $dir/build.log"; return 1; }
    "$PY" "$REPO/scripts/sass_report.py" "$dir/build/librope.so" > "$dir/sass.md" 2>&1
    grep -E "^\| (bf16|fp16|fp32) / fp32 tables" "$dir/sass.md" | head -n 12 | sed "s/^/$name /"
    PYTHONPATH="$dir/pkg${PYTHONPATH:+:$PYTHONPATH}" "$PY" "$REPO/scripts/gpu_timing.py" --label "$name" \
      --json "$dir/timing.json" || return 1
  done
  "$PY" - "$OUT/tune" <<'TABLE' | tee "$OUT/tuning.md"
import json, pathlib, sys
builds = sorted(pathlib.Path(sys.argv[1]).glob("*/timing.json"))
data = {b.parent.name: json.loads(b.read_text())["rows"] for b in builds}
names = list(data)
keys = [(r["shape"], r["dtype"]) for r in data[names[0]]]
print("| shape | dtype | " + " | ".join(f"{n} (ours/clone)" for n in names) + " |")
print("|---|---|" + "---|" * len(names))
for shape, dtype in keys:
    cells = []
    for n in names:
        match = [r for r in data[n] if r["shape"] == shape and r["dtype"] == dtype]
        cells.append(f"{match[0]['ours_over_clone']:.3f}" if match else "-")
    print(f"| {shape} | {dtype} | " + " | ".join(cells) + " |")
TABLE
}

# ---- the steps ----------------------------------------------------------------------------------
step build build_main
build_rc=$?
if [ $build_rc -ne 0 ] && [ $build_rc -ne 77 ]; then
  echo "gpu_check: the build failed; nothing else can run. See $OUT/build.log" | tee -a "$SUMMARY"
  exit 1
fi
step ctest run_ctest
step pytest-cuda run_pytest_cuda
step fuzz run_fuzz
step memcheck run_sanitizer memcheck
step initcheck run_sanitizer initcheck
step benchmark run_benchmark
step fused-benchmark run_fused_benchmark
step pytest-integrations run_pytest_integrations
step ncu run_ncu
step sass run_sass
step tuning run_tuning

echo
cat "$SUMMARY"
if [ ${#FAILED[@]} -gt 0 ]; then
  echo "gpu_check: FAILED steps: ${FAILED[*]} (logs in $OUT)"
  exit 1
fi
echo "gpu_check: every step passed or was skipped; results in $OUT"
if [ "$WITHOUT_GPU" = 0 ]; then
  echo "gpu_check: commit benchmarks/results/$GPU_SLUG.{json,md,png}; quote $OUT/sass.md, $OUT/tuning.md"
fi
exit 0
