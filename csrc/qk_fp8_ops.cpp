// SPDX-License-Identifier: BSD-3-Clause
// rope.apply_qk_fp8, rope.apply_qk_fp8_dynamic and their out= overloads outside the computing
// backends: the C++ API (through the dispatcher), the Meta kernels (the same checks as CPU and
// CUDA, on SymInts; the values of positions and scales are left to the real kernels), the Autograd
// kernels (not differentiable: the outputs are float8) and the ADInplaceOrView kernels of the out=
// overloads (the buffers' version counters where autograd is excluded). The schemas are in
// rope_ops.cpp; CPU and CUDA register in cpu/qk_fp8_cpu.cpp and cuda/qk_fp8_cuda.cu.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/VariableTypeUtils.h>
#include <torch/library.h>
#include <torch_rope/ops.h>

#include "common_optional.h"
#include "qk_fp8_body.h"

namespace rope {
namespace {

using Optional = const std::optional<at::Tensor>&;
using Quad = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using FunctionalSig = Quad(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                           const at::Tensor&, const at::Tensor&, Optional, Optional, Optional,
                           Optional, std::optional<at::ScalarType>, bool, bool,
                           at::OptionalIntArrayRef, bool, bool);
using OutSig = void(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                    const at::Tensor&, Optional, Optional, Optional, Optional, bool, bool,
                    at::OptionalIntArrayRef, bool, bool, const at::Tensor&, const at::Tensor&,
                    Optional, Optional);

const c10::TypedOperatorHandle<FunctionalSig>& functional_op() {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("rope::apply_qk_fp8", "")
                       .typed<FunctionalSig>();
  return op;
}

using DynamicSig = Quad(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                        const at::Tensor&, std::optional<at::ScalarType>, bool, bool, bool,
                        at::OptionalIntArrayRef, bool, bool);

const c10::TypedOperatorHandle<DynamicSig>& dynamic_op() {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("rope::apply_qk_fp8_dynamic", "")
                       .typed<DynamicSig>();
  return op;
}

using DynamicOutSig = void(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                           const at::Tensor&, const at::Tensor&, bool, bool, bool,
                           at::OptionalIntArrayRef, bool, bool, const at::Tensor&,
                           const at::Tensor&, const at::Tensor&, const at::Tensor&);

const c10::TypedOperatorHandle<DynamicOutSig>& dynamic_out_op() {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("rope::apply_qk_fp8_dynamic", "out")
                       .typed<DynamicOutSig>();
  return op;
}

const c10::TypedOperatorHandle<OutSig>& out_op() {
  static auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("rope::apply_qk_fp8", "out").typed<OutSig>();
  return op;
}

at::Tensor defined_or_empty(const std::optional<at::Tensor>& t) {
  return t.has_value() ? *t : at::Tensor();
}

// Quantizing to float8 is not differentiable: refuse, as aten's out= ops do, rather than return
// outputs whose gradient would silently be lost.
void refuse_grad(const char* op, const at::Tensor& q, const at::Tensor& k, Optional q_nope,
                 Optional k_nope, const at::Tensor& cos, const at::Tensor& sin) {
  const bool wants_grad = at::GradMode::is_enabled() &&
                          (q.requires_grad() || k.requires_grad() || requires_grad(q_nope) ||
                           requires_grad(k_nope) || cos.requires_grad() || sin.requires_grad());
  TORCH_CHECK(!wants_grad, op,
              ": quantizing to float8 doesn't support automatic differentiation, but one of the "
              "arguments requires grad; call torch_rope.apply_qk for gradients, or run under "
              "torch.no_grad() / torch.inference_mode()");
  TORCH_CHECK(!q._fw_grad(0).defined() && !k._fw_grad(0).defined() && !has_forward_grad(q_nope) &&
                  !has_forward_grad(k_nope),
              op, ": quantizing to float8 doesn't support forward-mode automatic differentiation");
}

// ---- Meta
// ----------------------------------------------------------------------------------------

Quad apply_qk_fp8_meta(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                       const at::Tensor& sin, const at::Tensor& positions, Optional q_nope,
                       Optional k_nope, Optional q_scale, Optional k_scale,
                       std::optional<at::ScalarType> dtype, bool /*interleaved*/,
                       bool /*multiply_by_scale*/, at::OptionalIntArrayRef mrope_section,
                       bool mrope_interleaved, bool /*inverse*/) {
  constexpr const char* op = "rope.apply_qk_fp8";
  const detail::QkFp8Inputs in{
      q,      k,      cos,     sin,     positions,
      q_nope, k_nope, q_scale, k_scale, {mrope_section, mrope_interleaved}};
  detail::check_apply_qk_fp8(op, in);
  const detail::QkFp8Outputs out = detail::new_qk_fp8_outputs(in, detail::qk_fp8_dtype(op, dtype));
  return {out.q_out, out.k_out, out.q_nope_out, out.k_nope_out};
}

void apply_qk_fp8_out_meta(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                           const at::Tensor& sin, const at::Tensor& positions, Optional q_nope,
                           Optional k_nope, Optional q_scale, Optional k_scale,
                           bool /*interleaved*/, bool /*multiply_by_scale*/,
                           at::OptionalIntArrayRef mrope_section, bool mrope_interleaved,
                           bool /*inverse*/, const at::Tensor& q_out, const at::Tensor& k_out,
                           Optional q_nope_out, Optional k_nope_out) {
  constexpr const char* op = "rope.apply_qk_fp8.out";
  const detail::QkFp8Inputs in{
      q,      k,      cos,     sin,     positions,
      q_nope, k_nope, q_scale, k_scale, {mrope_section, mrope_interleaved}};
  detail::check_apply_qk_fp8(op, in);
  detail::check_apply_qk_fp8_outputs(
      op, in, {q_out, k_out, defined_or_empty(q_nope_out), defined_or_empty(k_nope_out)});
}

const std::optional<at::Tensor> kNone;

Quad apply_qk_fp8_dynamic_meta(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                               const at::Tensor& sin, const at::Tensor& positions,
                               std::optional<at::ScalarType> dtype, bool /*interleaved*/,
                               bool per_token, bool /*pow2_scale*/,
                               at::OptionalIntArrayRef mrope_section, bool mrope_interleaved,
                               bool /*inverse*/) {
  constexpr const char* op = "rope.apply_qk_fp8_dynamic";
  const detail::QkFp8Inputs in{q,     k,     cos,   sin,   positions,
                               kNone, kNone, kNone, kNone, {mrope_section, mrope_interleaved}};
  detail::check_apply_qk_fp8(op, in);
  const detail::QkFp8Outputs out = detail::new_qk_fp8_outputs(in, detail::qk_fp8_dtype(op, dtype));
  const detail::QkFp8Scales scales = detail::new_qk_fp8_scales(in, per_token);
  return {out.q_out, out.k_out, scales.q_scale, scales.k_scale};
}

void apply_qk_fp8_dynamic_out_meta(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                   const at::Tensor& sin, const at::Tensor& positions,
                                   bool /*interleaved*/, bool per_token, bool /*pow2_scale*/,
                                   at::OptionalIntArrayRef mrope_section, bool mrope_interleaved,
                                   bool /*inverse*/, const at::Tensor& q_out,
                                   const at::Tensor& k_out, const at::Tensor& q_scale_out,
                                   const at::Tensor& k_scale_out) {
  constexpr const char* op = "rope.apply_qk_fp8_dynamic.out";
  const detail::QkFp8Inputs in{q,     k,     cos,   sin,   positions,
                               kNone, kNone, kNone, kNone, {mrope_section, mrope_interleaved}};
  detail::check_apply_qk_fp8(op, in);
  const detail::QkFp8Outputs out{q_out, k_out, at::Tensor(), at::Tensor()};
  detail::check_apply_qk_fp8_outputs(op, in, out);
  detail::check_qk_fp8_scale_outputs(op, in, out, {q_scale_out, k_scale_out}, per_token);
}

// ---- Autograd
// ------------------------------------------------------------------------------------

void bump_all(std::initializer_list<const at::Tensor*> written) {
  for (const at::Tensor* t : written) {
    torch::autograd::increment_version(*t);
  }
}

void apply_qk_fp8_dynamic_out_autograd(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
    const at::Tensor& positions, bool interleaved, bool per_token, bool pow2_scale,
    at::OptionalIntArrayRef mrope_section, bool mrope_interleaved, bool inverse,
    const at::Tensor& q_out, const at::Tensor& k_out, const at::Tensor& q_scale_out,
    const at::Tensor& k_scale_out) {
  refuse_grad("rope.apply_qk_fp8_dynamic.out", q, k, kNone, kNone, cos, sin);
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    dynamic_out_op().call(q, k, cos, sin, positions, interleaved, per_token, pow2_scale,
                          mrope_section, mrope_interleaved, inverse, q_out, k_out, q_scale_out,
                          k_scale_out);
  }
  bump_all({&q_out, &k_out, &q_scale_out, &k_scale_out});
}

void apply_qk_fp8_dynamic_out_view(c10::DispatchKeySet keys, const at::Tensor& q,
                                   const at::Tensor& k, const at::Tensor& cos,
                                   const at::Tensor& sin, const at::Tensor& positions,
                                   bool interleaved, bool per_token, bool pow2_scale,
                                   at::OptionalIntArrayRef mrope_section, bool mrope_interleaved,
                                   bool inverse, const at::Tensor& q_out, const at::Tensor& k_out,
                                   const at::Tensor& q_scale_out, const at::Tensor& k_scale_out) {
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    dynamic_out_op().redispatch(keys & c10::after_ADInplaceOrView_keyset, q, k, cos, sin, positions,
                                interleaved, per_token, pow2_scale, mrope_section,
                                mrope_interleaved, inverse, q_out, k_out, q_scale_out, k_scale_out);
  }
  bump_all({&q_out, &k_out, &q_scale_out, &k_scale_out});
}

Quad apply_qk_fp8_dynamic_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                   const at::Tensor& sin, const at::Tensor& positions,
                                   std::optional<at::ScalarType> dtype, bool interleaved,
                                   bool per_token, bool pow2_scale,
                                   at::OptionalIntArrayRef mrope_section, bool mrope_interleaved,
                                   bool inverse) {
  refuse_grad("rope.apply_qk_fp8_dynamic", q, k, kNone, kNone, cos, sin);
  at::AutoDispatchBelowADInplaceOrView guard;
  return dynamic_op().call(q, k, cos, sin, positions, dtype, interleaved, per_token, pow2_scale,
                           mrope_section, mrope_interleaved, inverse);
}

Quad apply_qk_fp8_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                           const at::Tensor& sin, const at::Tensor& positions, Optional q_nope,
                           Optional k_nope, Optional q_scale, Optional k_scale,
                           std::optional<at::ScalarType> dtype, bool interleaved,
                           bool multiply_by_scale, at::OptionalIntArrayRef mrope_section,
                           bool mrope_interleaved, bool inverse) {
  refuse_grad("rope.apply_qk_fp8", q, k, q_nope, k_nope, cos, sin);
  at::AutoDispatchBelowADInplaceOrView guard;
  return functional_op().call(q, k, cos, sin, positions, q_nope, k_nope, q_scale, k_scale, dtype,
                              interleaved, multiply_by_scale, mrope_section, mrope_interleaved,
                              inverse);
}

void bump_versions(const at::Tensor& q_out, const at::Tensor& k_out, Optional q_nope_out,
                   Optional k_nope_out) {
  torch::autograd::increment_version(q_out);
  torch::autograd::increment_version(k_out);
  for (const auto* t : {&q_nope_out, &k_nope_out}) {
    if (t->has_value() && (*t)->defined()) {
      torch::autograd::increment_version(**t);
    }
  }
}

void apply_qk_fp8_out_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                               const at::Tensor& sin, const at::Tensor& positions, Optional q_nope,
                               Optional k_nope, Optional q_scale, Optional k_scale,
                               bool interleaved, bool multiply_by_scale,
                               at::OptionalIntArrayRef mrope_section, bool mrope_interleaved,
                               bool inverse, const at::Tensor& q_out, const at::Tensor& k_out,
                               Optional q_nope_out, Optional k_nope_out) {
  refuse_grad("rope.apply_qk_fp8.out", q, k, q_nope, k_nope, cos, sin);
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    out_op().call(q, k, cos, sin, positions, q_nope, k_nope, q_scale, k_scale, interleaved,
                  multiply_by_scale, mrope_section, mrope_interleaved, inverse, q_out, k_out,
                  q_nope_out, k_nope_out);
  }
  // The ADInplaceOrView key, skipped above, would bump the versions of the written buffers.
  bump_versions(q_out, k_out, q_nope_out, k_nope_out);
}

// Where autograd is excluded (torch.inference_mode() writing buffers allocated outside it), the
// buffers' versions must still grow, as a native out= op's do.
void apply_qk_fp8_out_view(c10::DispatchKeySet keys, const at::Tensor& q, const at::Tensor& k,
                           const at::Tensor& cos, const at::Tensor& sin,
                           const at::Tensor& positions, Optional q_nope, Optional k_nope,
                           Optional q_scale, Optional k_scale, bool interleaved,
                           bool multiply_by_scale, at::OptionalIntArrayRef mrope_section,
                           bool mrope_interleaved, bool inverse, const at::Tensor& q_out,
                           const at::Tensor& k_out, Optional q_nope_out, Optional k_nope_out) {
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    out_op().redispatch(keys & c10::after_ADInplaceOrView_keyset, q, k, cos, sin, positions, q_nope,
                        k_nope, q_scale, k_scale, interleaved, multiply_by_scale, mrope_section,
                        mrope_interleaved, inverse, q_out, k_out, q_nope_out, k_nope_out);
  }
  bump_versions(q_out, k_out, q_nope_out, k_nope_out);
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> apply_qk_fp8(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
    const at::Tensor& positions, const std::optional<at::Tensor>& q_nope,
    const std::optional<at::Tensor>& k_nope, const std::optional<at::Tensor>& q_scale,
    const std::optional<at::Tensor>& k_scale, std::optional<at::ScalarType> dtype, bool interleaved,
    bool multiply_by_scale, at::OptionalIntArrayRef mrope_section, bool mrope_interleaved,
    bool inverse) {
  return functional_op().call(q, k, cos, sin, positions, q_nope, k_nope, q_scale, k_scale, dtype,
                              interleaved, multiply_by_scale, mrope_section, mrope_interleaved,
                              inverse);
}

void apply_qk_fp8_out(at::Tensor& q_out, at::Tensor& k_out,
                      const std::optional<at::Tensor>& q_nope_out,
                      const std::optional<at::Tensor>& k_nope_out, const at::Tensor& q,
                      const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
                      const at::Tensor& positions, const std::optional<at::Tensor>& q_nope,
                      const std::optional<at::Tensor>& k_nope,
                      const std::optional<at::Tensor>& q_scale,
                      const std::optional<at::Tensor>& k_scale, bool interleaved,
                      bool multiply_by_scale, at::OptionalIntArrayRef mrope_section,
                      bool mrope_interleaved, bool inverse) {
  out_op().call(q, k, cos, sin, positions, q_nope, k_nope, q_scale, k_scale, interleaved,
                multiply_by_scale, mrope_section, mrope_interleaved, inverse, q_out, k_out,
                q_nope_out, k_nope_out);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> apply_qk_fp8_dynamic(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
    const at::Tensor& positions, std::optional<at::ScalarType> dtype, bool interleaved,
    bool per_token, bool pow2_scale, at::OptionalIntArrayRef mrope_section, bool mrope_interleaved,
    bool inverse) {
  return dynamic_op().call(q, k, cos, sin, positions, dtype, interleaved, per_token, pow2_scale,
                           mrope_section, mrope_interleaved, inverse);
}

void apply_qk_fp8_dynamic_out(at::Tensor& q_out, at::Tensor& k_out, at::Tensor& q_scale_out,
                              at::Tensor& k_scale_out, const at::Tensor& q, const at::Tensor& k,
                              const at::Tensor& cos, const at::Tensor& sin,
                              const at::Tensor& positions, bool interleaved, bool per_token,
                              bool pow2_scale, at::OptionalIntArrayRef mrope_section,
                              bool mrope_interleaved, bool inverse) {
  dynamic_out_op().call(q, k, cos, sin, positions, interleaved, per_token, pow2_scale,
                        mrope_section, mrope_interleaved, inverse, q_out, k_out, q_scale_out,
                        k_scale_out);
}

}  // namespace rope

TORCH_LIBRARY_IMPL(rope, Meta, m) {
  m.impl("apply_qk_fp8_dynamic.out", &rope::apply_qk_fp8_dynamic_out_meta);
  m.impl("apply_qk_fp8_dynamic", &rope::apply_qk_fp8_dynamic_meta);
  m.impl("apply_qk_fp8", &rope::apply_qk_fp8_meta);
  m.impl("apply_qk_fp8.out", &rope::apply_qk_fp8_out_meta);
}

TORCH_LIBRARY_IMPL(rope, Autograd, m) {
  m.impl("apply_qk_fp8_dynamic.out", &rope::apply_qk_fp8_dynamic_out_autograd);
  m.impl("apply_qk_fp8_dynamic", &rope::apply_qk_fp8_dynamic_autograd);
  m.impl("apply_qk_fp8", &rope::apply_qk_fp8_autograd);
  m.impl("apply_qk_fp8.out", &rope::apply_qk_fp8_out_autograd);
}

TORCH_LIBRARY_IMPL(rope, ADInplaceOrView, m) {
  m.impl("apply_qk_fp8.out", &rope::apply_qk_fp8_out_view);
  m.impl("apply_qk_fp8_dynamic.out", &rope::apply_qk_fp8_dynamic_out_view);
}
