// SPDX-License-Identifier: BSD-3-Clause
// CPU backend of rope.apply_qk_fp8, rope.apply_qk_fp8_dynamic and their out= overloads: the op
// bodies of qk_fp8_body.h over the row streams' CPU policy (common_stream_backend.h).
#include <torch/library.h>

#include "../qk_fp8_body.h"
#include "common_stream_backend.h"

namespace rope::cpu {
namespace {

using Optional = const std::optional<at::Tensor>&;

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> apply_qk_fp8_cpu(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
    const at::Tensor& positions, Optional q_nope, Optional k_nope, Optional q_scale,
    Optional k_scale, std::optional<at::ScalarType> dtype, bool interleaved, bool multiply_by_scale,
    at::OptionalIntArrayRef mrope_section, bool mrope_interleaved, bool inverse) {
  return detail::apply_qk_fp8_body<CpuStreamsBackend>({q,
                                                       k,
                                                       cos,
                                                       sin,
                                                       positions,
                                                       q_nope,
                                                       k_nope,
                                                       q_scale,
                                                       k_scale,
                                                       {mrope_section, mrope_interleaved}},
                                                      dtype, RotationMode{interleaved, inverse},
                                                      multiply_by_scale);
}

void apply_qk_fp8_out_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                          const at::Tensor& sin, const at::Tensor& positions, Optional q_nope,
                          Optional k_nope, Optional q_scale, Optional k_scale, bool interleaved,
                          bool multiply_by_scale, at::OptionalIntArrayRef mrope_section,
                          bool mrope_interleaved, bool inverse, const at::Tensor& q_out,
                          const at::Tensor& k_out, Optional q_nope_out, Optional k_nope_out) {
  detail::apply_qk_fp8_out_body<CpuStreamsBackend>(
      {q,
       k,
       cos,
       sin,
       positions,
       q_nope,
       k_nope,
       q_scale,
       k_scale,
       {mrope_section, mrope_interleaved}},
      {q_out, k_out, q_nope_out.has_value() ? *q_nope_out : at::Tensor(),
       k_nope_out.has_value() ? *k_nope_out : at::Tensor()},
      RotationMode{interleaved, inverse}, multiply_by_scale);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> apply_qk_fp8_dynamic_cpu(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
    const at::Tensor& positions, std::optional<at::ScalarType> dtype, bool interleaved,
    bool per_token, bool pow2_scale, at::OptionalIntArrayRef mrope_section, bool mrope_interleaved,
    bool inverse) {
  const std::optional<at::Tensor> none;
  return detail::apply_qk_fp8_dynamic_body<CpuStreamsBackend>(
      {q, k, cos, sin, positions, none, none, none, none, {mrope_section, mrope_interleaved}},
      dtype, RotationMode{interleaved, inverse}, per_token, pow2_scale);
}

void apply_qk_fp8_dynamic_out_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                  const at::Tensor& sin, const at::Tensor& positions,
                                  bool interleaved, bool per_token, bool pow2_scale,
                                  at::OptionalIntArrayRef mrope_section, bool mrope_interleaved,
                                  bool inverse, const at::Tensor& q_out, const at::Tensor& k_out,
                                  const at::Tensor& q_scale_out, const at::Tensor& k_scale_out) {
  const std::optional<at::Tensor> none;
  detail::apply_qk_fp8_dynamic_out_body<CpuStreamsBackend>(
      {q, k, cos, sin, positions, none, none, none, none, {mrope_section, mrope_interleaved}},
      {q_out, k_out, at::Tensor(), at::Tensor()}, {q_scale_out, k_scale_out},
      RotationMode{interleaved, inverse}, per_token, pow2_scale);
}

}  // namespace
}  // namespace rope::cpu

TORCH_LIBRARY_IMPL(rope, CPU, m) {
  m.impl("apply_qk_fp8", &rope::cpu::apply_qk_fp8_cpu);
  m.impl("apply_qk_fp8.out", &rope::cpu::apply_qk_fp8_out_cpu);
  m.impl("apply_qk_fp8_dynamic", &rope::cpu::apply_qk_fp8_dynamic_cpu);
  m.impl("apply_qk_fp8_dynamic.out", &rope::cpu::apply_qk_fp8_dynamic_out_cpu);
}
