// SPDX-License-Identifier: BSD-3-Clause
// The body of rope.rms_norm_apply_qk, written once for the computing backends (CPU, CUDA), in
// the order of rope_body.h: every check, then allocation, then the kernel. The kernel is the row
// streams' (common_row_streams.h: the norm's sum of squares in its fixed order, then the
// rotation, rounded once), which rope.rms_norm_apply_qk_cache runs too; q and k of any of
// rope.apply_qk's shapes become streams through common_stream_layout.h. A backend supplies
// rope_body.h's check_positions and
//   static void run_streams(c10::ScalarType dtype, const PreparedStreams&);
// (the policies of the other stream ops: cpu/common_stream_backend.h, cuda/common_glue.h).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/FunctionRef.h>

#include <tuple>

#include "common_prepare.h"
#include "common_stream_prepare.h"
#include "rms_norm_validation.h"

namespace rope::detail {

struct RmsNormStreamInputs {
  const at::Tensor& q;
  const at::Tensor& k;
  const at::Tensor& q_out;
  const at::Tensor& k_out;
  const at::Tensor& q_weight;  // weight + weight_offset in the math type (contiguous)
  const at::Tensor& k_weight;
  const at::Tensor& cos;
  const at::Tensor& sin;
  const at::Tensor& positions;
  double eps;
  RotationMode mode;
  const MultiAxisArgs& axes;
};

// Hands `run` the streams of a checked call: one call with q's and k's streams, or, where q and
// k cannot share one positions tensor and token count, one call each (an empty tensor has none).
void for_each_rms_norm_call(const RmsNormStreamInputs& in,
                            c10::function_ref<void(const PreparedStreams&)> run);

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
  at::Tensor q_out = new_stream_output(q, q.sym_sizes(), q.scalar_type());
  at::Tensor k_out = new_stream_output(k, k.sym_sizes(), k.scalar_type());
  if (work) {
    const at::Tensor qw = norm_weight_in_math_type(q_weight, weight_offset, q.scalar_type());
    const at::Tensor kw = norm_weight_in_math_type(k_weight, weight_offset, q.scalar_type());
    for_each_rms_norm_call(
        {q, k, q_out, k_out, qw, kw, cos, sin, positions, eps, {interleaved, inverse}, axes},
        [&](const PreparedStreams& p) { Backend::run_streams(q.scalar_type(), p); });
  }
  return {q_out, k_out};
}

}  // namespace rope::detail
