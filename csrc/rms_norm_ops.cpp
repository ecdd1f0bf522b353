// SPDX-License-Identifier: BSD-3-Clause
// rope.rms_norm_apply_qk (schema in rope_ops.cpp): its C++ API, its Meta kernel and its Autograd
// kernel, in the style of rope_ops.cpp, rope_meta.cpp and rope_autograd.cpp. The CPU kernel is
// cpu/rms_norm_cpu.cpp, the CUDA kernel cuda/rms_norm_cuda.cpp.
//
// Backward is a composite of ATen ops and rope.apply with `inverse` flipped (the transpose of the
// rotation), recomputing the normalisation from the saved inputs: with n = x * r,
// r = 1 / sqrt(mean(x^2) + eps), w' = weight + weight_offset and g_y = R^T g_out,
//   g_weight = sum over rows of g_y * n,
//   g_x = r * (g_n - n * mean(g_n * n)),  g_n = g_y * w'.
// Every op of it is differentiable, so double backward works. Forward-mode AD is refused (no jvp
// rule); under torch.func the Python wrapper (torch_rope.rms_norm_apply_qk) takes a composite
// path that supports every transform.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <torch/autograd.h>
#include <torch/library.h>
#include <torch_rope/ops.h>

#include <numeric>
#include <optional>
#include <tuple>
#include <vector>

#include "rms_norm_validation.h"

namespace rope {

std::tuple<at::Tensor, at::Tensor> rms_norm_apply_qk(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& q_weight,
    const at::Tensor& k_weight, const at::Tensor& cos, const at::Tensor& sin,
    const at::Tensor& positions, double eps, double weight_offset, bool interleaved, bool inverse,
    at::OptionalIntArrayRef mrope_section, bool mrope_interleaved) {
  static auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("rope::rms_norm_apply_qk", "")
          .typed<std::tuple<at::Tensor, at::Tensor>(
              const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
              const at::Tensor&, const at::Tensor&, const at::Tensor&, double, double, bool, bool,
              at::OptionalIntArrayRef, bool)>();
  return op.call(q, k, q_weight, k_weight, cos, sin, positions, eps, weight_offset, interleaved,
                 inverse, mrope_section, mrope_interleaved);
}

namespace norm {
namespace {

constexpr const char* kOp = "rope.rms_norm_apply_qk";

// ---- Meta ---------------------------------------------------------------------------------------

at::Tensor empty_like_contiguous(const at::Tensor& x) {
  return at::empty_symint(x.sym_sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
}

std::tuple<at::Tensor, at::Tensor> rms_norm_apply_qk_meta(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& q_weight,
    const at::Tensor& k_weight, const at::Tensor& cos, const at::Tensor& sin,
    const at::Tensor& positions, double eps, double weight_offset, bool /*interleaved*/,
    bool /*inverse*/, at::OptionalIntArrayRef mrope_section, bool mrope_interleaved) {
  detail::check_rms_norm_apply_qk(kOp, q, k, q_weight, k_weight, cos, sin, positions, eps,
                                  weight_offset, {mrope_section, mrope_interleaved});
  return {empty_like_contiguous(q), empty_like_contiguous(k)};
}

// ---- Autograd -----------------------------------------------------------------------------------

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr uint64_t kForwardLevel = 0;

bool wrapped_by_functorch_autodiff(const at::Tensor& t) {
  return t.defined() && t.key_set().has(c10::DispatchKey::FuncTorchGradWrapper);
}

struct Saved {
  double eps;
  double weight_offset;
  bool interleaved;
  bool inverse;
  std::optional<std::vector<int64_t>> section;
  bool mrope_interleaved;
};

Saved load(AutogradContext* ctx) {
  Saved s{ctx->saved_data["eps"].toDouble(),
          ctx->saved_data["weight_offset"].toDouble(),
          ctx->saved_data["interleaved"].toBool(),
          ctx->saved_data["inverse"].toBool(),
          std::nullopt,
          ctx->saved_data["mrope_interleaved"].toBool()};
  const auto section = ctx->saved_data.find("mrope_section");
  if (section != ctx->saved_data.end()) {
    s.section = section->second.toIntVector();
  }
  return s;
}

// Gradients of one normalised-and-rotated tensor: {g_x, g_weight} (undefined when not wanted).
std::pair<at::Tensor, at::Tensor> norm_backward(const at::Tensor& x, const at::Tensor& weight,
                                                const at::Tensor& grad, const at::Tensor& cos,
                                                const at::Tensor& sin, const at::Tensor& positions,
                                                const Saved& s, bool want_x, bool want_weight) {
  if (!grad.defined() || (!want_x && !want_weight)) {
    return {};
  }
  const auto acc = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor xf = x.to(acc);
  const at::Tensor w = weight.to(acc) + s.weight_offset;
  // The transpose of the rotation, in the math type.
  const at::Tensor gy = rope::apply(grad.to(acc), cos, sin, positions, s.interleaved, !s.inverse,
                                    s.section ? at::OptionalIntArrayRef(*s.section) : std::nullopt,
                                    s.mrope_interleaved);
  const at::Tensor r = at::rsqrt(xf.square().mean(-1, /*keepdim=*/true) + s.eps);
  const at::Tensor n = xf * r;
  at::Tensor gx;
  at::Tensor gw;
  if (want_weight) {
    // Summed over every row dim (by dim index, so symbolic shapes trace); a single row sums
    // over nothing (an empty dim list would reduce everything).
    const at::Tensor per_row = gy * n;
    std::vector<int64_t> row_dims(static_cast<size_t>(x.dim() - 1));
    std::iota(row_dims.begin(), row_dims.end(), 0);
    gw = (row_dims.empty() ? per_row : per_row.sum(row_dims)).to(weight.scalar_type());
  }
  if (want_x) {
    const at::Tensor gn = gy * w;
    gx = (r * (gn - n * (gn * n).mean(-1, /*keepdim=*/true))).to(x.scalar_type());
  }
  return {gx, gw};
}

class NormQKFunction : public torch::autograd::Function<NormQKFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& q_weight, const at::Tensor& k_weight,
                               const at::Tensor& cos, const at::Tensor& sin,
                               const at::Tensor& positions, double eps, double weight_offset,
                               bool interleaved, bool inverse,
                               at::OptionalIntArrayRef mrope_section, bool mrope_interleaved) {
    ctx->save_for_backward({q, k, q_weight, k_weight, cos, sin, positions});
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["weight_offset"] = weight_offset;
    ctx->saved_data["interleaved"] = interleaved;
    ctx->saved_data["inverse"] = inverse;
    if (mrope_section.has_value()) {
      ctx->saved_data["mrope_section"] = mrope_section->vec();
    }
    ctx->saved_data["mrope_interleaved"] = mrope_interleaved;
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [q_out, k_out] =
        rope::rms_norm_apply_qk(q, k, q_weight, k_weight, cos, sin, positions, eps, weight_offset,
                                interleaved, inverse, mrope_section, mrope_interleaved);
    if (!q.requires_grad() && !q_weight.requires_grad()) {
      ctx->mark_non_differentiable({q_out});
    }
    if (!k.requires_grad() && !k_weight.requires_grad()) {
      ctx->mark_non_differentiable({k_out});
    }
    return {q_out, k_out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Saved s = load(ctx);
    auto [gq, gqw] = norm_backward(saved[0], saved[2], grads[0], saved[4], saved[5], saved[6], s,
                                   ctx->needs_input_grad(0), ctx->needs_input_grad(2));
    auto [gk, gkw] = norm_backward(saved[1], saved[3], grads[1], saved[4], saved[5], saved[6], s,
                                   ctx->needs_input_grad(1), ctx->needs_input_grad(3));
    return {gq, gk, gqw, gkw, {}, {}, {}, {}, {}, {}, {}, {}, {}};
  }
};

bool records_grad(const at::Tensor& t) { return at::GradMode::is_enabled() && t.requires_grad(); }

std::tuple<at::Tensor, at::Tensor> rms_norm_apply_qk_autograd(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& q_weight,
    const at::Tensor& k_weight, const at::Tensor& cos, const at::Tensor& sin,
    const at::Tensor& positions, double eps, double weight_offset, bool interleaved, bool inverse,
    at::OptionalIntArrayRef mrope_section, bool mrope_interleaved) {
  for (const at::Tensor* t : {&q, &k, &q_weight, &k_weight}) {
    TORCH_CHECK(!wrapped_by_functorch_autodiff(*t), kOp,
                ": torch.ops.rope.* cannot be differentiated by torch.func transforms (grad, vjp, "
                "jvp, jacrev, jacfwd, hessian); call torch_rope.rms_norm_apply_qk, which supports "
                "every torch.func transform");
    TORCH_CHECK(!t->defined() || !t->_fw_grad(kForwardLevel).defined(), kOp,
                ": forward-mode automatic differentiation (torch.autograd.forward_ad) is not "
                "supported; use torch.func.jvp on torch_rope.rms_norm_apply_qk instead");
  }
  if (!records_grad(q) && !records_grad(k) && !records_grad(q_weight) && !records_grad(k_weight)) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return rope::rms_norm_apply_qk(q, k, q_weight, k_weight, cos, sin, positions, eps,
                                   weight_offset, interleaved, inverse, mrope_section,
                                   mrope_interleaved);
  }
  auto out =
      NormQKFunction::apply(q, k, q_weight, k_weight, cos, sin, positions, eps, weight_offset,
                            interleaved, inverse, mrope_section, mrope_interleaved);
  return {out[0], out[1]};
}

}  // namespace
}  // namespace norm
}  // namespace rope

TORCH_LIBRARY_IMPL(rope, Meta, m) {
  m.impl("rms_norm_apply_qk", &rope::norm::rms_norm_apply_qk_meta);
}

TORCH_LIBRARY_IMPL(rope, Autograd, m) {
  m.impl("rms_norm_apply_qk", &rope::norm::rms_norm_apply_qk_autograd);
}
