// SPDX-License-Identifier: BSD-3-Clause
// The bodies of rope.apply, rope.apply_, rope.apply.out and rope.apply_qk, written once for every
// backend that computes (CPU, CUDA). A backend supplies a policy with:
//   static void check_positions(const char* op, const at::Tensor& positions, int64_t max_seq_len,
//                               const MultiAxisArgs& axes);
//   static void rotate(c10::ScalarType dtype, const RotationArgs&, const TableArgs&, RotationMode);
//   static void rotate_pair(c10::ScalarType dtype, const RotationArgs& q, const RotationArgs& k,
//                           const TableArgs&, RotationMode);
// Order matters and is the same everywhere: every check first (the same functions the Meta
// kernels in rope_meta.cpp call), then allocation, then the kernel, so a failed check never leaves
// a half-written tensor. `axes` carries mrope_section / mrope_interleaved (multi-axis positions).
#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>

#include "common_prepare.h"
#include "rope_validation.h"

namespace rope::detail {

template <typename Backend>
at::Tensor apply_body(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                      const at::Tensor& positions, bool interleaved, bool inverse,
                      const MultiAxisArgs& axes) {
  constexpr const char* op = "rope.apply";
  check_apply(op, x, cos, sin, positions, axes);
  if (x.numel() > 0) {
    Backend::check_positions(op, positions, cos.size(0), axes);
  }
  auto call = prepare_rotation(x, positions, 2 * cos.size(1), Destination::kNewTensor, {}, axes);
  if (x.numel() > 0) {
    const auto tables = prepare_tables(cos, sin, axes);
    Backend::rotate(x.scalar_type(), call.args, tables.args, {interleaved, inverse});
  }
  return call.output;
}

template <typename Backend>
void apply_inplace_body(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                        const at::Tensor& positions, bool interleaved, bool inverse,
                        const MultiAxisArgs& axes) {
  constexpr const char* op = "rope.apply_";
  check_apply_inplace(op, x, cos, sin, positions, axes);
  if (x.numel() == 0) {
    return;
  }
  Backend::check_positions(op, positions, cos.size(0), axes);
  auto call = prepare_rotation(x, positions, 2 * cos.size(1), Destination::kInPlace, {}, axes);
  const auto tables = prepare_tables(cos, sin, axes);
  Backend::rotate(x.scalar_type(), call.args, tables.args, {interleaved, inverse});
  call.write_back();
}

template <typename Backend>
void apply_out_body(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                    const at::Tensor& positions, bool interleaved, bool inverse,
                    const MultiAxisArgs& axes, const at::Tensor& out) {
  constexpr const char* op = "rope.apply.out";
  check_apply_out(op, x, cos, sin, positions, out, axes);
  if (x.numel() == 0) {
    return;
  }
  Backend::check_positions(op, positions, cos.size(0), axes);
  auto call = prepare_rotation(x, positions, 2 * cos.size(1), Destination::kOut, out, axes);
  const auto tables = prepare_tables(cos, sin, axes);
  Backend::rotate(x.scalar_type(), call.args, tables.args, {interleaved, inverse});
  call.write_back();
}

template <typename Backend>
std::tuple<at::Tensor, at::Tensor> apply_qk_body(const at::Tensor& q, const at::Tensor& k,
                                                 const at::Tensor& cos, const at::Tensor& sin,
                                                 const at::Tensor& positions, bool interleaved,
                                                 bool inverse, const MultiAxisArgs& axes) {
  constexpr const char* op = "rope.apply_qk";
  check_apply_qk(op, q, k, cos, sin, positions, axes);
  if (q.numel() > 0 || k.numel() > 0) {
    Backend::check_positions(op, positions, cos.size(0), axes);
  }
  const int64_t rotary_dim = 2 * cos.size(1);
  auto q_call = prepare_rotation(q, positions, rotary_dim, Destination::kNewTensor, {}, axes);
  auto k_call = prepare_rotation(k, positions, rotary_dim, Destination::kNewTensor, {}, axes);
  if (q.numel() > 0 || k.numel() > 0) {
    const auto tables = prepare_tables(cos, sin, axes);
    Backend::rotate_pair(q.scalar_type(), q_call.args, k_call.args, tables.args,
                         {interleaved, inverse});
  }
  return {q_call.output, k_call.output};
}

}  // namespace rope::detail
