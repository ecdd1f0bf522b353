// SPDX-License-Identifier: BSD-3-Clause
// Meta kernels: shapes without data, for meta tensors, FakeTensor (torch.compile, export) and
// symbolic shapes. They run exactly the checks of the computing backends (rope_validation.h), so a
// call that CPU or CUDA rejects is rejected here too, at trace time; only the position range,
// which needs the data, is left to the real kernels.
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <tuple>

#include "rope_forms.h"
#include "rope_validation.h"

namespace rope::meta {
namespace {

// The computing backends return a fresh contiguous tensor of x's shape and dtype.
at::Tensor empty_like_contiguous(const at::Tensor& x) {
  return at::empty_symint(x.sym_sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
}

at::Tensor apply_meta(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                      const at::Tensor& positions, bool /*interleaved*/, bool /*inverse*/,
                      at::OptionalIntArrayRef mrope_section, bool mrope_interleaved) {
  detail::check_apply("rope.apply", x, cos, sin, positions, {mrope_section, mrope_interleaved});
  return empty_like_contiguous(x);
}

void apply_inplace_meta(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                        const at::Tensor& positions, bool /*interleaved*/, bool /*inverse*/,
                        at::OptionalIntArrayRef mrope_section, bool mrope_interleaved) {
  detail::check_apply_inplace("rope.apply_", x, cos, sin, positions,
                              {mrope_section, mrope_interleaved});
}

void apply_out_meta(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                    const at::Tensor& positions, bool /*interleaved*/, bool /*inverse*/,
                    at::OptionalIntArrayRef mrope_section, bool mrope_interleaved,
                    const at::Tensor& out) {
  detail::check_apply_out("rope.apply.out", x, cos, sin, positions, out,
                          {mrope_section, mrope_interleaved});
}

std::tuple<at::Tensor, at::Tensor> apply_qk_meta(const at::Tensor& q, const at::Tensor& k,
                                                 const at::Tensor& cos, const at::Tensor& sin,
                                                 const at::Tensor& positions, bool /*interleaved*/,
                                                 bool /*inverse*/,
                                                 at::OptionalIntArrayRef mrope_section,
                                                 bool mrope_interleaved) {
  detail::check_apply_qk("rope.apply_qk", q, k, cos, sin, positions,
                         {mrope_section, mrope_interleaved});
  return {empty_like_contiguous(q), empty_like_contiguous(k)};
}

// The twelve overloads of the new forms (rope_forms.h): the same checks as the computing
// backends, then empty results of the same shapes.
struct MetaForms {
  static at::Tensor apply(const char* op, const at::Tensor& x, const detail::AngleSource& angles,
                          const detail::PositionSource& where, bool /*interleaved*/,
                          bool /*inverse*/, const detail::MultiAxisArgs& axes) {
    detail::check_apply_form(op, x, angles, where, axes);
    return empty_like_contiguous(x);
  }
  static void apply_inplace(const char* op, const at::Tensor& x, const detail::AngleSource& angles,
                            const detail::PositionSource& where, bool /*interleaved*/,
                            bool /*inverse*/, const detail::MultiAxisArgs& axes) {
    detail::check_apply_inplace_form(op, x, angles, where, axes);
  }
  static void apply_out(const char* op, const at::Tensor& x, const detail::AngleSource& angles,
                        const detail::PositionSource& where, bool /*interleaved*/, bool /*inverse*/,
                        const detail::MultiAxisArgs& axes, const at::Tensor& out) {
    detail::check_apply_out_form(op, x, angles, where, out, axes);
  }
  static std::tuple<at::Tensor, at::Tensor> apply_qk(const char* op, const at::Tensor& q,
                                                     const at::Tensor& k,
                                                     const detail::AngleSource& angles,
                                                     const detail::PositionSource& where,
                                                     bool /*interleaved*/, bool /*inverse*/,
                                                     const detail::MultiAxisArgs& axes) {
    detail::check_apply_qk_form(op, q, k, angles, where, axes);
    return {empty_like_contiguous(q), empty_like_contiguous(k)};
  }
};

}  // namespace
}  // namespace rope::meta

TORCH_LIBRARY_IMPL(rope, Meta, m) {
  m.impl("apply", &rope::meta::apply_meta);
  m.impl("apply_", &rope::meta::apply_inplace_meta);
  m.impl("apply.out", &rope::meta::apply_out_meta);
  m.impl("apply_qk", &rope::meta::apply_qk_meta);
  rope::detail::register_forms<rope::meta::MetaForms>(m);
}
