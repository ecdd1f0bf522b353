// SPDX-License-Identifier: BSD-3-Clause
// What the ops that run the row streams (rope.apply_qk_fp8, rope.rms_norm_apply_qk_cache,
// rope.mla_apply_cache) share on the torch side: the checks of their row tensors, fp8 targets,
// scales, caches and written tensors (metadata only, SymInt-aware, so their Meta kernels run
// them too), the host-side value checks of the CPU backend, and the conversion of checked tensors
// into the torch-free streams of common_row_streams.h.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/MaybeOwned.h>

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "common_prepare.h"
#include "common_row_streams.h"
#include "rope_validation.h"

namespace rope::detail {

bool is_fp8(at::ScalarType t);
// kFp8E4M3 / kFp8E5M2 for the float8 dtypes, kSame for any other.
CacheFormat format_of_dtype(at::ScalarType t);

// `t` is (tokens, heads, width) with tokens == like.size(0): the rows a stream reads (q, k, v,
// q_nope, ...), on like's device with like's dtype (`like_name`).
void check_row_tensor(const char* op, const char* name, const at::Tensor& t, const char* like_name,
                      const at::Tensor& like);

// A per-tensor fp8 scale, when given: float32, one value (0-d or 1 element), on `device`.
void check_scale_tensor(const char* op, const char* name, const std::optional<at::Tensor>& scale,
                        const at::Device& device);

// The value of a scale that is a CPU tensor (a CUDA one is read by the kernel alone, with no host
// sync): finite and > 0. `rule` words the message.
void check_scale_value_on_host(const char* op, const char* name,
                               const std::optional<at::Tensor>& scale, ScaleRule rule);

// A caller's output buffer of an fp8 stream: `dtype` (float8), the shape of `like`, on its device,
// unit last stride, writable (no overlapping elements).
void check_fp8_output(const char* op, const char* name, const at::Tensor& out, at::ScalarType dtype,
                      const char* like_name, const at::Tensor& like);

// The bytes a tensor with memory can touch, as absolute addresses [lo, hi]; empty (never meets)
// for meta tensors (no memory, maybe symbolic shapes), tensors without storage and empty ones.
// Comparing two spans is the cheap first test of whether a written tensor may overlap another.
struct Span {
  uintptr_t lo = 1;
  uintptr_t hi = 0;
  bool meets(const Span& o) const { return lo <= hi && o.lo <= o.hi && lo <= o.hi && o.lo <= hi; }
};
Span span_of(const at::Tensor& t);

// Every tensor an op writes must share no memory with anything it reads nor with another tensor
// it writes. Address ranges are compared first (a decode call has no time for a storage alias
// test per pair); only ranges that meet get the full check and its message. Two column slices of
// one buffer (cache[..., :R] and cache[..., R:]) do not overlap and pass.
using NamedTensors = std::vector<std::pair<const char*, const at::Tensor*>>;
void check_writes_disjoint(const char* op, const NamedTensors& written, const NamedTensors& read);

// Slots of a flat (num_slots, ...) or paged (num_blocks, block_size, ...) cache, whose row dims
// (after the slot dims) number `row_dims`.
int64_t slots_of(const at::Tensor& cache, int64_t row_dims);

// Strides of positions broadcast to (tokens, heads) (multi-axis: of positions.shape[:-1]); axis:
// the stride of the axis dim (multi-axis only).
struct PositionStrides {
  int64_t token = 0;
  int64_t head = 0;
  int64_t axis = 0;
};
PositionStrides position_strides(const at::Tensor& positions, const MultiAxisArgs& axes);

// A fresh contiguous output of `sizes` and `dtype` on like's device (meta tensors too, through
// empty_symint). On the CPU without a second trip through the dispatcher (decode calls are a few
// microseconds), large ones with pages of their own (cpu/common_fresh_output.h).
at::Tensor new_stream_output(const at::Tensor& like, c10::SymIntArrayRef sizes,
                             at::ScalarType dtype);

// x, or a copy of it with a unit last stride.
c10::MaybeOwned<at::Tensor> with_unit_last_stride(const at::Tensor& x);

// The source side of a stream over x (tokens, heads, width) or (tokens, width) (one head), unit
// last stride; positions strides broadcast over x's heads.
RowStream source_stream(const at::Tensor& x, int64_t rotary_dim, const PositionStrides& pos);

// A target tensor (tokens, heads, width) written row by row.
StreamTarget tensor_target(const at::Tensor& out, const std::optional<at::Tensor>& scale,
                           ScaleRule rule);

// A target cache whose rows are picked by slot: (num_slots, [heads,] width) or (num_blocks,
// block_size, [heads,] width), row_dims = 2 with a heads dim, 1 without; the row's features start
// at feature_offset.
StreamTarget cache_target(const at::Tensor& cache, int64_t row_dims, int64_t feature_offset,
                          const std::optional<at::Tensor>& scale, ScaleRule rule);

// The streams of one call, and what their raw pointers point into for the duration of the call:
// copies of sources without a unit last stride, the tables, the weights in the math type.
struct PreparedStreams {
  std::vector<c10::MaybeOwned<at::Tensor>> sources;
  std::vector<at::Tensor> keep;
  PreparedTables tables;
  StreamArgs args;

  // The arguments every call sets: the tables (and multi-axis map), the tokens, the pair layout,
  // positions and, for by_slot targets, slot_mapping (undefined: none). Returns the positions'
  // strides for the streams.
  PositionStrides begin(const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& positions,
                        const MultiAxisArgs& axes, int64_t num_tokens, bool interleaved,
                        const at::Tensor& slot_mapping);

  // Appends a stream reading x (tokens, heads, width) into `target`; returns it for more settings.
  RowStream& add(const at::Tensor& x, int64_t rotary_dim, const PositionStrides& pos,
                 const StreamTarget& target);
};

}  // namespace rope::detail
