// SPDX-License-Identifier: BSD-3-Clause
// rope.mla_apply_cache outside the computing backends: the C++ API (through the dispatcher), the
// Meta kernel (the same checks as CPU and CUDA, on SymInts; the values of slots, positions and
// scales are left to the real kernels), the Autograd kernel (not differentiable, as
// apply_qk_cache) and the ADInplaceOrView kernel (the caches' version counters where autograd is
// excluded). The schema is in rope_ops.cpp; CPU and CUDA register in cpu/mla_cpu.cpp and
// cuda/mla_cuda.cpp.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/VariableTypeUtils.h>
#include <torch/library.h>
#include <torch_rope/ops.h>

#include "common_optional.h"
#include "mla_body.h"

namespace rope {
namespace {

using Optional = const std::optional<at::Tensor>&;
using Pair = std::tuple<at::Tensor, at::Tensor>;
using Sig = Pair(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                 const at::Tensor&, const at::Tensor&, const at::Tensor&, Optional,
                 const at::Tensor&, Optional, Optional, Optional, bool, Optional, Optional,
                 std::optional<at::ScalarType>, Optional, bool);

const c10::TypedOperatorHandle<Sig>& mla_op() {
  static auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("rope::mla_apply_cache", "").typed<Sig>();
  return op;
}

void bump_versions(const at::Tensor& kv_cache, Optional kpe_cache, Optional v_cache) {
  torch::autograd::increment_version(kv_cache);
  for (const auto* t : {&kpe_cache, &v_cache}) {
    if (given(*t)) {
      torch::autograd::increment_version(**t);
    }
  }
}

Pair mla_apply_cache_meta(const at::Tensor& q_pe, const at::Tensor& k_pe, const at::Tensor& kv_c,
                          const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& positions,
                          const at::Tensor& kv_cache, Optional kpe_cache,
                          const at::Tensor& slot_mapping, Optional q_nope, Optional v,
                          Optional v_cache, bool /*interleaved*/, Optional kv_scale,
                          Optional v_scale, std::optional<at::ScalarType> q_dtype, Optional q_scale,
                          bool /*multiply_by_scale*/) {
  const detail::MlaInputs in{q_pe,     k_pe,      kv_c,         cos,    sin, positions,
                             kv_cache, kpe_cache, slot_mapping, q_nope, v,   v_cache,
                             kv_scale, v_scale,   q_dtype,      q_scale};
  return detail::new_mla_outputs(in, detail::check_mla_apply_cache("rope.mla_apply_cache", in));
}

// Writing into caches is not differentiable: refuse, as apply_qk_cache does.
Pair mla_apply_cache_autograd(const at::Tensor& q_pe, const at::Tensor& k_pe,
                              const at::Tensor& kv_c, const at::Tensor& cos, const at::Tensor& sin,
                              const at::Tensor& positions, const at::Tensor& kv_cache,
                              Optional kpe_cache, const at::Tensor& slot_mapping, Optional q_nope,
                              Optional v, Optional v_cache, bool interleaved, Optional kv_scale,
                              Optional v_scale, std::optional<at::ScalarType> q_dtype,
                              Optional q_scale, bool multiply_by_scale) {
  const bool wants_grad =
      at::GradMode::is_enabled() &&
      (q_pe.requires_grad() || k_pe.requires_grad() || kv_c.requires_grad() ||
       requires_grad(q_nope) || requires_grad(v) || cos.requires_grad() || sin.requires_grad() ||
       kv_cache.requires_grad() || requires_grad(kpe_cache) || requires_grad(v_cache));
  TORCH_CHECK(!wants_grad,
              "rope.mla_apply_cache: writing into a KV cache doesn't support automatic "
              "differentiation, but one of the arguments requires grad; call torch_rope.apply "
              "on q_pe and k_pe to get gradients, or run under torch.no_grad() / "
              "torch.inference_mode()");
  TORCH_CHECK(!q_pe._fw_grad(0).defined() && !k_pe._fw_grad(0).defined() &&
                  !kv_c._fw_grad(0).defined() && !has_forward_grad(q_nope) && !has_forward_grad(v),
              "rope.mla_apply_cache: writing into a KV cache doesn't support forward-mode "
              "automatic differentiation");
  Pair out;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    out = mla_op().call(q_pe, k_pe, kv_c, cos, sin, positions, kv_cache, kpe_cache, slot_mapping,
                        q_nope, v, v_cache, interleaved, kv_scale, v_scale, q_dtype, q_scale,
                        multiply_by_scale);
  }
  bump_versions(kv_cache, kpe_cache, v_cache);
  return out;
}

Pair mla_apply_cache_view(c10::DispatchKeySet keys, const at::Tensor& q_pe, const at::Tensor& k_pe,
                          const at::Tensor& kv_c, const at::Tensor& cos, const at::Tensor& sin,
                          const at::Tensor& positions, const at::Tensor& kv_cache,
                          Optional kpe_cache, const at::Tensor& slot_mapping, Optional q_nope,
                          Optional v, Optional v_cache, bool interleaved, Optional kv_scale,
                          Optional v_scale, std::optional<at::ScalarType> q_dtype, Optional q_scale,
                          bool multiply_by_scale) {
  Pair out;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    out = mla_op().redispatch(keys & c10::after_ADInplaceOrView_keyset, q_pe, k_pe, kv_c, cos, sin,
                              positions, kv_cache, kpe_cache, slot_mapping, q_nope, v, v_cache,
                              interleaved, kv_scale, v_scale, q_dtype, q_scale, multiply_by_scale);
  }
  bump_versions(kv_cache, kpe_cache, v_cache);
  return out;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> mla_apply_cache(
    const at::Tensor& q_pe, const at::Tensor& k_pe, const at::Tensor& kv_c, const at::Tensor& cos,
    const at::Tensor& sin, const at::Tensor& positions, at::Tensor& kv_cache,
    const std::optional<at::Tensor>& kpe_cache, const at::Tensor& slot_mapping,
    const std::optional<at::Tensor>& q_nope, const std::optional<at::Tensor>& v,
    const std::optional<at::Tensor>& v_cache, bool interleaved,
    const std::optional<at::Tensor>& kv_scale, const std::optional<at::Tensor>& v_scale,
    std::optional<at::ScalarType> q_dtype, const std::optional<at::Tensor>& q_scale,
    bool multiply_by_scale) {
  return mla_op().call(q_pe, k_pe, kv_c, cos, sin, positions, kv_cache, kpe_cache, slot_mapping,
                       q_nope, v, v_cache, interleaved, kv_scale, v_scale, q_dtype, q_scale,
                       multiply_by_scale);
}

}  // namespace rope

TORCH_LIBRARY_IMPL(rope, Meta, m) { m.impl("mla_apply_cache", &rope::mla_apply_cache_meta); }

TORCH_LIBRARY_IMPL(rope, Autograd, m) {
  m.impl("mla_apply_cache", &rope::mla_apply_cache_autograd);
}

TORCH_LIBRARY_IMPL(rope, ADInplaceOrView, m) {
  m.impl("mla_apply_cache", &rope::mla_apply_cache_view);
}
