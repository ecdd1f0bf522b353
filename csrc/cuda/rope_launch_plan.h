// SPDX-License-Identifier: BSD-3-Clause
// Launch planning of the CUDA kernel: which path each part of each tensor takes, how rows map to
// threads, and the grid. Plain C++ with no CUDA runtime and no torch, so the plans are unit-tested
// on any machine (tests/cpp/test_launch_plan.cpp) and the host run of the kernel
// (tests/cuda_host) plans exactly as the .cu glue does. The device code is rope_kernel.cuh.
//
// How the work is cut
// -------------------
// A *lane* is the part of one row a thread owns. A row's lanes are, in order:
//   - rotating lanes, on the vector path 16 bytes of x per access (interleaved: whole (a, b)
//     pairs; half split: 16 bytes from each half, i.e. the a's and the b's of the same planes),
//     on the paired path 4 bytes per access (16-bit storage only; interleaved: one (a, b)
//     plane; half split: two consecutive a's and the matching two b's), on the scalar path one
//     plane, one element per access;
//   - vector copy lanes (rows written out of place only): 16 bytes of the tail
//     [rotary_dim, head_dim) each;
//   - pair copy lanes (16-bit storage): 4 bytes (two elements) each of what the vector copy
//     lanes leave;
//   - scalar copy lanes: what is left of the tail, one element each.
// A row with no lane at all (in place with rotary_dim == 0) still gets one lane that only range
// checks its position, as the CPU backend does for every row.
//
// Three access widths, decided per tensor (q and k of apply_qk may differ) and per part:
//   - 16 bytes (Access::kVector): the rotated part when the rows and its run of features are
//     16-byte aligned; the tail when, moreover, it starts on a 16-byte boundary.
//   - 4 bytes (Access::kPair), bf16 / fp16 only: where 16 bytes do not hold but 4 do: rows
//     4-byte aligned (both base pointers at an even element, every row stride even) and, for a
//     half-split rotation, half = rotary_dim / 2 even (so the b's are 4-byte aligned too; an
//     interleaved plane (2k, 2k+1) always is). The rest of the tail after any vector copy lanes
//     starts at an even feature (rotary_dim and the vector width are even), so it is paired on
//     4-byte aligned rows. Typical: a k slice of a fused qkv projection, or a storage offset of
//     a few elements, which only 2-byte accesses could reach before.
//   - one element (Access::kScalar): everything else (odd offsets or strides, an odd half split
//     half), and the last element of an odd tail.
// So a misaligned k never pulls q off a wider path, and an odd tail never pulls the rotated part
// off one. The 16-byte rotation exists only in the vector kernel variant (wants_vector_kernel);
// the paired and scalar paths exist in both variants, so the variant still follows only whether
// q or k rotates 16 bytes at a time.
//
// The row dims (RowGeometry) are split into *token* dims, along which positions change, and up to
// two *shared* dims whose position stride is 0 (heads; also batch when positions are (S,)). One
// thread owns one lane of one token over up to kMaxRowsPerThread consecutive shared rows: it
// reads the position and that lane's cos/sin once, keeps them in registers and walks the rows
// that share them. A multi-axis position (M-RoPE) is read once too, every axis of it, and each
// plane's cos/sin comes from the table row of its axis (TablePlan::axes). When nothing
// broadcasts, every row is its own token and a thread does one row.
//
// Thread w of a tensor decodes as w = (row_group * num_tokens + token) * lanes + lane: lanes are
// fastest, so a warp reads whole rows (several consecutive tokens' rows when head_dim is small)
// and every 32-byte sector it touches is fully used. q and k of apply_qk are the two tensors of
// one launch: the first blocks serve q, the rest k, so the branch is uniform per block.
//
// Indexing is int64 throughout (offsets, products of sizes and strides).
#pragma once

#include <cstdint>

#include "../common_kernel_args.h"

// Tuning knobs, overridable at compile time (scripts/gpu_check.sh builds variants to compare).
// Rows whose loads one thread issues before it computes and stores any of them.
#ifndef ROPE_CUDA_ROW_BATCH
#define ROPE_CUDA_ROW_BATCH 4
#endif
// Upper bound on the shared rows one thread walks with one cos/sin load.
#ifndef ROPE_CUDA_MAX_ROWS_PER_THREAD
#define ROPE_CUDA_MAX_ROWS_PER_THREAD 8
#endif

namespace rope::cuda {

constexpr int kBlockThreads = 256;
// 4 rows of 16 bytes (32 half split) in flight per thread cover DRAM latency at moderate
// occupancy; fewer rows need fewer registers, so more threads are resident.
constexpr int kRowBatch = ROPE_CUDA_ROW_BATCH;
// More rows per thread would save little table traffic (cos/sin rows mostly hit L1/L2) and make
// the last wave of blocks longer.
constexpr int64_t kMaxRowsPerThread = ROPE_CUDA_MAX_ROWS_PER_THREAD;
// Bytes moved by one access of the vector path: one 128-bit load or store.
constexpr int64_t kVectorBytes = 16;
// Bytes moved by one access of the paired path: one 32-bit load or store of two 16-bit elements.
constexpr int64_t kPairBytes = 4;

// The access width of a part of a row (see "How the work is cut").
enum class Access : int32_t {
  kScalar = 0,  // one element per access
  kPair = 1,    // kPairBytes: two elements, bf16 / fp16 storage only
  kVector = 2,  // kVectorBytes
};

constexpr int64_t access_bytes(Access a, int storage_bytes) {
  return a == Access::kVector ? kVectorBytes : a == Access::kPair ? kPairBytes : storage_bytes;
}

static_assert(kRowBatch >= 1 && kMaxRowsPerThread >= 1, "rope: bad CUDA tuning knobs");

// ---- the kernel's parameter block (built here, passed by value to the kernel) ---------------

// One rotated tensor (x, q or k) in the shape the kernel walks it. Element types are erased; the
// kernel template knows them.
struct TensorPlan {
  const void* in = nullptr;         // [..., head_dim], last dim stride 1
  void* out = nullptr;              // [..., head_dim], last dim stride 1; may alias `in`
  const void* positions = nullptr;  // int32 or int64, addressed through token_pos_strides
  int64_t num_threads = 0;          // threads this tensor needs; 0: nothing to do
  int64_t lanes = 0;                // per row: rotating, then vector, pair and scalar copy lanes
  int64_t rot_lanes = 0;
  int64_t vec_copy_lanes = 0;     // tail lanes of kVectorBytes each, from feature rotary_dim on
  int64_t pair_copy_lanes = 0;    // tail lanes of kPairBytes each, after the vector ones
  int64_t scalar_copy_lanes = 0;  // tail lanes of one element each, after the pair ones
  int64_t rotary_dim = 0;
  // Token dims, outermost first: walked once per thread by unravelling the token index.
  int64_t num_tokens = 1;
  int64_t token_sizes[kMaxRowDims] = {};
  int64_t token_in_strides[kMaxRowDims] = {};
  int64_t token_out_strides[kMaxRowDims] = {};
  int64_t token_pos_strides[kMaxRowDims] = {};
  // Shared dims (position stride 0), as an (outer, inner) pair; size 1 and stride 0 where absent.
  int64_t shared_rows = 1;   // outer size * inner size
  int64_t shared_inner = 1;  // inner size
  int64_t shared_in_outer = 0;
  int64_t shared_in_inner = 0;
  int64_t shared_in_wrap = 0;  // in offset step when the inner index wraps to the next outer one
  int64_t shared_out_outer = 0;
  int64_t shared_out_inner = 0;
  int64_t shared_out_wrap = 0;
  int64_t rows_per_thread = 1;  // shared rows one thread walks (<= kMaxRowsPerThread)
  int32_t token_ndim = 0;
  // Multi-axis positions (TablePlan::axes.num_axes > 0): elements between axis a and a + 1 of
  // one token's positions, which sit at positions + pos_off + a * axis_stride.
  int64_t axis_stride = 0;
  Access rot_access = Access::kScalar;  // of the rotating lanes; kVector only in a vector kernel
  bool positions_are_int64 = true;
  // The position source (common_kernel_args.h): kTensor reads `positions`; kPacked computes the
  // position of token pos_off from `packed` (the token dims' position strides are then virtual:
  // 1 along x's token dim).
  PositionKind position_kind = PositionKind::kTensor;
  PackedSequenceArgs packed;
};

struct TablePlan {
  const void* cos = nullptr;  // [max_seq_len, rotary_dim / 2], row stride `stride`
  const void* sin = nullptr;
  int64_t max_seq_len = 0;
  int64_t stride = 0;
  // Every vector lane's cos/sin slice is aligned for vector loads. For 16-bit storage this also
  // covers a half-split pair lane's two planes: its slice starts at an even plane and the piece
  // behind this flag is >= 2 values. Multi-axis positions keep the column of each plane, so the
  // slices are those of one-axis ones; the kernel vector-loads a lane's slice only when all its
  // planes read one axis (one table row), and loads plane by plane otherwise.
  bool vector_loads = false;
  // Which axis of a multi-axis position each plane reads; num_axes == 0 for one-axis positions,
  // whose path in the kernel is the one-axis code behind a uniform branch.
  AxisMap axes;
  // The frequency form (rope_freqs_kernel): cos and sin are null, plane k turns by
  // position * frequencies.freqs[k * freq_stride], positions need only be >= 0.
  bool from_frequencies = false;
  FrequencyArgs frequencies;
};

struct KernelParams {
  TensorPlan tensor[2];      // x (or q), and k for apply_qk
  int64_t first_blocks = 0;  // blocks [0, first_blocks) serve tensor[0], the rest tensor[1]
  TablePlan tables;
  bool inverse = false;
};

// ---- what the plan is made from ----------------------------------------------------------------

// The two numbers of the device the plan needs. The .cu glue asks the runtime for them
// (multiProcessorCount, cudaOccupancyMaxActiveBlocksPerMultiprocessor of the chosen kernel); the
// host run and the unit tests pass whatever they want to exercise.
struct DeviceShape {
  int num_sms = 1;
  int resident_blocks_per_sm = 1;  // of the kernel variant being launched
};

// The storage and table element sizes in bytes: 8 (double), 4 (float) or 2 (half, bfloat16).
struct ElementSizes {
  int storage = 4;
  int table = 4;
};

// The shape of one lane of a path. The kernel's rotating lanes (RotLane) take theirs from here.
struct LaneShape {
  int64_t elems;   // storage elements per access
  int64_t planes;  // planes one rotating lane turns: cos/sin values it keeps in registers
};

// Interleaved, an access of `elems` holds elems / 2 whole planes (a scalar lane's one plane takes
// two accesses); half split, one access holds `elems` a's and another the matching b's.
constexpr LaneShape lane_shape(Access a, int storage_bytes, bool interleaved) {
  const int64_t elems = access_bytes(a, storage_bytes) / storage_bytes;
  return {elems, !interleaved ? elems : elems >= 2 ? elems / 2 : 1};
}

constexpr LaneShape vector_lane(int storage_bytes, bool interleaved) {
  return lane_shape(Access::kVector, storage_bytes, interleaved);
}

// Table values one vector load covers for a lane of `planes` planes: at most 16 bytes.
constexpr int64_t table_piece(int table_bytes, int64_t planes) {
  const int64_t most = kVectorBytes / table_bytes;
  return planes < most ? planes : most;
}

// The paths and lanes of one tensor.
struct TensorPaths {
  Access rot_access = Access::kScalar;
  int64_t rot_lanes = 0;
  int64_t vec_copy_lanes = 0;
  int64_t pair_copy_lanes = 0;
  int64_t scalar_copy_lanes = 0;
  int64_t lanes = 0;  // sum of the above, or 1 (a position-check lane) when that is 0
};

inline bool aligned_to(const void* p, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0;
}

// Whether accesses of `bytes` (16 or 4) at feature offsets that are multiples of `bytes` are
// aligned in every row of `a`: both base pointers and every row stride that is ever stepped.
inline bool rows_aligned_to(const RotationArgs& a, int storage_bytes, int64_t bytes) {
  const int64_t elems = bytes / storage_bytes;
  if (elems < 2 || !aligned_to(a.in, bytes) || !aligned_to(a.out, bytes)) {
    return false;  // (an access of `bytes` that is not several elements is no wider path)
  }
  for (int32_t d = 0; d < a.geometry.ndim; ++d) {
    if (a.geometry.in_strides[d] % elems != 0 || a.geometry.out_strides[d] % elems != 0) {
      return false;
    }
  }
  return true;
}

// Decides the path of each part of `a` (see "How the work is cut"). `vector_kernel` says whether
// the kernel being launched has the 16-byte rotation at all; without it a rotating lane is at
// most paired.
inline TensorPaths plan_paths(const RotationArgs& a, int storage_bytes, bool interleaved,
                              bool vector_kernel) {
  TensorPaths p;
  if (a.geometry.num_rows == 0) {
    return p;  // nothing is read or written
  }
  const LaneShape v = lane_shape(Access::kVector, storage_bytes, interleaved);
  const LaneShape w = lane_shape(Access::kPair, storage_bytes, interleaved);
  const bool rows_vector = rows_aligned_to(a, storage_bytes, kVectorBytes);
  // Only 16-bit storage has a paired path: for wider elements 4 bytes are at most one.
  const bool rows_pair = storage_bytes == 2 && rows_aligned_to(a, storage_bytes, kPairBytes);
  const int64_t half = a.rotary_dim / 2;
  // Interleaved, a lane's run is its pairs; half split, the same planes' a's and b's, which start
  // half apart, so half must be a whole number of accesses as well.
  const int64_t run = interleaved ? a.rotary_dim : half;
  if (half > 0 && vector_kernel && rows_vector && run % v.elems == 0) {
    p.rot_access = Access::kVector;
    p.rot_lanes = half / v.planes;
  } else if (half > 0 && rows_pair && run % w.elems == 0) {
    p.rot_access = Access::kPair;
    p.rot_lanes = half / w.planes;
  } else {
    p.rot_access = Access::kScalar;
    p.rot_lanes = half;
  }
  const int64_t tail = a.copy_tail ? a.head_dim - a.rotary_dim : 0;
  if (rows_vector && a.rotary_dim % v.elems == 0) {
    p.vec_copy_lanes = tail / v.elems;
  }
  const int64_t rest = tail - p.vec_copy_lanes * v.elems;
  if (rows_pair && (a.rotary_dim + p.vec_copy_lanes * v.elems) % w.elems == 0) {
    p.pair_copy_lanes = rest / w.elems;
  }
  p.scalar_copy_lanes = rest - p.pair_copy_lanes * w.elems;
  p.lanes = p.rot_lanes + p.vec_copy_lanes + p.pair_copy_lanes + p.scalar_copy_lanes;
  if (p.lanes == 0) {
    p.lanes = 1;  // nothing to write: one lane per row range-checks the position
  }
  return p;
}

// Which kernel variant a call needs: the vector one when any tensor rotates on the 16-byte path.
// The scalar-only variant has no 16-byte rotation and fewer registers, so more threads resident;
// it keeps the paired and scalar rotations (a paired q or k does not need the vector variant).
inline bool wants_vector_kernel(const RotationArgs& first, const RotationArgs* second,
                                ElementSizes sizes, bool interleaved) {
  const auto rotates_vectors = [&](const RotationArgs& a) {
    return plan_paths(a, sizes.storage, interleaved, true).rot_access == Access::kVector;
  };
  return rotates_vectors(first) || (second != nullptr && rotates_vectors(*second));
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Fills the walk of tensor `a` on paths `paths`; rows_per_thread is the shared rows a thread is
// asked to walk.
inline TensorPlan plan_tensor(const RotationArgs& a, const TensorPaths& paths,
                              int64_t rows_per_thread) {
  TensorPlan p;
  const RowGeometry& g = a.geometry;
  if (g.num_rows == 0) {
    return p;  // num_threads stays 0
  }
  p.in = a.in;
  p.out = a.out;
  p.positions = a.positions;
  p.positions_are_int64 = a.positions_are_int64;
  p.lanes = paths.lanes;
  p.rot_lanes = paths.rot_lanes;
  p.vec_copy_lanes = paths.vec_copy_lanes;
  p.pair_copy_lanes = paths.pair_copy_lanes;
  p.scalar_copy_lanes = paths.scalar_copy_lanes;
  p.rot_access = paths.rot_access;
  p.rotary_dim = a.rotary_dim;
  p.axis_stride = a.axis_stride;
  p.position_kind = a.position_kind;
  p.packed = a.packed;

  // The two innermost dims along which positions broadcast become the shared dims; any further
  // broadcast dims stay token dims (correct, just without reuse along them).
  int32_t inner = -1;
  int32_t outer = -1;
  for (int32_t d = g.ndim - 1; d >= 0; --d) {
    if (g.pos_strides[d] != 0) {
      continue;
    }
    if (inner < 0) {
      inner = d;
    } else {
      outer = d;
      break;
    }
  }
  if (inner >= 0) {
    p.shared_inner = g.row_sizes[inner];
    p.shared_in_inner = g.in_strides[inner];
    p.shared_out_inner = g.out_strides[inner];
  }
  const int64_t outer_size = outer >= 0 ? g.row_sizes[outer] : 1;
  if (outer >= 0) {
    p.shared_in_outer = g.in_strides[outer];
    p.shared_out_outer = g.out_strides[outer];
  }
  p.shared_rows = outer_size * p.shared_inner;
  p.shared_in_wrap = p.shared_in_outer - p.shared_inner * p.shared_in_inner;
  p.shared_out_wrap = p.shared_out_outer - p.shared_inner * p.shared_out_inner;

  // Every other dim is a token dim, outermost first.
  p.token_ndim = 0;
  p.num_tokens = 1;
  for (int32_t d = 0; d < g.ndim; ++d) {
    if (d == inner || d == outer) {
      continue;
    }
    const int32_t n = p.token_ndim++;
    p.token_sizes[n] = g.row_sizes[d];
    p.token_in_strides[n] = g.in_strides[d];
    p.token_out_strides[n] = g.out_strides[d];
    p.token_pos_strides[n] = g.pos_strides[d];
    p.num_tokens *= g.row_sizes[d];
  }

  // Spread the shared rows evenly over the row groups that rows_per_thread calls for (12 heads
  // at up to 8 rows: 6 + 6, not 8 + 4). Never more rows per thread than asked, and no group is
  // empty: (groups - 1) * rows < shared_rows.
  const int64_t asked = rows_per_thread < p.shared_rows ? rows_per_thread : p.shared_rows;
  p.rows_per_thread = ceil_div(p.shared_rows, ceil_div(p.shared_rows, asked));
  const int64_t row_groups = ceil_div(p.shared_rows, p.rows_per_thread);
  p.num_threads = p.num_tokens * p.lanes * row_groups;
  return p;
}

// A complete launch: kernel parameters, grid size, and the variant they are for.
struct LaunchPlan {
  KernelParams params;
  int64_t blocks = 0;  // 0: nothing to do, do not launch
  bool vector_kernel = false;
};

// Plans the launch of `first` and, if not null, `second` (apply_qk) on the kernel variant
// `vector_kernel` (see wants_vector_kernel) of a device shaped `device`.
inline LaunchPlan plan_launch(const RotationArgs& first, const RotationArgs* second,
                              const TableArgs& tables, RotationMode mode, ElementSizes sizes,
                              bool vector_kernel, DeviceShape device) {
  LaunchPlan plan;
  plan.vector_kernel = vector_kernel;
  TensorPaths paths[2];
  paths[0] = plan_paths(first, sizes.storage, mode.interleaved, vector_kernel);
  int64_t lane_rows = first.geometry.num_rows * paths[0].lanes;
  if (second != nullptr) {
    paths[1] = plan_paths(*second, sizes.storage, mode.interleaved, vector_kernel);
    lane_rows += second->geometry.num_rows * paths[1].lanes;
  }
  // Threads first: one row per thread until there is a full wave of resident threads, then more
  // rows per thread (more cos/sin reuse, fewer index computations), up to kMaxRowsPerThread. A
  // power of two, so that it divides typical head counts and fills whole batches of kRowBatch.
  const int64_t sms = device.num_sms > 0 ? device.num_sms : 1;
  const int64_t resident = device.resident_blocks_per_sm > 0 ? device.resident_blocks_per_sm : 1;
  const int64_t wave = sms * resident * kBlockThreads;
  int64_t rows_per_thread = 1;
  while (rows_per_thread < kMaxRowsPerThread && 2 * rows_per_thread * wave <= lane_rows) {
    rows_per_thread *= 2;
  }
  // The frequency form computes each lane's angles itself, which costs several rows' rotations:
  // a thread takes as many of a token's shared rows (heads) as it may, whatever the wave.
  if (tables.from_frequencies()) {
    rows_per_thread = kMaxRowsPerThread;
  }

  KernelParams& params = plan.params;
  params.tensor[0] = plan_tensor(first, paths[0], rows_per_thread);
  if (second != nullptr) {
    params.tensor[1] = plan_tensor(*second, paths[1], rows_per_thread);
  }
  const LaneShape v = vector_lane(sizes.storage, mode.interleaved);
  const int64_t piece = table_piece(sizes.table, v.planes);
  params.tables.cos = tables.cos;
  params.tables.sin = tables.sin;
  params.tables.max_seq_len = tables.max_seq_len;
  params.tables.stride = tables.table_stride;
  params.tables.axes = tables.axes;
  params.tables.from_frequencies = tables.from_frequencies();
  params.tables.frequencies = tables.frequencies;
  // A vector lane's slice starts at a multiple of `planes`, which is a multiple of `piece`.
  params.tables.vector_loads =
      piece > 1 && !tables.from_frequencies() && aligned_to(tables.cos, piece * sizes.table) &&
      aligned_to(tables.sin, piece * sizes.table) && tables.table_stride % piece == 0;
  params.inverse = mode.inverse;
  params.first_blocks = ceil_div(params.tensor[0].num_threads, kBlockThreads);
  plan.blocks = params.first_blocks + ceil_div(params.tensor[1].num_threads, kBlockThreads);
  return plan;
}

}  // namespace rope::cuda
