// Autograd for the rope ops, registered in C++ so LibTorch callers get gradients too.
//
// A rotation is orthogonal, so its gradient is the inverse rotation: the same op with `inverse`
// flipped. Backward calls the op through the dispatcher, which makes it differentiable again, so
// double backward comes for free. cos, sin and positions get no gradient (documented).
#include <torch/autograd.h>
#include <torch/csrc/autograd/VariableTypeUtils.h>
#include <torch/library.h>
#include <torch_rope/ops.h>

namespace rope::autograd {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

void save_rotation(AutogradContext* ctx, const at::Tensor& cos, const at::Tensor& sin,
                   const at::Tensor& positions, bool interleaved, bool inverse) {
  ctx->save_for_backward({cos, sin, positions});
  ctx->saved_data["interleaved"] = interleaved;
  ctx->saved_data["inverse"] = inverse;
}

// Rotates `grad` back; an undefined grad (output unused) stays undefined.
at::Tensor rotate_back(AutogradContext* ctx, const at::Tensor& grad) {
  if (!grad.defined()) {
    return {};
  }
  const auto saved = ctx->get_saved_variables();
  return rope::apply(grad, saved[0], saved[1], saved[2], ctx->saved_data["interleaved"].toBool(),
                     !ctx->saved_data["inverse"].toBool());
}

class RotateFunction : public torch::autograd::Function<RotateFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos,
                            const at::Tensor& sin, const at::Tensor& positions, bool interleaved,
                            bool inverse) {
    save_rotation(ctx, cos, sin, positions, interleaved, inverse);
    at::AutoDispatchBelowADInplaceOrView guard;
    return rope::apply(x, cos, sin, positions, interleaved, inverse);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {rotate_back(ctx, grads[0]), {}, {}, {}, {}, {}};
  }
};

class RotateQKFunction : public torch::autograd::Function<RotateQKFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& cos, const at::Tensor& sin,
                               const at::Tensor& positions, bool interleaved, bool inverse) {
    save_rotation(ctx, cos, sin, positions, interleaved, inverse);
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [q_out, k_out] = rope::apply_qk(q, k, cos, sin, positions, interleaved, inverse);
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
    return {rotate_back(ctx, grads[0]), rotate_back(ctx, grads[1]), {}, {}, {}, {}, {}};
  }
};

// Inference (no input needs a gradient) skips building a graph node: decode calls are small
// enough for that bookkeeping to show.
bool records_grad(const at::Tensor& t) {
  return at::GradMode::is_enabled() && t.requires_grad();
}

at::Tensor apply_autograd(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                          const at::Tensor& positions, bool interleaved, bool inverse) {
  if (!records_grad(x)) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return rope::apply(x, cos, sin, positions, interleaved, inverse);
  }
  return RotateFunction::apply(x, cos, sin, positions, interleaved, inverse);
}

std::tuple<at::Tensor, at::Tensor> apply_qk_autograd(const at::Tensor& q, const at::Tensor& k,
                                                     const at::Tensor& cos, const at::Tensor& sin,
                                                     const at::Tensor& positions, bool interleaved,
                                                     bool inverse) {
  if (!records_grad(q) && !records_grad(k)) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return rope::apply_qk(q, k, cos, sin, positions, interleaved, inverse);
  }
  auto out = RotateQKFunction::apply(q, k, cos, sin, positions, interleaved, inverse);
  return {out[0], out[1]};
}

// In place. When no gradient is being recorded for x this is the true in-place kernel. When one
// is, the rotation is recorded out of place and copied into x, so autograd sees an ordinary
// in-place copy_ (rebasing x's history, and refusing leaves that require grad, as for any
// in-place op).
void apply_inplace_autograd(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                            const at::Tensor& positions, bool interleaved, bool inverse) {
  if (records_grad(x)) {
    const auto rotated = RotateFunction::apply(x, cos, sin, positions, interleaved, inverse);
    const_cast<at::Tensor&>(x).copy_(rotated);
    return;
  }
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    at::Tensor target = x;
    rope::apply_(target, cos, sin, positions, interleaved, inverse);
  }
  // We skipped the ADInplaceOrView key, whose job is to bump the version counter of mutated
  // inputs; do it here so saved-tensor checks see the write.
  torch::autograd::increment_version(x);
}

}  // namespace
}  // namespace rope::autograd

TORCH_LIBRARY_IMPL(rope, Autograd, m) {
  m.impl("apply", &rope::autograd::apply_autograd);
  m.impl("apply_", &rope::autograd::apply_inplace_autograd);
  m.impl("apply_qk", &rope::autograd::apply_qk_autograd);
}
