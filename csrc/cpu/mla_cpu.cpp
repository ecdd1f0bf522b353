// SPDX-License-Identifier: BSD-3-Clause
// CPU backend of rope.mla_apply_cache: the op body of mla_body.h over the row streams' CPU policy
// (common_stream_backend.h: positions and slots checked on the host before anything is written).
#include <torch/library.h>

#include "../mla_body.h"
#include "common_stream_backend.h"

namespace rope::cpu {
namespace {

using Optional = const std::optional<at::Tensor>&;

std::tuple<at::Tensor, at::Tensor> mla_apply_cache_cpu(
    const at::Tensor& q_pe, const at::Tensor& k_pe, const at::Tensor& kv_c, const at::Tensor& cos,
    const at::Tensor& sin, const at::Tensor& positions, const at::Tensor& kv_cache,
    Optional kpe_cache, const at::Tensor& slot_mapping, Optional q_nope, Optional v,
    Optional v_cache, bool interleaved, Optional kv_scale, Optional v_scale,
    std::optional<at::ScalarType> q_dtype, Optional q_scale, bool multiply_by_scale) {
  return detail::mla_apply_cache_body<CpuStreamsBackend>(
      {q_pe, k_pe, kv_c, cos, sin, positions, kv_cache, kpe_cache, slot_mapping, q_nope, v, v_cache,
       kv_scale, v_scale, q_dtype, q_scale},
      interleaved, multiply_by_scale);
}

}  // namespace
}  // namespace rope::cpu

TORCH_LIBRARY_IMPL(rope, CPU, m) { m.impl("mla_apply_cache", &rope::cpu::mla_apply_cache_cpu); }
