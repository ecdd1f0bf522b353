// SPDX-License-Identifier: BSD-3-Clause
// The body of rope.rms_norm_apply_qk, written once for the computing backends (CPU, CUDA), in
// the order of rope_body.h: every check, then allocation, then the kernel. A backend supplies
// rope_body.h's check_positions and
//   static void norm_rotate_pair(c10::ScalarType dtype, const RotationArgs& q,
//                                const RotationArgs& k, const at::Tensor& q_weight,
//                                const at::Tensor& k_weight, const TableArgs&, RotationMode,
//                                NormParams);
#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>

#include "common_prepare.h"
#include "rms_norm_args.h"
#include "rms_norm_validation.h"

namespace rope::detail {

template <typename Backend>
std::tuple<at::Tensor, at::Tensor> rms_norm_apply_qk_body(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& q_weight,
    const at::Tensor& k_weight, const at::Tensor& cos, const at::Tensor& sin,
    const at::Tensor& positions, double eps, double weight_offset, bool interleaved, bool inverse,
    const MultiAxisArgs& axes) {
  constexpr const char* op = "rope.rms_norm_apply_qk";
  check_rms_norm_apply_qk(op, q, k, q_weight, k_weight, cos, sin, positions, eps, weight_offset,
                          axes);
  const bool work = q.numel() > 0 || k.numel() > 0;
  if (work) {
    Backend::check_positions(op, positions, cos.size(0), axes);
  }
  const int64_t rotary_dim = 2 * cos.size(1);
  auto q_call = prepare_rotation(q, positions, rotary_dim, Destination::kNewTensor, {}, axes);
  auto k_call = prepare_rotation(k, positions, rotary_dim, Destination::kNewTensor, {}, axes);
  if (work) {
    const auto tables = prepare_tables(cos, sin, axes);
    Backend::norm_rotate_pair(q.scalar_type(), q_call.args, k_call.args, q_weight, k_weight,
                              tables.args, RotationMode{interleaved, inverse},
                              NormParams{eps, weight_offset});
  }
  return {q_call.output, k_call.output};
}

}  // namespace rope::detail
