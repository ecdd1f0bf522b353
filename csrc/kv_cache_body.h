// SPDX-License-Identifier: BSD-3-Clause
// rope.apply_qk_cache: rotate q and k, write the rotated k and a copy of v into rows of a KV
// cache (flat or paged, 16/32-bit or fp8). The checks (shared by CPU, CUDA and Meta) and the op
// body, written once for the computing backends as rope_body.h does for the other ops; the work
// itself is three row streams (common_row_streams.h: q into q_out, k and v into their caches'
// slot rows), the engine of every fused op. A backend supplies:
//   static void check_positions(const char* op, const at::Tensor& positions, int64_t max_seq_len,
//                               const MultiAxisArgs& axes);
//   static void check_slots(const char* op, const at::Tensor& slot_mapping, int64_t num_slots);
//   static void run_streams(c10::ScalarType dtype, const PreparedStreams&);
// Every check runs before anything is allocated or written.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "common_prepare.h"
#include "common_stream_prepare.h"
#include "kv_cache_args.h"
#include "rope_validation.h"

namespace rope::detail {

// The op's arguments, as the dispatcher passes them.
struct KvCacheInputs {
  const at::Tensor& q;
  const at::Tensor& k;
  const std::optional<at::Tensor>& v;
  const at::Tensor& cos;
  const at::Tensor& sin;
  const at::Tensor& positions;
  const at::Tensor& k_cache;
  const std::optional<at::Tensor>& v_cache;
  const at::Tensor& slot_mapping;
  const std::optional<at::Tensor>& k_scale;
  const std::optional<at::Tensor>& v_scale;
  MultiAxisArgs axes = {};  // multi-axis positions (M-RoPE)
};

// Metadata checks only (SymInt-aware), so the Meta kernel runs them too.
void check_apply_qk_cache(const char* op, const KvCacheInputs& in);

// Host-side check of the fp8 scales' values (CPU tensors only: a CUDA scale is read by the kernel
// alone, with no host sync): each finite and > 0. Call after check_apply_qk_cache.
void check_scales_on_host(const char* op, const KvCacheInputs& in);

// Slots a cache has: size(0) flat, size(0) * size(1) paged. Real (non-symbolic) caches only.
int64_t cache_slots(const at::Tensor& cache);

// Host-side check of slot_mapping's values (CPU backend): every slot < num_slots, and no
// non-negative slot twice. Names the offending entry.
void check_slots_on_host(const char* op, const at::Tensor& slot_mapping, int64_t num_slots);

// The norm of rms_norm_apply_qk_cache: (head_dim,) weights already plus weight_offset in the
// math type, contiguous (kv_cache_norm_body.h makes them).
struct StreamNorm {
  const at::Tensor& q_weight;
  const at::Tensor& k_weight;
  double eps;
};

// The row streams of a checked call (kv_cache_streams.cpp): q (rotated, normalised with a norm)
// into q_out, k (likewise) into k_cache's slot rows, v into v_cache's.
PreparedStreams prepare_kv_cache_streams(const KvCacheInputs& in, const at::Tensor& q_out,
                                         const std::optional<at::Tensor>& q_scale, bool interleaved,
                                         const StreamNorm* norm);

// The value checks every backend makes before anything is written (CPU: on the host; CUDA: none,
// the kernels assert).
template <typename Backend>
void check_kv_cache_values(const char* op, const KvCacheInputs& in) {
  if (in.q.numel() > 0 || in.k.numel() > 0) {
    Backend::check_positions(op, in.positions, in.cos.size(0), in.axes);
  }
  if (in.slot_mapping.numel() > 0) {
    Backend::check_slots(op, in.slot_mapping, cache_slots(in.k_cache));
  }
}

template <typename Backend>
at::Tensor apply_qk_cache_body(const KvCacheInputs& in, bool interleaved) {
  constexpr const char* op = "rope.apply_qk_cache";
  check_apply_qk_cache(op, in);
  check_scales_on_host(op, in);
  check_kv_cache_values<Backend>(op, in);
  at::Tensor q_out = new_stream_output(in.q, in.q.sym_sizes(), in.q.scalar_type());
  const PreparedStreams streams =
      prepare_kv_cache_streams(in, q_out, std::nullopt, interleaved, nullptr);
  if (streams.args.num_tokens > 0) {
    Backend::run_streams(in.q.scalar_type(), streams);
  }
  return q_out;
}

}  // namespace rope::detail
