#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Mutation check of the host run of the CUDA kernels: plants realistic bugs, one at a time, in a
copy of the kernel headers (csrc/cuda/rope_kernel.cuh, rope_launch_plan.h,
common_stream_kernel.cuh, the device helpers they share in common_device.cuh, the argument
headers)
and of the glue every CUDA op goes through (csrc/cuda/common_glue.h: device guard, stream),
builds the host run against the copy and requires it to fail. A mutant goes through its checks
in order until one fails (checks_of): a bug in the row streams' kernel first meets the torch-free
run of that kernel (stream_host.cpp, its independent reference), then the host run (bit
comparisons with the CPU backend, the big cases); a bug in rope_launch_plan.h that the host run
misses meets the launch-plan unit tests (tests/cpp/test_launch_plan.cpp, built against the copy:
some plan bugs leave every result correct and only cost speed), then the tuning defaults of
scripts/sass_report.py. A bug no check catches is a hole in the tests.

    python tests/cuda_host/mutation_check.py [--build-dir build] [--cases N] [--only NAME]

The copies go to <build>/tests/cuda_host/mutant_overlay, which the `cuda_host_mutant` target
searches before csrc/; each mutant costs one compile of host_kernel.cpp (or of the glue's
translation unit), one link and a short run. Mutants run in lanes, one mutant per lane at a time
(CMake's TORCH_ROPE_MUTATION_LANES, 2 by default; lane n > 0 has mutant_overlay_n and targets
suffixed _n): one build command compiles every lane's mutant at once and the runs go side by
side, so two cores check two mutants in the time of one. First the unmutated copy must pass with
the same arguments in every lane, so a broken harness cannot pass as "every mutant caught". Exit
status 0 when every mutant was caught.
"""

import argparse
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# overlay path -> source. The kernel's overlay mirrors csrc/ so relative includes resolve; the
# glue has an overlay of its own (mutant_overlay_glue), searched first only by the glue's
# translation unit, which also includes csrc/'s common_kernel_args.h through the op bodies.
SOURCES = {
    "cuda/rope_kernel.cuh": REPO / "csrc" / "cuda" / "rope_kernel.cuh",
    "cuda/rope_launch_plan.h": REPO / "csrc" / "cuda" / "rope_launch_plan.h",
    "common_kernel_args.h": REPO / "csrc" / "common_kernel_args.h",
    # The fp8 quantization of the fused ops' fp8 targets.
    "kv_cache_args.h": REPO / "csrc" / "kv_cache_args.h",
    # The device helpers the kernels share.
    "cuda/common_device.cuh": REPO / "csrc" / "cuda" / "common_device.cuh",
    # The frequency form's exact reduction and sin/cos.
    "common_exact_angle.h": REPO / "csrc" / "common_exact_angle.h",
    # The serving fusions: the row streams' kernel and its torch-free arguments.
    "cuda/common_stream_kernel.cuh": REPO / "csrc" / "cuda" / "common_stream_kernel.cuh",
    "common_row_streams.h": REPO / "csrc" / "common_row_streams.h",
}
# Mutants of these meet the torch-free run of the row streams' kernel (stream_host.cpp, its
# independent reference, fp8 by the formats' definitions) first, then the host run (the fused
# ops' bit comparisons with the CPU backend).
STREAM_FILES = {"cuda/common_stream_kernel.cuh", "common_row_streams.h", "kv_cache_args.h"}
# Mutants of the table-free angle core meet its torch-free run first (exact_angle_host.cpp: the
# device branches against an independent double path, and bit for bit against the clean host
# branches), then the host run (the frequency form of every op).
EXACT_ANGLE_FILES = {"common_exact_angle.h"}
GLUE_SOURCES = {"cuda/common_glue.h": REPO / "csrc" / "cuda" / "common_glue.h"}


@dataclass
class Mutant:
    name: str
    file: str  # overlay path
    before: str  # must occur exactly once
    after: str
    why: str
    # How many times `before` occurs: code the frequency form repeats (its lane, its kernels) is
    # mutated in every copy, so a planted bug reaches each kernel that carries that line.
    copies: int = 1


# A mutant must not change the layout of a struct that the driver (built against csrc/) shares
# with the mutated kernel build (KernelParams in LaunchRecord): that would be an ODR violation,
# "caught" for the wrong reason. Narrow values where they are computed instead.
MUTANTS = [
    Mutant(
        "inverse-sign",
        "cuda/rope_kernel.cuh",
        "      if (inverse) {\n",
        "      if (!inverse) {\n",
        "inverse turns the wrong way",
    ),
    Mutant(
        "swapped-rotation-terms",
        "cuda/common_device.cuh",
        "  rb = fused(a, s, b * c);",
        "  rb = fused(b, c, a * s);",
        "same value in exact arithmetic, different rounding: the bit-exactness claim",
    ),
    Mutant(
        "token-in-uses-out-stride",
        "cuda/rope_kernel.cuh",
        "    in_off += qr.rem * t.token_in_strides[d];",
        "    in_off += qr.rem * t.token_out_strides[d];",
        "a row stride of the wrong tensor",
    ),
    Mutant(
        "walker-in-uses-out-stride",
        "cuda/rope_kernel.cuh",
        "    in += t.shared_in_inner;",
        "    in += t.shared_out_inner;",
        "shared-row stepping with the output's stride",
    ),
    Mutant(
        "token-unravel-off-by-one",
        "cuda/rope_kernel.cuh",
        "for (int d = t.token_ndim - 1; d > 0; --d) {",
        "for (int d = t.token_ndim - 1; d > 1; --d) {",
        "one token dim left out of the unravel",
    ),
    Mutant(
        "walker-wrap-off-by-one",
        "cuda/rope_kernel.cuh",
        "if (++inner == t.shared_inner) {",
        "if (inner++ == t.shared_inner) {",
        "the inner shared dim wraps one row late",
    ),
    Mutant(
        "missing-tail-lane",
        "cuda/rope_kernel.cuh",
        "  if (scalar_copy < t.scalar_copy_lanes) {",
        "  if (scalar_copy + 1 < t.scalar_copy_lanes) {",
        "the last element of an odd tail is never copied",
    ),
    Mutant(
        "missing-vector-tail-lane",
        "cuda/rope_kernel.cuh",
        "  if (copy < t.vec_copy_lanes) {",
        "  if (copy + 1 < t.vec_copy_lanes) {",
        "the last 16-byte tail lane falls through to the scalar lanes",
    ),
    Mutant(
        "overlapping-tail-lane",
        "cuda/rope_kernel.cuh",
        "  const int64_t after_vectors = t.rotary_dim + t.vec_copy_lanes * kVecElems;",
        "  const int64_t after_vectors = t.rotary_dim + t.vec_copy_lanes;",
        "pair and scalar tail lanes start inside the vector ones (a forgotten * elements)",
    ),
    Mutant(
        "overlapping-rotating-lane",
        "cuda/rope_kernel.cuh",
        "  const int64_t a_feature = kInterleaved ? lane * (2 * P) : lane * P;",
        "  const int64_t a_feature = kInterleaved ? lane * P : lane * P;",
        "interleaved lanes step by planes, not features: they overlap",
        copies=2,
    ),
    Mutant(
        "position-range-off-by-one",
        "cuda/common_device.cuh",
        "  return pos >= 0 && pos < tb.max_seq_len;",
        "  return pos >= 0 && pos <= tb.max_seq_len;",
        "position max_seq_len reads one row past the tables",
    ),
    Mutant(
        "no-position-check-without-rotation",
        "cuda/rope_kernel.cuh",
        "  if (t.rot_lanes == 0) {\n    if (tb.axes.num_axes == 0) {",
        "  if (false) {\n    if (tb.axes.num_axes == 0) {",
        "rotary_dim == 0 skips the range check of positions",
    ),
    Mutant(
        "int32-positions-read-as-int64",
        "cuda/common_device.cuh",
        "  return r.positions_are_int64\n",
        "  return !r.positions_are_int64\n",
        "positions read with the wrong width",
    ),
    Mutant(
        "half-split-alignment",
        "cuda/rope_launch_plan.h",
        "  const int64_t run = interleaved ? a.rotary_dim : half;",
        "  const int64_t run = a.rotary_dim;",
        "vector path for a half split whose b's are not 16-byte aligned",
    ),
    Mutant(
        "table-alignment",
        "cuda/rope_launch_plan.h",
        "      aligned_to(tables.sin, piece * sizes.table) && tables.table_stride % piece == 0;",
        "      aligned_to(tables.sin, piece * sizes.table) && true;",
        "vector table loads on rows that are not aligned",
    ),
    Mutant(
        "row-groups-floor",
        "cuda/rope_launch_plan.h",
        "  const int64_t row_groups = ceil_div(p.shared_rows, p.rows_per_thread);",
        "  const int64_t row_groups = p.shared_rows / p.rows_per_thread;",
        "the last, partial group of shared rows gets no thread",
    ),
    Mutant(
        "qk-block-split",
        "cuda/rope_launch_plan.h",
        "  params.first_blocks = ceil_div(params.tensor[0].num_threads, kBlockThreads);",
        "  params.first_blocks = params.tensor[0].num_threads / kBlockThreads;",
        "q's last, partial block is handed to k",
    ),
    Mutant(
        "qk-second-thread-index",
        "cuda/rope_kernel.cuh",
        "         (second ? block - params.first_blocks : block) * kBlockThreads + threadIdx.x);",
        "         block * kBlockThreads + threadIdx.x);",
        "k's blocks number their threads from q's first block on, so k's first rows get none",
    ),
    Mutant(
        "tail-lanes-count",
        "cuda/rope_launch_plan.h",
        "  const int64_t rest = tail - p.vec_copy_lanes * v.elems;",
        "  const int64_t rest = tail - p.vec_copy_lanes * v.elems - (tail > v.elems);",
        "one tail element too few when the tail is longer than a vector",
    ),
    # Element offsets past 2^31 (the fixed cases of big_cases.cpp: a 12 GiB KV cache).
    Mutant(
        "int32-token-out-offset",
        "cuda/rope_kernel.cuh",
        "  int64_t out_off = 0;\n",
        "  int32_t out_off = 0;\n",
        "out= into a KV cache past 2^31 elements: the token offset held in 32 bits",
    ),
    Mutant(
        "int32-row-offsets",
        "cuda/rope_kernel.cuh",
        "    have_angles = true;\n  }\n  for (int64_t h = h_begin; h < h_end; h += kRowBatch) {\n"
        "    int64_t src[kRowBatch];\n    int64_t dst[kRowBatch];",
        "    have_angles = true;\n  }\n  for (int64_t h = h_begin; h < h_end; h += kRowBatch) {\n"
        "    int src[kRowBatch];\n    int dst[kRowBatch];",
        "the batch's row offsets held in 32 bits",
    ),
    Mutant(
        "int32-shared-outer-stride",
        "cuda/rope_launch_plan.h",
        "    p.shared_out_outer = g.out_strides[outer];",
        "    p.shared_out_outer = static_cast<int32_t>(g.out_strides[outer]);",
        "a stride of the parameter block narrowed to 32 bits",
    ),
    Mutant(
        "int32-token-in-strides",
        "cuda/rope_launch_plan.h",
        "    p.token_in_strides[n] = g.in_strides[d];",
        "    p.token_in_strides[n] = static_cast<int32_t>(g.in_strides[d]);",
        "the input's token strides narrowed to 32 bits",
    ),
    # Grids of >= 65536 blocks and past 2^31 threads (sampled launches of big_cases.cpp).
    Mutant(
        "grid-capped-at-65535",
        "cuda/common_device.cuh",
        "dim3(static_cast<unsigned int>(blocks))",
        "dim3(static_cast<unsigned int>(blocks < 65535 ? blocks : 65535))",
        "the grid capped at 65535 blocks, as for gridDim.y",
    ),
    Mutant(
        "grid-in-y",
        "cuda/common_device.cuh",
        "dim3(static_cast<unsigned int>(blocks))",
        "dim3(1, static_cast<unsigned int>(blocks))",
        "the blocks counted in gridDim.y (at most 65535)",
    ),
    Mutant(
        "int32-block-index",
        "cuda/rope_kernel.cuh",
        "         (second ? block - params.first_blocks : block) * kBlockThreads + threadIdx.x);",
        "         static_cast<int>(second ? block - params.first_blocks : block) * kBlockThreads"
        " + threadIdx.x);",
        "block * 256 + threadIdx.x in 32 bits: wraps past 2^31 threads",
    ),
    # Device and stream (the glue, run with a simulated runtime).
    Mutant(
        "default-stream",
        "cuda/common_glue.h",
        "  const typename Runtime::Stream stream = Runtime::current_stream();",
        "  const typename Runtime::Stream stream{};",
        "the kernel launched on the legacy default stream",
    ),
    Mutant(
        "no-device-guard",
        "cuda/common_glue.h",
        "  const typename Runtime::Guard guard(Runtime::device_of(x));\n"
        "  return detail::apply_body",
        "  return detail::apply_body",
        "rope.apply without the device guard: runs on whatever device is current",
    ),
    Mutant(
        "launch-drops-stream",
        "cuda/common_device.cuh",
        "kernel_args, 0, stream);",
        "kernel_args, 0, nullptr);",
        "the launcher ignores the stream it was given",
    ),
    # Positions past 32 bits.
    Mutant(
        "position-narrowed-to-int32",
        "cuda/common_device.cuh",
        "? static_cast<int64_t>(__ldg(static_cast<const long long*>(r.positions) + pos_off))",
        "? static_cast<int32_t>(__ldg(static_cast<const long long*>(r.positions) + pos_off))",
        "an int64 position narrowed before the range check: 2^32 + p passes as p",
    ),
    # The kernel variant must follow q and k independently (launch-plan tests only).
    Mutant(
        "vector-kernel-needs-both",
        "cuda/rope_launch_plan.h",
        "  return rotates_vectors(first) || (second != nullptr && rotates_vectors(*second));",
        "  return rotates_vectors(first) && (second == nullptr || rotates_vectors(*second));",
        "a misaligned k pushes an aligned q onto the scalar kernel (correct, only slower)",
    ),
    # The paired path: two 16-bit elements per 4-byte access, for rows 4- but not 16-byte aligned.
    Mutant(
        "pair-on-2-byte-rows",
        "cuda/rope_launch_plan.h",
        "  const bool rows_pair = storage_bytes == 2 && "
        "rows_aligned_to(a, storage_bytes, kPairBytes);",
        "  const bool rows_pair = storage_bytes == 2;",
        "4-byte accesses on rows that are only 2-byte aligned",
    ),
    Mutant(
        "pair-ignores-row-strides",
        "cuda/rope_launch_plan.h",
        "  const bool rows_pair = storage_bytes == 2 && "
        "rows_aligned_to(a, storage_bytes, kPairBytes);",
        "  const bool rows_pair =\n"
        "      storage_bytes == 2 && aligned_to(a.in, kPairBytes) && "
        "aligned_to(a.out, kPairBytes);",
        "pairs checked on the base pointers only: an odd row stride misaligns every other row",
    ),
    Mutant(
        "pair-half-split-odd-half",
        "cuda/rope_launch_plan.h",
        "  } else if (half > 0 && rows_pair && run % w.elems == 0) {",
        "  } else if (half > 0 && rows_pair) {",
        "half-split pairs with an odd half: the b's 2-byte aligned, the last plane in no lane",
    ),
    Mutant(
        "pair-lanes-counted-in-elements",
        "cuda/rope_launch_plan.h",
        "    p.rot_lanes = half / w.planes;",
        "    p.rot_lanes = half / w.elems;",
        "interleaved paired lanes counted per element: half of the planes get no lane",
    ),
    Mutant(
        "pair-elements-swapped",
        "cuda/common_device.cuh",
        "  const unsigned int bits = *reinterpret_cast<const unsigned int*>(p);  "
        "// sass: pair load",
        "  const unsigned int word = *reinterpret_cast<const unsigned int*>(p);\n"
        "  const unsigned int bits = word << 16 | word >> 16;  // sass: pair load",
        "the two halves of a 32-bit word unpacked in the wrong order (.x / .y of a bfloat162)",
    ),
    Mutant(
        "pair-half-split-a-b-swapped",
        "cuda/rope_kernel.cuh",
        "        store_elems<kAccess>(out + dst[u] + a_feature, ya);  // sass: rotated store\n"
        "        if constexpr (!kInterleaved) {\n"
        "          store_elems<kAccess>(out + dst[u] + b_feature, yb);  // sass: rotated store",
        "        constexpr bool kSwap = kAccess == Access::kPair && !kInterleaved;\n"
        "        store_elems<kAccess>(out + dst[u] + (kSwap ? b_feature : a_feature), ya);\n"
        "        if constexpr (!kInterleaved) {\n"
        "          store_elems<kAccess>(out + dst[u] + (kSwap ? a_feature : b_feature), yb);",
        "the half-split paired path writes the a's where the b's go and back",
        copies=2,
    ),
    Mutant(
        "pair-tail-lane-stride",
        "cuda/rope_kernel.cuh",
        "(t, after_vectors + pair_copy * kPairElems, walker,",
        "(t, after_vectors + pair_copy, walker,",
        "pair tail lanes step by one element: they overlap and every other one is misaligned",
    ),
    Mutant(
        "missing-pair-tail-lane",
        "cuda/rope_kernel.cuh",
        "    if (pair_copy < t.pair_copy_lanes) {",
        "    if (pair_copy + 1 < t.pair_copy_lanes) {",
        "the last pair tail lane falls through to the scalar lanes",
    ),
    Mutant(
        "pair-rotation-only-in-vector-kernel",
        "cuda/rope_kernel.cuh",
        "    if constexpr (kHasPairs<scalar_t>) {\n      if (t.rot_access == Access::kPair) {",
        "    if constexpr (kVectorKernel && kHasPairs<scalar_t>) {\n"
        "      if (t.rot_access == Access::kPair) {",
        "the scalar-only kernel runs planned pair lanes as one-plane scalar lanes",
    ),
    Mutant(
        "vector-kernel-for-pairs",
        "cuda/rope_launch_plan.h",
        "    return plan_paths(a, sizes.storage, interleaved, true).rot_access == Access::kVector;",
        "    return plan_paths(a, sizes.storage, interleaved, true).rot_access != Access::kScalar;",
        "a paired tensor picks the vector kernel and its register budget (correct, only slower)",
    ),
    # Multi-axis positions (M-RoPE): which axis each plane reads, where the axes' positions are,
    # their range checks, and when a lane's cos/sin may be one vector load.
    Mutant(
        "axis-map-ignored",
        "cuda/rope_kernel.cuh",
        "  if (tb.axes.num_axes == 0) {\n    rotate_lane<",
        "  if (true) {\n    rotate_lane<",
        "the defect this path fixed: every plane of a multi-axis position reads axis 0",
    ),
    Mutant(
        "every-plane-picks-axis-0",
        "cuda/common_device.cuh",
        "    r = a == i ? v[i] : r;",
        "    r = a == i ? v[0] : r;",
        "every axis loaded and checked, but each plane takes axis 0's table row",
    ),
    Mutant(
        "section-boundary-off-by-one",
        "cuda/common_device.cuh",
        "    axis += a + 1 < m.num_axes && k >= end ? 1 : 0;",
        "    axis += a + 1 < m.num_axes && k > end ? 1 : 0;",
        "the first plane of each contiguous section reads the previous axis",
    ),
    Mutant(
        "interleaved-ignores-section-limit",
        "cuda/common_device.cuh",
        "    return r == 1 && k < 3 * m.sections[1] ? 1 : r == 2 && k < 3 * m.sections[2] ? 2 : 0;",
        "    return r == 1 ? 1 : r == 2 ? 2 : 0;",
        "Qwen3-VL: planes k % 3 == 1, 2 read h, w past 3 * sections[1], 3 * sections[2] too",
    ),
    Mutant(
        "interleaved-read-as-contiguous",
        "cuda/common_device.cuh",
        "  if (m.interleaved) {\n    const int64_t r = k % 3;",
        "  if (false) {\n    const int64_t r = k % 3;",
        "mrope_interleaved dropped: Qwen3-VL sections taken as contiguous runs",
    ),
    Mutant(
        "axis-stride-assumed-1",
        "cuda/common_device.cuh",
        "read_position(r, pos_off + a * axis_stride)",
        "read_position(r, pos_off + a)",
        "the axis dim taken as dense and innermost: positions moved from (A, ...) read wrongly",
        copies=2,
    ),
    Mutant(
        "axis-stride-not-planned",
        "cuda/rope_launch_plan.h",
        "  p.axis_stride = a.axis_stride;\n",
        "",
        "the plan drops the axis stride: every axis reads axis 0's entry",
    ),
    Mutant(
        "axis-map-not-planned",
        "cuda/rope_launch_plan.h",
        "  params.tables.axes = tables.axes;\n",
        "",
        "the plan drops the AxisMap: every multi-axis call runs as a one-axis one",
    ),
    Mutant(
        "range-check-axis-0-only",
        "cuda/common_device.cuh",
        "      in_range = position_in_range(tb, pos) && in_range;",
        "      in_range = (a > 0 || position_in_range(tb, pos)) && in_range;",
        "only axis 0 of a multi-axis position is range-checked: a bad axis 1 reads past the tables",
    ),
    Mutant(
        "vector-table-load-across-axes",
        "cuda/rope_kernel.cuh",
        "    one_axis = one_axis && axis[j] == axis[0];",
        "    one_axis = one_axis && (axis[j] == axis[0] || tb.vector_loads);",
        "a lane across a section boundary loads its cos/sin as one vector from one axis's row",
    ),
    Mutant(
        "lane-axis-from-first-plane",
        "cuda/rope_kernel.cuh",
        "    const int64_t at = pick_axis(rows, axis[j]) + k0 + j;",
        "    const int64_t at = pick_axis(rows, axis[0]) + k0 + j;",
        "plane-by-plane loads, all from the row of the lane's first plane's axis",
    ),
    Mutant(
        "multi-axis-copy-rows-check-axis-0",
        "cuda/rope_kernel.cuh",
        "    if (tb.axes.num_axes == 0) {\n      int64_t pos;",
        "    if (true) {\n      int64_t pos;",
        "rows with no rotating lane range-check only axis 0 of a multi-axis position",
    ),
    # The fp8 quantization of every fused op's fp8 targets (csrc/kv_cache_args.h)
    Mutant(
        "kv-scale-multiplied",
        "kv_cache_args.h",
        "  const float x = apply_scale(value, scale, rule);",
        "  const float x = apply_scale(value, scale, ScaleRule::kMultiply);",
        "fp8 (float math): the scale multiplies instead of dividing",
    ),
    Mutant(
        "kv-no-saturation",
        "kv_cache_args.h",
        "  return x > max ? max : (x < -max ? -max : x);  // NaN compares false: stays NaN",
        "  (void)max;\n  return x;",
        "fp8 overflow not clamped (e5m2 turns it into inf)",
    ),
]


# The grid of the row streams' kernel (every fused op), caught by the host run's cases with
# several blocks.
MUTANTS += [
    Mutant(
        "grid-rounds-down",
        "cuda/common_device.cuh",
        "  return (threads + kThreads - 1) / kThreads;",
        "  return threads / kThreads + (threads < kThreads);",
        "the row streams' grid rounds down: a partial last block's rows are never written",
    ),
]


# The argument forms (table-free angles, packed sequences), caught by the host run's forms cases
# (tests/cuda_host/forms_cases.cpp: a binary128 reference of the exact angle p * f, positions to
# 2^62, packings with empty sequences, seq_offsets and every rank of cp_size 2, 4, 8).
EXACT = "common_exact_angle.h"
MUTANTS += [
    Mutant(
        "exact-turn-fraction-carry-dropped",
        EXACT,
        "    g.hi = hi1 + lo0 + carry128;",
        "    g.hi = hi1 + lo0;",
        "a carry lost in the 128-bit frac(f / 2 pi): 2^-64 turn per position, 3.7e-7 rad at 2^40",
    ),
    Mutant(
        "exact-turns-low-word-ignored",
        EXACT,
        "  return u * g.hi + mul_hi(u, g.lo);",
        "  return u * g.hi;",
        "the reduction with 64 bits of 1 / 2 pi past the binary point: fails at large positions",
    ),
    Mutant(
        "exact-f32-cubic-term-dropped",
        EXACT,
        "fma_f32(C.hi, tl, C.lo * th) + mul_rn(C.hi, sigma);",
        "fma_f32(C.hi, tl, C.lo * th);",
        "sin of the reduced angle without its cubic term: 3e-7 off near 1/512 turn",
    ),
    Mutant(
        "exact-f32-quadrant-cos",
        EXACT,
        "  const FloatFloat c = q == 0 ? cos_phi : q == 1 ? neg_sin : q == 2 ? neg_cos : sin_phi;",
        "  const FloatFloat c = q == 0 ? cos_phi : q == 1 ? sin_phi : q == 2 ? neg_cos : sin_phi;",
        "cos in the second quadrant with the wrong sign",
    ),
    Mutant(
        "exact-f64-quadrant-sign",
        EXACT,
        "  out.cos = flip_sign(swap ? s : c, ((q + 1) >> 1) & 1) * attention_factor;",
        "  out.cos = flip_sign(swap ? s : c, (q >> 1) & 1) * attention_factor;",
        "the float64 path's cos with the sine's quadrant sign",
    ),
    Mutant(
        "freqs-attention-factor-dropped",
        "cuda/rope_kernel.cuh",
        "                                         tb.frequencies.af_hi, tb.frequencies.af_lo);",
        "                                         1.0f, 0.0f);",
        "the 32-bit frequency path ignores the attention factor (YaRN's mscale)",
    ),
    Mutant(
        "freqs-packed-source-ignored",
        "cuda/rope_kernel.cuh",
        "    if (t.position_kind == PositionKind::kPacked) {\n"
        "      return load_row_position<true>(",
        "    if (false) {\n      return load_row_position<true>(",
        "the frequency kernel, one for every position source, reads packed positions as a tensor",
    ),
    Mutant(
        "freqs-multi-axis-planes-on-axis-0",
        "cuda/rope_kernel.cuh",
        "    const int32_t axis = tb.axes.num_axes > 0 ? plane_axis(tb.axes, k) : 0;\n"
        "    plane_angle(",
        "    const int32_t axis = 0;\n    plane_angle(",
        "the frequency form's multi-axis planes all take axis 0's position",
    ),
    Mutant(
        "packed-zigzag-second-chunk",
        "common_kernel_args.h",
        "(2 * cp_size - 1 - cp_rank) * c + (j - c)",
        "(2 * cp_size - 2 - cp_rank) * c + (j - c)",
        "a rank's second chunk taken from its neighbour's place in the zigzag",
    ),
    Mutant(
        "packed-search-strict",
        "common_kernel_args.h",
        "    if ((cp_size == 1 ? start : start / cp_size) <= t) {",
        "    if ((cp_size == 1 ? start : start / cp_size) < t) {",
        "a sequence's first token attributed to the sequence before it",
    ),
    Mutant(
        "packed-local-begin-global",
        "cuda/common_device.cuh",
        "  const int64_t begin = start / cp;",
        "  const int64_t begin = start;",
        "a rank's local token counted from the global boundary (cp_size > 1 only)",
    ),
    Mutant(
        "packed-offsets-ignored",
        "cuda/common_device.cuh",
        "  pos = ok ? offset + relative : 0;",
        "  pos = ok ? relative : 0;",
        "seq_offsets read and checked, then not added",
    ),
]


# Bugs that once passed every CPU-side check, before the checks they name.
MUTANTS += [
    # rope.rms_norm_apply_qk with multi-axis positions (norm_cases.cpp: axis-first positions,
    # up to 4 axes, as hf.patch hands Qwen3-VL's to this op).
    # Device and stream of the two newest ops (their launches now go through common_glue.h).
    Mutant(
        "kv-no-device-guard",
        "cuda/common_glue.h",
        "  const typename Runtime::Guard guard(Runtime::device_of(q));\n"
        "  return detail::apply_qk_cache_body",
        "  return detail::apply_qk_cache_body",
        "apply_qk_cache without the device guard: runs on whatever device is current",
    ),
    # A tuning default changed (scripts/sass_report.py's own expectation, not the header's).
    Mutant(
        "row-batch-default-changed",
        "cuda/rope_launch_plan.h",
        "#define ROPE_CUDA_ROW_BATCH 4\n",
        "#define ROPE_CUDA_ROW_BATCH 2\n",
        "the row batch halved: every result the same, the SASS rule's expectation must notice",
    ),
]


# The row streams' kernel of the serving fusions (csrc/cuda/common_stream_kernel.cuh,
# csrc/common_row_streams.h): its index math, its scale rule and its slot mapping. Caught by the
# torch-free run against its independent reference (stream_host.cpp), else by the serving
# fusions' bit comparisons with the CPU backend in the host run (serving_cases.h).
STREAMS = "cuda/common_stream_kernel.cuh"
MUTANTS += [
    Mutant(
        "streams-inverse-negates-the-cosine",
        STREAMS,
        "  if (inverse) {\n    s = -s;\n  }",
        "  if (inverse) {\n    c = -c;\n  }",
        "the inverse rotation turns by pi - angle: the cosine negated, not the sine",
    ),
    Mutant(
        "streams-inverse-ignored",
        STREAMS,
        "  if (inverse) {\n    s = -s;\n  }",
        "  if (inverse && tb.table_stride < 0) {\n    s = -s;\n  }",
        "inverse=True rotates forwards on CUDA (the flag read, never honoured)",
    ),
    Mutant(
        "streams-tail-lane-offset",
        STREAMS,
        "    const int64_t first = R + (lane - sp.rot_lanes) * kChunk;",
        "    const int64_t first = R + lane * kChunk;",
        "tail lanes counted from the row's first lane: the first tail chunks are never written",
    ),
    Mutant(
        "streams-rot-lanes-layout-swapped",
        STREAMS,
        "        ceil_div(args.interleaved ? s.rotary_dim : s.rotary_dim / 2, "
        "static_cast<int64_t>(kChunk));",
        "        ceil_div(args.interleaved ? s.rotary_dim / 2 : s.rotary_dim, "
        "static_cast<int64_t>(kChunk));",
        "rotating lanes sized for the other pair layout",
    ),
    Mutant(
        "streams-half-split-b-store-in-source-bytes",
        STREAMS,
        "    emit_chunk<kVector, T>(st.target, static_cast<char*>(dst) + half * tbytes, first,"
        " half, b,",
        "    emit_chunk<kVector, T>(st.target, static_cast<char*>(dst) + half * sizeof(T), first,"
        " half, b,",
        "half split: the b half of an fp8 row placed by the source's element size",
    ),
    Mutant(
        "streams-half-split-b-weight",
        STREAMS,
        "      normalise(b, w + half, first, half, r);",
        "      normalise(b, w, first, half, r);",
        "norm: the b half of a plane scaled by the a half's weights",
    ),
    Mutant(
        "streams-segment-boundary",
        STREAMS,
        "        if (w < sp.threads) {",
        "        if (w <= sp.threads) {",
        "the first thread of a stream's segment runs as the previous stream's last",
    ),
    Mutant(
        "streams-heads-unravel",
        STREAMS,
        "  const QuotRem th = div_rem(lr.quot, st.heads);",
        "  const QuotRem th = div_rem(lr.quot, sp.lanes);",
        "rows unravelled by lanes instead of heads",
    ),
    Mutant(
        "streams-padding-written",
        STREAMS,
        "    if (slot < 0) {\n      return false;  // padding",
        "    if (slot < -1) {\n      return false;  // padding",
        "slot -1 (padding) writes a row (slot -1 wraps to the end of the cache)",
    ),
    Mutant(
        "streams-slot-range-unchecked",
        STREAMS,
        "    if (slot >= tg.num_slots) {\n      return false;\n    }",
        "",
        "a slot past the cache still writes (after the assert)",
    ),
    Mutant(
        "streams-slot-block-offset-swapped",
        "common_row_streams.h",
        "  return block * t.block_stride + offset * t.offset_stride + head * t.head_stride +",
        "  return offset * t.block_stride + block * t.offset_stride + head * t.head_stride +",
        "paged slot: block and offset strides swapped",
    ),
    Mutant(
        "streams-feature-offset-ignored",
        "common_row_streams.h",
        "  return block * t.block_stride + offset * t.offset_stride + head * t.head_stride +\n"
        "         t.feature_offset;",
        "  return block * t.block_stride + offset * t.offset_stride + head * t.head_stride;",
        "a cache row's k_pe written over its kv_c (the feature offset of by-slot targets dropped)",
    ),
    Mutant(
        "streams-scale-rule-ignored",
        STREAMS,
        "    out[j] = quantize_fp8(v[j], scale, t.format, t.rule);",
        "    out[j] = quantize_fp8(v[j], scale, t.format);",
        "FlashInfer's multiply rule quantized as a division",
    ),
    Mutant(
        "streams-scale-not-read",
        STREAMS,
        "    sink.scale = __ldg(st.target.scale);",
        "    sink.scale = 1.0f;",
        "the fp8 scale never read",
    ),
    Mutant(
        "streams-norm-scale-not-read",
        STREAMS,
        "    sink.scale = __ldg(tg.scale);",
        "    sink.scale = 1.0f;",
        "a norm stream's fp8 scale never read",
    ),
    Mutant(
        "streams-norm-eps-outside-sqrt",
        STREAMS,
        "  return A(1) / acc_sqrt(s / static_cast<A>(width) + static_cast<A>(eps));",
        "  return A(1) / (acc_sqrt(s / static_cast<A>(width)) + static_cast<A>(eps));",
        "norm: eps added after the square root",
    ),
    Mutant(
        "streams-norm-tail-sum-dropped",
        STREAMS,
        "    s = fused(x, x, s);",
        "    (void)x;",
        "norm: the features past the last whole chunk left out of the sum",
    ),
    Mutant(
        "streams-vector-ignores-alignment",
        STREAMS,
        "  const bool source_ok = aligned16(s.src) && stride_ok(s.token_stride, source_bytes) &&",
        "  const bool source_ok = stride_ok(s.token_stride, source_bytes) &&",
        "the vector path on a source that is not 16-byte aligned",
    ),
    Mutant(
        "streams-vector-partial-tail",
        STREAMS,
        "  if (rot_run % kChunk != 0 || (s.width - s.rotary_dim) % kChunk != 0) {",
        "  if (rot_run % kChunk != 0) {",
        "the vector path on a row whose tail is not whole chunks: it reads and writes past it",
    ),
    Mutant(
        "streams-axis-ignored",
        STREAMS,
        "  const int32_t axis = tb.axes.num_axes > 0 ? plane_axis(tb.axes, k) : 0;",
        "  const int32_t axis = 0;",
        "multi-axis positions: every plane reads axis 0",
    ),
    Mutant(
        "streams-axis-stride-assumed-1",
        STREAMS,
        "  return load_axis_rows(a, tb, pos_off, a.axis_stride, tb.table_stride, rows);",
        "  return load_axis_rows(a, tb, pos_off, 1, tb.table_stride, rows);",
        "multi-axis positions taken as dense and innermost (axis-first positions read wrong)",
    ),
    Mutant(
        "streams-position-unchecked",
        STREAMS,
        "    if (!load_position(a, tb, pos_off, pos)) {\n      return false;\n    }",
        "    (void)load_position(a, tb, pos_off, pos);",
        "a row at an out-of-range position reads past the tables and writes",
    ),
    Mutant(
        "streams-swapped-rotation-terms",
        STREAMS,
        "        rotate_plane(v[2 * j], v[2 * j + 1], c, s, ra, rb);",
        "        rotate_plane(v[2 * j + 1], v[2 * j], c, -s, rb, ra);",
        "interleaved: the same values in exact arithmetic, the other product rounded first: not "
        "the CPU's bits",
    ),
    # Bit-exactness of the rounding to the storage type (the fused ops' bit comparisons with the
    # CPU backend: apply_qk_cache's kv_cache_cases.cpp among them).
    Mutant(
        "streams-bf16-truncated",
        STREAMS,
        "      out[j] = from_acc<T>(v[j]);",
        "      A t = v[j];\n"
        "      if constexpr (std::is_same_v<T, __nv_bfloat16>) {\n"
        "        uint32_t bits;\n"
        "        memcpy(&bits, &t, sizeof(bits));\n"
        "        bits &= 0xffff0000u;\n"
        "        memcpy(&t, &bits, sizeof(bits));\n"
        "      }\n"
        "      out[j] = from_acc<T>(t);",
        "bf16 by truncation instead of round to nearest even: within the tolerance, not the bits",
    ),
    Mutant(
        "streams-default-stream",
        "cuda/common_glue.h",
        "      return Runtime::launch_streams(dtype, p.args, p.tables.args, stream);",
        "      return Runtime::launch_streams(dtype, p.args, p.tables.args,\n"
        "                                     typename Runtime::Stream{});",
        "the serving fusions launched on the legacy default stream",
    ),
    # rope.rms_norm_apply_qk on the row streams (norm_cases.cpp: any apply_qk shape, the
    # extended-precision reference, eps up to 3, weight_offset 1 and -0.5, partial rotary, up to
    # 4 axes): the bugs its retired kernel was checked for, in the one engine.
    Mutant(
        "streams-norm-tail-not-normalised",
        STREAMS,
        "    if (w != nullptr) {\n      normalise(v, w, first, st.width, r);\n    }",
        "    (void)r;",
        "norm: the features past rotary_dim stored as they came, not normalised",
    ),
    Mutant(
        "streams-norm-weight-shifted",
        STREAMS,
        "      v[j] = (v[j] * r) * __ldg(w + first + j);",
        "      v[j] = (v[j] * r) * __ldg(w + first + (j ^ 1));",
        "norm: each feature takes its neighbour's weight (a of a plane takes b's)",
    ),
    Mutant(
        "streams-norm-weight-not-applied",
        STREAMS,
        "      v[j] = (v[j] * r) * __ldg(w + first + j);",
        "      v[j] = v[j] * r;",
        "norm: the weight (Gemma's 1 + w included) never applied",
    ),
    Mutant(
        "streams-axis-3-reads-axis-2",
        STREAMS,
        "  const int32_t axis = tb.axes.num_axes > 0 ? plane_axis(tb.axes, k) : 0;\n"
        "  const int64_t at =",
        "  const int32_t any_axis = tb.axes.num_axes > 0 ? plane_axis(tb.axes, k) : 0;\n"
        "  const int32_t axis = any_axis > 2 ? 2 : any_axis;\n  const int64_t at =",
        "at most 3 axes assumed: a 4th axis reads the 3rd axis's position",
    ),
    Mutant(
        "norm-no-device-guard",
        "cuda/common_glue.h",
        "  const typename Runtime::Guard guard(Runtime::device_of(q));\n"
        "  return detail::rms_norm_apply_qk_body",
        "  return detail::rms_norm_apply_qk_body",
        "rms_norm_apply_qk without the device guard: runs on whatever device is current",
    ),
    Mutant(
        "kv-norm-no-device-guard",
        "cuda/common_glue.h",
        "  const typename Runtime::Guard guard(Runtime::device_of(q));\n"
        "  return detail::rms_norm_apply_qk_cache_body",
        "  return detail::rms_norm_apply_qk_cache_body",
        "rms_norm_apply_qk_cache without the device guard: runs on whatever device is current",
    ),
    # The norm's half-warp per row (fold_lanes): the lane math the cooperative host run checks.
    Mutant(
        "streams-norm-fold-reordered",
        STREAMS,
        "  p = fold_lanes<8>(p, mask, lane);\n  p = fold_lanes<4>(p, mask, lane);",
        "  p = fold_lanes<4>(p, mask, lane);\n  p = fold_lanes<8>(p, mask, lane);",
        "the norm's partial sums folded in another order: another sum, not the CPU's bits",
    ),
    Mutant(
        "streams-norm-shuffle-offset",
        STREAMS,
        "  p = fold_lanes<2>(p, mask, lane);",
        "  p = fold_lanes<4>(p, mask, lane);",
        "a wrong shuffle offset: partials 2 apart never meet, those 4 apart meet twice",
    ),
    Mutant(
        "streams-norm-lane-out-of-mask",
        STREAMS,
        "  const unsigned mask = 0xffffu << (threadIdx.x & 16u);  // the row's half-warp",
        "  const unsigned mask = 0x7fffu << (threadIdx.x & 16u);  // the row's half-warp",
        "the row's last lane left out of the shuffles' mask",
    ),
    Mutant(
        "streams-norm-mask-whole-warp",
        STREAMS,
        "  const unsigned mask = 0xffffu << (threadIdx.x & 16u);  // the row's half-warp",
        "  const unsigned mask = 0xffffffffu;  // the row's half-warp",
        "the shuffles' mask spans both rows of the warp: a row dropped by the checks, or the "
        "segment's padding, leaves its partner row waiting on exited lanes",
    ),
    Mutant(
        "streams-norm-group-width",
        STREAMS,
        "constexpr int kRowLanes = static_cast<int>(kStreamChunk);",
        "constexpr int kRowLanes = static_cast<int>(kStreamChunk) / 2;",
        "8 threads per norm row instead of 16: half the partial sums never summed",
    ),
    Mutant(
        "streams-segment-not-warp-aligned",
        STREAMS,
        "    sp.span = ceil_div(sp.threads, static_cast<int64_t>(kWarpSize)) * kWarpSize;",
        "    sp.span = sp.threads;",
        "a stream's segment starts mid-warp: a norm row's 16 threads straddle two half-warps",
    ),
    # Dynamic fp8 scales: a half-warp per scale group, its maxima folded by shuffles.
    Mutant(
        "streams-amax-shuffle-offset",
        STREAMS,
        "  for (int step = 8; step >= 1; step /= 2) {\n    m = fold_amax(",
        "  for (int step = 4; step >= 1; step /= 2) {\n    m = fold_amax(",
        "the group's maxima folded from 8 threads: the other 8 threads' maxima never meet them",
    ),
    Mutant(
        "streams-amax-lane-out-of-mask",
        STREAMS,
        "  const unsigned mask = 0xffffu << (threadIdx.x & 16u);  // the group's half-warp",
        "  const unsigned mask = 0x7fffu << (threadIdx.x & 16u);  // the group's half-warp",
        "the scale group's last thread left out of the amax shuffles' mask",
    ),
    Mutant(
        "streams-dynamic-not-measured",
        STREAMS,
        "  for (int pass = sp.dynamic ? 0 : 1; pass < 2; ++pass) {",
        "  for (int pass = 1; pass < 2; ++pass) {",
        "dynamic scales never measured: the rows stored with scale 1, no scale written",
    ),
    Mutant(
        "streams-dynamic-drop-not-agreed",
        STREAMS,
        "    if (group_any(dropped)) {",
        "    if (dropped) {",
        "a dropped row's threads leave alone: the group's other threads shuffle with exited lanes",
    ),
    Mutant(
        "streams-dynamic-scale-index",
        STREAMS,
        "      store_scalar(tg.scales + t * tg.scale_token_stride + h0 * tg.scale_head_stride, ",
        "      store_scalar(tg.scales + t * tg.scale_token_stride + h0, ",
        "a per-row scale written at the head's index without its stride",
    ),
    Mutant(
        "streams-per-token-first-head",
        STREAMS,
        "    for (int64_t i = lane; i < sp.group_heads * sp.lanes; i += kRowLanes) {",
        "    for (int64_t i = lane; i < sp.lanes; i += kRowLanes) {",
        "a per-token group measures and stores its first head only",
    ),
    Mutant(
        "kv-pow2-rounded-down",
        "kv_cache_args.h",
        "  return fp32_from((fp32_bits(scale) + 0x007FFFFFu) & 0xFF800000u);",
        "  return fp32_from(fp32_bits(scale) & 0xFF800000u);",
        "power-of-two scales rounded down: the largest values saturate",
    ),
    Mutant(
        "kv-dynamic-zero-amax",
        "kv_cache_args.h",
        "  if (amax == A(0)) {\n    scale = 1.0f;\n  } else if",
        "  if (false) {\n    scale = 1.0f;\n  } else if",
        "an all-zero group gets scale 0: its rows store 0 / 0, NaN",
    ),
    Mutant(
        "qk-fp8-no-device-guard",
        "cuda/common_glue.h",
        "  const typename Runtime::Guard guard(Runtime::device_of(q));\n"
        "  return detail::apply_qk_fp8_body",
        "  return detail::apply_qk_fp8_body",
        "apply_qk_fp8 without the device guard: runs on whatever device is current",
    ),
]


# The outside review's planted bugs that every CPU-side check missed, each now caught by the check
# it names: bad packings of every kind on the device and cu_seqlens / seq_offsets of independent
# integer types (forms_cases.cpp), non-finite frequencies on the device, the exact-angle core's
# device branches run on the host (exact_angle_host.cpp), the row streams past 2^32 threads,
# source elements and cache elements (big_cases.cpp), every host run in both thread orders with a
# one-store-per-byte ledger (store_ledger.h), and pointers into host memory refused at launch.
MUTANTS += [
    Mutant(
        "packed-device-length-multiple-unchecked",
        "cuda/common_device.cuh",
        "start % cp == 0 && (cp == 1 || length % (2 * cp) == 0) && j >= 0",
        "start % cp == 0 && j >= 0",
        "a sequence length not divisible by 2 * cp_size placed off its zigzag chunk on the device",
    ),
    Mutant(
        "packed-device-negative-first-boundary",
        "cuda/common_device.cuh",
        "  bool ok = cu(0) == 0 && last % cp == 0",
        "  bool ok = cu(0) <= 0 && last % cp == 0",
        "a negative cu_seqlens[0] accepted on the device",
    ),
    Mutant(
        "packed-device-offsets-read-with-cu-width",
        "cuda/common_device.cuh",
        "read_index(s.seq_offsets, s.seq_offsets_are_int64, i)",
        "read_index(s.seq_offsets, s.cu_seqlens_are_int64, i)",
        "seq_offsets read with cu_seqlens' integer width (int32 with int64 passes validation)",
    ),
    Mutant(
        "packed-device-no-sequence-read",
        "cuda/common_device.cuh",
        "  ROPE_DEVICE_ASSERT(s.num_seqs >= 1);\n  if (s.num_seqs < 1) {\n    return false;\n  }\n",
        "",
        "cu_seqlens = [0] with tokens: cu_seqlens[1] and seq_offsets[0] read past their ends",
    ),
    Mutant(
        "freqs-nonfinite-rotates-by-zero",
        "cuda/rope_kernel.cuh",
        "  if (!finite_bits(bits)) {\n    constexpr float nan",
        "  if (false) {\n    constexpr float nan",
        "an inf / NaN frequency on the device rotates by angle 0 instead of giving NaN",
    ),
    Mutant(
        "exact-device-mul-hi-32-bit",
        EXACT,
        "  return __umul64hi(a, b);",
        "  return __umul64hi(a & 0xffffffffu, b);",
        "the device branch's 64 x 64 high product from 32 bits of one factor",
    ),
    Mutant(
        "exact-device-sin-table-index-wraps",
        EXACT,
        "__ldg(reinterpret_cast<const float2*>(kSinTableDevice) + i);",
        "__ldg(reinterpret_cast<const float2*>(kSinTableDevice) + (i & 63u));",
        "the device branch's sin-table index wraps at 64 (entry 64, cos(0), read as sin(0))",
    ),
    Mutant(
        "exact-device-flip-sign-dropped",
        EXACT,
        "  return __longlong_as_double(static_cast<long long>(double_bits(x) ^ (flip << 63)));",
        "  return __longlong_as_double(static_cast<long long>(double_bits(x)));",
        "the device branch of the float64 path never flips a quadrant's sign",
    ),
    Mutant(
        "streams-thread-index-32-bit",
        STREAMS,
        "  int64_t w = grid_thread_index<kBlockThreads>();",
        "  int64_t w = static_cast<uint32_t>(grid_thread_index<kBlockThreads>());",
        "the row streams' thread index held in 32 bits (a serving call past 2^32 threads)",
    ),
    Mutant(
        "streams-source-offset-32-bit",
        STREAMS,
        "static_cast<const T*>(st.src) + t * st.token_stride + h * st.head_stride;",
        "static_cast<const T*>(st.src) +\n"
        "      static_cast<int32_t>(t * st.token_stride + h * st.head_stride);",
        "a source row's element offset held in 32 bits (a source view past 2^31 elements)",
        copies=2,
    ),
    Mutant(
        "streams-cache-row-32-bit",
        STREAMS,
        "    offset = slot_row(tg, slot, h);",
        "    offset = static_cast<int32_t>(slot_row(tg, slot, h));",
        "a cache row's element offset held in 32 bits (a KV cache past 2^31 elements)",
    ),
    Mutant(
        "streams-rotating-lane-stores-into-tail",
        STREAMS,
        "    emit_chunk<kVector, T>(st.target, dst, first, R, v, sink);\n  } else {",
        "    emit_chunk<kVector, T>(st.target, dst, first, st.width, v, sink);\n  } else {",
        "the last rotating lane also stores the first tail features, which the tail lane rewrites "
        "(a race the serial order hides)",
    ),
    Mutant(
        "glue-seq-offsets-left-on-host",
        "cuda/common_glue.h",
        "      on_device.seq_offsets = Runtime::to_device(packed.seq_offsets, x);",
        "      on_device.seq_offsets = packed.seq_offsets;",
        "seq_offsets given on the host passed to the kernel as a host pointer",
    ),
]


def write_overlay(overlay: Path, mutant=None):
    write_sources(overlay, SOURCES, mutant)
    write_sources(overlay.parent / (overlay.name + "_glue"), GLUE_SOURCES, mutant)


def write_sources(overlay: Path, sources, mutant):
    # Files are rewritten only when their text changes, so a mutant rebuilds only what includes
    # the mutated file (the glue's translation unit includes torch and is slow to compile).
    for stale in [p for p in overlay.rglob("*") if p.is_file()] if overlay.exists() else []:
        if str(stale.relative_to(overlay)) not in sources:
            stale.unlink()
    for rel, src in sources.items():
        dst = overlay / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        text = src.read_text()
        if mutant is not None and rel == mutant.file:
            count = text.count(mutant.before)
            if count != mutant.copies:
                raise SystemExit(
                    f"mutant {mutant.name}: its text occurs {count} times in "
                    f"{src} (expected {mutant.copies}); update MUTANTS to the current code"
                )
            text = text.replace(mutant.before, mutant.after)
        if not dst.exists() or dst.read_text() != text:
            dst.write_text(text)
        if rel == "common_kernel_args.h" and text == src.read_text():
            # Also reached through csrc/ (common_prepare.h) by the launch-plan tests: with the same
            # mtime and content, GCC's #pragma once takes the copy for the same file.
            os.utime(dst, ns=(src.stat().st_atime_ns, src.stat().st_mtime_ns))


@dataclass
class Lane:
    """One mutant at a time: its overlay directories and the targets built against them."""

    build_dir: Path
    suffix: str  # "" for lane 0, "_n" for lane n

    @property
    def overlay(self) -> Path:
        return self.build_dir / "tests" / "cuda_host" / f"mutant_overlay{self.suffix}"

    def host_target(self, kind: str) -> str:
        """kind: "host" (the host run), "streams" (the row streams')."""
        base = {
            "host": "cuda_host_mutant",
            "streams": "cuda_host_streams_mutant",
            "exact_angle": "cuda_host_exact_angle_mutant",
        }[kind]
        return base + self.suffix

    def host_binary(self, kind: str) -> Path:
        return self.build_dir / "tests" / "cuda_host" / self.host_target(kind)

    @property
    def plan_target(self) -> str:
        return "rope_launch_plan_mutant" + self.suffix

    @property
    def plan_binary(self) -> Path:
        return self.build_dir / "tests" / "cpp" / self.plan_target


def configured_lanes(build_dir: Path):
    """The lanes the build was configured with (their overlay directories exist)."""
    lanes = [Lane(build_dir, "")]
    while lanes[-1].overlay.is_dir() and Lane(build_dir, f"_{len(lanes)}").overlay.is_dir():
        lanes.append(Lane(build_dir, f"_{len(lanes)}"))
    return lanes


def build(build_dir: Path, targets):
    """One build command for ``targets`` (ninja compiles them in parallel).

    ccache runs in preprocessor mode (CCACHE_NODIRECT): its direct mode finds a cached object from
    a manifest of the include files' paths, which a mutant overlay of another build directory at
    the same depth shares, and could serve an unmutated object to a mutant target (a false
    "survived"). The preprocessor mode hashes the preprocessed source itself, mutant included."""
    result = subprocess.run(
        ["cmake", "--build", str(build_dir), "--target", *targets],
        capture_output=True,
        text=True,
        env={**os.environ, "CCACHE_NODIRECT": "1"},
    )
    return result.returncode == 0, result.stdout + result.stderr


def side_by_side(function, items):
    """``function`` of each item, run at the same time (each waits on a subprocess)."""
    with ThreadPoolExecutor(max_workers=max(1, len(items))) as pool:
        return list(pool.map(lambda item: function(*item), items))


def run_plan_tests(binary: Path, timeout: float):
    """The launch-plan unit tests against the overlay; ("failed", first failure) or "passed"."""
    try:
        result = subprocess.run(
            [str(binary), "--gtest_filter=LaunchPlan*", "--gtest_brief=1", "--gtest_color=no"],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return "timeout", ""
    out = result.stdout + result.stderr
    if result.returncode == 0:
        return "passed", out
    lines = [
        ln for ln in out.splitlines() if "Failure" in ln or "Expected" in ln or "Value of" in ln
    ]
    return "failed", "launch-plan tests: " + " | ".join(lines[:3])


def run_host(binary: Path, cases: int, seed: int, timeout: float):
    try:
        result = subprocess.run(
            [
                str(binary),
                "--cases",
                str(cases),
                "--seed",
                str(seed),
                "--max-failures",
                "1",
                "--no-coverage-gate",
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return "timeout", ""
    out = result.stdout + result.stderr
    return ("passed" if result.returncode == 0 else "failed"), out


def first_failure(out: str) -> str:
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if (
            line.startswith("    ")
            and i > 0
            and any(prev.startswith("FAILED") for prev in lines[:i])
        ):
            return line.strip()
        if "runtime error" in line or "ERROR: AddressSanitizer" in line or "cuda host shim" in line:
            return line.strip()
    return next((text for text in lines if "FAILED" in text), lines[-1] if lines else "")


# The checks a mutant goes through, in order, until one fails: the host run of the kernels
# (cuda_host_run: every op through the glue, bit comparisons with the CPU backend, the big cases),
# the torch-free host run of the row streams' kernel against its independent reference
# (stream_host.cpp: out-of-range slots and positions, float64), the launch-plan unit tests, and
# the tuning defaults of scripts/sass_report.py (a text check of the plan header).
CHECK_NAMES = {
    "streams": "row streams host run",
    "exact_angle": "exact-angle host run",
    "host": "host run",
    "plan": "launch-plan tests",
    "tuning": "tuning defaults",
}


def checks_of(m):
    if m.file in STREAM_FILES:
        return ["streams", "host"]
    if m.file in EXACT_ANGLE_FILES:
        return ["exact_angle", "host"]
    if m.file == "cuda/rope_launch_plan.h":
        return ["host", "plan", "tuning"]
    return ["host"]


def run_tuning_check(overlay: Path):
    """scripts/sass_report.py --check-tuning on the mutated plan header."""
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "sass_report.py"),
            "--check-tuning",
            str(overlay / "cuda" / "rope_launch_plan.h"),
        ],
        capture_output=True,
        text=True,
    )
    out = (result.stdout + result.stderr).strip()
    return ("passed" if result.returncode == 0 else "failed"), out.splitlines()[-1] if out else ""


def target_of(lane, check):
    if check == "plan":
        return lane.plan_target
    return lane.host_target(check)


def run_stage(build_dir: Path, items, args):
    """One check for each (lane, mutant, check): builds what they need in one command, runs them
    side by side. [(status, how)], or None when a mutant does not compile."""
    targets = [target_of(lane, c) for lane, _, c in items if c != "tuning"]
    if targets:
        ok, log = build(build_dir, targets)
        if not ok:
            # Which one: build each alone, for its own log.
            for lane, m, c in items:
                if c == "tuning":
                    continue
                ok, log = build(build_dir, [target_of(lane, c)])
                if not ok:
                    print(log[-3000:])
                    print(f"mutant {m.name}: does not compile; a mutant must be plausible code")
                    return None

    def one(lane, m, c):
        if c == "tuning":
            return run_tuning_check(lane.overlay)
        if c == "plan":
            return run_plan_tests(lane.plan_binary, args.timeout)
        status, out = run_host(lane.host_binary(c), args.cases, args.seed, args.timeout)
        how = {"failed": first_failure(out), "timeout": "timed out", "passed": "NOT CAUGHT"}[status]
        return status, how

    return side_by_side(one, items)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build-dir", default=str(REPO / "build"))
    parser.add_argument("--cases", type=int, default=600)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--only", help="run only the mutants of these names (comma-separated)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per run")
    parser.add_argument(
        "--lanes", type=int, help="mutants at a time (default: the configured lanes, at most nproc)"
    )
    args = parser.parse_args()
    build_dir = Path(args.build_dir)
    lanes = configured_lanes(build_dir)
    if not lanes[0].overlay.parent.is_dir():
        print(
            f"mutation check: {lanes[0].overlay.parent} does not exist; build with "
            "TORCH_ROPE_BUILD_TESTS=ON first (scripts/build.sh)"
        )
        return 2
    wanted = args.lanes or min(len(lanes), os.cpu_count() or 1)
    if not 1 <= wanted <= len(lanes):
        print(f"mutation check: --lanes {wanted}, but the build has {len(lanes)} lane(s)")
        return 2
    lanes = lanes[:wanted]

    only = set(args.only.split(",")) if args.only else None
    mutants = [m for m in MUTANTS if only is None or m.name in only]
    if only is not None and len(mutants) != len(only):
        print(f"mutation check: no mutant named {sorted(only - {m.name for m in mutants})}")
        return 2
    lanes = lanes[: len(mutants)] or lanes[:1]
    start = time.time()
    try:
        for lane in lanes:
            write_overlay(lane.overlay)
        # Every host run a selected mutant goes through (KV-cache and row-stream mutants: two).
        kinds = ["host"]
        kinds += ["streams"] * any(m.file in STREAM_FILES for m in mutants)
        kinds += ["exact_angle"] * any(m.file in EXACT_ANGLE_FILES for m in mutants)
        for kind in kinds:
            target = lanes[0].host_target(kind)
            ok, log = build(build_dir, [lane.host_target(kind) for lane in lanes])
            if not ok:
                print(log)
                print(f"mutation check: the unmutated host run ({target}) does not build")
                return 1
            runs = [(lane.host_binary(kind), args.cases, args.seed, args.timeout) for lane in lanes]
            for status, out in side_by_side(run_host, runs):
                if status != "passed":
                    print(out[-4000:])
                    print(f"mutation check: the unmutated host run ({target}) does not pass")
                    return 1
            print(
                f"unmutated: {target} passed {args.cases} cases (seed {args.seed}) "
                f"in {len(lanes)} lane(s)"
            )
        if any(m.file == "cuda/rope_launch_plan.h" for m in mutants):
            ok, log = build(build_dir, [lane.plan_target for lane in lanes])
            if not ok:
                print(log[-3000:])
                print("mutation check: the unmutated launch-plan tests do not build")
                return 1
            runs = [(lane.plan_binary, args.timeout) for lane in lanes]
            for status, out in side_by_side(run_plan_tests, runs):
                if status != "passed":
                    print(out[-3000:])
                    print("mutation check: the unmutated launch-plan tests do not pass")
                    return 1
            print("unmutated: the launch-plan tests pass")
            status, how = run_tuning_check(lanes[0].overlay)
            if status != "passed":
                print(how)
                print("mutation check: the unmutated plan header fails the tuning check")
                return 1
            print("unmutated: the tuning defaults are the checked ones")

        survived = []
        for first in range(0, len(mutants), len(lanes)):
            t0 = time.time()
            batch = list(zip(lanes, mutants[first : first + len(lanes)]))
            for lane, m in batch:
                write_overlay(lane.overlay, m)
            # Each mutant goes through its checks in order until one catches it; the mutants of
            # a batch that are still alive take their next check together.
            alive = [(lane, m, 0) for lane, m in batch]
            while alive:
                stage = [(lane, m, checks_of(m)[i]) for lane, m, i in alive]
                status = run_stage(build_dir, stage, args)
                if status is None:
                    return 1
                nxt = []
                for (lane, m, i), (result, how) in zip(alive, status):
                    if result != "passed":
                        print(
                            f"caught   {m.name:38s} {time.time() - t0:5.1f} s  ({m.why})\n"
                            f"         {how[:200]}"
                        )
                    elif i + 1 < len(checks_of(m)):
                        nxt.append((lane, m, i + 1))
                    else:
                        survived.append(m)
                        names = " and ".join(CHECK_NAMES[c] for c in checks_of(m))
                        print(
                            f"SURVIVED {m.name:38s} {time.time() - t0:5.1f} s  ({m.why})\n"
                            f"         NOT CAUGHT ({names})"
                        )
                alive = nxt
    finally:
        for lane in lanes:
            write_overlay(lane.overlay)  # leave the overlays unmutated

    print(
        f"\n{len(mutants) - len(survived)} of {len(mutants)} mutants caught in "
        f"{time.time() - start:.0f} s ({len(lanes)} at a time)"
    )
    if survived:
        print("SURVIVED: " + ", ".join(m.name for m in survived))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
