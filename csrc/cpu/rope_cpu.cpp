// SPDX-License-Identifier: BSD-3-Clause
// CPU backend: registers rope.apply, rope.apply_ and rope.apply_qk for the CPU dispatch key.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>

#include "../op_bodies.h"
#include "kernel_choice.h"
#include "rotate_rows.h"

namespace rope::cpu {
namespace {

struct CpuBackend {
  static void check_positions(const char* op, const at::Tensor& positions, int64_t max_seq_len) {
    detail::check_positions_in_range(op, positions, max_seq_len);
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
                     const at::Tensor& positions, bool interleaved, bool inverse) {
  return detail::apply_body<CpuBackend>(x, cos, sin, positions, interleaved, inverse);
}

void apply_inplace_cpu(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                       const at::Tensor& positions, bool interleaved, bool inverse) {
  detail::apply_inplace_body<CpuBackend>(x, cos, sin, positions, interleaved, inverse);
}

void apply_out_cpu(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                   const at::Tensor& positions, bool interleaved, bool inverse,
                   const at::Tensor& out) {
  detail::apply_out_body<CpuBackend>(x, cos, sin, positions, interleaved, inverse, out);
}

std::tuple<at::Tensor, at::Tensor> apply_qk_cpu(const at::Tensor& q, const at::Tensor& k,
                                                const at::Tensor& cos, const at::Tensor& sin,
                                                const at::Tensor& positions, bool interleaved,
                                                bool inverse) {
  return detail::apply_qk_body<CpuBackend>(q, k, cos, sin, positions, interleaved, inverse);
}

}  // namespace

namespace {
// Rows per parallel task: at least 32768 features, the threshold (at::internal::GRAIN_SIZE) that
// torch's own elementwise kernels, clone among them, use. Below it the whole call runs on the
// calling thread: waking the OpenMP team costs microseconds, as much as rotating a decode step of
// a few heads (B=1..8, 32 heads of 128). Above it each task is big enough to amortise the wake-up.
constexpr int64_t kGrainFeatures = 32768;

int64_t grain_rows(int64_t head_dim) {
  return std::max<int64_t>(1, kGrainFeatures / std::max<int64_t>(head_dim, 1));
}

}  // namespace

void rotate(c10::ScalarType dtype, const RotationArgs& args, const TableArgs& tables,
            RotationMode mode) {
  const RotateRowsFn rotate_rows = row_kernel();
  at::parallel_for(
      0, args.geometry.num_rows, grain_rows(args.head_dim),
      [&](int64_t begin, int64_t end) { rotate_rows(dtype, args, tables, mode, begin, end); });
}

void rotate_pair(c10::ScalarType dtype, const RotationArgs& q, const RotationArgs& k,
                 const TableArgs& tables, RotationMode mode) {
  // One parallel region over q's rows followed by k's: for decode-sized inputs the thread
  // wake-up of a second region costs as much as the rotation itself.
  const RotateRowsFn rotate_rows = row_kernel();
  const int64_t q_rows = q.geometry.num_rows;
  const int64_t total = q_rows + k.geometry.num_rows;
  at::parallel_for(0, total, grain_rows(q.head_dim), [&](int64_t begin, int64_t end) {
    if (begin < q_rows) {
      rotate_rows(dtype, q, tables, mode, begin, std::min(end, q_rows));
    }
    if (end > q_rows) {
      rotate_rows(dtype, k, tables, mode, std::max(begin, q_rows) - q_rows, end - q_rows);
    }
  });
}

}  // namespace rope::cpu

TORCH_LIBRARY_IMPL(rope, CPU, m) {
  m.impl("apply", &rope::cpu::apply_cpu);
  m.impl("apply_", &rope::cpu::apply_inplace_cpu);
  m.impl("apply.out", &rope::cpu::apply_out_cpu);
  m.impl("apply_qk", &rope::cpu::apply_qk_cpu);
}
