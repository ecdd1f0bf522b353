// SPDX-License-Identifier: BSD-3-Clause
// The glue of rope.rms_norm_apply_qk on CUDA, as common_glue.h is for the rotation ops: a template
// over a Runtime, so rms_norm_cuda.cu (real runtime) and tests/cuda_host (simulated runtime) run
// the same code. Besides common_glue.h's members, a Runtime provides
//   static int launch_norm(c10::ScalarType, const NormRotationArgs& q, const NormRotationArgs& k,
//                          const TableArgs&, RotationMode, NormParams, Stream);  // a cudaError_t
#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>

#include "rms_norm_body.h"  // csrc/ is on the include path of every user

namespace rope::cuda::glue {

template <typename Runtime>
struct NormBackend {
  static void check_positions(const char* /*op*/, const at::Tensor& /*positions*/,
                              int64_t /*max_seq_len*/, const detail::MultiAxisArgs& /*axes*/) {}
  // The weights go to the kernel contiguous in its math type; the temporaries are freed after
  // the launch is enqueued, which the stream-ordered caching allocator allows.
  static void norm_rotate_pair(c10::ScalarType dtype, const RotationArgs& q, const RotationArgs& k,
                               const at::Tensor& q_weight, const at::Tensor& k_weight,
                               const TableArgs& tables, RotationMode mode, NormParams params) {
    const auto acc = dtype == at::kDouble ? at::kDouble : at::kFloat;
    const at::Tensor qw = q_weight.to(acc).contiguous();
    const at::Tensor kw = k_weight.to(acc).contiguous();
    const NormRotationArgs q_args{q, qw.const_data_ptr()};
    const NormRotationArgs k_args{k, kw.const_data_ptr()};
    const typename Runtime::Stream stream = Runtime::current_stream();
    Runtime::check(Runtime::launch_norm(dtype, q_args, k_args, tables, mode, params, stream));
  }
};

template <typename Runtime>
std::tuple<at::Tensor, at::Tensor> rms_norm_apply_qk(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& q_weight,
    const at::Tensor& k_weight, const at::Tensor& cos, const at::Tensor& sin,
    const at::Tensor& positions, double eps, double weight_offset, bool interleaved, bool inverse,
    at::OptionalIntArrayRef mrope_section, bool mrope_interleaved) {
  const typename Runtime::Guard guard(Runtime::device_of(q));
  return detail::rms_norm_apply_qk_body<NormBackend<Runtime>>(
      q, k, q_weight, k_weight, cos, sin, positions, eps, weight_offset, interleaved, inverse,
      {mrope_section, mrope_interleaved});
}

}  // namespace rope::cuda::glue
