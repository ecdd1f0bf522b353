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
#include <string>
#include <vector>

#include "rope_forms.h"
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

// ---- the frequency and packed-sequence forms -------------------------------------------------
// The same autograd for the twelve overloads of rope_forms.h: a call's arguments other than the
// rotated tensors are kept in a FormCall, which calls the matching overload of the C++ API again
// (backward: the same overload with `inverse` flipped).

struct FormCall {
  at::Tensor freqs;  // the angle source: freqs, or cos and sin
  at::Tensor cos;
  at::Tensor sin;
  at::Tensor positions;  // the position source: positions, or the packed sequences
  at::Tensor cu_seqlens;
  at::Tensor seq_offsets;
  double attention_factor = 1.0;
  int64_t cp_size = 1;
  int64_t cp_rank = 0;
  std::optional<std::vector<int64_t>> mrope_section;
  bool mrope_interleaved = false;
  bool interleaved = true;

  static FormCall of(const detail::AngleSource& angles, const detail::PositionSource& where,
                     bool interleaved, const detail::MultiAxisArgs& axes) {
    FormCall c;
    if (angles.frequencies()) {
      c.freqs = *angles.freqs;
      c.attention_factor = angles.attention_factor;
    } else {
      c.cos = *angles.cos;
      c.sin = *angles.sin;
    }
    if (where.is_packed()) {
      c.cu_seqlens = where.packed->cu_seqlens;
      c.seq_offsets = where.packed->seq_offsets;
      c.cp_size = where.packed->cp_size;
      c.cp_rank = where.packed->cp_rank;
    } else {
      c.positions = *where.positions;
    }
    if (axes.active()) {
      c.mrope_section = axes.section->vec();
    }
    c.mrope_interleaved = axes.interleaved;
    c.interleaved = interleaved;
    return c;
  }

  bool frequencies() const { return freqs.defined(); }
  bool packed() const { return cu_seqlens.defined(); }
  Frequencies frequency_source() const { return {freqs, attention_factor}; }
  PackedSequences packed_source() const {
    return {cu_seqlens,
            seq_offsets.defined() ? std::optional<at::Tensor>(seq_offsets) : std::nullopt, cp_size,
            cp_rank};
  }
  at::OptionalIntArrayRef section() const {
    return mrope_section ? at::OptionalIntArrayRef(*mrope_section) : std::nullopt;
  }

  // The overload of this call, through the dispatcher.
  at::Tensor apply(const at::Tensor& x, bool inverse) const {
    if (frequencies() && packed()) {
      return rope::apply(x, frequency_source(), packed_source(), interleaved, inverse);
    }
    if (frequencies()) {
      return rope::apply(x, frequency_source(), positions, interleaved, inverse, section(),
                         mrope_interleaved);
    }
    return rope::apply(x, cos, sin, packed_source(), interleaved, inverse);
  }
  void apply_(at::Tensor& x, bool inverse) const {
    if (frequencies() && packed()) {
      return rope::apply_(x, frequency_source(), packed_source(), interleaved, inverse);
    }
    if (frequencies()) {
      return rope::apply_(x, frequency_source(), positions, interleaved, inverse, section(),
                          mrope_interleaved);
    }
    rope::apply_(x, cos, sin, packed_source(), interleaved, inverse);
  }
  void apply_out(at::Tensor& out, const at::Tensor& x, bool inverse) const {
    if (frequencies() && packed()) {
      rope::apply_out(out, x, frequency_source(), packed_source(), interleaved, inverse);
    } else if (frequencies()) {
      rope::apply_out(out, x, frequency_source(), positions, interleaved, inverse, section(),
                      mrope_interleaved);
    } else {
      rope::apply_out(out, x, cos, sin, packed_source(), interleaved, inverse);
    }
  }
  std::tuple<at::Tensor, at::Tensor> apply_qk(const at::Tensor& q, const at::Tensor& k,
                                              bool inverse) const {
    if (frequencies() && packed()) {
      return rope::apply_qk(q, k, frequency_source(), packed_source(), interleaved, inverse);
    }
    if (frequencies()) {
      return rope::apply_qk(q, k, frequency_source(), positions, interleaved, inverse, section(),
                            mrope_interleaved);
    }
    return rope::apply_qk(q, k, cos, sin, packed_source(), interleaved, inverse);
  }

  // Saved once per forward and unpacked once per backward (activation checkpointing).
  void save(AutogradContext* ctx, bool inverse) const {
    ctx->save_for_backward({freqs, cos, sin, positions, cu_seqlens, seq_offsets});
    ctx->saved_data["attention_factor"] = attention_factor;
    ctx->saved_data["cp_size"] = cp_size;
    ctx->saved_data["cp_rank"] = cp_rank;
    if (mrope_section) {
      ctx->saved_data["mrope_section"] = *mrope_section;
    }
    ctx->saved_data["mrope_interleaved"] = mrope_interleaved;
    ctx->saved_data["interleaved"] = interleaved;
    ctx->saved_data["inverse"] = inverse;
  }
  static FormCall restore(AutogradContext* ctx, const variable_list& saved) {
    FormCall c;
    c.freqs = saved[0];
    c.cos = saved[1];
    c.sin = saved[2];
    c.positions = saved[3];
    c.cu_seqlens = saved[4];
    c.seq_offsets = saved[5];
    c.attention_factor = ctx->saved_data["attention_factor"].toDouble();
    c.cp_size = ctx->saved_data["cp_size"].toInt();
    c.cp_rank = ctx->saved_data["cp_rank"].toInt();
    const auto section = ctx->saved_data.find("mrope_section");
    if (section != ctx->saved_data.end()) {
      c.mrope_section = section->second.toIntVector();
    }
    c.mrope_interleaved = ctx->saved_data["mrope_interleaved"].toBool();
    c.interleaved = ctx->saved_data["interleaved"].toBool();
    return c;
  }
};

at::Tensor rotate_form_back(AutogradContext* ctx, const FormCall& call, const at::Tensor& grad) {
  if (!grad.defined()) {
    return {};
  }
  return call.apply(grad, !ctx->saved_data["inverse"].toBool());
}

class FormRotateFunction : public torch::autograd::Function<FormRotateFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const FormCall& call,
                            bool inverse) {
    call.save(ctx, inverse);
    at::AutoDispatchBelowADInplaceOrView guard;
    return call.apply(x, inverse);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const FormCall call = FormCall::restore(ctx, ctx->get_saved_variables());
    return {rotate_form_back(ctx, call, grads[0]), {}, {}};
  }
};

class FormRotateQKFunction : public torch::autograd::Function<FormRotateQKFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const FormCall& call, bool inverse) {
    call.save(ctx, inverse);
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [q_out, k_out] = call.apply_qk(q, k, inverse);
    if (!q.requires_grad()) {
      ctx->mark_non_differentiable({q_out});
    }
    if (!k.requires_grad()) {
      ctx->mark_non_differentiable({k_out});
    }
    return {q_out, k_out};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const FormCall call = FormCall::restore(ctx, ctx->get_saved_variables());
    return {rotate_form_back(ctx, call, grads[0]), rotate_form_back(ctx, call, grads[1]), {}, {}};
  }
};

// The Python API's name of an overload's op, for the functorch refusal.
const char* python_api_of(const char* op) {
  const std::string name(op);
  if (name.rfind("rope.apply_qk", 0) == 0) return "torch_rope.apply_qk";
  if (name.rfind("rope.apply_.", 0) == 0) return "torch_rope.apply_";
  return "torch_rope.apply";
}

bool is_subclass(const at::Tensor& t) {
  return t.defined() && t.key_set().has(c10::DispatchKey::Python);
}

struct AutogradForms {
  static at::Tensor apply(const char* op, const at::Tensor& x, const detail::AngleSource& angles,
                          const detail::PositionSource& where, bool interleaved, bool inverse,
                          const detail::MultiAxisArgs& axes) {
    refuse_functorch_autodiff(op, python_api_of(op), x);
    const FormCall call = FormCall::of(angles, where, interleaved, axes);
    const at::Tensor& x_tangent = x._fw_grad(kForwardLevel);
    if (x_tangent.defined()) {
      const at::Tensor out =
          apply(op, x._fw_primal(kForwardLevel), angles, where, interleaved, inverse, axes);
      out._set_fw_grad(call.apply(x_tangent, inverse), kForwardLevel, /*is_inplace_op=*/false);
      return out;
    }
    if (!records_grad(x)) {
      at::AutoDispatchBelowADInplaceOrView guard;
      return call.apply(x, inverse);
    }
    return FormRotateFunction::apply(x, call, inverse);
  }

  static void apply_inplace(const char* op, const at::Tensor& x, const detail::AngleSource& angles,
                            const detail::PositionSource& where, bool interleaved, bool inverse,
                            const detail::MultiAxisArgs& axes) {
    refuse_functorch_autodiff(op, python_api_of(op), x);
    const FormCall call = FormCall::of(angles, where, interleaved, axes);
    const at::Tensor& x_tangent = x._fw_grad(kForwardLevel);
    if (x_tangent.defined()) {
      apply_inplace(op, x._fw_primal(kForwardLevel), angles, where, interleaved, inverse, axes);
      if (at::has_internal_overlap(x_tangent) == at::MemOverlap::Yes) {
        x._set_fw_grad(call.apply(x_tangent, inverse), kForwardLevel, /*is_inplace_op=*/true);
      } else {
        at::Tensor tangent = x_tangent;
        apply_inplace(op, tangent, angles, where, interleaved, inverse, axes);
      }
      return;
    }
    if (records_grad(x)) {
      // As apply_inplace_autograd: checked here under this overload's name, plain tensors only.
      const bool plain = !is_subclass(x) && !is_subclass(call.freqs) && !is_subclass(call.cos) &&
                         !is_subclass(call.positions) && !is_subclass(call.cu_seqlens);
      if (plain) {
        detail::check_apply_inplace_form(op, x, angles, where, axes);
        if (x.numel() > 0 || where.is_packed()) {
          detail::check_form_values_on_host(op, angles, where, where.is_packed() ? x.size(0) : 0,
                                            axes);
        }
      }
      const auto rotated = FormRotateFunction::apply(x, call, inverse);
      const_cast<at::Tensor&>(x).copy_(rotated);
      return;
    }
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      at::Tensor target = x;
      call.apply_(target, inverse);
    }
    torch::autograd::increment_version(x);
  }

  static void apply_out(const char* op, const at::Tensor& x, const detail::AngleSource& angles,
                        const detail::PositionSource& where, bool interleaved, bool inverse,
                        const detail::MultiAxisArgs& axes, const at::Tensor& out) {
    const FormCall call = FormCall::of(angles, where, interleaved, axes);
    const auto needs_grad = [](const at::Tensor& t) { return t.defined() && t.requires_grad(); };
    const bool wants_grad = at::GradMode::is_enabled() &&
                            (needs_grad(x) || needs_grad(call.freqs) || needs_grad(call.cos) ||
                             needs_grad(call.sin) || needs_grad(out));
    TORCH_CHECK(!wants_grad, op,
                ": functions with out=... arguments don't support automatic differentiation, "
                "but one of the arguments requires grad; call torch_rope.apply without out= to "
                "get gradients, or run under torch.no_grad()");
    TORCH_CHECK(!x._fw_grad(kForwardLevel).defined() && !out._fw_grad(kForwardLevel).defined(), op,
                ": functions with out=... arguments don't support forward-mode automatic "
                "differentiation; call torch_rope.apply without out=");
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      at::Tensor target = out;
      call.apply_out(target, x, inverse);
    }
    torch::autograd::increment_version(out);
  }

  static std::tuple<at::Tensor, at::Tensor> apply_qk(const char* op, const at::Tensor& q,
                                                     const at::Tensor& k,
                                                     const detail::AngleSource& angles,
                                                     const detail::PositionSource& where,
                                                     bool interleaved, bool inverse,
                                                     const detail::MultiAxisArgs& axes) {
    refuse_functorch_autodiff(op, python_api_of(op), q, k);
    const FormCall call = FormCall::of(angles, where, interleaved, axes);
    const at::Tensor& q_tangent = q._fw_grad(kForwardLevel);
    const at::Tensor& k_tangent = k._fw_grad(kForwardLevel);
    if (q_tangent.defined() || k_tangent.defined()) {
      auto [q_out, k_out] = apply_qk(op, q._fw_primal(kForwardLevel), k._fw_primal(kForwardLevel),
                                     angles, where, interleaved, inverse, axes);
      if (q_tangent.defined()) {
        q_out._set_fw_grad(call.apply(q_tangent, inverse), kForwardLevel, false);
      }
      if (k_tangent.defined()) {
        k_out._set_fw_grad(call.apply(k_tangent, inverse), kForwardLevel, false);
      }
      return {q_out, k_out};
    }
    if (!records_grad(q) && !records_grad(k)) {
      at::AutoDispatchBelowADInplaceOrView guard;
      return call.apply_qk(q, k, inverse);
    }
    auto out = FormRotateQKFunction::apply(q, k, call, inverse);
    return {out[0], out[1]};
  }
};

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

// The writing overloads of the new forms: redispatched below this key, then the version bump.
template <typename Signature, typename... Args>
void redispatch_writing(c10::DispatchKeySet keys, const c10::TypedOperatorHandle<Signature>& op,
                        const at::Tensor& written, const Args&... args) {
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    op.redispatch(keys & c10::after_ADInplaceOrView_keyset, args...);
  }
  torch::autograd::increment_version(written);
}

using OptTensor = std::optional<at::Tensor>;

void apply_inplace_freqs_view(c10::DispatchKeySet keys, const at::Tensor& x,
                              const at::Tensor& freqs, const at::Tensor& positions,
                              double attention_factor, bool interleaved, bool inverse,
                              at::OptionalIntArrayRef mrope_section, bool mrope_interleaved) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("rope::apply_", "freqs")
                       .typed<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
                                   bool, bool, at::OptionalIntArrayRef, bool)>();
  redispatch_writing(keys, op, x, x, freqs, positions, attention_factor, interleaved, inverse,
                     mrope_section, mrope_interleaved);
}

void apply_inplace_varlen_view(c10::DispatchKeySet keys, const at::Tensor& x, const at::Tensor& cos,
                               const at::Tensor& sin, const at::Tensor& cu_seqlens,
                               const OptTensor& seq_offsets, int64_t cp_size, int64_t cp_rank,
                               bool interleaved, bool inverse) {
  static auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("rope::apply_", "varlen")
          .typed<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                      const OptTensor&, int64_t, int64_t, bool, bool)>();
  redispatch_writing(keys, op, x, x, cos, sin, cu_seqlens, seq_offsets, cp_size, cp_rank,
                     interleaved, inverse);
}

void apply_inplace_freqs_varlen_view(c10::DispatchKeySet keys, const at::Tensor& x,
                                     const at::Tensor& freqs, const at::Tensor& cu_seqlens,
                                     const OptTensor& seq_offsets, int64_t cp_size, int64_t cp_rank,
                                     double attention_factor, bool interleaved, bool inverse) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("rope::apply_", "freqs_varlen")
                       .typed<void(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                   const OptTensor&, int64_t, int64_t, double, bool, bool)>();
  redispatch_writing(keys, op, x, x, freqs, cu_seqlens, seq_offsets, cp_size, cp_rank,
                     attention_factor, interleaved, inverse);
}

void apply_out_freqs_view(c10::DispatchKeySet keys, const at::Tensor& x, const at::Tensor& freqs,
                          const at::Tensor& positions, double attention_factor, bool interleaved,
                          bool inverse, at::OptionalIntArrayRef mrope_section,
                          bool mrope_interleaved, const at::Tensor& out) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("rope::apply", "freqs_out")
                       .typed<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
                                   bool, bool, at::OptionalIntArrayRef, bool, const at::Tensor&)>();
  redispatch_writing(keys, op, out, x, freqs, positions, attention_factor, interleaved, inverse,
                     mrope_section, mrope_interleaved, out);
}

void apply_out_varlen_view(c10::DispatchKeySet keys, const at::Tensor& x, const at::Tensor& cos,
                           const at::Tensor& sin, const at::Tensor& cu_seqlens,
                           const OptTensor& seq_offsets, int64_t cp_size, int64_t cp_rank,
                           bool interleaved, bool inverse, const at::Tensor& out) {
  static auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("rope::apply", "varlen_out")
          .typed<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                      const OptTensor&, int64_t, int64_t, bool, bool, const at::Tensor&)>();
  redispatch_writing(keys, op, out, x, cos, sin, cu_seqlens, seq_offsets, cp_size, cp_rank,
                     interleaved, inverse, out);
}

void apply_out_freqs_varlen_view(c10::DispatchKeySet keys, const at::Tensor& x,
                                 const at::Tensor& freqs, const at::Tensor& cu_seqlens,
                                 const OptTensor& seq_offsets, int64_t cp_size, int64_t cp_rank,
                                 double attention_factor, bool interleaved, bool inverse,
                                 const at::Tensor& out) {
  static auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("rope::apply", "freqs_varlen_out")
          .typed<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, const OptTensor&,
                      int64_t, int64_t, double, bool, bool, const at::Tensor&)>();
  redispatch_writing(keys, op, out, x, freqs, cu_seqlens, seq_offsets, cp_size, cp_rank,
                     attention_factor, interleaved, inverse, out);
}

}  // namespace
}  // namespace rope::autograd

TORCH_LIBRARY_IMPL(rope, Autograd, m) {
  m.impl("apply", &rope::autograd::apply_autograd);
  m.impl("apply_", &rope::autograd::apply_inplace_autograd);
  m.impl("apply.out", &rope::autograd::apply_out_autograd);
  m.impl("apply_qk", &rope::autograd::apply_qk_autograd);
  rope::detail::register_forms<rope::autograd::AutogradForms>(m);
}

TORCH_LIBRARY_IMPL(rope, ADInplaceOrView, m) {
  m.impl("apply_", &rope::autograd::apply_inplace_view);
  m.impl("apply.out", &rope::autograd::apply_out_view);
  m.impl("apply_.freqs", &rope::autograd::apply_inplace_freqs_view);
  m.impl("apply_.varlen", &rope::autograd::apply_inplace_varlen_view);
  m.impl("apply_.freqs_varlen", &rope::autograd::apply_inplace_freqs_varlen_view);
  m.impl("apply.freqs_out", &rope::autograd::apply_out_freqs_view);
  m.impl("apply.varlen_out", &rope::autograd::apply_out_varlen_view);
  m.impl("apply.freqs_varlen_out", &rope::autograd::apply_out_freqs_varlen_view);
}
