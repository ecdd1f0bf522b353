// SPDX-License-Identifier: BSD-3-Clause
// Autograd for the rope ops, registered in C++ so LibTorch callers get gradients too.
//
// A rotation is orthogonal, so its gradient is the inverse rotation: the same op with `inverse`
// flipped. Backward calls the op through the dispatcher, which makes it differentiable again, so
// double backward comes for free. The op is linear in x, so forward-mode AD
// (torch.autograd.forward_ad) pushes the tangent through the same rotation. cos, sin and positions
// get no gradient (documented).
//
// The ops that write a tensor (apply_, apply.out) also register ADInplaceOrView, which bumps the
// written tensor's version where the Autograd key is excluded (torch.inference_mode()).
//
// torch.func: a C++ autograd::Function cannot take part in functorch's grad/jvp transforms, so
// under those the raw ops raise an error that points to the torch_rope Python API, whose Python
// autograd.Function supports them. vmap is handled before autograd by the ops' vmap rule
// (python/torch_rope/_functorch.py).
#include <ATen/MemoryOverlap.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/VariableTypeUtils.h>
#include <torch/library.h>
#include <torch_rope/ops.h>

#include <optional>
#include <vector>

#include "rope_validation.h"

namespace rope::autograd {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Forward-mode AD level used by torch.autograd.forward_ad (and by the generated aten kernels).
constexpr uint64_t kForwardLevel = 0;

// Under torch.func.grad/vjp/jvp (and jacrev, jacfwd, hessian), functorch hands the Autograd
// kernel its TensorWrappers, which carry the FuncTorchGradWrapper key. The key check needs no
// functorch header (those include nlohmann/json, which the torch wheel does not ship).
bool wrapped_by_functorch_autodiff(const at::Tensor& t) {
  return t.defined() && t.key_set().has(c10::DispatchKey::FuncTorchGradWrapper);
}

void refuse_functorch_autodiff(const char* op, const char* python_api, const at::Tensor& a,
                               const at::Tensor& b = {}) {
  TORCH_CHECK(!wrapped_by_functorch_autodiff(a) && !wrapped_by_functorch_autodiff(b), op,
              ": torch.ops.rope.* cannot be differentiated by torch.func transforms (grad, vjp, "
              "jvp, jacrev, jacfwd, hessian); call ",
              python_api,
              " (or use torch_rope.RotaryPositionalEmbedding), which supports every torch.func "
              "transform");
}

void save_rotation(AutogradContext* ctx, const at::Tensor& cos, const at::Tensor& sin,
                   const at::Tensor& positions, bool interleaved, bool inverse,
                   at::OptionalIntArrayRef mrope_section, bool mrope_interleaved) {
  ctx->save_for_backward({cos, sin, positions});
  ctx->saved_data["interleaved"] = interleaved;
  ctx->saved_data["inverse"] = inverse;
  if (mrope_section.has_value()) {
    ctx->saved_data["mrope_section"] = mrope_section->vec();
  }
  ctx->saved_data["mrope_interleaved"] = mrope_interleaved;
}

// Rotates `grad` back with the saved tables and positions; an undefined grad (output unused) stays
// undefined. `saved` is ctx->get_saved_variables(), unpacked once per backward by the caller:
// under non-reentrant activation checkpointing (torch.utils.checkpoint, use_reentrant=False) a
// second unpack of the same saved tensors raises CheckpointError.
at::Tensor rotate_back(AutogradContext* ctx, const variable_list& saved, const at::Tensor& grad) {
  if (!grad.defined()) {
    return {};
  }
  const auto section = ctx->saved_data.find("mrope_section");
  std::optional<std::vector<int64_t>> mrope_section;
  if (section != ctx->saved_data.end()) {
    mrope_section = section->second.toIntVector();
  }
  return rope::apply(grad, saved[0], saved[1], saved[2], ctx->saved_data["interleaved"].toBool(),
                     !ctx->saved_data["inverse"].toBool(),
                     mrope_section ? at::OptionalIntArrayRef(*mrope_section) : std::nullopt,
                     ctx->saved_data["mrope_interleaved"].toBool());
}

class RotateFunction : public torch::autograd::Function<RotateFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos,
                            const at::Tensor& sin, const at::Tensor& positions, bool interleaved,
                            bool inverse, at::OptionalIntArrayRef mrope_section,
                            bool mrope_interleaved) {
    save_rotation(ctx, cos, sin, positions, interleaved, inverse, mrope_section, mrope_interleaved);
    at::AutoDispatchBelowADInplaceOrView guard;
    return rope::apply(x, cos, sin, positions, interleaved, inverse, mrope_section,
                       mrope_interleaved);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {rotate_back(ctx, ctx->get_saved_variables(), grads[0]), {}, {}, {}, {}, {}, {}, {}};
  }
};

class RotateQKFunction : public torch::autograd::Function<RotateQKFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& cos, const at::Tensor& sin,
                               const at::Tensor& positions, bool interleaved, bool inverse,
                               at::OptionalIntArrayRef mrope_section, bool mrope_interleaved) {
    save_rotation(ctx, cos, sin, positions, interleaved, inverse, mrope_section, mrope_interleaved);
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [q_out, k_out] = rope::apply_qk(q, k, cos, sin, positions, interleaved, inverse,
                                         mrope_section, mrope_interleaved);
    // GQA with only one of q, k trainable: the other output depends on nothing that needs a
    // gradient, so (as for native ops) it must not require one either.
    if (!q.requires_grad()) {
      ctx->mark_non_differentiable({q_out});
    }
    if (!k.requires_grad()) {
      ctx->mark_non_differentiable({k_out});
    }
    return {q_out, k_out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();  // once for both outputs
    variable_list grad_inputs(9);  // q, k, then the 7 arguments that get no gradient
    grad_inputs[0] = rotate_back(ctx, saved, grads[0]);
    grad_inputs[1] = rotate_back(ctx, saved, grads[1]);
    return grad_inputs;
  }
};

// Inference (no input needs a gradient) skips building a graph node: decode calls are small
// enough for that bookkeeping to show.
bool records_grad(const at::Tensor& t) { return at::GradMode::is_enabled() && t.requires_grad(); }

at::Tensor apply_autograd(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                          const at::Tensor& positions, bool interleaved, bool inverse,
                          at::OptionalIntArrayRef mrope_section, bool mrope_interleaved) {
  refuse_functorch_autodiff("rope.apply", "torch_rope.apply", x);
  const at::Tensor& x_tangent = x._fw_grad(kForwardLevel);
  if (x_tangent.defined()) {
    // Compute on the primal (a C++ autograd::Function has no jvp), then attach the tangent.
    const at::Tensor out = apply_autograd(x._fw_primal(kForwardLevel), cos, sin, positions,
                                          interleaved, inverse, mrope_section, mrope_interleaved);
    out._set_fw_grad(rope::apply(x_tangent, cos, sin, positions, interleaved, inverse,
                                 mrope_section, mrope_interleaved),
                     kForwardLevel, /*is_inplace_op=*/false);
    return out;
  }
  if (!records_grad(x)) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return rope::apply(x, cos, sin, positions, interleaved, inverse, mrope_section,
                       mrope_interleaved);
  }
  return RotateFunction::apply(x, cos, sin, positions, interleaved, inverse, mrope_section,
                               mrope_interleaved);
}

std::tuple<at::Tensor, at::Tensor> apply_qk_autograd(const at::Tensor& q, const at::Tensor& k,
                                                     const at::Tensor& cos, const at::Tensor& sin,
                                                     const at::Tensor& positions, bool interleaved,
                                                     bool inverse,
                                                     at::OptionalIntArrayRef mrope_section,
                                                     bool mrope_interleaved) {
  refuse_functorch_autodiff("rope.apply_qk", "torch_rope.apply_qk", q, k);
  const at::Tensor& q_tangent = q._fw_grad(kForwardLevel);
  const at::Tensor& k_tangent = k._fw_grad(kForwardLevel);
  if (q_tangent.defined() || k_tangent.defined()) {
    auto [q_out, k_out] =
        apply_qk_autograd(q._fw_primal(kForwardLevel), k._fw_primal(kForwardLevel), cos, sin,
                          positions, interleaved, inverse, mrope_section, mrope_interleaved);
    if (q_tangent.defined()) {
      q_out._set_fw_grad(rope::apply(q_tangent, cos, sin, positions, interleaved, inverse,
                                     mrope_section, mrope_interleaved),
                         kForwardLevel, /*is_inplace_op=*/false);
    }
    if (k_tangent.defined()) {
      k_out._set_fw_grad(rope::apply(k_tangent, cos, sin, positions, interleaved, inverse,
                                     mrope_section, mrope_interleaved),
                         kForwardLevel, /*is_inplace_op=*/false);
    }
    return {q_out, k_out};
  }
  if (!records_grad(q) && !records_grad(k)) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return rope::apply_qk(q, k, cos, sin, positions, interleaved, inverse, mrope_section,
                          mrope_interleaved);
  }
  auto out = RotateQKFunction::apply(q, k, cos, sin, positions, interleaved, inverse, mrope_section,
                                     mrope_interleaved);
  return {out[0], out[1]};
}

// In place. When no gradient is being recorded for x this is the true in-place kernel. When one
// is, the rotation is recorded out of place and copied into x, so autograd sees an ordinary
// in-place copy_ (rebasing x's history, and refusing leaves that require grad, as for any
// in-place op).
void apply_inplace_autograd(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                            const at::Tensor& positions, bool interleaved, bool inverse,
                            at::OptionalIntArrayRef mrope_section, bool mrope_interleaved) {
  refuse_functorch_autodiff("rope.apply_", "torch_rope.apply_", x);
  const at::Tensor& x_tangent = x._fw_grad(kForwardLevel);
  if (x_tangent.defined()) {
    // Rotate the value through its primal view, then the tangent, as aten's in-place ops do.
    apply_inplace_autograd(x._fw_primal(kForwardLevel), cos, sin, positions, interleaved, inverse,
                           mrope_section, mrope_interleaved);
    if (at::has_internal_overlap(x_tangent) == at::MemOverlap::Yes) {
      x._set_fw_grad(rope::apply(x_tangent, cos, sin, positions, interleaved, inverse,
                                 mrope_section, mrope_interleaved),
                     kForwardLevel, /*is_inplace_op=*/true);
    } else {
      at::Tensor tangent = x_tangent;
      apply_inplace_autograd(tangent, cos, sin, positions, interleaved, inverse, mrope_section,
                             mrope_interleaved);
    }
    return;
  }
  if (records_grad(x)) {
    // Check plain tensors here, under this op's name: the out-of-place rotation below would
    // report a bad call as rope.apply's. Tensor subclasses (DTensor, FakeTensor under compile)
    // have no data to range-check here; their own dispatch checks the local tensors.
    const auto is_subclass = [](const at::Tensor& t) {
      return t.defined() && t.key_set().has(c10::DispatchKey::Python);
    };
    if (!is_subclass(x) && !is_subclass(cos) && !is_subclass(sin) && !is_subclass(positions)) {
      constexpr const char* op = "rope.apply_";
      const detail::MultiAxisArgs axes{mrope_section, mrope_interleaved};
      detail::check_apply_inplace(op, x, cos, sin, positions, axes);
      if (x.numel() > 0 && x.device().is_cpu()) {
        detail::check_positions_in_range(op, positions, cos.size(0), axes);
      }
    }
    const auto rotated = RotateFunction::apply(x, cos, sin, positions, interleaved, inverse,
                                               mrope_section, mrope_interleaved);
    const_cast<at::Tensor&>(x).copy_(rotated);
    return;
  }
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    at::Tensor target = x;
    rope::apply_(target, cos, sin, positions, interleaved, inverse, mrope_section,
                 mrope_interleaved);
  }
  // We skipped the ADInplaceOrView key, whose job is to bump the version counter of mutated
  // inputs; do it here so saved-tensor checks see the write.
  torch::autograd::increment_version(x);
}

// out= is not differentiable, as for aten's out= ops: refuse rather than return an output whose
// gradient would silently be lost.
void apply_out_autograd(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                        const at::Tensor& positions, bool interleaved, bool inverse,
                        at::OptionalIntArrayRef mrope_section, bool mrope_interleaved,
                        const at::Tensor& out) {
  const bool wants_grad =
      at::GradMode::is_enabled() &&
      (x.requires_grad() || cos.requires_grad() || sin.requires_grad() || out.requires_grad());
  TORCH_CHECK(!wants_grad,
              "rope.apply.out: functions with out=... arguments don't support automatic "
              "differentiation, but one of the arguments requires grad; call torch_rope.apply "
              "without out= to get gradients, or run under torch.no_grad()");
  TORCH_CHECK(!x._fw_grad(kForwardLevel).defined() && !out._fw_grad(kForwardLevel).defined(),
              "rope.apply.out: functions with out=... arguments don't support forward-mode "
              "automatic differentiation; call torch_rope.apply without out=");
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    at::Tensor target = out;
    rope::apply_out(target, x, cos, sin, positions, interleaved, inverse, mrope_section,
                    mrope_interleaved);
  }
  torch::autograd::increment_version(out);
}

// ---- ADInplaceOrView: the version counter of the written tensor -----------------------------
// The Autograd kernels above skip this key and bump the version themselves. Where autograd is
// excluded (torch.inference_mode(), or a caller below Autograd), a normal (non-inference) tensor
// still reaches this key, and its write must still bump its version, as native in-place and out=
// ops do there: a tensor saved for backward and then overwritten must make that backward raise,
// not return a stale gradient. Inference tensors lack this key (they have no version counter).

void apply_inplace_view(c10::DispatchKeySet keys, const at::Tensor& x, const at::Tensor& cos,
                        const at::Tensor& sin, const at::Tensor& positions, bool interleaved,
                        bool inverse, at::OptionalIntArrayRef mrope_section,
                        bool mrope_interleaved) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("rope::apply_", "")
                       .typed<void(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                   const at::Tensor&, bool, bool, at::OptionalIntArrayRef, bool)>();
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    op.redispatch(keys & c10::after_ADInplaceOrView_keyset, x, cos, sin, positions, interleaved,
                  inverse, mrope_section, mrope_interleaved);
  }
  torch::autograd::increment_version(x);
}

void apply_out_view(c10::DispatchKeySet keys, const at::Tensor& x, const at::Tensor& cos,
                    const at::Tensor& sin, const at::Tensor& positions, bool interleaved,
                    bool inverse, at::OptionalIntArrayRef mrope_section, bool mrope_interleaved,
                    const at::Tensor& out) {
  static auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("rope::apply", "out")
          .typed<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                      bool, bool, at::OptionalIntArrayRef, bool, const at::Tensor&)>();
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    op.redispatch(keys & c10::after_ADInplaceOrView_keyset, x, cos, sin, positions, interleaved,
                  inverse, mrope_section, mrope_interleaved, out);
  }
  torch::autograd::increment_version(out);
}

}  // namespace
}  // namespace rope::autograd

TORCH_LIBRARY_IMPL(rope, Autograd, m) {
  m.impl("apply", &rope::autograd::apply_autograd);
  m.impl("apply_", &rope::autograd::apply_inplace_autograd);
  m.impl("apply.out", &rope::autograd::apply_out_autograd);
  m.impl("apply_qk", &rope::autograd::apply_qk_autograd);
}

TORCH_LIBRARY_IMPL(rope, ADInplaceOrView, m) {
  m.impl("apply_", &rope::autograd::apply_inplace_view);
  m.impl("apply.out", &rope::autograd::apply_out_view);
}
