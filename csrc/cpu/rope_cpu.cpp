// SPDX-License-Identifier: BSD-3-Clause
// CPU backend: registers rope.apply, rope.apply.out, rope.apply_ and rope.apply_qk for the CPU
// dispatch key. The op bodies (rope_body.h) check and prepare; the parallel drivers rotate.
#include <torch/library.h>

#include "../rope_body.h"
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
}
