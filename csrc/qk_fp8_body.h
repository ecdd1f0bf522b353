// SPDX-License-Identifier: BSD-3-Clause
// rope.apply_qk_fp8 and rope.apply_qk_fp8.out: rotate q and k and store them as float8, with their
// no-RoPE parts (q_nope, k_nope: MLA's split heads) quantized alongside. The checks (shared by
// CPU, CUDA and Meta), the outputs, and the op body over a backend policy, as kv_cache_body.h.
// A backend supplies:
//   static void check_positions(const char* op, const at::Tensor& positions, int64_t max_seq_len,
//                               const MultiAxisArgs& axes);
//   static void run_streams(c10::ScalarType dtype, const PreparedStreams&);
// Every check runs before anything is written.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

#include "common_stream_prepare.h"

namespace rope::detail {

// The op's inputs, as the dispatcher passes them.
struct QkFp8Inputs {
  const at::Tensor& q;  // (T, Hq, D)
  const at::Tensor& k;  // (T, Hk, D)
  const at::Tensor& cos;
  const at::Tensor& sin;
  const at::Tensor& positions;
  const std::optional<at::Tensor>& q_nope;  // (T, Hq, Nq): quantized, not rotated
  const std::optional<at::Tensor>& k_nope;  // (T, Hk, Nk)
  const std::optional<at::Tensor>& q_scale;
  const std::optional<at::Tensor>& k_scale;
  MultiAxisArgs axes;
};

// The four fp8 outputs; a nope output of an absent nope input is an empty (T, H, 0) tensor
// (functional overload) or undefined (out=).
struct QkFp8Outputs {
  at::Tensor q_out;
  at::Tensor k_out;
  at::Tensor q_nope_out;
  at::Tensor k_nope_out;
};

// Metadata checks of the inputs (SymInt-aware: the Meta kernels run them too).
void check_apply_qk_fp8(const char* op, const QkFp8Inputs& in);

// The fp8 dtype of the functional overload: `dtype`, float8_e4m3fn by default.
at::ScalarType qk_fp8_dtype(const char* op, std::optional<at::ScalarType> dtype);

// The out= overload's buffers against the inputs; returns their fp8 dtype.
at::ScalarType check_apply_qk_fp8_outputs(const char* op, const QkFp8Inputs& in,
                                          const QkFp8Outputs& out);

// Fresh contiguous outputs of `dtype` (empty_symint: meta and real tensors alike).
QkFp8Outputs new_qk_fp8_outputs(const QkFp8Inputs& in, at::ScalarType dtype);

// The streams of a checked call (q, k, then the nope parts present); the rotation forward or
// inverse (RotationMode), the nope parts only quantized.
PreparedStreams prepare_qk_fp8(const QkFp8Inputs& in, const QkFp8Outputs& out, RotationMode mode,
                               bool multiply_by_scale);

// Everything after the checks of the outputs: the scales' and positions' values, then the kernel.
template <typename Backend>
void apply_qk_fp8_run(const char* op, const QkFp8Inputs& in, const QkFp8Outputs& out,
                      RotationMode mode, bool multiply_by_scale) {
  const ScaleRule rule = multiply_by_scale ? ScaleRule::kMultiply : ScaleRule::kDivide;
  check_scale_value_on_host(op, "q_scale", in.q_scale, rule);
  check_scale_value_on_host(op, "k_scale", in.k_scale, rule);
  if (in.q.numel() > 0 || in.k.numel() > 0) {
    Backend::check_positions(op, in.positions, in.cos.size(0), in.axes);
  }
  const PreparedStreams prepared = prepare_qk_fp8(in, out, mode, multiply_by_scale);
  if (prepared.args.num_tokens > 0) {
    Backend::run_streams(in.q.scalar_type(), prepared);
  }
}

// rope.apply_qk_fp8_dynamic's scales: float32 (T, Hq, 1) and (T, Hk, 1), or (T, 1, 1) each with
// per_token (empty_symint: meta and real tensors alike).
struct QkFp8Scales {
  at::Tensor q_scale;
  at::Tensor k_scale;
};
QkFp8Scales new_qk_fp8_scales(const QkFp8Inputs& in, bool per_token);

// Turns the q and k streams of prepare_qk_fp8 into dynamic-scale streams writing `scales`.
void set_dynamic_scales(PreparedStreams& p, const QkFp8Scales& scales, bool per_token, bool pow2);

// rope.apply_qk_fp8_dynamic.out's scale buffers: float32 on q's device in the functional
// overload's shapes ((T, H, 1), or (T, 1, 1) with per_token; any strides), sharing no memory with
// an input, an fp8 output or each other.
void check_qk_fp8_scale_outputs(const char* op, const QkFp8Inputs& in, const QkFp8Outputs& out,
                                const QkFp8Scales& scales, bool per_token);

// Everything of rope.apply_qk_fp8_dynamic after the checks of its outputs: the positions' values,
// then the kernel.
template <typename Backend>
void apply_qk_fp8_dynamic_run(const char* op, const QkFp8Inputs& in, const QkFp8Outputs& out,
                              const QkFp8Scales& scales, RotationMode mode, bool per_token,
                              bool pow2_scale) {
  if (in.q.numel() > 0 || in.k.numel() > 0) {
    Backend::check_positions(op, in.positions, in.cos.size(0), in.axes);
  }
  PreparedStreams prepared = prepare_qk_fp8(in, out, mode, /*multiply_by_scale=*/false);
  set_dynamic_scales(prepared, scales, per_token, pow2_scale);
  if (prepared.args.num_tokens > 0) {
    Backend::run_streams(in.q.scalar_type(), prepared);
  }
}

template <typename Backend>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> apply_qk_fp8_body(
    const QkFp8Inputs& in, std::optional<at::ScalarType> dtype, RotationMode mode,
    bool multiply_by_scale) {
  constexpr const char* op = "rope.apply_qk_fp8";
  check_apply_qk_fp8(op, in);
  const at::ScalarType fp8 = qk_fp8_dtype(op, dtype);
  QkFp8Outputs out = new_qk_fp8_outputs(in, fp8);
  apply_qk_fp8_run<Backend>(op, in, out, mode, multiply_by_scale);
  return {out.q_out, out.k_out, out.q_nope_out, out.k_nope_out};
}

template <typename Backend>
void apply_qk_fp8_out_body(const QkFp8Inputs& in, const QkFp8Outputs& out, RotationMode mode,
                           bool multiply_by_scale) {
  constexpr const char* op = "rope.apply_qk_fp8.out";
  check_apply_qk_fp8(op, in);
  check_apply_qk_fp8_outputs(op, in, out);
  apply_qk_fp8_run<Backend>(op, in, out, mode, multiply_by_scale);
}

// rope.apply_qk_fp8_dynamic: the rotation of apply_qk_fp8 with scales computed from the rotated
// rows, one per (token, head) row or per token (common_row_streams.h, docs/quant_formats.md);
// returns (q_out, k_out, q_scale, k_scale). No nope parts (the inputs' q_nope / k_nope / scales
// are absent).
template <typename Backend>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> apply_qk_fp8_dynamic_body(
    const QkFp8Inputs& in, std::optional<at::ScalarType> dtype, RotationMode mode, bool per_token,
    bool pow2_scale) {
  constexpr const char* op = "rope.apply_qk_fp8_dynamic";
  check_apply_qk_fp8(op, in);
  const QkFp8Outputs out = new_qk_fp8_outputs(in, qk_fp8_dtype(op, dtype));
  const QkFp8Scales scales = new_qk_fp8_scales(in, per_token);
  apply_qk_fp8_dynamic_run<Backend>(op, in, out, scales, mode, per_token, pow2_scale);
  return {out.q_out, out.k_out, scales.q_scale, scales.k_scale};
}

// rope.apply_qk_fp8_dynamic.out: the same into the caller's fp8 rows and float32 scales (CUDA
// graphs and preallocated serving buffers); every check before anything is written.
template <typename Backend>
void apply_qk_fp8_dynamic_out_body(const QkFp8Inputs& in, const QkFp8Outputs& out,
                                   const QkFp8Scales& scales, RotationMode mode, bool per_token,
                                   bool pow2_scale) {
  constexpr const char* op = "rope.apply_qk_fp8_dynamic.out";
  check_apply_qk_fp8(op, in);
  check_apply_qk_fp8_outputs(op, in, out);
  check_qk_fp8_scale_outputs(op, in, out, scales, per_token);
  apply_qk_fp8_dynamic_run<Backend>(op, in, out, scales, mode, per_token, pow2_scale);
}

}  // namespace rope::detail
