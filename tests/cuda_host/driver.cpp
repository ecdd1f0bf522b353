// SPDX-License-Identifier: BSD-3-Clause
// Host run of the CUDA kernels: random calls of rope.apply, rope.apply_ and rope.apply_qk go
// through the project's own op bodies (rope_body.h: validation, common_prepare.cpp, allocation),
// exactly as on CUDA, but the backend launches the real rope_kernel.cuh compiled for the host
// (host_kernel.cpp), the threads of each block as cooperative fibers, under ASan and UBSan. Each
// result is held against an independent extended-precision reference and the CPU backend, and each
// launch against the access rules of access_tracker.h; the buffers around every input and around x
// of apply_ must come back unchanged.
//
// Then the random calls of rope.rms_norm_apply_qk (norm_cases.h) and rope.apply_qk_cache
// (kv_cache_cases.h), and of the serving fusions (serving_cases.h), through the same glue.
//
//   cuda_host_run [--cases N] [--seed S] [--only I] [--max-failures F] [--no-coverage-gate] [-v]
//                 [--norm-cases N] [--norm-only I] [--kv-cases N] [--kv-only I]
//                 [--serving-cases N] [--qk-fp8-only I] [--mla-only I]
//                 [--kv-norm-only I]
//
// Registered with ctest (label cuda-host). Exit status 0 when every case passed.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch_rope/ops.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "access_tracker.h"
#include "big_cases.h"
#include "cases.h"
#include "compare.h"
#include "forms_cases.h"
#include "host_backend.h"
#include "host_kernel.h"
#include "kv_cache_cases.h"
#include "norm_cases.h"
#include "serving_cases.h"

// The driver links libtorch, which is not instrumented and keeps some allocations until exit:
// leak reports would be about torch, not the kernel. Every other ASan / UBSan finding aborts.
extern "C" const char* __asan_default_options() { return "detect_leaks=0:abort_on_error=1"; }
extern "C" const char* __ubsan_default_options() { return "print_stacktrace=1:halt_on_error=1"; }

namespace rope_host {
namespace {

// Coverage of the paths the kernel and its planning can take, counted over all launches. The
// run fails when a path was never taken, so the generator cannot drift away from one unseen.
struct Coverage {
  std::map<std::string, int64_t> hits;
  void hit(const std::string& what, bool cond = true) {
    if (cond) {
      ++hits[what];
    } else {
      hits.emplace(what, 0);
    }
  }
};

// The multi-axis paths of one launch: rotating lanes whose planes all read one axis (vector
// table loads where the plan allows them) or read several (plane-by-plane loads), rows that only
// check or copy, the axis strides, shared rows.
void count_multi_axis_launch(const LaunchRecord& r, const Case& c, Coverage& cov) {
  const rope::cuda::KernelParams& p = r.params;
  const int storage = static_cast<int>(c10::elementSize(c.dtype));
  bool one_axis_vector_tables = false;
  bool across_axes = false;
  for (const rope::cuda::TensorPlan* t : {&p.tensor[0], &p.tensor[1]}) {
    if (t->num_threads == 0) {
      continue;
    }
    const int64_t planes = rope::cuda::lane_shape(t->rot_access, storage, c.interleaved).planes;
    for (int64_t lane = 0; lane < t->rot_lanes; ++lane) {
      bool same = true;
      for (int64_t j = 1; j < planes; ++j) {
        same = same && rope::axis_of_plane(p.tables.axes, lane * planes + j) ==
                           rope::axis_of_plane(p.tables.axes, lane * planes);
      }
      one_axis_vector_tables =
          one_axis_vector_tables || (same && planes > 1 && p.tables.vector_loads);
      across_axes = across_axes || !same;
    }
    cov.hit("multi-axis: rows that only check or copy (no rotating lane)", t->rot_lanes == 0);
    cov.hit("multi-axis: axis stride > 1 (not the innermost dim)", t->axis_stride > 1);
    cov.hit("multi-axis: several shared rows per token", t->shared_rows > 1);
    cov.hit("multi-axis: vector rotation",
            t->rot_lanes > 0 && t->rot_access == rope::cuda::Access::kVector);
    cov.hit("multi-axis: paired rotation",
            t->rot_lanes > 0 && t->rot_access == rope::cuda::Access::kPair);
  }
  cov.hit("multi-axis: a lane on one axis with vector table loads", one_axis_vector_tables);
  cov.hit("multi-axis: a lane across axes (plane-by-plane table loads)", across_axes);
  cov.hit("multi-axis: q/k in one launch",
          p.tensor[0].num_threads > 0 && p.tensor[1].num_threads > 0);
}

void count_launch(const LaunchRecord& r, const rope::TableArgs& tables, const at::Tensor& cos,
                  const Case& c, Coverage& cov) {
  using rope::cuda::Access;
  const bool interleaved = c.interleaved;
  const bool sixteen_bit = c.dtype == at::kHalf || c.dtype == at::kBFloat16;
  if (!r.launched) {
    return;
  }
  const rope::cuda::KernelParams& p = r.params;
  const rope::cuda::TensorPlan& t0 = p.tensor[0];
  const rope::cuda::TensorPlan& t1 = p.tensor[1];
  cov.hit("vector kernel", r.vector_kernel);
  cov.hit("scalar-only kernel", !r.vector_kernel);
  cov.hit("q/k in one launch", t0.num_threads > 0 && t1.num_threads > 0);
  const bool both_rotate =
      t0.num_threads > 0 && t1.num_threads > 0 && t0.rot_lanes > 0 && t1.rot_lanes > 0;
  const auto q_k_paths = [&](Access x, Access y) {
    return both_rotate && ((t0.rot_access == x && t1.rot_access == y) ||
                           (t0.rot_access == y && t1.rot_access == x));
  };
  cov.hit("q/k rotations 16-byte and paired", q_k_paths(Access::kVector, Access::kPair));
  cov.hit("q/k rotations 16-byte and scalar", q_k_paths(Access::kVector, Access::kScalar));
  cov.hit("q/k rotations paired and scalar", q_k_paths(Access::kPair, Access::kScalar));
  bool any_vector = false;
  bool any_pair = false;
  for (const rope::cuda::TensorPlan* t : {&t0, &t1}) {
    if (t->num_threads == 0) {
      continue;
    }
    const bool vec = t->rot_lanes > 0 && t->rot_access == Access::kVector;
    const bool pair = t->rot_lanes > 0 && t->rot_access == Access::kPair;
    const bool scalar = t->rot_lanes > 0 && t->rot_access == Access::kScalar;
    any_vector = any_vector || vec;
    any_pair = any_pair || pair;
    cov.hit("rotation, vector path", vec);
    cov.hit("rotation, scalar path", scalar);
    cov.hit("rotation, scalar path, 16-bit (2-byte rows)", scalar && sixteen_bit);
    cov.hit("rotation, paired path, interleaved", pair && interleaved);
    cov.hit("rotation, paired path, half split", pair && !interleaved);
    cov.hit("rotation, paired path, vector kernel", pair && r.vector_kernel);
    cov.hit("rotation, paired path, scalar-only kernel", pair && !r.vector_kernel);
    cov.hit("vector rotation with a vector tail", vec && t->vec_copy_lanes > 0);
    cov.hit("vector rotation with a pair tail", vec && t->pair_copy_lanes > 0);
    cov.hit("vector rotation with a scalar tail", vec && t->scalar_copy_lanes > 0);
    cov.hit("pair rotation with a vector tail", pair && t->vec_copy_lanes > 0);
    cov.hit("pair rotation with a pair tail", pair && t->pair_copy_lanes > 0);
    cov.hit("pair rotation with a scalar tail", pair && t->scalar_copy_lanes > 0);
    cov.hit("scalar rotation with a vector tail", scalar && t->vec_copy_lanes > 0);
    cov.hit("scalar rotation with a pair tail", scalar && t->pair_copy_lanes > 0);
    cov.hit("vector, pair and scalar tail lanes in one row",
            t->vec_copy_lanes > 0 && t->pair_copy_lanes > 0 && t->scalar_copy_lanes > 0);
    cov.hit("no rotating lane, copy lanes only",
            t->rot_lanes == 0 && t->lanes > 0 &&
                (t->vec_copy_lanes + t->pair_copy_lanes + t->scalar_copy_lanes) > 0);
    cov.hit("position-check-only lane", t->rot_lanes == 0 && t->vec_copy_lanes == 0 &&
                                            t->pair_copy_lanes == 0 && t->scalar_copy_lanes == 0);
    cov.hit("several rows per thread", t->rows_per_thread > 1);
    cov.hit("uneven last row group",
            t->rows_per_thread > 1 && t->shared_rows % t->rows_per_thread != 0);
    cov.hit("two shared dims (outer and inner)",
            t->shared_rows > t->shared_inner && t->shared_inner > 1);
    cov.hit(">= 2 token dims", t->token_ndim >= 2);
    cov.hit("int32 positions", !t->positions_are_int64);
    cov.hit("out of place", t->in != t->out);
    cov.hit("in place", t->in == t->out);
  }
  if (c.num_axes() > 0) {
    count_multi_axis_launch(r, c, cov);
  }
  cov.hit("table vector loads", any_vector && p.tables.vector_loads);
  cov.hit("table scalar loads on the vector path", any_vector && !p.tables.vector_loads);
  cov.hit("table vector loads on the paired half-split path",
          any_pair && !interleaved && p.tables.vector_loads);
  cov.hit("tables copied by prepare_tables", tables.cos != cos.const_data_ptr());
  cov.hit("several blocks", r.blocks > 1);
}

// The multi-axis cases: every number of axes, both section layouts, zero-sized sections, partial
// rotation, every dtype, pair layout and op, positions built axis-first, and a position out of
// range on an axis other than 0.
void count_multi_axis_case(const Case& c, Coverage& cov) {
  const int64_t n = c.num_axes();
  for (int64_t a = 1; a <= rope::kMaxAxes; ++a) {
    cov.hit("multi-axis: " + std::to_string(a) + " axes", n == a);
  }
  if (n == 0) {
    return;
  }
  cov.hit("multi-axis: interleaved sections (Qwen3-VL)", c.mrope_interleaved);
  cov.hit("multi-axis: contiguous sections, >= 3 axes", !c.mrope_interleaved && n >= 3);
  cov.hit("multi-axis: a zero-sized section",
          n > 1 && std::find(c.mrope_section.begin(), c.mrope_section.end(), 0) !=
                       c.mrope_section.end());
  cov.hit("multi-axis: partial rotation", c.rotary_dim > 0 && c.rotary_dim < c.head_dim);
  cov.hit("multi-axis: interleaved pairs", c.interleaved);
  cov.hit("multi-axis: half-split pairs", !c.interleaved);
  cov.hit("multi-axis: inverse", c.inverse);
  cov.hit("multi-axis: float64 tables", c.table_dtype == at::kDouble);
  for (const at::ScalarType t : {at::kDouble, at::kFloat, at::kHalf, at::kBFloat16}) {
    cov.hit(std::string("multi-axis: dtype ") + c10::toString(t), c.dtype == t);
  }
  for (const Op op : {Op::kApply, Op::kApplyInPlace, Op::kApplyOut, Op::kApplyQK}) {
    cov.hit(std::string("multi-axis: op ") + op_name(op), c.op == op);
  }
  cov.hit("multi-axis: int32 positions", c.positions.view.scalar_type() == at::kInt);
  cov.hit("multi-axis: positions built (A, ...) and moved to (..., A)",
          c.positions.layout.rfind("axes-first", 0) == 0);
  cov.hit("multi-axis: out-of-range position on axis 0", !c.positions_in_range && c.bad_axis == 0);
  cov.hit("multi-axis: out-of-range position on another axis",
          !c.positions_in_range && c.bad_axis > 0 && c.positions.view.stride(-1) != 0);
}

struct Totals {
  int64_t cases = 0;
  int64_t big_cases = 0;
  int64_t failures = 0;
  int64_t assert_cases = 0;
  int64_t launches = 0;
  std::map<int64_t, int64_t> by_axes;  // multi-axis cases by number of axes
  std::map<std::string, int64_t> by_op;
  Tally tally;
  Coverage coverage;
  // What the occupancy cache of the kernel header should have asked the runtime: once per
  // (device ordinal, kernel) below 64 ordinals, every time above.
  std::set<std::pair<int, const void*>> cached_queries;
  int64_t uncached_queries = 0;
};

// Runs one case; returns its problems (empty: passed).
std::vector<std::string> run_case(const Case& c, const CpuVectorPath& cpu_path, Totals& totals) {
  CaseContext ctx;
  ctx.device = c.device;
  // The caller's current device is another one: the op's guard must switch to x's and back.
  ctx.start_device = (c.device.ordinal + 1 + static_cast<int>(c.index % 7)) % 68;
  ctx.positions_in_range = c.positions_in_range;
  for (const Viewed* v : {&c.x, &c.k, &c.out, &c.cos, &c.sin, &c.positions}) {
    ctx.place(v->buffer);
  }
  std::vector<std::string>& problems = ctx.problems;

  // Snapshots of every buffer, to prove the inputs untouched afterwards.
  const at::Tensor x_buffer_before = c.x.buffer.clone();
  const at::Tensor x_before = c.x.view.clone();
  const at::Tensor k_before = c.op == Op::kApplyQK ? c.k.view.clone() : at::Tensor();
  const at::Tensor k_buffer_before = c.op == Op::kApplyQK ? c.k.buffer.clone() : at::Tensor();
  const at::Tensor out_buffer_before = c.op == Op::kApplyOut ? c.out.buffer.clone() : at::Tensor();
  const at::Tensor cos_before = c.cos.buffer.clone();
  const at::Tensor sin_before = c.sin.buffer.clone();
  const at::Tensor pos_before = c.positions.buffer.clone();
  const at::Tensor& cos = c.cos.view;
  const at::Tensor& sin = c.sin.view;
  const at::Tensor& positions = c.positions.view;

  // The CPU backend first, on the untouched inputs (out of place, even for apply_).
  at::Tensor cpu_x;
  at::Tensor cpu_k;
  bool cpu_rejected = false;
  try {
    if (c.op == Op::kApplyQK) {
      std::tie(cpu_x, cpu_k) =
          rope::apply_qk(c.x.view, c.k.view, cos, sin, positions, c.interleaved, c.inverse,
                         c.section_arg(), c.mrope_interleaved);
    } else {
      cpu_x = rope::apply(c.x.view, cos, sin, positions, c.interleaved, c.inverse, c.section_arg(),
                          c.mrope_interleaved);
    }
  } catch (const c10::IndexError&) {
    cpu_rejected = true;
  }
  if (c.positions_in_range && cpu_rejected) {
    problems.push_back("the CPU backend rejected positions that are all in range");
  }
  if (!c.positions_in_range && !cpu_rejected) {
    problems.push_back("the CPU backend accepted an out-of-range position");
  }

  // The host run of the CUDA kernel, through the CUDA backend's own glue and op bodies.
  at::Tensor host_x;
  at::Tensor host_k;
  try {
    switch (c.op) {
      case Op::kApply:
        host_x = host_apply(ctx, c.x.view, cos, sin, positions, c.interleaved, c.inverse,
                            c.section_arg(), c.mrope_interleaved);
        break;
      case Op::kApplyInPlace:
        host_apply_(ctx, c.x.view, cos, sin, positions, c.interleaved, c.inverse, c.section_arg(),
                    c.mrope_interleaved);
        host_x = c.x.view;
        break;
      case Op::kApplyOut:
        host_apply_out(ctx, c.x.view, cos, sin, positions, c.interleaved, c.inverse, c.out.view,
                       c.section_arg(), c.mrope_interleaved);
        host_x = c.out.view;
        break;
      case Op::kApplyQK:
        std::tie(host_x, host_k) =
            host_apply_qk(ctx, c.x.view, c.k.view, cos, sin, positions, c.interleaved, c.inverse,
                          c.section_arg(), c.mrope_interleaved);
        break;
    }
  } catch (const c10::Error& e) {
    problems.push_back(std::string("the host-run op raised: ") + e.what_without_backtrace());
  }

  // Inputs untouched; apply_ wrote only inside x.
  if (c.op == Op::kApplyInPlace) {
    if (!outside_unchanged(x_buffer_before, c.x.buffer, c.x.view)) {
      problems.push_back("apply_ changed memory outside x's view");
    }
  } else if (!same_bits(x_buffer_before, c.x.buffer)) {
    problems.push_back("x's buffer changed");
  }
  if (c.op == Op::kApplyOut && !outside_unchanged(out_buffer_before, c.out.buffer, c.out.view)) {
    problems.push_back("apply.out changed memory outside out's view");
  }
  if (c.op == Op::kApplyQK && !same_bits(k_buffer_before, c.k.buffer)) {
    problems.push_back("k's buffer changed");
  }
  if (!same_bits(cos_before, c.cos.buffer) || !same_bits(sin_before, c.sin.buffer)) {
    problems.push_back("cos or sin changed");
  }
  if (!same_bits(pos_before, c.positions.buffer)) {
    problems.push_back("positions changed");
  }
  const int64_t work =
      c.op == Op::kApplyQK ? c.x.view.numel() + c.k.view.numel() : c.x.view.numel();
  if (work > 0 && ctx.launches.size() != 1) {
    problems.push_back("expected one launch, got " + std::to_string(ctx.launches.size()));
  }

  // Values, when every position was valid (otherwise the CPU raised and the kernel asserted).
  if (c.positions_in_range && problems.empty()) {
    compare_rotation(c.op == Op::kApplyQK ? "q" : "x", host_x, cpu_x, x_before, cos, sin, positions,
                     c.interleaved, c.inverse, cpu_path, totals.tally, problems, c.mrope_section,
                     c.mrope_interleaved);
    if (c.op == Op::kApplyQK) {
      compare_rotation("k", host_k, cpu_k, k_before, cos, sin, positions, c.interleaved, c.inverse,
                       cpu_path, totals.tally, problems, c.mrope_section, c.mrope_interleaved);
    }
    if (c.op == Op::kApply || c.op == Op::kApplyQK) {  // new tensors; out= keeps out's strides
      if (host_x.defined() && !host_x.is_contiguous()) {
        problems.push_back("the result is not contiguous");
      }
    }
  }

  ++totals.cases;
  ++totals.by_op[op_name(c.op)];
  totals.launches += static_cast<int64_t>(ctx.launches.size());
  if (!c.positions_in_range) {
    ++totals.assert_cases;
  }
  for (size_t i = 0; i < ctx.launches.size(); ++i) {
    count_launch(ctx.launches[i], ctx.tables[i], cos, c, totals.coverage);
    if (c.device.ordinal < 64) {
      totals.cached_queries.emplace(c.device.ordinal, ctx.launches[i].kernel);
    } else {
      ++totals.uncached_queries;
    }
  }
  if (c.num_axes() > 0) {
    ++totals.by_axes[c.num_axes()];
  }
  count_multi_axis_case(c, totals.coverage);
  totals.coverage.hit("out-of-range position asserted", !c.positions_in_range);
  totals.coverage.hit(
      "out-of-range int64 position outside int32",
      !c.positions_in_range && (c.bad_position > INT32_MAX || c.bad_position < INT32_MIN));
  totals.coverage.hit("out-of-range position with rotary_dim 0",
                      !c.positions_in_range && c.rotary_dim == 0);
  totals.coverage.hit("table-stride defect layout",
                      c.cos.layout == "row-padded-2x" || c.sin.layout == "row-padded-2x");
  totals.coverage.hit("fused qkv slices", c.fused_qk);
  totals.coverage.hit("fused cos|sin cache", c.cos.layout.rfind("fused-cos-sin", 0) == 0);
  totals.coverage.hit("x copied by prepare (inner stride != 1)",
                      c.x.view.dim() > 0 && c.x.view.size(-1) > 1 && c.x.view.stride(-1) != 1);
  totals.coverage.hit("expanded input", c.x.layout.find("expanded") != std::string::npos);
  totals.coverage.hit("occupancy cache bypassed (ordinal >= 64)", c.device.ordinal >= 64);
  for (const at::ScalarType t : {at::kDouble, at::kFloat, at::kHalf, at::kBFloat16}) {
    totals.coverage.hit(std::string("dtype ") + c10::toString(t), c.dtype == t);
  }
  totals.coverage.hit("float64 tables", c.table_dtype == at::kDouble);
  totals.coverage.hit("inverse, half split", c.inverse && !c.interleaved);
  totals.coverage.hit("inverse, interleaved", c.inverse && c.interleaved);
  return problems;
}

// The shim's half / bfloat16 conversions agree with c10's (round to nearest even): every half
// and bfloat16 value, each midpoint to its successor (a tie), and one float-ulp either side.
int64_t check_conversions() {
  int64_t bad = 0;
  const auto check = [&](const char* what, float f, uint16_t got, uint16_t want) {
    if (got != want && bad++ < 5) {
      std::fprintf(stderr, "conversion %s(%.9g): shim 0x%04x, c10 0x%04x\n", what, f, got, want);
    }
  };
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const auto bits = static_cast<uint16_t>(h);
    const float hf = half_bits_to_float(bits);
    const float bf = bfloat16_bits_to_float(bits);
    if (!std::isnan(hf)) {
      const float want = static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
      if (std::memcmp(&hf, &want, sizeof(float)) != 0 && bad++ < 5) {
        std::fprintf(stderr, "half 0x%04x -> float: shim %.9g, c10 %.9g\n", h, hf, want);
      }
      const float next = half_bits_to_float(static_cast<uint16_t>(bits + 1));
      if (!std::isnan(next) && std::isfinite(hf) && (bits & 0x7fff) != 0x7bff &&
          (bits & 0x7fff) < 0x7c00 && bits != 0x7fff) {
        for (const float f :
             {hf, std::nextafter(hf, next), (hf + next) / 2, std::nextafter((hf + next) / 2, hf),
              std::nextafter((hf + next) / 2, next)}) {
          check("half", f, float_to_half_bits(f), c10::Half(f).x);
        }
      }
    }
    if (!std::isnan(bf) && std::isfinite(bf)) {
      const float next = bfloat16_bits_to_float(static_cast<uint16_t>(bits + 1));
      if (std::isfinite(next)) {
        for (const float f : {bf, (bf + next) / 2, std::nextafter((bf + next) / 2, bf),
                              std::nextafter((bf + next) / 2, next)}) {
          check("bfloat16", f, float_to_bfloat16_bits(f), c10::BFloat16(f).x);
        }
      }
    }
  }
  for (const float f : {65504.0f, 65519.99f, 65520.0f, 1e-8f, 2.98e-8f, 3e-8f, -0.0f}) {
    check("half", f, float_to_half_bits(f), c10::Half(f).x);
  }
  return bad;
}

struct Options {
  int64_t cases = 4000;
  uint64_t seed = 1;
  int64_t only = -1;
  int64_t max_failures = 3;
  bool coverage_gate = true;
  bool verbose = false;
  int64_t norm_cases = -1;  // rope.rms_norm_apply_qk cases; -1: cases / 4
  int64_t norm_only = -1;
  int64_t kv_cases = -1;  // rope.apply_qk_cache cases; -1: cases / 4
  int64_t kv_only = -1;
  int64_t forms_cases = -1;  // the frequency and packed-sequence forms; -1: cases / 4
  int64_t forms_only = -1;
  int64_t serving_cases = -1;  // cases of each serving fusion; -1: cases / 4
  int64_t qk_fp8_only = -1;
  int64_t mla_only = -1;
  int64_t kv_norm_only = -1;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "cuda_host_run: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--cases") {
      o.cases = std::atoll(next());
    } else if (a == "--seed") {
      o.seed = std::strtoull(next(), nullptr, 10);
    } else if (a == "--only") {
      o.only = std::atoll(next());
    } else if (a == "--max-failures") {
      o.max_failures = std::atoll(next());
    } else if (a == "--norm-cases") {
      o.norm_cases = std::atoll(next());
    } else if (a == "--norm-only") {
      o.norm_only = std::atoll(next());
    } else if (a == "--kv-cases") {
      o.kv_cases = std::atoll(next());
    } else if (a == "--kv-only") {
      o.kv_only = std::atoll(next());
    } else if (a == "--forms-cases") {
      o.forms_cases = std::atoll(next());
    } else if (a == "--forms-only") {
      o.forms_only = std::atoll(next());
    } else if (a == "--serving-cases") {
      o.serving_cases = std::atoll(next());
    } else if (a == "--qk-fp8-only") {
      o.qk_fp8_only = std::atoll(next());
    } else if (a == "--mla-only") {
      o.mla_only = std::atoll(next());
    } else if (a == "--kv-norm-only") {
      o.kv_norm_only = std::atoll(next());
    } else if (a == "--no-coverage-gate") {
      o.coverage_gate = false;
    } else if (a == "-v" || a == "--verbose") {
      o.verbose = true;
    } else {
      std::fprintf(stderr,
                   "usage: cuda_host_run [--cases N] [--seed S] [--only I] [--max-failures F] "
                   "[--norm-cases N] [--norm-only I] [--kv-cases N] [--kv-only I] "
                   "[--forms-cases N] [--forms-only I] "
                   "[--serving-cases N] [--qk-fp8-only I] [--mla-only I] [--kv-norm-only I] "
                   "[--no-coverage-gate] [-v]\n");
      std::exit(2);
    }
  }
  return o;
}

}  // namespace
}  // namespace rope_host

int main(int argc, char** argv) {
  using namespace rope_host;
  const Options opt = parse(argc, argv);
  // --norm-only / --kv-only / --forms-only / --qk-fp8-only / --mla-only rerun one case of that op
  // alone.
  const bool serving_only = opt.qk_fp8_only >= 0 || opt.mla_only >= 0 || opt.kv_norm_only >= 0;
  const bool one_family =
      opt.norm_only >= 0 || opt.kv_only >= 0 || opt.forms_only >= 0 || serving_only;
  const auto start = std::chrono::steady_clock::now();
  const CpuVectorPath cpu_path = cpu_vector_path();
  std::printf("cuda host run: seed %llu, %lld cases; CPU backend kernel %s (%s)\n",
              static_cast<unsigned long long>(opt.seed), static_cast<long long>(opt.cases),
              cpu_path.name.c_str(),
              cpu_path.fused ? "fused multiply-adds: bit-exact comparison on its vector planes"
                             : "no FMA: every element held to the bound only");

  if (opt.only < 0) {
    const int64_t bad = check_conversions();
    if (bad > 0) {
      std::printf("FAILED: %lld shim conversions differ from c10\n", static_cast<long long>(bad));
      return 1;
    }
  }

  Totals totals;
  if (opt.only < 0 && !one_family) {
    // The fixed cases at sizes the random ones cannot reach (big_cases.h).
    for (const BigCaseResult& r : run_big_cases(cpu_path, totals.tally)) {
      ++totals.big_cases;
      for (const auto& [device, kernel] : r.launches) {
        if (device < 64) {
          totals.cached_queries.emplace(device, kernel);
        } else {
          ++totals.uncached_queries;
        }
      }
      if (!r.problems.empty()) {
        ++totals.failures;
        std::printf("FAILED fixed case: %s\n", r.name.c_str());
        for (const std::string& p : r.problems) {
          std::printf("    %s\n", p.c_str());
        }
      } else if (opt.verbose) {
        std::printf("passed fixed case: %s\n", r.name.c_str());
      }
    }
  }
  const int64_t first = opt.only >= 0 ? opt.only : 0;
  const int64_t last = opt.only >= 0 ? opt.only + 1 : one_family ? 0 : opt.cases;
  for (int64_t i = first; i < last; ++i) {
    // Odd cases run their launches' blocks and threads in reverse order (a rerun of one case
    // keeps its order).
    set_reverse_order(i % 2 == 1);
    const Case c = make_case(opt.seed, i);
    if (opt.verbose) {
      std::printf("%s\n", c.describe().c_str());
    }
    const std::vector<std::string> problems = run_case(c, cpu_path, totals);
    if (!problems.empty()) {
      ++totals.failures;
      std::printf("FAILED %s\n", c.describe().c_str());
      for (const std::string& p : problems) {
        std::printf("    %s\n", p.c_str());
      }
      std::printf("  rerun: cuda_host_run --seed %llu --only %lld -v\n",
                  static_cast<unsigned long long>(opt.seed), static_cast<long long>(i));
      if (totals.failures >= opt.max_failures) {
        std::printf("stopping after %lld failed cases\n", static_cast<long long>(totals.failures));
        break;
      }
    }
  }

  // rope.rms_norm_apply_qk (on the row streams): its own random cases (norm_cases.h).
  NormRun norm;
  Tally norm_tally;
  if (opt.only < 0 && opt.kv_only < 0 && opt.forms_only < 0 && !serving_only &&
      totals.failures < opt.max_failures) {
    const int64_t n = opt.norm_cases >= 0 ? opt.norm_cases : std::max<int64_t>(opt.cases / 4, 1);
    norm = run_norm_cases(opt.seed, n, opt.norm_only, opt.max_failures - totals.failures,
                          opt.verbose, cpu_path, norm_tally);
    totals.failures += norm.failures;
    for (const auto& [what, hits] : norm.coverage) {
      totals.coverage.hits[what] += hits;
    }
  }

  // rope.apply_qk_cache (the row streams' kernel): its own random cases (kv_cache_cases.h), bit for
  // bit against the CPU backend.
  KvCacheRun kv;
  if (opt.only < 0 && opt.norm_only < 0 && opt.forms_only < 0 && !serving_only &&
      totals.failures < opt.max_failures) {
    const int64_t n = opt.kv_cases >= 0 ? opt.kv_cases : std::max<int64_t>(opt.cases / 4, 1);
    kv = run_kv_cache_cases(opt.seed, n, opt.kv_only, opt.max_failures - totals.failures,
                            opt.verbose, cpu_path);
    totals.failures += kv.failures;
    for (const auto& [what, hits] : kv.coverage) {
      totals.coverage.hits[what] += hits;
    }
  }

  // The frequency and packed-sequence forms (forms_cases.h): rope_freqs_kernel and the
  // sequence lookup, through the glue's Forms.
  FormsRun forms;
  Tally forms_tally;
  if (opt.only < 0 && opt.norm_only < 0 && opt.kv_only < 0 && !serving_only &&
      totals.failures < opt.max_failures) {
    const int64_t n = opt.forms_cases >= 0 ? opt.forms_cases : std::max<int64_t>(opt.cases / 4, 1);
    forms = run_form_cases(opt.seed, n, opt.forms_only, opt.max_failures - totals.failures,
                           opt.verbose, cpu_path, forms_tally);
    totals.failures += forms.failures;
    totals.launches += forms.launches;
    totals.cached_queries.insert(forms.cached_queries.begin(), forms.cached_queries.end());
    totals.uncached_queries += forms.uncached_queries;
    for (const auto& [what, hits] : forms.coverage) {
      totals.coverage.hits[what] += hits;
    }
  }
  // The serving fusions (the row streams' kernel): their own random cases, bit for bit against
  // the CPU backend (serving_cases.h).
  const int64_t serving_n =
      opt.serving_cases >= 0 ? opt.serving_cases : std::max<int64_t>(opt.cases / 4, 1);
  const bool serving_all =
      opt.only < 0 && opt.norm_only < 0 && opt.kv_only < 0 && opt.forms_only < 0 && !serving_only;
  std::vector<std::pair<std::string, ServingRun>> serving;
  const auto run_serving = [&](const char* name, int64_t only, auto run) {
    if ((serving_all || only >= 0) && totals.failures < opt.max_failures) {
      ServingRun r =
          run(opt.seed, serving_n, only, opt.max_failures - totals.failures, opt.verbose, cpu_path);
      totals.failures += r.failures;
      for (const auto& [what, hits] : r.coverage) {
        totals.coverage.hits[what] += hits;
      }
      serving.emplace_back(name, r);
    }
  };
  run_serving("apply_qk_fp8", opt.qk_fp8_only, run_qk_fp8_cases);
  run_serving("mla_apply_cache", opt.mla_only, run_mla_cases);
  run_serving("KV-cache streams", opt.kv_norm_only, run_kv_norm_cases);

  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "\n%lld fixed cases (offsets past 2^31, grids of >= 65536 blocks and past 2^32 threads), "
      "%lld cases (",
      static_cast<long long>(totals.big_cases), static_cast<long long>(totals.cases));
  for (const auto& [op, n] : totals.by_op) {
    std::printf("%s %lld, ", op.c_str(), static_cast<long long>(n));
  }
  std::printf(
      "%lld with an out-of-range position), %lld rms_norm_apply_qk cases (%lld with an "
      "out-of-range position), ",
      static_cast<long long>(totals.assert_cases), static_cast<long long>(norm.cases),
      static_cast<long long>(norm.assert_cases));
  std::printf("%lld apply_qk_cache cases, ", static_cast<long long>(kv.cases));
  std::printf("%lld launches, %.1f s\n", static_cast<long long>(totals.launches), seconds);
  int64_t multi_axis = 0;
  for (const auto& [axes, n] : totals.by_axes) {
    multi_axis += n;
  }
  std::printf("multi-axis (M-RoPE) cases: %lld (", static_cast<long long>(multi_axis));
  for (const auto& [axes, n] : totals.by_axes) {
    std::printf("%s%lld axes: %lld", axes == totals.by_axes.begin()->first ? "" : ", ",
                static_cast<long long>(axes), static_cast<long long>(n));
  }
  std::printf(")\n");
  std::printf(
      "elements: %lld bit-exact vs CPU and input, %lld within the bound; worst error "
      "%.3f of the bound\n",
      static_cast<long long>(totals.tally.exact), static_cast<long long>(totals.tally.bounded),
      totals.tally.worst);
  std::printf(
      "rms_norm_apply_qk elements (host run and CPU backend): %lld within the bound of the "
      "extended-precision reference; worst error %.3f of the bound; %lld of the host run "
      "bit-exact vs the CPU backend%s\n",
      static_cast<long long>(norm_tally.bounded), norm_tally.worst,
      static_cast<long long>(norm.elements_same_bits),
      cpu_path.fused ? "" : " (not compared: this CPU copy rounds its products first)");
  if (kv.bit_exact) {
    std::printf(
        "apply_qk_cache elements (host run): %lld bit-exact vs the CPU backend (q_out, every "
        "byte of the caches); %lld of q_out and of the k rows of 16/32-bit caches also within the "
        "bound of the extended-precision reference, worst error %.3f of the bound\n",
        static_cast<long long>(kv.elements_same_bits),
        static_cast<long long>(kv.reference.exact + kv.reference.bounded), kv.reference.worst);
  } else {
    std::printf(
        "apply_qk_cache cases NOT RUN: the CPU kernel here (%s) has no FMA copy, so its bits "
        "cannot match the CUDA kernel's; only cuda_host_streams checks that kernel on this "
        "machine\n",
        cpu_path.name.c_str());
  }
  std::printf(
      "frequency / packed-sequence form cases: %lld (%lld with a bad position or packing); "
      "%lld elements of the frequency form within the bound of the binary128 reference, worst "
      "error %.3f of the bound; %lld elements of the packed forms bit-exact vs the same op given "
      "the rules' positions\n",
      static_cast<long long>(forms.cases), static_cast<long long>(forms.assert_cases),
      static_cast<long long>(forms.bounded), forms.worst, static_cast<long long>(forms.same_bits));
  for (const auto& [name, r] : serving) {
    if (r.bit_exact) {
      std::printf(
          "%s: %lld cases, %lld elements bit-exact vs the CPU backend (every output and "
          "every byte of the buffers and caches it writes)\n",
          name.c_str(), static_cast<long long>(r.cases),
          static_cast<long long>(r.elements_same_bits));
    } else {
      std::printf(
          "%s cases NOT RUN: the CPU kernel here (%s) has no FMA copy, so its bits cannot "
          "match the CUDA kernel's; only stream_host checks that kernel on this machine\n",
          name.c_str(), cpu_path.name.c_str());
    }
  }
  const int64_t want_queries =
      static_cast<int64_t>(totals.cached_queries.size()) + totals.uncached_queries;
  std::printf(
      "occupancy queries: %lld for %lld launches (expected %lld: once per device "
      "ordinal < 64 and kernel, every time above)\n",
      static_cast<long long>(occupancy_queries()), static_cast<long long>(totals.launches),
      static_cast<long long>(want_queries));
  if (opt.only < 0 && !one_family && occupancy_queries() != want_queries) {
    std::printf("FAILED: the occupancy cache of rope_kernel.cuh asked %lld times, expected %lld\n",
                static_cast<long long>(occupancy_queries()), static_cast<long long>(want_queries));
    return 1;
  }
  std::printf("coverage (launches or cases):\n");
  std::vector<std::string> missing;
  for (const auto& [what, n] : totals.coverage.hits) {
    std::printf("  %-45s %lld\n", what.c_str(), static_cast<long long>(n));
    if (n == 0) {
      missing.push_back(what);
    }
  }
  if (totals.failures > 0) {
    std::printf("FAILED: %lld of %lld cases\n", static_cast<long long>(totals.failures),
                static_cast<long long>(totals.cases));
    return 1;
  }
  if (opt.coverage_gate && opt.only < 0 && !one_family && !missing.empty()) {
    std::printf("FAILED: the cases never took these paths:");
    for (const std::string& m : missing) {
      std::printf(" [%s]", m.c_str());
    }
    std::printf("\n");
    return 1;
  }
  std::printf("PASSED\n");
  return 0;
}
