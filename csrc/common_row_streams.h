// SPDX-License-Identifier: BSD-3-Clause
// The row streams: one torch-free description of what the serving fusions do (rope.apply_qk_fp8,
// rope.rms_norm_apply_qk_cache, rope.mla_apply_cache), which one CPU kernel
// (csrc/cpu/common_stream_rows.cpp) and one CUDA kernel (csrc/cuda/common_stream_kernel.cuh)
// execute, so that the three ops share their math, their fp8 rounding and their index arithmetic,
// and the host run of the CUDA kernel (tests/cuda_host) checks all three at once.
//
// A call is a few *streams*. A stream reads rows of one source tensor (q, k, v, q_nope, kv_c,
// k_pe, ...) laid out as (tokens, heads, width) with a unit last stride, and writes each row, in
// the same order of features, into a *target*: a tensor (T, heads, width) or the rows of a cache
// that slot_mapping picks for the token (flat or paged; a negative slot skips the token). On the
// way a row may be RMS-normalised, its first rotary_dim features rotated, and it is stored either
// in the source's dtype (rounded once) or as fp8 with a per-tensor scale or with scales computed
// from the rows themselves (one per row or per token: dynamic scales).
//
// The math of one row, in the math type A (float; double for double storage), is fixed here so
// that every backend gives the same bits (the CPU kernel's FMA copies and the CUDA kernel):
//   x_i    = A(src[i]), i < width.
//   norm   (when the stream has a weight): the sum of squares in a fixed order: 16 partial sums,
//          p_j = fma(x_i, x_i, p_j) for i = 16 m + j over the whole 16-element chunks in order of
//          m; then p_j += p_{j+8}, p_j += p_{j+4}, p_j += p_{j+2}, p_0 += p_1 (j below the step);
//          then s = p_0 and s = fma(x_i, x_i, s) for each feature past the last whole chunk, in
//          order. (The CUDA kernel gives each row a half-warp: thread j sums p_j, and shuffles fold
//          the partials in this tree, always the lower partial plus the upper one.) r = 1 / sqrt(s
//          / width + eps) (IEEE division, square root and division), and y_i = (x_i * r) * w_i with
//          w_i = weight + weight_offset in A (the op bodies pass it added). Without a weight, y_i =
//          x_i.
//   rotate (i < rotary_dim, planes as rope.apply: (2k, 2k+1) interleaved, (k, k + rotary_dim/2)
//          half split), c, s = A(cos[p, k]), A(sin[p, k]) at the row's position p (multi-axis: the
//          position of the plane's axis): a' = fma(a, c, -(b * s)), b' = fma(a, s, b * c).
//          The inverse rotation (StreamArgs::inverse) takes s = -A(sin[p, k]): rope.apply's
//          inverse, bit for bit (the negation is exact).
//   store  rounded once to the storage type, or quantized (kv_cache_args.h's quantize_fp8 with
//          the target's ScaleRule). Dynamic scales: the group's amax is the NaN-propagating max
//          of |y_i| over its rows' stored features after the norm and the rotation (fold_amax;
//          max is exact, so the order of the fold does not matter), its scale dynamic_fp8_scale,
//          and every feature is stored as quantize_fp8(y_i, scale, kDivide). A feature that is
//          neither normalised nor rotated, stored in the source's dtype (v rows, a partial
//          rotation's tail), is copied bit for bit, NaN payloads included, as index_copy_ would.
// The CUDA kernel's explicit fmaf is what the CPU kernel's vector FMAs compute; the CPU copy
// without FMA (DEFAULT) rounds the products first and is exact only where that agrees.
#pragma once

#include <cstdint>

#include "common_kernel_args.h"
#include "kv_cache_args.h"  // CacheFormat, ScaleRule, quantize_fp8

namespace rope {

// The most streams one call has: rope.mla_apply_cache with FlashInfer's split GQA rows (q_pe,
// q_nope, k_pe, kv_c, v).
constexpr int kMaxStreams = 5;

// The elements one lane of the CUDA kernel, and one step of the norm's partial sums, covers.
constexpr int64_t kStreamChunk = 16;

// Where a stream's rows go.
struct StreamTarget {
  void* data = nullptr;
  CacheFormat format = CacheFormat::kSame;  // the source's dtype, or fp8
  ScaleRule rule = ScaleRule::kDivide;
  const float* scale = nullptr;  // fp8: one float32 on the target's device; nullptr: scale 1
  // fp8 with dynamic scales (kv_cache_args.h's dynamic_fp8_scale; `scale` unused): each scale
  // group's scale is computed from its rotated rows and written to scales[t * scale_token_stride
  // + h * scale_head_stride] (per_token: h = 0). A group is one (token, head) row, or with
  // per_token every head of a token. Tensor targets only (not by_slot), and per_token only on a
  // stream without a norm (the CUDA kernel's per-token groups take no sum of squares). nullptr: a
  // static scale.
  float* scales = nullptr;
  int64_t scale_token_stride = 0;
  int64_t scale_head_stride = 0;
  bool per_token = false;
  bool pow2_scale = false;
  // by_slot: row (slot / block_size, slot % block_size, head) of a cache, slot from
  // slot_mapping[token] (negative: the token is skipped); a flat cache has block_size 1 and
  // offset_stride 0. Otherwise row (token, head) of a tensor, token_stride apart.
  bool by_slot = false;
  int64_t num_slots = 0;
  int64_t block_size = 1;
  int64_t block_stride = 0;  // elements of the target
  int64_t offset_stride = 0;
  int64_t token_stride = 0;
  int64_t head_stride = 0;
  int64_t feature_offset = 0;  // elements before the row's feature 0 (a [kv_c | k_pe] row's k_pe)
};

// One source tensor (tokens, heads, width), unit last stride, and what happens to its rows.
struct RowStream {
  const void* src = nullptr;
  int64_t token_stride = 0;  // elements
  int64_t head_stride = 0;
  int64_t heads = 0;
  int64_t width = 0;       // features per row
  int64_t rotary_dim = 0;  // the first rotary_dim features rotate (even; 0: none)
  // RMSNorm: width values of weight + weight_offset in the math type; nullptr: no norm.
  const void* weight = nullptr;
  // Positions of the rows, read through broadcast strides (0 where broadcast): the row (t, h)
  // reads positions[t * pos_token_stride + h * pos_head_stride] (+ a * axis_stride for axis a).
  int64_t pos_token_stride = 0;
  int64_t pos_head_stride = 0;
  StreamTarget target;
};

// Everything one call needs. The storage type of every source is the same (the op's dtype); the
// math type follows it. Tables and their multi-axis map are common_kernel_args.h's TableArgs.
struct StreamArgs {
  int64_t num_tokens = 0;
  int32_t num_streams = 0;
  bool interleaved = true;
  bool inverse = false;  // every rotating stream rotates by -angle (the sines negated)
  RowStream streams[kMaxStreams];
  const void* positions = nullptr;  // int32 or int64; unused when no stream rotates
  bool positions_are_int64 = true;
  int64_t axis_stride = 0;         // multi-axis positions: elements between two axes
  const int64_t* slots = nullptr;  // slot_mapping, for by_slot targets
  int64_t slot_stride = 1;
  double eps = 1e-6;  // RMSNorm streams
};

// Element offset of (slot, head) in a by_slot target, 0 <= slot < num_slots; feature 0.
ROPE_HOST_DEVICE inline int64_t slot_row(const StreamTarget& t, int64_t slot, int64_t head) {
  const int64_t block = slot / t.block_size;
  const int64_t offset = slot - block * t.block_size;
  return block * t.block_stride + offset * t.offset_stride + head * t.head_stride +
         t.feature_offset;
}

// Element offset of (token, head) in a tensor target; feature 0.
ROPE_HOST_DEVICE inline int64_t token_row(const StreamTarget& t, int64_t token, int64_t head) {
  return token * t.token_stride + head * t.head_stride + t.feature_offset;
}

// The bytes of one element of a target whose source type has `source_bytes` bytes.
ROPE_HOST_DEVICE inline int64_t target_element_bytes(const StreamTarget& t, int64_t source_bytes) {
  return t.format == CacheFormat::kSame ? source_bytes : 1;
}

}  // namespace rope
