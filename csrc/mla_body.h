// SPDX-License-Identifier: BSD-3-Clause
// rope.mla_apply_cache: the cache rows of multi-head latent attention (DeepSeek-V2/V3 and their
// successors), on the row streams of common_row_streams.h. q_pe and the single-head k_pe are
// rotated; [kv_c | k_pe] goes into cache rows by slot_mapping, either as one row of width
// kv_lora_rank + rope_dim (vLLM's layout) or split over two caches (FlashInfer's ckv and kpe);
// q_pe (and q_nope, quantized alongside) is returned, as float8 on request. The key parts may
// also carry a heads dim, with v into a v cache: FlashInfer's split GQA rows [k_rope | k_nope]
// are the two-cache layout over column slices of one cache. The checks (shared by CPU, CUDA and
// Meta), the streams and the op body over a backend policy (check_positions, check_slots,
// run_streams, as qk_fp8_body.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

#include "common_stream_prepare.h"

namespace rope::detail {

struct MlaInputs {
  const at::Tensor& q_pe;  // (T, Hq, R): rotated, returned
  const at::Tensor& k_pe;  // (T, R), or (T, Hk, R): rotated into the cache
  const at::Tensor& kv_c;  // (T, L), or (T, Hk, L): copied into the cache
  const at::Tensor& cos;
  const at::Tensor& sin;
  const at::Tensor& positions;
  const at::Tensor& kv_cache;                  // [kv_c | k_pe] rows, or kv_c's rows (ckv)
  const std::optional<at::Tensor>& kpe_cache;  // k_pe's rows (two caches), or None
  const at::Tensor& slot_mapping;
  const std::optional<at::Tensor>& q_nope;  // (T, Hq, N): quantized alongside q_pe
  const std::optional<at::Tensor>& v;       // (T, Hk, Dv), with v_cache (k_pe with heads only)
  const std::optional<at::Tensor>& v_cache;
  const std::optional<at::Tensor>& kv_scale;
  const std::optional<at::Tensor>& v_scale;
  std::optional<at::ScalarType> q_dtype;  // nullopt: q_pe's dtype
  const std::optional<at::Tensor>& q_scale;
};

// Metadata checks (SymInt-aware: the Meta kernel runs them too). Returns the outputs' dtype.
at::ScalarType check_mla_apply_cache(const char* op, const MlaInputs& in);

// Slots of the caches (checked: all alike).
int64_t mla_cache_slots(const MlaInputs& in);

// Fresh contiguous outputs of `dtype`: q_pe's shape, and q_nope's (an empty (T, Hq, 0) without it).
std::tuple<at::Tensor, at::Tensor> new_mla_outputs(const MlaInputs& in, at::ScalarType dtype);

PreparedStreams prepare_mla(const MlaInputs& in, const at::Tensor& q_pe_out,
                            const at::Tensor& q_nope_out, bool interleaved, bool multiply_by_scale);

template <typename Backend>
std::tuple<at::Tensor, at::Tensor> mla_apply_cache_body(const MlaInputs& in, bool interleaved,
                                                        bool multiply_by_scale) {
  constexpr const char* op = "rope.mla_apply_cache";
  const at::ScalarType dtype = check_mla_apply_cache(op, in);
  const ScaleRule rule = multiply_by_scale ? ScaleRule::kMultiply : ScaleRule::kDivide;
  check_scale_value_on_host(op, "kv_scale", in.kv_scale, rule);
  check_scale_value_on_host(op, "v_scale", in.v_scale, rule);
  check_scale_value_on_host(op, "q_scale", in.q_scale, rule);
  if (in.q_pe.numel() > 0 || in.k_pe.numel() > 0) {
    Backend::check_positions(op, in.positions, in.cos.size(0), {});
  }
  if (in.slot_mapping.numel() > 0) {
    Backend::check_slots(op, in.slot_mapping, mla_cache_slots(in));
  }
  auto [q_pe_out, q_nope_out] = new_mla_outputs(in, dtype);
  const PreparedStreams prepared =
      prepare_mla(in, q_pe_out, q_nope_out, interleaved, multiply_by_scale);
  if (prepared.args.num_tokens > 0) {
    Backend::run_streams(in.q_pe.scalar_type(), prepared);
  }
  return {q_pe_out, q_nope_out};
}

}  // namespace rope::detail
