// SPDX-License-Identifier: BSD-3-Clause
// rope.rms_norm_apply_qk_cache outside the computing backends: the C++ API (through the
// dispatcher), the Meta kernel (the same checks as CPU and CUDA, on SymInts; the values of slots,
// positions and scales are left to the real kernels), the Autograd kernel (not differentiable, as
// apply_qk_cache) and the ADInplaceOrView kernel (the caches' version counters where autograd is
// excluded). The schema is in rope_ops.cpp; CPU and CUDA register in cpu/kv_cache_norm_cpu.cpp
// and cuda/kv_cache_cuda.cpp.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/VariableTypeUtils.h>
#include <torch/library.h>
#include <torch_rope/ops.h>

#include "common_optional.h"
#include "kv_cache_norm_body.h"

namespace rope {
namespace {

using Optional = const std::optional<at::Tensor>&;
using Sig = at::Tensor(const at::Tensor&, const at::Tensor&, Optional, const at::Tensor&,
                       const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                       const at::Tensor&, Optional, const at::Tensor&, double, double, bool,
                       Optional, Optional, std::optional<at::ScalarType>, Optional,
                       at::OptionalIntArrayRef, bool);

const c10::TypedOperatorHandle<Sig>& norm_cache_op() {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("rope::rms_norm_apply_qk_cache", "")
                       .typed<Sig>();
  return op;
}

void bump_versions(const at::Tensor& k_cache, Optional v_cache) {
  torch::autograd::increment_version(k_cache);
  if (v_cache.has_value() && v_cache->defined()) {
    torch::autograd::increment_version(*v_cache);
  }
}

at::Tensor rms_norm_apply_qk_cache_meta(
    const at::Tensor& q, const at::Tensor& k, Optional v, const at::Tensor& q_weight,
    const at::Tensor& k_weight, const at::Tensor& cos, const at::Tensor& sin,
    const at::Tensor& positions, const at::Tensor& k_cache, Optional v_cache,
    const at::Tensor& slot_mapping, double eps, double weight_offset, bool /*interleaved*/,
    Optional k_scale, Optional v_scale, std::optional<at::ScalarType> q_dtype, Optional q_scale,
    at::OptionalIntArrayRef mrope_section, bool mrope_interleaved) {
  const detail::KvCacheNormInputs in{{q,
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
                                     q_scale};
  const at::ScalarType dtype =
      detail::check_rms_norm_apply_qk_cache("rope.rms_norm_apply_qk_cache", in);
  return detail::new_stream_output(q, q.sym_sizes(), dtype);
}

// Writing into caches is not differentiable: refuse, as apply_qk_cache does.
at::Tensor rms_norm_apply_qk_cache_autograd(
    const at::Tensor& q, const at::Tensor& k, Optional v, const at::Tensor& q_weight,
    const at::Tensor& k_weight, const at::Tensor& cos, const at::Tensor& sin,
    const at::Tensor& positions, const at::Tensor& k_cache, Optional v_cache,
    const at::Tensor& slot_mapping, double eps, double weight_offset, bool interleaved,
    Optional k_scale, Optional v_scale, std::optional<at::ScalarType> q_dtype, Optional q_scale,
    at::OptionalIntArrayRef mrope_section, bool mrope_interleaved) {
  const bool wants_grad =
      at::GradMode::is_enabled() &&
      (q.requires_grad() || k.requires_grad() || requires_grad(v) || q_weight.requires_grad() ||
       k_weight.requires_grad() || cos.requires_grad() || sin.requires_grad() ||
       k_cache.requires_grad() || requires_grad(v_cache));
  TORCH_CHECK(!wants_grad,
              "rope.rms_norm_apply_qk_cache: writing into a KV cache doesn't support automatic "
              "differentiation, but one of the arguments requires grad; call "
              "torch_rope.rms_norm_apply_qk to get gradients, or run under torch.no_grad() / "
              "torch.inference_mode()");
  TORCH_CHECK(!q._fw_grad(0).defined() && !k._fw_grad(0).defined() && !has_forward_grad(v) &&
                  !q_weight._fw_grad(0).defined() && !k_weight._fw_grad(0).defined(),
              "rope.rms_norm_apply_qk_cache: writing into a KV cache doesn't support "
              "forward-mode automatic differentiation; call torch_rope.rms_norm_apply_qk");
  at::Tensor q_out;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    q_out = norm_cache_op().call(q, k, v, q_weight, k_weight, cos, sin, positions, k_cache, v_cache,
                                 slot_mapping, eps, weight_offset, interleaved, k_scale, v_scale,
                                 q_dtype, q_scale, mrope_section, mrope_interleaved);
  }
  bump_versions(k_cache, v_cache);
  return q_out;
}

at::Tensor rms_norm_apply_qk_cache_view(
    c10::DispatchKeySet keys, const at::Tensor& q, const at::Tensor& k, Optional v,
    const at::Tensor& q_weight, const at::Tensor& k_weight, const at::Tensor& cos,
    const at::Tensor& sin, const at::Tensor& positions, const at::Tensor& k_cache, Optional v_cache,
    const at::Tensor& slot_mapping, double eps, double weight_offset, bool interleaved,
    Optional k_scale, Optional v_scale, std::optional<at::ScalarType> q_dtype, Optional q_scale,
    at::OptionalIntArrayRef mrope_section, bool mrope_interleaved) {
  at::Tensor q_out;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    q_out = norm_cache_op().redispatch(keys & c10::after_ADInplaceOrView_keyset, q, k, v, q_weight,
                                       k_weight, cos, sin, positions, k_cache, v_cache,
                                       slot_mapping, eps, weight_offset, interleaved, k_scale,
                                       v_scale, q_dtype, q_scale, mrope_section, mrope_interleaved);
  }
  bump_versions(k_cache, v_cache);
  return q_out;
}

}  // namespace

at::Tensor rms_norm_apply_qk_cache(const at::Tensor& q, const at::Tensor& k,
                                   const std::optional<at::Tensor>& v, const at::Tensor& q_weight,
                                   const at::Tensor& k_weight, const at::Tensor& cos,
                                   const at::Tensor& sin, const at::Tensor& positions,
                                   at::Tensor& k_cache, const std::optional<at::Tensor>& v_cache,
                                   const at::Tensor& slot_mapping, double eps, double weight_offset,
                                   bool interleaved, const std::optional<at::Tensor>& k_scale,
                                   const std::optional<at::Tensor>& v_scale,
                                   std::optional<at::ScalarType> q_dtype,
                                   const std::optional<at::Tensor>& q_scale,
                                   at::OptionalIntArrayRef mrope_section, bool mrope_interleaved) {
  return norm_cache_op().call(q, k, v, q_weight, k_weight, cos, sin, positions, k_cache, v_cache,
                              slot_mapping, eps, weight_offset, interleaved, k_scale, v_scale,
                              q_dtype, q_scale, mrope_section, mrope_interleaved);
}

}  // namespace rope

TORCH_LIBRARY_IMPL(rope, Meta, m) {
  m.impl("rms_norm_apply_qk_cache", &rope::rms_norm_apply_qk_cache_meta);
}

TORCH_LIBRARY_IMPL(rope, Autograd, m) {
  m.impl("rms_norm_apply_qk_cache", &rope::rms_norm_apply_qk_cache_autograd);
}

TORCH_LIBRARY_IMPL(rope, ADInplaceOrView, m) {
  m.impl("rms_norm_apply_qk_cache", &rope::rms_norm_apply_qk_cache_view);
}
