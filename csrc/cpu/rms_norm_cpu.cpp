// SPDX-License-Identifier: BSD-3-Clause
// CPU backend of rope.rms_norm_apply_qk: registration, the weights in the math type, and the
// parallel driver over q's rows then k's (one parallel region, as rope_parallel.cpp's
// rotate_pair), running the copy of rms_norm_rows.cpp that matches the chosen rotation kernel.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>

#include "../rms_norm_body.h"
#include "common_kernel_choice.h"
#include "common_shared_angles.h"
#include "rms_norm_rows.h"
#include "rope_parallel.h"  // kGrainFeatures

namespace rope::cpu {

NormRowsFn norm_row_kernel() {
  static const NormRowsFn fn = [] {
#ifdef TORCH_ROPE_CPU_X86_DISPATCH
    [[maybe_unused]] const char* v = row_kernel_variant();
#if ROPE_CPU_HAS_AVX512_BF16
    if (std::strcmp(v, "AVX512_BF16") == 0) return &AVX512_BF16::norm_rows;
#endif
#if ROPE_CPU_HAS_AVX512
    if (std::strcmp(v, "AVX512") == 0) return &AVX512::norm_rows;
#endif
#if ROPE_CPU_HAS_AVX2
    if (std::strcmp(v, "AVX2") == 0) return &AVX2::norm_rows;
#endif
#endif
    return &DEFAULT::norm_rows;
  }();
  return fn;
}

namespace {

// weight + weight_offset in the math type, read through weight's stride (any floating dtype).
template <typename acc_t>
void effective_weight(const at::Tensor& weight, double offset, c10::SmallVector<acc_t, 256>& out) {
  const int64_t n = weight.size(0);
  const int64_t stride = weight.stride(0);
  out.resize(static_cast<size_t>(n));
  const acc_t off = static_cast<acc_t>(offset);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, weight.scalar_type(), "rope_norm_w",
                                  [&] {
                                    const auto* w = weight.const_data_ptr<scalar_t>();
                                    for (int64_t i = 0; i < n; ++i) {
                                      out[i] = static_cast<acc_t>(w[i * stride]) + off;
                                    }
                                  });
}

template <typename acc_t>
void run_pair(c10::ScalarType dtype, const RotationArgs& q, const RotationArgs& k,
              const at::Tensor& q_weight, const at::Tensor& k_weight, const TableArgs& tables,
              RotationMode mode, NormParams params) {
  c10::SmallVector<acc_t, 256> qw;
  c10::SmallVector<acc_t, 256> kw;
  effective_weight(q_weight, params.weight_offset, qw);
  effective_weight(k_weight, params.weight_offset, kw);
  // Multi-axis positions shared by heads: each tensor gets its compact one-axis tables.
  const auto q_shared = share_angles(q, tables);
  const auto k_shared = share_angles(k, tables);
  const NormRotationArgs q_args{q_shared ? q_shared->args : q, qw.data()};
  const NormRotationArgs k_args{k_shared ? k_shared->args : k, kw.data()};
  const TableArgs& q_tables = q_shared ? q_shared->tables : tables;
  const TableArgs& k_tables = k_shared ? k_shared->tables : tables;
  const NormRowsFn rows = norm_row_kernel();
  const int64_t q_rows = q.geometry.num_rows;
  const int64_t total = q_rows + k.geometry.num_rows;
  const int64_t grain = std::max<int64_t>(1, kGrainFeatures / std::max<int64_t>(q.head_dim, 1));
  at::parallel_for(0, total, grain, [&](int64_t begin, int64_t end) {
    if (begin < q_rows) {
      rows(dtype, q_args, q_tables, mode, params, begin, std::min(end, q_rows));
    }
    if (end > q_rows) {
      rows(dtype, k_args, k_tables, mode, params, std::max(begin, q_rows) - q_rows, end - q_rows);
    }
  });
}

struct CpuNormBackend {
  static void check_positions(const char* op, const at::Tensor& positions, int64_t max_seq_len,
                              const detail::MultiAxisArgs& axes) {
    detail::check_positions_in_range(op, positions, max_seq_len, axes);
  }
  static void norm_rotate_pair(c10::ScalarType dtype, const RotationArgs& q, const RotationArgs& k,
                               const at::Tensor& q_weight, const at::Tensor& k_weight,
                               const TableArgs& tables, RotationMode mode, NormParams params) {
    if (dtype == at::kDouble) {
      run_pair<double>(dtype, q, k, q_weight, k_weight, tables, mode, params);
    } else {
      run_pair<float>(dtype, q, k, q_weight, k_weight, tables, mode, params);
    }
  }
};

std::tuple<at::Tensor, at::Tensor> rms_norm_apply_qk_cpu(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& q_weight,
    const at::Tensor& k_weight, const at::Tensor& cos, const at::Tensor& sin,
    const at::Tensor& positions, double eps, double weight_offset, bool interleaved, bool inverse,
    at::OptionalIntArrayRef mrope_section, bool mrope_interleaved) {
  return detail::rms_norm_apply_qk_body<CpuNormBackend>(
      q, k, q_weight, k_weight, cos, sin, positions, eps, weight_offset, interleaved, inverse,
      {mrope_section, mrope_interleaved});
}

}  // namespace
}  // namespace rope::cpu

TORCH_LIBRARY_IMPL(rope, CPU, m) { m.impl("rms_norm_apply_qk", &rope::cpu::rms_norm_apply_qk_cpu); }
