// SPDX-License-Identifier: BSD-3-Clause
// CPU backend of rope.rms_norm_apply_qk: the op body of rms_norm_body.h over the row streams' CPU
// policy (common_stream_backend.h: positions checked on the host before anything is written, then
// the streams' parallel driver and its per-capability rows, common_stream_rows.cpp).
#include <torch/library.h>

#include "../rms_norm_body.h"
#include "common_stream_backend.h"

namespace rope::cpu {
namespace {

std::tuple<at::Tensor, at::Tensor> rms_norm_apply_qk_cpu(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& q_weight,
    const at::Tensor& k_weight, const at::Tensor& cos, const at::Tensor& sin,
    const at::Tensor& positions, double eps, double weight_offset, bool interleaved, bool inverse,
    at::OptionalIntArrayRef mrope_section, bool mrope_interleaved) {
  return detail::rms_norm_apply_qk_body<CpuStreamsBackend>(
      q, k, q_weight, k_weight, cos, sin, positions, eps, weight_offset, interleaved, inverse,
      {mrope_section, mrope_interleaved});
}

}  // namespace
}  // namespace rope::cpu

TORCH_LIBRARY_IMPL(rope, CPU, m) { m.impl("rms_norm_apply_qk", &rope::cpu::rms_norm_apply_qk_cpu); }
