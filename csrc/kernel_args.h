// SPDX-License-Identifier: BSD-3-Clause
// A torch-free description of one rotation: raw pointers, int64 element strides and sizes.
//
// Both backends consume this struct, so the CPU kernel and the CUDA kernel headers never include
// torch. The torch glue validates the tensors (csrc/validation.cpp) and fills these structs in
// (csrc/prepare.cpp).
#pragma once

#include <cstdint>

namespace rope {

// After merging dimensions that are contiguous with respect to x, out and positions alike, real
// inputs need 1 to 3 dims; 8 covers any caller while keeping the struct small enough to pass by
// value to a CUDA kernel.
constexpr int kMaxRowDims = 8;

// One "row" is the head_dim features of one (token, head): x[..., :]. Rows are addressed by an
// index over `row_sizes` (x.shape[:-1], merged), with a separate stride set per tensor. Positions
// broadcast to x.shape[:-1] carry stride 0 along the broadcast dims.
struct RowGeometry {
  int32_t ndim = 0;                       // number of (merged) row dims, 0 for a single row
  int64_t num_rows = 0;                   // product of row_sizes
  int64_t row_sizes[kMaxRowDims] = {};    // merged x.shape[:-1]
  int64_t in_strides[kMaxRowDims] = {};   // x, in elements
  int64_t out_strides[kMaxRowDims] = {};  // out, in elements (== in_strides for the in-place op)
  int64_t pos_strides[kMaxRowDims] = {};  // positions expanded to x.shape[:-1], 0 where broadcast
};

// Everything one kernel launch needs for one tensor (q or k or x).
// Element types are erased here; the backends know them from the dispatch that created the args.
struct RotationArgs {
  const void* in = nullptr;         // x: [..., head_dim], last-dim stride 1
  void* out = nullptr;              // [..., head_dim], last-dim stride 1 (may alias `in`)
  const void* positions = nullptr;  // int32 or int64, addressed through geometry.pos_strides
  bool positions_are_int64 = true;
  RowGeometry geometry;
  int64_t head_dim = 0;    // features per row
  int64_t rotary_dim = 0;  // first rotary_dim features are rotated (even, <= head_dim)
  bool copy_tail = true;   // copy features [rotary_dim, head_dim) to out (false when in place)
};

// The cos/sin tables, shared by q and k: [max_seq_len, rotary_dim / 2], row stride table_stride.
struct TableArgs {
  const void* cos = nullptr;
  const void* sin = nullptr;
  bool tables_are_double = false;  // float32 (default) or float64
  int64_t max_seq_len = 0;
  int64_t table_stride = 0;  // elements between consecutive positions' rows
};

// What the rotation does. `interleaved` becomes a compile-time template parameter of every kernel
// (it decides the memory access pattern). `inverse` only negates sin: the CPU kernels take it as a
// template parameter too (the sign folds into the FMA sequence), the CUDA kernel as a run-time
// flag (a uniform branch costs nothing there and halves the number of variants).
struct RotationMode {
  bool interleaved = true;  // plane k is (2k, 2k+1); false: (k, k + rotary_dim/2)
  bool inverse = false;     // rotate by -angle (the transpose, which is also the backward)
};

}  // namespace rope
