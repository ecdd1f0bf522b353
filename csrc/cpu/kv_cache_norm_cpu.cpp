// SPDX-License-Identifier: BSD-3-Clause
// CPU backend of rope.rms_norm_apply_qk_cache: the op body of kv_cache_norm_body.h over the row
// streams' CPU policy (common_stream_backend.h: positions and slots checked on the host before
// anything is written).
#include <torch/library.h>

#include "../kv_cache_norm_body.h"
#include "common_stream_backend.h"

namespace rope::cpu {
namespace {

using Optional = const std::optional<at::Tensor>&;

at::Tensor rms_norm_apply_qk_cache_cpu(const at::Tensor& q, const at::Tensor& k, Optional v,
                                       const at::Tensor& q_weight, const at::Tensor& k_weight,
                                       const at::Tensor& cos, const at::Tensor& sin,
                                       const at::Tensor& positions, const at::Tensor& k_cache,
                                       Optional v_cache, const at::Tensor& slot_mapping, double eps,
                                       double weight_offset, bool interleaved, Optional k_scale,
                                       Optional v_scale, std::optional<at::ScalarType> q_dtype,
                                       Optional q_scale, at::OptionalIntArrayRef mrope_section,
                                       bool mrope_interleaved) {
  return detail::rms_norm_apply_qk_cache_body<CpuStreamsBackend>(
      {{q,
        k,
        v,
        cos,
        sin,
        positions,
        k_cache,
        v_cache,
        slot_mapping,
        k_scale,
        v_scale,
        {mrope_section, mrope_interleaved}},
       q_weight,
       k_weight,
       eps,
       weight_offset,
       q_dtype,
       q_scale},
      interleaved);
}

}  // namespace
}  // namespace rope::cpu

TORCH_LIBRARY_IMPL(rope, CPU, m) {
  m.impl("rms_norm_apply_qk_cache", &rope::cpu::rms_norm_apply_qk_cache_cpu);
}
