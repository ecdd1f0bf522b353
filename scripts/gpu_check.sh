#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Validates and measures the CUDA kernels in one command, on a machine with a GPU and a torch
# already installed (any torch >= 2.4 with CUDA, e.g. 2.11 with Python 3.12). Downloads nothing.
#
#   bash scripts/gpu_check.sh [--out DIR] [--python PY] [--jobs N] [--skip-tuning] [--without-gpu]
#
# Steps (each logs to DIR/<step>.log; DIR/summary.txt lists them):
#   build        configure and build with CUDA on (DIR/build), with the GoogleTest suite if found
#   ctest        the GoogleTest suite (CUDA cases included), the host run, the SASS check
#   pytest-cuda  the pytest cases that run on CUDA (device-parametrised ones, test_cuda.py)
#   fuzz         CUDA against CPU on random calls (test_cuda_fuzz.py, ROPE_CUDA_FUZZ_EXAMPLES)
#   memcheck     compute-sanitizer memcheck on a subset, caching allocator off
#   initcheck    compute-sanitizer initcheck on the same subset
#   sass         registers, spills, occupancy, store widths (scripts/sass_report.py --check)
#   benchmark    benchmarks/bench_gpu.py --device cuda -> benchmarks/results/<gpu>.json, + plot
#   fused-benchmark  benchmarks/bench_fused_gpu.py: rms_norm_apply_qk and apply_qk_cache against
#                apply_qk alone and the unfused sequences -> benchmarks/results/fused_<gpu>.json
#   ncu          Nsight Compute summary of the main shapes (scripts/gpu_timing.py --once)
#   tuning       the kernel rebuilt with other rows-in-flight / register budgets, timed side by
#                side (TUNE_VARIANTS, see below)
# A missing optional tool (GoogleTest, hypothesis, matplotlib, compute-sanitizer, ncu, cuobjdump)
# makes its step a visible SKIP. Without a GPU the script stops at once. Exit status: 0 when no
# step failed; otherwise 1, naming the failed steps.
#
# --without-gpu runs what needs no GPU (build, ctest, the CPU half of the fuzz, sass) and skips
# the rest: a check of this script itself on a CPU-only machine.
#
# Environment: FUZZ_EXAMPLES (default 5000); TUNE_VARIANTS, space-separated NAME=FLAGS entries
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
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --python) PY="$2"; shift 2 ;;
    --jobs) JOBS="$2"; shift 2 ;;
    --skip-tuning) SKIP_TUNING=1; shift ;;
    --without-gpu) WITHOUT_GPU=1; shift ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
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
FUZZ_EXAMPLES="${FUZZ_EXAMPLES:-5000}"
# Rows in flight per thread (ROPE_CUDA_ROW_BATCH) trade latency hiding for registers; a register
# budget (ROPE_CUDA_MIN_BLOCKS_PER_SM, the __launch_bounds__ minimum) trades them back.
TUNE_VARIANTS="${TUNE_VARIANTS:-default= rows2=-DROPE_CUDA_ROW_BATCH=2 rows8=-DROPE_CUDA_ROW_BATCH=8 blocks4=-DROPE_CUDA_MIN_BLOCKS_PER_SM=4}"

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
GPU_NAME="$("$PY" -c 'import torch; print(torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU")')"
GPU_SLUG="$(echo "$GPU_NAME" | tr ' /' '__')"
{
  echo "gpu_check $(date -u +%Y-%m-%dT%H:%MZ) on $GPU_NAME"
  "$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "| torch", torch.__version__, "| CUDA", torch.version.cuda)'
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
} | tee -a "$SUMMARY"

# step NAME CMD...: runs CMD with its output in $OUT/NAME.log; exit 77 means a visible skip.
step() {
  local name="$1"; shift
  local log="$OUT/$name.log"
  echo "== $name"
  local start=$SECONDS
  "$@" > "$log" 2>&1
  local rc=$?
  local took=$((SECONDS - start))
  if [ $rc -eq 0 ]; then
    printf '%-12s PASS  %4ds  %s\n' "$name" "$took" "$log" | tee -a "$SUMMARY"
  elif [ $rc -eq 77 ]; then
    printf '%-12s SKIP  %4ds  %s\n' "$name" "$took" "$(tail -n 1 "$log")" | tee -a "$SUMMARY"
  else
    printf '%-12s FAIL  %4ds  %s (exit %d)\n' "$name" "$took" "$log" "$rc" | tee -a "$SUMMARY"
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
# (In a scratch directory: the probe leaves a CMakeFiles/ behind.)
PROBE_DIR="$(mktemp -d)"
if (cd "$PROBE_DIR" && cmake --find-package -DNAME=GTest -DCOMPILER_ID=GNU -DLANGUAGE=CXX \
      -DMODE=EXIST 2>/dev/null) | grep -q "GTest found"; then
  HAVE_GTEST=1
elif [ -f /usr/include/gtest/gtest.h ] || [ -f /usr/local/include/gtest/gtest.h ]; then
  HAVE_GTEST=1
fi
rm -rf "$PROBE_DIR"

# configure_and_build DIR [EXTRA CMAKE ARGS...]
configure_and_build() {
  local dir="$1"; shift
  cmake -S "$REPO" -B "$dir" "${GENERATOR[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" -DPython3_EXECUTABLE="$PY" \
    -DTORCH_ROPE_CUDA=ON "$@" &&
  cmake --build "$dir" --parallel "$JOBS"
}

build_main() {
  local tests=OFF
  [ "$HAVE_GTEST" = 1 ] && tests=ON
  echo "GoogleTest found: $HAVE_GTEST"
  configure_and_build "$OUT/build" -DTORCH_ROPE_BUILD_TESTS="$tests"
}

run_ctest() {
  [ "$HAVE_GTEST" = 1 ] || { skip "GoogleTest not found: no C++ test suite was built"; return 77; }
  ctest --test-dir "$OUT/build" --output-on-failure --timeout 900 || return 1
  # A GPU is present, so no CUDA case may skip for want of one.
  if [ "$WITHOUT_GPU" = 0 ] &&
     grep -q "CUDA not available" "$OUT/build/Testing/Temporary/LastTest.log"; then
    echo "CUDA GoogleTest cases skipped although a GPU is present"; return 1
  fi
}

run_pytest_cuda() {
  needs_gpu || return 77
  PYTHONPATH="$REPO/python" "$PY" -m pytest "$REPO/tests/python" -q -ra -k cuda \
    -p no:cacheprovider || return 1
}

run_fuzz() {
  have_python_module hypothesis || { skip "hypothesis not installed"; return 77; }
  ROPE_CUDA_FUZZ_EXAMPLES="$FUZZ_EXAMPLES" PYTHONPATH="$REPO/python" "$PY" -m pytest \
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
  "$cs" --help 2>&1 | grep -q -- "--kernel-name " && filter=(--kernel-name kns=rope_kernel)
  # The caching allocator would hide out-of-bounds accesses inside its blocks.
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 ROPE_CUDA_FUZZ_EXAMPLES=60 ROPE_CPU_FUZZ_EXAMPLES=1 \
  PYTHONPATH="$REPO/python" "$cs" --tool "$tool" --error-exitcode 3 "${filter[@]}" \
    "$PY" -m pytest -q -p no:cacheprovider -x \
      "$REPO/tests/python/kernels/test_cuda.py" "$REPO/tests/python/kernels/test_cuda_fuzz.py" \
      -k "not device_assert and not current_stream"
}

run_sass() {
  "$PY" "$REPO/scripts/sass_report.py" --check --markdown "$OUT/sass.md" --json "$OUT/sass.json" \
    "$OUT/build/librope.so"
}

run_fused_benchmark() {
  needs_gpu || return 77
  PYTHONPATH="$REPO/python" "$PY" "$REPO/benchmarks/bench_fused_gpu.py" --device cuda \
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
  PYTHONPATH="$REPO/python" "$PY" "$REPO/benchmarks/bench_gpu.py" "${args[@]}" || return 1
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
  PYTHONPATH="$REPO/python" "$ncu" --kernel-name regex:rope_kernel --launch-count 30 \
    --section SpeedOfLight --section Occupancy --section LaunchStats \
    --section MemoryWorkloadAnalysis --csv --page details \
    "$PY" "$REPO/scripts/gpu_timing.py" --once > "$OUT/ncu.csv" || return 1
  echo "ncu details: $OUT/ncu.csv"
  grep -E '"(Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per Thread|Grid Size)"' \
    "$OUT/ncu.csv" | cut -d, -f5,13-16 | head -n 200
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
    PYTHONPATH="$dir/pkg" "$PY" "$REPO/scripts/gpu_timing.py" --label "$name" \
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
if ! step build build_main; then
  echo "gpu_check: the build failed; nothing else can run. See $OUT/build.log" | tee -a "$SUMMARY"
  exit 1
fi
step ctest run_ctest
step pytest-cuda run_pytest_cuda
step fuzz run_fuzz
step memcheck run_sanitizer memcheck
step initcheck run_sanitizer initcheck
step sass run_sass
step benchmark run_benchmark
step fused-benchmark run_fused_benchmark
step ncu run_ncu
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
