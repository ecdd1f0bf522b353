// SPDX-License-Identifier: BSD-3-Clause
// rope.apply_qk_cache outside the computing backends: the C++ API (through the dispatcher), the
// Meta kernel (the same checks as CPU and CUDA, on SymInts; the slot and position values are left
// to the real kernels), the Autograd kernel (not differentiable, as apply.out) and the
// ADInplaceOrView kernel (the caches' version counters where autograd is excluded). The schema is
// in rope_ops.cpp with the others; CPU and CUDA register in cpu/kv_cache_cpu.cpp and
// cuda/kv_cache_cuda.cpp.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/VariableTypeUtils.h>
#include <torch/library.h>
#include <torch_rope/ops.h>

#include "common_optional.h"
#include "kv_cache_body.h"

namespace rope {

at::Tensor apply_qk_cache(const at::Tensor& q, const at::Tensor& k,
                          const std::optional<at::Tensor>& v, const at::Tensor& cos,
                          const at::Tensor& sin, const at::Tensor& positions, at::Tensor& k_cache,
                          const std::optional<at::Tensor>& v_cache, const at::Tensor& slot_mapping,
                          bool interleaved, const std::optional<at::Tensor>& k_scale,
                          const std::optional<at::Tensor>& v_scale,
                          at::OptionalIntArrayRef mrope_section, bool mrope_interleaved) {
  using Optional = const std::optional<at::Tensor>&;
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("rope::apply_qk_cache", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, Optional,
                                         const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         const at::Tensor&, Optional, const at::Tensor&, bool,
                                         Optional, Optional, at::OptionalIntArrayRef, bool)>();
  return op.call(q, k, v, cos, sin, positions, k_cache, v_cache, slot_mapping, interleaved, k_scale,
                 v_scale, mrope_section, mrope_interleaved);
}

namespace {

at::Tensor apply_qk_cache_meta(const at::Tensor& q, const at::Tensor& k,
                               const std::optional<at::Tensor>& v, const at::Tensor& cos,
                               const at::Tensor& sin, const at::Tensor& positions,
                               const at::Tensor& k_cache, const std::optional<at::Tensor>& v_cache,
                               const at::Tensor& slot_mapping, bool /*interleaved*/,
                               const std::optional<at::Tensor>& k_scale,
                               const std::optional<at::Tensor>& v_scale,
                               at::OptionalIntArrayRef mrope_section, bool mrope_interleaved) {
  detail::check_apply_qk_cache("rope.apply_qk_cache", {q,
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
                                                       {mrope_section, mrope_interleaved}});
  return at::empty_symint(q.sym_sizes(), q.options().memory_format(at::MemoryFormat::Contiguous));
}

// Writing into caches is not differentiable: refuse, as aten's out= ops do, rather than return a
// q_out whose gradient (and the caches') would silently be lost.
at::Tensor apply_qk_cache_autograd(const at::Tensor& q, const at::Tensor& k,
                                   const std::optional<at::Tensor>& v, const at::Tensor& cos,
                                   const at::Tensor& sin, const at::Tensor& positions,
                                   const at::Tensor& k_cache,
                                   const std::optional<at::Tensor>& v_cache,
                                   const at::Tensor& slot_mapping, bool interleaved,
                                   const std::optional<at::Tensor>& k_scale,
                                   const std::optional<at::Tensor>& v_scale,
                                   at::OptionalIntArrayRef mrope_section, bool mrope_interleaved) {
  const bool wants_grad =
      at::GradMode::is_enabled() &&
      (q.requires_grad() || k.requires_grad() || requires_grad(v) || cos.requires_grad() ||
       sin.requires_grad() || k_cache.requires_grad() || requires_grad(v_cache) ||
       requires_grad(k_scale) || requires_grad(v_scale));
  TORCH_CHECK(!wants_grad,
              "rope.apply_qk_cache: writing into a KV cache doesn't support automatic "
              "differentiation, but one of the arguments requires grad; call torch_rope.apply_qk "
              "to get gradients, or run under torch.no_grad() / torch.inference_mode()");
  TORCH_CHECK(!q._fw_grad(0).defined() && !k._fw_grad(0).defined() && !has_forward_grad(v) &&
                  !k_cache._fw_grad(0).defined() && !has_forward_grad(v_cache),
              "rope.apply_qk_cache: writing into a KV cache doesn't support forward-mode "
              "automatic differentiation; call torch_rope.apply_qk");
  at::Tensor q_out;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    at::Tensor target = k_cache;
    q_out = rope::apply_qk_cache(q, k, v, cos, sin, positions, target, v_cache, slot_mapping,
                                 interleaved, k_scale, v_scale, mrope_section, mrope_interleaved);
  }
  // The ADInplaceOrView key, skipped above, would bump the version of the mutated caches.
  torch::autograd::increment_version(k_cache);
  if (v_cache.has_value() && v_cache->defined()) {
    torch::autograd::increment_version(*v_cache);
  }
  return q_out;
}

// Where autograd is excluded (torch.inference_mode(): a decode loop writing caches allocated
// outside it), the caches reach this key instead of the Autograd kernel above, and their versions
// must still grow, as a native in-place op's do there: a cache saved for backward and then
// overwritten must make that backward raise. Inference tensors lack this key.
at::Tensor apply_qk_cache_view(c10::DispatchKeySet keys, const at::Tensor& q, const at::Tensor& k,
                               const std::optional<at::Tensor>& v, const at::Tensor& cos,
                               const at::Tensor& sin, const at::Tensor& positions,
                               const at::Tensor& k_cache, const std::optional<at::Tensor>& v_cache,
                               const at::Tensor& slot_mapping, bool interleaved,
                               const std::optional<at::Tensor>& k_scale,
                               const std::optional<at::Tensor>& v_scale,
                               at::OptionalIntArrayRef mrope_section, bool mrope_interleaved) {
  using Optional = const std::optional<at::Tensor>&;
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("rope::apply_qk_cache", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, Optional,
                                         const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         const at::Tensor&, Optional, const at::Tensor&, bool,
                                         Optional, Optional, at::OptionalIntArrayRef, bool)>();
  at::Tensor q_out;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    q_out = op.redispatch(keys & c10::after_ADInplaceOrView_keyset, q, k, v, cos, sin, positions,
                          k_cache, v_cache, slot_mapping, interleaved, k_scale, v_scale,
                          mrope_section, mrope_interleaved);
  }
  torch::autograd::increment_version(k_cache);
  if (v_cache.has_value() && v_cache->defined()) {
    torch::autograd::increment_version(*v_cache);
  }
  return q_out;
}

}  // namespace
}  // namespace rope

TORCH_LIBRARY_IMPL(rope, Meta, m) { m.impl("apply_qk_cache", &rope::apply_qk_cache_meta); }

TORCH_LIBRARY_IMPL(rope, Autograd, m) { m.impl("apply_qk_cache", &rope::apply_qk_cache_autograd); }

TORCH_LIBRARY_IMPL(rope, ADInplaceOrView, m) {
  m.impl("apply_qk_cache", &rope::apply_qk_cache_view);
}
