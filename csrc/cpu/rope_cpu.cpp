// SPDX-License-Identifier: BSD-3-Clause
// CPU backend: registers rope.apply, rope.apply.out, rope.apply_ and rope.apply_qk for the CPU
// dispatch key. The op bodies (rope_body.h) check and prepare; the parallel drivers rotate.
#include <torch/library.h>

#include "../rope_body.h"
#include "../rope_forms.h"
#include "rope_frequencies.h"
#include "rope_parallel.h"

namespace rope::cpu {
namespace {

struct CpuBackend {
  static void check_positions(const char* op, const at::Tensor& positions, int64_t max_seq_len,
                              const detail::MultiAxisArgs& axes) {
    detail::check_positions_in_range(op, positions, max_seq_len, axes);
  }
  static void rotate(c10::ScalarType dtype, const RotationArgs& args, const TableArgs& tables,
                     RotationMode mode) {
    cpu::rotate(dtype, args, tables, mode);
  }
  static void rotate_pair(c10::ScalarType dtype, const RotationArgs& q, const RotationArgs& k,
                          const TableArgs& tables, RotationMode mode) {
    cpu::rotate_pair(dtype, q, k, tables, mode);
  }

  // The new forms (rope_body.h): every value is read here, before anything is written.
  static void check_form_values(const char* op, const detail::AngleSource& angles,
                                const detail::PositionSource& where, int64_t num_tokens,
                                const detail::MultiAxisArgs& axes) {
    detail::check_form_values_on_host(op, angles, where, num_tokens, axes);
  }
  static detail::PackedArgs packed_for_kernel(const detail::PackedArgs& packed,
                                              const at::Tensor& /*x*/) {
    return packed;
  }
  // The distinct positions, contiguous: a dim along which positions broadcast (stride 0) is kept
  // once, so each distinct position's angles are computed once (rope_frequencies.h).
  static at::Tensor frequency_positions(const at::Tensor& positions,
                                        const detail::MultiAxisArgs& axes) {
    at::Tensor p = positions;
    const int64_t row_dims = positions.dim() - (axes.active() ? 1 : 0);
    for (int64_t d = 0; d < row_dims; ++d) {
      if (p.size(d) > 1 && p.stride(d) == 0) {
        p = p.narrow(d, 0, 1);
      }
    }
    return p.contiguous();
  }
  static void rotate_frequencies(c10::ScalarType dtype, const detail::PreparedRotation& first,
                                 const detail::PreparedRotation* second, const TableArgs& freqs,
                                 RotationMode mode) {
    cpu::rotate_frequencies(dtype, first.args, *first.positions,
                            second != nullptr ? &second->args : nullptr,
                            second != nullptr ? &*second->positions : nullptr, freqs, mode);
  }
};

// The twelve overloads of the new forms (rope_forms.h) on the CPU backend.
struct CpuForms {
  static at::Tensor apply(const char* op, const at::Tensor& x, const detail::AngleSource& angles,
                          const detail::PositionSource& where, bool interleaved, bool inverse,
                          const detail::MultiAxisArgs& axes) {
    return detail::apply_form_body<CpuBackend>(op, x, angles, where, interleaved, inverse, axes);
  }
  static void apply_inplace(const char* op, const at::Tensor& x, const detail::AngleSource& angles,
                            const detail::PositionSource& where, bool interleaved, bool inverse,
                            const detail::MultiAxisArgs& axes) {
    detail::apply_inplace_form_body<CpuBackend>(op, x, angles, where, interleaved, inverse, axes);
  }
  static void apply_out(const char* op, const at::Tensor& x, const detail::AngleSource& angles,
                        const detail::PositionSource& where, bool interleaved, bool inverse,
                        const detail::MultiAxisArgs& axes, const at::Tensor& out) {
    detail::apply_out_form_body<CpuBackend>(op, x, angles, where, interleaved, inverse, out, axes);
  }
  static std::tuple<at::Tensor, at::Tensor> apply_qk(const char* op, const at::Tensor& q,
                                                     const at::Tensor& k,
                                                     const detail::AngleSource& angles,
                                                     const detail::PositionSource& where,
                                                     bool interleaved, bool inverse,
                                                     const detail::MultiAxisArgs& axes) {
    return detail::apply_qk_form_body<CpuBackend>(op, q, k, angles, where, interleaved, inverse,
                                                  axes);
  }
};

at::Tensor apply_cpu(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     const at::Tensor& positions, bool interleaved, bool inverse,
                     at::OptionalIntArrayRef mrope_section, bool mrope_interleaved) {
  return detail::apply_body<CpuBackend>(x, cos, sin, positions, interleaved, inverse,
                                        {mrope_section, mrope_interleaved});
}

void apply_inplace_cpu(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                       const at::Tensor& positions, bool interleaved, bool inverse,
                       at::OptionalIntArrayRef mrope_section, bool mrope_interleaved) {
  detail::apply_inplace_body<CpuBackend>(x, cos, sin, positions, interleaved, inverse,
                                         {mrope_section, mrope_interleaved});
}

void apply_out_cpu(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                   const at::Tensor& positions, bool interleaved, bool inverse,
                   at::OptionalIntArrayRef mrope_section, bool mrope_interleaved,
                   const at::Tensor& out) {
  detail::apply_out_body<CpuBackend>(x, cos, sin, positions, interleaved, inverse,
                                     {mrope_section, mrope_interleaved}, out);
}

std::tuple<at::Tensor, at::Tensor> apply_qk_cpu(const at::Tensor& q, const at::Tensor& k,
                                                const at::Tensor& cos, const at::Tensor& sin,
                                                const at::Tensor& positions, bool interleaved,
                                                bool inverse, at::OptionalIntArrayRef mrope_section,
                                                bool mrope_interleaved) {
  return detail::apply_qk_body<CpuBackend>(q, k, cos, sin, positions, interleaved, inverse,
                                           {mrope_section, mrope_interleaved});
}

}  // namespace

}  // namespace rope::cpu

TORCH_LIBRARY_IMPL(rope, CPU, m) {
  m.impl("apply", &rope::cpu::apply_cpu);
  m.impl("apply_", &rope::cpu::apply_inplace_cpu);
  m.impl("apply.out", &rope::cpu::apply_out_cpu);
  m.impl("apply_qk", &rope::cpu::apply_qk_cpu);
  rope::detail::register_forms<rope::cpu::CpuForms>(m);
}
