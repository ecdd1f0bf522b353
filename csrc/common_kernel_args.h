// SPDX-License-Identifier: BSD-3-Clause
// A torch-free description of one rotation: raw pointers, int64 element strides and sizes.
//
// Both backends consume this struct, so the CPU kernel and the CUDA kernel headers never include
// torch. The torch glue validates the tensors (csrc/rope_validation.cpp) and fills these structs in
// (csrc/common_prepare.cpp).
#pragma once

#include <cstdint>

// Functions both the host code and the CUDA kernel call.
#if defined(__CUDACC__)
#define ROPE_HOST_DEVICE __host__ __device__
#else
#define ROPE_HOST_DEVICE
#endif

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

// Where a row's position comes from (the position source of docs/architecture.md, "Angle sources
// and position sources"). The row geometry's pos_strides then address:
//   kTensor: `positions` (int32 / int64), the positions form;
//   kPacked: nothing real: pos_strides are 1 along x's token dim (dim 0) and 0 elsewhere, so a
//            row's position offset is its token's index t, and its position is the packed
//            sequences' rule at t (packed_position below);
//   kIndex:  the same virtual offsets, read as the row of a compact angle table (the CPU's
//            frequency form with packed sequences: one table row per token).
enum class PositionKind : int32_t { kTensor = 0, kPacked = 1, kIndex = 2 };

// Packed sequences (`varlen`: cu_seqlens, seq_offsets, cp_size, cp_rank). cu_seqlens holds the
// global boundaries of num_seqs sequences (num_seqs + 1 values); this rank holds tokens
// [cu_seqlens[i] / cp_size, cu_seqlens[i + 1] / cp_size) of sequence i. See packed_position.
struct PackedSequenceArgs {
  const void* cu_seqlens = nullptr;
  bool cu_seqlens_are_int64 = true;
  const void* seq_offsets = nullptr;  // nullptr: every sequence starts at position 0
  bool seq_offsets_are_int64 = true;
  int64_t num_seqs = 0;
  int64_t num_tokens = 0;  // x.size(0): this rank's tokens; cu_seqlens[num_seqs] == it * cp_size
  int64_t cp_size = 1;
  int64_t cp_rank = 0;
};

// The position of local token j (0-based) of a sequence of global length `length` (its
// cu_seqlens difference) starting at `offset`, on rank cp_rank of cp_size: TransformerEngine's
// zigzag layout, where the sequence is cut into 2 cp_size chunks of c = length / (2 cp_size)
// tokens and rank r holds chunks r and 2 cp_size - 1 - r. cp_size == 1: offset + j.
ROPE_HOST_DEVICE inline int64_t packed_position_in(int64_t j, int64_t length, int64_t offset,
                                                   int64_t cp_size, int64_t cp_rank) {
  if (cp_size == 1) {
    return offset + j;
  }
  const int64_t c = length / (2 * cp_size);
  return offset + (j < c ? cp_rank * c + j : (2 * cp_size - 1 - cp_rank) * c + (j - c));
}

// The sequence that holds local token t (0 <= t < num_tokens): the largest i < num_seqs with
// cu_seqlens[i] / cp_size <= t, which skips empty sequences. Binary search; `read(i)` returns
// cu_seqlens[i] as int64 and is only called for 0 < i < num_seqs, so any values are memory-safe
// (invalid ones give some sequence, which the callers' checks then refuse).
template <typename Read>
ROPE_HOST_DEVICE inline int64_t packed_sequence_of(int64_t num_seqs, int64_t cp_size, int64_t t,
                                                   const Read& read) {
  int64_t lo = 0;
  int64_t hi = num_seqs;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    const int64_t start = read(mid);
    if ((cp_size == 1 ? start : start / cp_size) <= t) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

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
  // Multi-axis positions (TableArgs::axes.num_axes > 0): elements between axis a and axis a + 1
  // of one row's positions, which then sit at positions + pos_offset + a * axis_stride.
  int64_t axis_stride = 0;
  // The position source: kTensor reads `positions`; kPacked and kIndex read `packed` (see
  // PositionKind), with positions == nullptr.
  PositionKind position_kind = PositionKind::kTensor;
  PackedSequenceArgs packed;
};

// Multi-axis positions (M-RoPE): the most axes a position may have. Qwen2-VL, Qwen3-VL and
// GLM-4V use 3 (time, height, width), 2-D vision RoPE uses 2.
constexpr int kMaxAxes = 4;

// Which axis of a multi-axis position each plane takes its angle from (mrope_section and
// mrope_interleaved of the ops). num_axes == 0 means one-axis positions: every plane reads the
// one position of its row, and positions have no axis dim.
struct AxisMap {
  int32_t num_axes = 0;
  // false: contiguous runs (Qwen2-VL, Qwen2.5-VL, GLM-4V): planes [0, sections[0]) read axis 0,
  // the next sections[1] planes axis 1, and so on. true (Qwen3-VL, num_axes == 3): plane k reads
  // axis 1 if k % 3 == 1 and k < 3 * sections[1], axis 2 if k % 3 == 2 and k < 3 * sections[2],
  // else axis 0.
  bool interleaved = false;
  int64_t sections[kMaxAxes] = {};  // planes per axis; they add up to rotary_dim / 2
};

// The axis plane k (0 <= k < rotary_dim / 2) of a multi-axis rotation reads.
ROPE_HOST_DEVICE inline int32_t axis_of_plane(const AxisMap& m, int64_t k) {
  if (m.interleaved) {
    const int64_t r = k % 3;
    if (r == 1 && k < 3 * m.sections[1]) {
      return 1;
    }
    if (r == 2 && k < 3 * m.sections[2]) {
      return 2;
    }
    return 0;
  }
  int32_t a = 0;
  int64_t end = m.sections[0];
  while (k >= end && a + 1 < m.num_axes) {
    ++a;
    end += m.sections[a];
  }
  return a;
}

// The frequency form's angle source (table-free): plane k at position p turns by the exact
// real number p * freqs[k * freq_stride] (csrc/common_exact_angle.h), scaled by the attention
// factor. attention_factor is for the double paths; af_hi + af_lo is the same value as a
// float-float, for the FP32-only CUDA path.
struct FrequencyArgs {
  const double* freqs = nullptr;  // rotary_dim / 2 float64 values
  int64_t freq_stride = 1;
  double attention_factor = 1.0;
  float af_hi = 1.0f;
  float af_lo = 0.0f;
};

// The angle source, shared by q and k: the cos/sin tables [max_seq_len, rotary_dim / 2] (row
// stride table_stride), or, when use_frequencies is set, the frequencies (cos and sin null;
// max_seq_len is then no bound: positions need only be >= 0).
struct TableArgs {
  const void* cos = nullptr;
  const void* sin = nullptr;
  bool tables_are_double = false;  // float32 (default) or float64
  int64_t max_seq_len = 0;
  int64_t table_stride = 0;  // elements between consecutive positions' rows
  AxisMap axes;              // multi-axis positions: which axis each plane reads
  FrequencyArgs frequencies;
  // CPU: float64 tables of exact angles (the frequency form's compact tables), rotated in double
  // and rounded once to the storage type, whatever it is (the table form rotates 16- and 32-bit
  // storage in float).
  bool exact_rotation = false;
  // The angle source is the frequencies. A flag, not `frequencies.freqs != nullptr`: an empty
  // freqs (rotary_dim 0) freshly allocated has a null data pointer, and is still the frequency
  // form (which then rotates nothing and needs no tables).
  bool use_frequencies = false;
  ROPE_HOST_DEVICE bool from_frequencies() const { return use_frequencies; }
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
