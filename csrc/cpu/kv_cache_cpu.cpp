// SPDX-License-Identifier: BSD-3-Clause
// CPU backend of rope.apply_qk_cache: the op body of kv_cache_body.h over the row streams' CPU
// policy (common_stream_backend.h: positions and slots checked on the host before anything is
// written; the rows then run on the streams' kernel, common_stream_rows.cpp).
#include <torch/library.h>

#include "../kv_cache_body.h"
#include "common_stream_backend.h"

namespace rope::cpu {
namespace {

at::Tensor apply_qk_cache_cpu(const at::Tensor& q, const at::Tensor& k,
                              const std::optional<at::Tensor>& v, const at::Tensor& cos,
                              const at::Tensor& sin, const at::Tensor& positions,
                              const at::Tensor& k_cache, const std::optional<at::Tensor>& v_cache,
                              const at::Tensor& slot_mapping, bool interleaved,
                              const std::optional<at::Tensor>& k_scale,
                              const std::optional<at::Tensor>& v_scale,
                              at::OptionalIntArrayRef mrope_section, bool mrope_interleaved) {
  return detail::apply_qk_cache_body<CpuStreamsBackend>({q,
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
                                                        interleaved);
}

}  // namespace
}  // namespace rope::cpu

TORCH_LIBRARY_IMPL(rope, CPU, m) { m.impl("apply_qk_cache", &rope::cpu::apply_qk_cache_cpu); }
