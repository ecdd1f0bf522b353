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

// ---- the frequency and packed-sequence forms (docs/architecture.md, "Angle sources and position
// sources") -------------------------------------------------------------------------------------
// The bodies of every overload but the tables-and-positions one. The backend policy adds:
//   static void check_form_values(const char* op, const AngleSource&, const PositionSource&,
//                                 int64_t num_tokens, const MultiAxisArgs&);
//       the checks that read data (positions >= 0, finite freqs, packed sequences), where the
//       backend reads them (CPU: all; CUDA: packed sequences given as CPU tensors);
//   static PackedArgs packed_for_kernel(const PackedArgs&, const at::Tensor& x);
//       the packed sequences on the kernel's device (CUDA copies CPU ones to x's device);
//   static at::Tensor frequency_positions(const at::Tensor& positions, const MultiAxisArgs&);
//       the positions tensor the frequency form's kernel reads (CPU: compact and contiguous);
//   static void rotate_frequencies(c10::ScalarType, const PreparedRotation& first,
//                                  const PreparedRotation* second, const TableArgs& freqs,
//                                  RotationMode);
// Same order as above: every check, then allocation, then the kernel.

// The prepared rotation of one tensor in any form. `positions` is the tensor the kernel reads
// for the positions form (the backend's frequency_positions for the frequency form), kept alive
// by the caller.
template <typename Backend>
PreparedRotation prepare_form(const at::Tensor& x, const AngleSource& angles,
                              const PositionSource& where, const PackedArgs& kernel_packed,
                              const at::Tensor& positions, Destination destination,
                              const at::Tensor& out, const MultiAxisArgs& axes) {
  const int64_t rotary_dim = rotary_dim_of(angles);
  if (where.is_packed()) {
    return prepare_packed_rotation(x, kernel_packed, rotary_dim, destination, out);
  }
  return prepare_rotation(x, positions, rotary_dim, destination, out, axes);
}

// What the kernel reads of the position source: positions (the backend's compact copy for the
// frequency form) or the packed sequences on the kernel's device.
template <typename Backend>
struct KernelPositions {
  at::Tensor positions;
  PackedArgs packed;

  KernelPositions(const at::Tensor& x, const AngleSource& angles, const PositionSource& where,
                  const MultiAxisArgs& axes) {
    if (where.is_packed()) {
      packed = Backend::packed_for_kernel(*where.packed, x);
    } else if (angles.frequencies()) {
      positions = Backend::frequency_positions(*where.positions, axes);
    } else {
      positions = *where.positions;
    }
  }
};

// The kernel launch of a prepared call (and its second tensor, apply_qk's k) in any form.
template <typename Backend>
void rotate_form(c10::ScalarType dtype, const PreparedRotation& first,
                 const PreparedRotation* second, const AngleSource& angles,
                 const MultiAxisArgs& axes, RotationMode mode) {
  if (angles.frequencies()) {
    const auto freqs = prepare_frequencies(*angles.freqs, angles.attention_factor, axes);
    Backend::rotate_frequencies(dtype, first, second, freqs.args, mode);
    return;
  }
  const auto tables = prepare_tables(*angles.cos, *angles.sin, axes);
  if (second == nullptr) {
    Backend::rotate(dtype, first.args, tables.args, mode);
  } else {
    Backend::rotate_pair(dtype, first.args, second->args, tables.args, mode);
  }
}

template <typename Backend>
at::Tensor apply_form_body(const char* op, const at::Tensor& x, const AngleSource& angles,
                           const PositionSource& where, bool interleaved, bool inverse,
                           const MultiAxisArgs& axes = {}) {
  check_apply_form(op, x, angles, where, axes);
  if (x.numel() > 0 || where.is_packed()) {
    Backend::check_form_values(op, angles, where, where.is_packed() ? x.size(0) : 0, axes);
  }
  const KernelPositions<Backend> kernel(x, angles, where, axes);
  auto call = prepare_form<Backend>(x, angles, where, kernel.packed, kernel.positions,
                                    Destination::kNewTensor, {}, axes);
  if (x.numel() > 0) {
    rotate_form<Backend>(x.scalar_type(), call, nullptr, angles, axes, {interleaved, inverse});
  }
  return call.output;
}

template <typename Backend>
void apply_inplace_form_body(const char* op, const at::Tensor& x, const AngleSource& angles,
                             const PositionSource& where, bool interleaved, bool inverse,
                             const MultiAxisArgs& axes = {}) {
  check_apply_inplace_form(op, x, angles, where, axes);
  if (x.numel() > 0 || where.is_packed()) {
    Backend::check_form_values(op, angles, where, where.is_packed() ? x.size(0) : 0, axes);
  }
  if (x.numel() == 0) {
    return;
  }
  const KernelPositions<Backend> kernel(x, angles, where, axes);
  auto call = prepare_form<Backend>(x, angles, where, kernel.packed, kernel.positions,
                                    Destination::kInPlace, {}, axes);
  rotate_form<Backend>(x.scalar_type(), call, nullptr, angles, axes, {interleaved, inverse});
  call.write_back();
}

template <typename Backend>
void apply_out_form_body(const char* op, const at::Tensor& x, const AngleSource& angles,
                         const PositionSource& where, bool interleaved, bool inverse,
                         const at::Tensor& out, const MultiAxisArgs& axes = {}) {
  check_apply_out_form(op, x, angles, where, out, axes);
  if (x.numel() > 0 || where.is_packed()) {
    Backend::check_form_values(op, angles, where, where.is_packed() ? x.size(0) : 0, axes);
  }
  if (x.numel() == 0) {
    return;
  }
  const KernelPositions<Backend> kernel(x, angles, where, axes);
  auto call = prepare_form<Backend>(x, angles, where, kernel.packed, kernel.positions,
                                    Destination::kOut, out, axes);
  rotate_form<Backend>(x.scalar_type(), call, nullptr, angles, axes, {interleaved, inverse});
  call.write_back();
}

template <typename Backend>
std::tuple<at::Tensor, at::Tensor> apply_qk_form_body(
    const char* op, const at::Tensor& q, const at::Tensor& k, const AngleSource& angles,
    const PositionSource& where, bool interleaved, bool inverse, const MultiAxisArgs& axes = {}) {
  check_apply_qk_form(op, q, k, angles, where, axes);
  const bool work = q.numel() > 0 || k.numel() > 0;
  if (work || where.is_packed()) {
    Backend::check_form_values(op, angles, where, where.is_packed() ? q.size(0) : 0, axes);
  }
  const KernelPositions<Backend> kernel(q, angles, where, axes);
  auto q_call = prepare_form<Backend>(q, angles, where, kernel.packed, kernel.positions,
                                      Destination::kNewTensor, {}, axes);
  auto k_call = prepare_form<Backend>(k, angles, where, kernel.packed, kernel.positions,
                                      Destination::kNewTensor, {}, axes);
  if (work) {
    rotate_form<Backend>(q.scalar_type(), q_call, &k_call, angles, axes, {interleaved, inverse});
  }
  return {q_call.output, k_call.output};
}

}  // namespace rope::detail
