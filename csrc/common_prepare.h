// SPDX-License-Identifier: BSD-3-Clause
// Turns validated tensors into the torch-free kernel arguments of common_kernel_args.h, and owns
// the tensors those raw pointers point into for the duration of the call.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/MaybeOwned.h>

#include <cstddef>

#include "common_kernel_args.h"
#include "rope_validation.h"

namespace rope::detail {

// Where a rotation writes its result.
enum class Destination {
  kNewTensor,  // rope.apply / apply_qk: a fresh contiguous tensor of x's shape and dtype
  kInPlace,    // rope.apply_: x itself
  kOut,        // rope.apply.out: a caller's buffer of x's shape and dtype, any strides
};

// Borrowed tensors (x, positions) are the caller's and must outlive this struct; it owns only
// the copies it makes, so the common call costs no reference-count traffic for them.
struct PreparedRotation {
  c10::MaybeOwned<at::Tensor> input;      // x, or a contiguous copy when x.stride(-1) != 1
  at::Tensor output;                      // what the kernel writes
  c10::MaybeOwned<at::Tensor> positions;  // positions (read through broadcast strides), or a
                                          // contiguous copy expanded to x.shape[:-1]
  at::Tensor write_back_to;  // defined when `output` is a temporary standing in for x or out
  RotationArgs args;
  // Packed sequences (PositionKind kPacked): the cu_seqlens and seq_offsets the kernel reads
  // (contiguous copies where the caller's were strided).
  at::Tensor cu_seqlens;
  at::Tensor seq_offsets;

  // After the kernel ran: copies a temporary result back into x (in place) or out (out=) when
  // their layout could not be written directly. No-op otherwise.
  void write_back();
};

struct PreparedTables {
  at::Tensor cos;  // last-dim contiguous
  at::Tensor sin;
  TableArgs args;
};

// Call after the checks of rope_validation.h. Copies only when a table's last dim is not contiguous
// or cos and sin have different row strides. `axes` (checked) becomes TableArgs::axes.
PreparedTables prepare_tables(const at::Tensor& cos, const at::Tensor& sin,
                              const MultiAxisArgs& axes = {});

// Call after the checks of rope_validation.h. Copies x once when its last dim is not contiguous
// (stride(-1) != 1) or its leading dims cannot be described in kMaxRowDims merged dims; any other
// layout (sliced from a fused qkv tensor, transposed heads) is read in place through its strides.
// `out` is the caller's buffer for Destination::kOut and ignored otherwise; it is written in place
// through its strides when its last dim is contiguous, else through a temporary.
// With multi-axis positions (`axes` active), positions' last dim is the axis dim: its leading dims
// broadcast to x.shape[:-1] and its axis stride becomes RotationArgs::axis_stride.
PreparedRotation prepare_rotation(const at::Tensor& x, const at::Tensor& positions,
                                  int64_t rotary_dim, Destination destination,
                                  const at::Tensor& out = {}, const MultiAxisArgs& axes = {});

// The frequency form's angle source: TableArgs with no tables and `frequencies` set (the float64
// freqs read through their stride, the attention factor also as a float-float), and the
// multi-axis map. Call after the checks of rope_validation.h.
struct PreparedFrequencies {
  TableArgs args;
};
PreparedFrequencies prepare_frequencies(const at::Tensor& freqs, double attention_factor,
                                        const MultiAxisArgs& axes = {});

// As prepare_rotation, for packed sequences: x is (T, ..., head_dim) with its tokens on dim 0, and
// the rows' position offsets are virtual (1 along dim 0, 0 elsewhere: a row's offset is its
// token's index), PositionKind kPacked. `packed` holds the cu_seqlens and seq_offsets the kernel
// reads (on its device). Call after the checks of rope_validation.h.
PreparedRotation prepare_packed_rotation(const at::Tensor& x, const PackedArgs& packed,
                                         int64_t rotary_dim, Destination destination,
                                         const at::Tensor& out = {});

// Builds the row geometry of `sizes` for three stride sets, dropping size-1 dims and merging dims
// that are contiguous in all three. Returns false (and leaves `g` unusable) when more than
// kMaxRowDims dims remain; prepare_rotation then copies the inputs to contiguous ones.
bool build_row_geometry(at::IntArrayRef sizes, at::IntArrayRef in_strides,
                        at::IntArrayRef out_strides, at::IntArrayRef pos_strides, RowGeometry& g);

// The same, throwing when the dims do not fit: for callers that have already reduced the dims
// (prepare_rotation, after its copy fallback) and for the tests of the merging logic.
RowGeometry make_row_geometry(at::IntArrayRef sizes, at::IntArrayRef in_strides,
                              at::IntArrayRef out_strides, at::IntArrayRef pos_strides);

}  // namespace rope::detail
