// The bodies of rope.apply, rope.apply_ and rope.apply_qk, written once for every real backend.
// A backend supplies a policy with:
//   static void check_positions(const char* op, const at::Tensor& positions, int64_t max_seq_len);
//   static void rotate(c10::ScalarType dtype, const RotationArgs&, const TableArgs&, RotationMode);
//   static void rotate_pair(c10::ScalarType dtype, const RotationArgs& q, const RotationArgs& k,
//                           const TableArgs&, RotationMode);
// Order matters and is the same everywhere: every check first, then allocation, then the kernel,
// so a failed check never leaves a half-written tensor.
#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>

#include "prepare.h"
#include "validation.h"

namespace rope::detail {

template <typename Backend>
at::Tensor apply_body(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                      const at::Tensor& positions, bool interleaved, bool inverse) {
  constexpr const char* op = "rope.apply";
  check_tables(op, cos, sin);
  check_rotated_input(op, "x", x, cos, positions);
  if (x.numel() > 0) {
    Backend::check_positions(op, positions, cos.size(0));
  }
  auto call = prepare_rotation(x, positions, 2 * cos.size(1), Destination::kNewTensor);
  if (x.numel() > 0) {
    const auto tables = prepare_tables(cos, sin);
    Backend::rotate(x.scalar_type(), call.args, tables.args, {interleaved, inverse});
  }
  return call.output;
}

template <typename Backend>
void apply_inplace_body(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                        const at::Tensor& positions, bool interleaved, bool inverse) {
  constexpr const char* op = "rope.apply_";
  check_tables(op, cos, sin);
  check_rotated_input(op, "x", x, cos, positions);
  check_writable(op, "x", x);
  if (x.numel() == 0) {
    return;
  }
  Backend::check_positions(op, positions, cos.size(0));
  auto call = prepare_rotation(x, positions, 2 * cos.size(1), Destination::kInPlace);
  const auto tables = prepare_tables(cos, sin);
  Backend::rotate(x.scalar_type(), call.args, tables.args, {interleaved, inverse});
  call.finish();
}

template <typename Backend>
std::tuple<at::Tensor, at::Tensor> apply_qk_body(const at::Tensor& q, const at::Tensor& k,
                                                 const at::Tensor& cos, const at::Tensor& sin,
                                                 const at::Tensor& positions, bool interleaved,
                                                 bool inverse) {
  constexpr const char* op = "rope.apply_qk";
  check_tables(op, cos, sin);
  check_rotated_input(op, "q", q, cos, positions);
  check_rotated_input(op, "k", k, cos, positions);
  TORCH_CHECK(q.scalar_type() == k.scalar_type(), op,
              ": q and k must have the same dtype, got q ", q.scalar_type(), " and k ",
              k.scalar_type());
  TORCH_CHECK(q.size(-1) == k.size(-1), op,
              ": q and k must have the same head_dim (size(-1)), got q ", q.size(-1), " and k ",
              k.size(-1));
  if (q.numel() > 0 || k.numel() > 0) {
    Backend::check_positions(op, positions, cos.size(0));
  }
  const int64_t rotary_dim = 2 * cos.size(1);
  auto q_call = prepare_rotation(q, positions, rotary_dim, Destination::kNewTensor);
  auto k_call = prepare_rotation(k, positions, rotary_dim, Destination::kNewTensor);
  if (q.numel() > 0 || k.numel() > 0) {
    const auto tables = prepare_tables(cos, sin);
    Backend::rotate_pair(q.scalar_type(), q_call.args, k_call.args, tables.args,
                         {interleaved, inverse});
  }
  return {q_call.output, k_call.output};
}

}  // namespace rope::detail
