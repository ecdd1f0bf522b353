// SPDX-License-Identifier: BSD-3-Clause
// rope.rms_norm_apply_qk_cache: QK-RMSNorm, RoPE and the KV-cache write in one pass
// (rms_norm_apply_qk and apply_qk_cache fused, on the row streams of common_row_streams.h): each
// row of q and k normalised over its head_dim with its weight, rotated, k and v written into their
// cache rows by slot_mapping, q returned (its dtype, or float8 with q_scale). The checks (shared
// by CPU, CUDA and Meta), and the op body over a backend policy that supplies check_positions,
// check_slots and run_streams (kv_cache_body.h). Every check runs before anything is written.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "kv_cache_body.h"
#include "rms_norm_validation.h"  // norm_weight_in_math_type

namespace rope::detail {

struct KvCacheNormInputs {
  KvCacheInputs cache;  // q, k, v, tables, positions, caches, slots, cache scales, axes
  const at::Tensor& q_weight;
  const at::Tensor& k_weight;
  double eps;
  double weight_offset;
  std::optional<at::ScalarType> q_dtype;  // nullopt: q's dtype
  const std::optional<at::Tensor>& q_scale;
};

// Metadata checks (SymInt-aware: the Meta kernel runs them too): apply_qk_cache's, the norm's
// weights and eps, and q's output dtype and scale. Returns q_out's dtype.
at::ScalarType check_rms_norm_apply_qk_cache(const char* op, const KvCacheNormInputs& in);

template <typename Backend>
at::Tensor rms_norm_apply_qk_cache_body(const KvCacheNormInputs& in, bool interleaved) {
  constexpr const char* op = "rope.rms_norm_apply_qk_cache";
  const at::ScalarType q_dtype = check_rms_norm_apply_qk_cache(op, in);
  const KvCacheInputs& c = in.cache;
  check_scales_on_host(op, c);
  check_scale_value_on_host(op, "q_scale", in.q_scale, ScaleRule::kDivide);
  check_kv_cache_values<Backend>(op, c);
  at::Tensor q_out = new_stream_output(c.q, c.q.sym_sizes(), q_dtype);
  const at::Tensor q_weight =
      norm_weight_in_math_type(in.q_weight, in.weight_offset, c.q.scalar_type());
  const at::Tensor k_weight =
      norm_weight_in_math_type(in.k_weight, in.weight_offset, c.q.scalar_type());
  const StreamNorm norm{q_weight, k_weight, in.eps};
  const PreparedStreams streams =
      prepare_kv_cache_streams(c, q_out, in.q_scale, interleaved, &norm);
  if (streams.args.num_tokens > 0) {
    Backend::run_streams(c.q.scalar_type(), streams);
  }
  return q_out;
}

}  // namespace rope::detail
