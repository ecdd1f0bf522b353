// Rotary position embedding on CUDA: the kernel and its launcher, free of torch.
//
// Like FlashInfer's include/flashinfer/pos_enc.cuh, this header sees only raw pointers, int64
// element strides and a cudaStream_t, and reports failure as a cudaError_t. The torch glue
// (rope_cuda.cu) validates the tensors, fills the structs of kernel_args.h, picks the stream and
// turns the status into an error. It computes exactly the function of the CPU kernel
// (csrc/cpu/rotate_rows.cpp): plane k is (2k, 2k+1) interleaved or (k, k + rotary_dim/2) half
// split; x'_a = a cos - b sin, x'_b = a sin + b cos; `inverse` negates sin; features
// [rotary_dim, head_dim) are copied when copy_tail; math in float (double for double storage).
//
// How the work is cut
// -------------------
// A *lane* is the part of one row a thread owns. On the vector path (16-byte loads and stores):
// interleaved, 16 bytes of x, which hold whole (a, b) pairs; half split, 16 bytes from each half,
// i.e. the a's and the b's of the same planes. On the scalar path: one plane. Rows written out of
// place have extra *copy lanes* after the rotating ones that move the tail [rotary_dim, head_dim)
// 16 bytes (scalar path: one element) at a time.
//
// The row dims (RowGeometry) are split into *token* dims, along which positions change, and up to
// two *shared* dims whose position stride is 0 (heads; also batch when positions are (S,)). One
// thread owns one lane of one token over up to kMaxRowsPerThread consecutive shared rows: it
// reads the position and that lane's cos/sin once, keeps them in registers and walks the rows
// that share them. When nothing broadcasts, every row is its own token and a thread does one row:
// the same code is then the generic fallback.
//
// Thread w decodes as w = (slice * num_tokens + token) * lanes + lane: lanes are fastest, so a
// warp reads whole rows (several consecutive tokens' rows when head_dim is small) and every
// 32-byte sector it touches is fully used. q and k of apply_qk are two Problems of one launch:
// the first blocks serve q, the rest k, so the branch is uniform per block.
//
// Indexing is int64 throughout (offsets, products of sizes and strides); only quotients that are
// known to fit take a 32-bit division, which is much cheaper than a 64-bit one on GPUs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cassert>
#include <cstdint>
#include <type_traits>

#include "../kernel_args.h"

// Hook for the range check of positions. The torch glue defines it as CUDA_KERNEL_ASSERT, which
// stays on in release builds, before including this header.
#ifndef ROPE_DEVICE_ASSERT
#define ROPE_DEVICE_ASSERT(cond) assert(cond)
#endif

namespace rope::cuda {
namespace kernel {

constexpr int kBlockThreads = 256;
// Rows whose loads a thread issues before it computes and stores any of them: 4 rows of 16 bytes
// (32 half split) in flight per thread is enough to cover DRAM latency at moderate occupancy.
constexpr int kRowBatch = 4;
// Upper bound on rows sharing one cos/sin load in a thread. More would save little table traffic
// (cos/sin rows mostly hit L1/L2) and make the last wave of blocks longer.
constexpr int64_t kMaxRowsPerThread = 8;
// Resident threads per SM on sm_80 and sm_90: one "full wave" of threads.
constexpr int64_t kThreadsPerSm = 2048;

// ---- launch description (built on the host, passed by value as the kernel parameter) ----------

// One rotated tensor (x, q or k) in the shape the kernel walks it. Element types are erased; the
// kernel template knows them.
struct Problem {
  const void* in = nullptr;         // [..., head_dim], last dim stride 1
  void* out = nullptr;              // [..., head_dim], last dim stride 1; may alias `in`
  const void* positions = nullptr;  // int32 or int64, addressed through token_pos_strides
  int64_t work = 0;                 // threads this tensor needs; 0: nothing to do
  int64_t lanes = 0;                // lanes per row: rot_lanes rotating ones, then copy lanes
  int64_t rot_lanes = 0;
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
  bool positions_are_int64 = true;
};

struct Tables {
  const void* cos = nullptr;  // [max_seq_len, rotary_dim / 2], row stride `stride`
  const void* sin = nullptr;
  int64_t max_seq_len = 0;
  int64_t stride = 0;
  bool vector_loads = false;  // every lane's cos/sin slice is aligned for vector loads
};

struct Params {
  Problem problem[2];        // x (or q), and k for apply_qk
  int64_t first_blocks = 0;  // blocks [0, first_blocks) serve problem[0], the rest problem[1]
  Tables tables;
  bool inverse = false;
};

// What a lane holds, per storage type, layout and path.
template <typename scalar_t, bool kInterleaved, bool kVector>
struct LaneShape {
  static constexpr int kVecElems = 16 / static_cast<int>(sizeof(scalar_t));
  // Planes rotated by one lane, i.e. cos/sin values a thread keeps in registers.
  static constexpr int kPlanes = !kVector ? 1 : (kInterleaved ? kVecElems / 2 : kVecElems);
  // Contiguous elements per access: interleaved one run of (a, b) pairs, half split one run from
  // each half.
  static constexpr int kRotElems = kInterleaved ? 2 * kPlanes : kPlanes;
  static constexpr int kTailElems = kVector ? kVecElems : 1;
};

// ---- device helpers ----------------------------------------------------------------------------

template <typename T>
struct AccType {
  using type = float;
};
template <>
struct AccType<double> {
  using type = double;
};

__device__ __forceinline__ float to_acc(float v) { return v; }
__device__ __forceinline__ double to_acc(double v) { return v; }
__device__ __forceinline__ float to_acc(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }

// Round to nearest even, as c10::Half / c10::BFloat16 do on the CPU.
template <typename T, typename A>
__device__ __forceinline__ T from_acc(A v) {
  if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(v);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(v);
  } else {
    return v;
  }
}

template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// x is loaded with plain (coherent) loads, not __ldg: for rope.apply_ the same kernel writes it.
template <bool kVector, typename T, int N>
__device__ __forceinline__ void load_elems(const T* p, T (&dst)[N]) {
  if constexpr (kVector) {
    static_assert(sizeof(T) * N == 16, "the vector path moves exactly 16 bytes per access");
    const Pack<T, N> v = *reinterpret_cast<const Pack<T, N>*>(p);
#pragma unroll
    for (int j = 0; j < N; ++j) {
      dst[j] = v.v[j];
    }
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) {
      dst[j] = p[j];
    }
  }
}

template <bool kVector, typename T, int N>
__device__ __forceinline__ void store_elems(T* p, const T (&src)[N]) {
  if constexpr (kVector) {
    static_assert(sizeof(T) * N == 16, "the vector path moves exactly 16 bytes per access");
    Pack<T, N> v;
#pragma unroll
    for (int j = 0; j < N; ++j) {
      v.v[j] = src[j];
    }
    *reinterpret_cast<Pack<T, N>*>(p) = v;
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) {
      p[j] = src[j];
    }
  }
}

// One aligned read-only vector of N table values (N * sizeof(T) <= 16).
template <typename T, int N>
__device__ __forceinline__ void ldg_pack(const T* p, T* dst) {
  if constexpr (std::is_same_v<T, float> && N == 4) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(p));
    dst[0] = v.x;
    dst[1] = v.y;
    dst[2] = v.z;
    dst[3] = v.w;
  } else if constexpr (std::is_same_v<T, float> && N == 2) {
    const float2 v = __ldg(reinterpret_cast<const float2*>(p));
    dst[0] = v.x;
    dst[1] = v.y;
  } else {
    static_assert(std::is_same_v<T, double> && N == 2, "no vector load for this table slice");
    const double2 v = __ldg(reinterpret_cast<const double2*>(p));
    dst[0] = v.x;
    dst[1] = v.y;
  }
}

// Table values a table_t vector load covers for a lane of N planes.
template <typename table_t, int N>
constexpr int table_piece() {
  constexpr int kMax = 16 / static_cast<int>(sizeof(table_t));
  return N < kMax ? N : kMax;
}

// N consecutive cos (or sin) values of one table row, converted to the math type. Tables are
// read-only for the whole launch, so they go through the non-coherent (__ldg) path.
template <int N, typename table_t, typename acc_t>
__device__ __forceinline__ void load_table(const table_t* __restrict__ p, bool vector_loads,
                                           acc_t (&dst)[N]) {
  constexpr int kPiece = table_piece<table_t, N>();
  table_t raw[N];
  bool done = false;
  if constexpr (kPiece > 1) {
    if (vector_loads) {
#pragma unroll
      for (int i = 0; i < N; i += kPiece) {
        ldg_pack<table_t, kPiece>(p + i, raw + i);
      }
      done = true;
    }
  }
  if (!done) {
#pragma unroll
    for (int j = 0; j < N; ++j) {
      raw[j] = __ldg(p + j);
    }
  }
#pragma unroll
  for (int j = 0; j < N; ++j) {
    dst[j] = static_cast<acc_t>(raw[j]);
  }
}

struct QuotRem {
  int64_t quot;
  int64_t rem;
};

// n / d and n % d for n >= 0, d > 0.
__device__ __forceinline__ QuotRem div_rem(int64_t n, int64_t d) {
  if ((static_cast<uint64_t>(n) | static_cast<uint64_t>(d)) <= 0xffffffffull) {
    const uint32_t n32 = static_cast<uint32_t>(n);
    const uint32_t d32 = static_cast<uint32_t>(d);
    const uint32_t q32 = n32 / d32;
    return {static_cast<int64_t>(q32), static_cast<int64_t>(n32 - q32 * d32)};
  }
  const int64_t q = n / d;
  return {q, n - q * d};
}

// Offsets of the current shared row of a thread; stepping is additions only.
struct RowWalker {
  int64_t in;
  int64_t out;
  int64_t inner;  // index along the inner shared dim

  __device__ __forceinline__ void step(const Problem& pr) {
    in += pr.shared_in_inner;
    out += pr.shared_out_inner;
    if (++inner == pr.shared_inner) {
      inner = 0;
      in += pr.shared_in_wrap;
      out += pr.shared_out_wrap;
    }
  }
};

// Rotates one lane of rows [h_begin, h_end) of one token.
template <typename scalar_t, typename table_t, bool kInterleaved, bool kVector>
__device__ __forceinline__ void rotate_lane(const Problem& pr, const Tables& tb, bool inverse,
                                            int64_t lane, int64_t pos_off, RowWalker walker,
                                            int64_t h_begin, int64_t h_end) {
  using Shape = LaneShape<scalar_t, kInterleaved, kVector>;
  using acc_t = typename AccType<scalar_t>::type;
  constexpr int P = Shape::kPlanes;
  constexpr int E = Shape::kRotElems;

  const auto* in = static_cast<const scalar_t*>(pr.in);
  auto* out = static_cast<scalar_t*>(pr.out);
  // Feature of this lane's first a. Interleaved, its b's are in the same run; half split, they
  // start rotary_dim / 2 further on.
  const int64_t a_feature = kInterleaved ? lane * (2 * P) : lane * P;
  [[maybe_unused]] const int64_t b_feature = a_feature + pr.rotary_dim / 2;  // half split only

  acc_t c[P];
  acc_t s[P];
  bool have_angles = false;
  for (int64_t h = h_begin; h < h_end; h += kRowBatch) {
    int64_t src[kRowBatch];
    int64_t dst[kRowBatch];
#pragma unroll
    for (int u = 0; u < kRowBatch; ++u) {
      src[u] = walker.in;
      dst[u] = walker.out;
      walker.step(pr);  // past h_end only offsets that are never used
    }
    // Every load of the batch before any store: independent loads in flight, and reading a
    // row fully before writing it keeps in == out (rope.apply_) correct.
    scalar_t xa[kRowBatch][E];
    [[maybe_unused]] scalar_t xb[kRowBatch][E];
#pragma unroll
    for (int u = 0; u < kRowBatch; ++u) {
      if (h + u < h_end) {
        load_elems<kVector>(in + src[u] + a_feature, xa[u]);
        if constexpr (!kInterleaved) {
          load_elems<kVector>(in + src[u] + b_feature, xb[u]);
        }
      }
    }
    // The angles after the first x loads, so their latency overlaps those loads.
    if (!have_angles) {
      const int64_t pos =
          pr.positions_are_int64
              ? static_cast<int64_t>(__ldg(static_cast<const long long*>(pr.positions) + pos_off))
              : static_cast<int64_t>(__ldg(static_cast<const int*>(pr.positions) + pos_off));
      ROPE_DEVICE_ASSERT(pos >= 0 && pos < tb.max_seq_len);
      if (pos < 0 || pos >= tb.max_seq_len) {
        return;  // assertions compiled out: write nothing rather than read outside the tables
      }
      const int64_t row = pos * tb.stride + lane * P;
      load_table<P>(static_cast<const table_t*>(tb.cos) + row, tb.vector_loads, c);
      load_table<P>(static_cast<const table_t*>(tb.sin) + row, tb.vector_loads, s);
      if (inverse) {
#pragma unroll
        for (int j = 0; j < P; ++j) {
          s[j] = -s[j];
        }
      }
      have_angles = true;
    }
#pragma unroll
    for (int u = 0; u < kRowBatch; ++u) {
      if (h + u < h_end) {
        scalar_t ya[E];
        [[maybe_unused]] scalar_t yb[E];
#pragma unroll
        for (int j = 0; j < P; ++j) {
          if constexpr (kInterleaved) {
            const acc_t a = to_acc(xa[u][2 * j]);
            const acc_t b = to_acc(xa[u][2 * j + 1]);
            ya[2 * j] = from_acc<scalar_t>(a * c[j] - b * s[j]);
            ya[2 * j + 1] = from_acc<scalar_t>(a * s[j] + b * c[j]);
          } else {
            const acc_t a = to_acc(xa[u][j]);
            const acc_t b = to_acc(xb[u][j]);
            ya[j] = from_acc<scalar_t>(a * c[j] - b * s[j]);
            yb[j] = from_acc<scalar_t>(a * s[j] + b * c[j]);
          }
        }
        store_elems<kVector>(out + dst[u] + a_feature, ya);
        if constexpr (!kInterleaved) {
          store_elems<kVector>(out + dst[u] + b_feature, yb);
        }
      }
    }
  }
}

// Copies one lane of the tail [rotary_dim, head_dim) of rows [h_begin, h_end) of one token.
template <typename scalar_t, bool kVector>
__device__ __forceinline__ void copy_lane(const Problem& pr, int64_t tail_lane, RowWalker walker,
                                          int64_t h_begin, int64_t h_end) {
  constexpr int E = LaneShape<scalar_t, true, kVector>::kTailElems;
  const auto* in = static_cast<const scalar_t*>(pr.in);
  auto* out = static_cast<scalar_t*>(pr.out);
  const int64_t feature = pr.rotary_dim + tail_lane * E;
  for (int64_t h = h_begin; h < h_end; h += kRowBatch) {
    int64_t src[kRowBatch];
    int64_t dst[kRowBatch];
#pragma unroll
    for (int u = 0; u < kRowBatch; ++u) {
      src[u] = walker.in;
      dst[u] = walker.out;
      walker.step(pr);
    }
    scalar_t x[kRowBatch][E];
#pragma unroll
    for (int u = 0; u < kRowBatch; ++u) {
      if (h + u < h_end) {
        load_elems<kVector>(in + src[u] + feature, x[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < kRowBatch; ++u) {
      if (h + u < h_end) {
        store_elems<kVector>(out + dst[u] + feature, x[u]);
      }
    }
  }
}

// The work of thread w of one Problem.
template <typename scalar_t, typename table_t, bool kInterleaved, bool kVector>
__device__ __forceinline__ void rope_thread(const Problem& pr, const Tables& tb, bool inverse,
                                            int64_t w) {
  if (w >= pr.work) {
    return;
  }
  const QuotRem by_lane = div_rem(w, pr.lanes);
  const int64_t lane = by_lane.rem;
  const QuotRem by_token = div_rem(by_lane.quot, pr.num_tokens);
  const int64_t slice = by_token.quot;

  // Unravel the token index over the token dims, innermost first; the outermost index is what
  // is left, so it needs no division.
  int64_t in_off = 0;
  int64_t out_off = 0;
  int64_t pos_off = 0;
  int64_t t = by_token.rem;
  for (int d = pr.token_ndim - 1; d > 0; --d) {
    const QuotRem qr = div_rem(t, pr.token_sizes[d]);
    in_off += qr.rem * pr.token_in_strides[d];
    out_off += qr.rem * pr.token_out_strides[d];
    pos_off += qr.rem * pr.token_pos_strides[d];
    t = qr.quot;
  }
  if (pr.token_ndim > 0) {
    in_off += t * pr.token_in_strides[0];
    out_off += t * pr.token_out_strides[0];
    pos_off += t * pr.token_pos_strides[0];
  }

  // This thread's shared rows.
  const int64_t h_begin = slice * pr.rows_per_thread;
  const int64_t h_stop = h_begin + pr.rows_per_thread;
  const int64_t h_end = h_stop < pr.shared_rows ? h_stop : pr.shared_rows;
  const QuotRem h = div_rem(h_begin, pr.shared_inner);
  const RowWalker walker{in_off + h.quot * pr.shared_in_outer + h.rem * pr.shared_in_inner,
                         out_off + h.quot * pr.shared_out_outer + h.rem * pr.shared_out_inner,
                         h.rem};

  if (lane < pr.rot_lanes) {
    rotate_lane<scalar_t, table_t, kInterleaved, kVector>(pr, tb, inverse, lane, pos_off, walker,
                                                          h_begin, h_end);
  } else {
    copy_lane<scalar_t, kVector>(pr, lane - pr.rot_lanes, walker, h_begin, h_end);
  }
}

// Minimum resident blocks per SM, i.e. a register budget: 3 blocks (<= 80 registers) for the
// interleaved layout, whose 4 x 16 bytes in flight per thread need the occupancy; 2 (<= 128) for
// the half split layout, which has 4 x 32 bytes in flight per thread but more live registers.
template <bool kInterleaved>
constexpr int kMinBlocksPerSm = kInterleaved ? 3 : 2;

// Thread `thread` of block `block`: blocks [0, first_blocks) serve problem[0], the rest
// problem[1]. Split from the kernel so host code can step through the exact same work.
template <typename scalar_t, typename table_t, bool kInterleaved, bool kVector>
__device__ __forceinline__ void rope_block_thread(const Params& params, int64_t block,
                                                  int64_t thread) {
  if (block < params.first_blocks) {
    rope_thread<scalar_t, table_t, kInterleaved, kVector>(params.problem[0], params.tables,
                                                          params.inverse,
                                                          block * kBlockThreads + thread);
  } else {
    rope_thread<scalar_t, table_t, kInterleaved, kVector>(
        params.problem[1], params.tables, params.inverse,
        (block - params.first_blocks) * kBlockThreads + thread);
  }
}

// __grid_constant__: the parameter block is read in place from constant memory even where the
// code indexes its arrays with a runtime index (token dims), instead of being copied to local
// memory first.
template <typename scalar_t, typename table_t, bool kInterleaved, bool kVector>
__global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSm<kInterleaved>)
    rope_kernel(const __grid_constant__ Params params) {
  rope_block_thread<scalar_t, table_t, kInterleaved, kVector>(params, blockIdx.x, threadIdx.x);
}

// ---- host side ---------------------------------------------------------------------------------

inline bool aligned_to(const void* p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// Whether every 16-byte access of the vector path is aligned: both base pointers, every row
// stride, and the lane boundaries (rotary_dim, half split rotary_dim / 2, and the tail).
template <typename scalar_t>
bool vector_path_fits(const RotationArgs& a, bool interleaved) {
  constexpr int64_t kV = 16 / static_cast<int64_t>(sizeof(scalar_t));
  if (a.geometry.num_rows == 0) {
    return true;  // nothing is read or written
  }
  if (!aligned_to(a.in, 16) || !aligned_to(a.out, 16)) {
    return false;
  }
  for (int32_t d = 0; d < a.geometry.ndim; ++d) {
    if (a.geometry.in_strides[d] % kV != 0 || a.geometry.out_strides[d] % kV != 0) {
      return false;
    }
  }
  const int64_t run = interleaved ? a.rotary_dim : a.rotary_dim / 2;
  if (run % kV != 0) {
    return false;
  }
  return !a.copy_tail || (a.head_dim - a.rotary_dim) % kV == 0;
}

template <typename table_t, int kPlanes>
bool table_vector_loads(const TableArgs& t) {
  constexpr int kPiece = table_piece<table_t, kPlanes>();
  if (kPiece == 1) {
    return false;
  }
  constexpr uintptr_t kBytes = kPiece * sizeof(table_t);
  return aligned_to(t.cos, kBytes) && aligned_to(t.sin, kBytes) && t.table_stride % kPiece == 0;
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Lanes per row of `a` for a lane shape.
template <typename Shape>
void count_lanes(const RotationArgs& a, int64_t& rot_lanes, int64_t& lanes) {
  rot_lanes = (a.rotary_dim / 2) / Shape::kPlanes;
  const int64_t tail = a.copy_tail ? a.head_dim - a.rotary_dim : 0;
  lanes = rot_lanes + tail / Shape::kTailElems;
}

// Fills `p` for tensor `a`; rows_per_thread is the thread's share of the shared rows.
inline void describe(const RotationArgs& a, int64_t rot_lanes, int64_t lanes,
                     int64_t rows_per_thread, Problem& p) {
  p = Problem{};
  const RowGeometry& g = a.geometry;
  if (g.num_rows == 0 || lanes == 0) {
    return;  // work stays 0
  }
  p.in = a.in;
  p.out = a.out;
  p.positions = a.positions;
  p.positions_are_int64 = a.positions_are_int64;
  p.lanes = lanes;
  p.rot_lanes = rot_lanes;
  p.rotary_dim = a.rotary_dim;

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

  // Spread the shared rows evenly over the slices that rows_per_thread calls for (12 heads at
  // up to 8 rows: 6 + 6, not 8 + 4). Never more rows per thread than asked, and no slice is
  // empty: (slices - 1) * rows < shared_rows.
  const int64_t asked = rows_per_thread < p.shared_rows ? rows_per_thread : p.shared_rows;
  p.rows_per_thread = ceil_div(p.shared_rows, ceil_div(p.shared_rows, asked));
  const int64_t slices = ceil_div(p.shared_rows, p.rows_per_thread);
  p.work = p.num_tokens * lanes * slices;
}

// The kernel parameters for `first` and, if not null, `second`; blocks = grid size (0: nothing
// to do).
template <typename scalar_t, typename table_t, bool kInterleaved, bool kVector>
Params make_params(const RotationArgs& first, const RotationArgs* second, const TableArgs& tables,
                   bool inverse, int num_sms, int64_t& blocks) {
  using Shape = LaneShape<scalar_t, kInterleaved, kVector>;
  int64_t rot_lanes[2] = {0, 0};
  int64_t lanes[2] = {0, 0};
  count_lanes<Shape>(first, rot_lanes[0], lanes[0]);
  int64_t lane_rows = first.geometry.num_rows * lanes[0];
  if (second != nullptr) {
    count_lanes<Shape>(*second, rot_lanes[1], lanes[1]);
    lane_rows += second->geometry.num_rows * lanes[1];
  }
  // Threads first: one row per thread until there is a full wave of them, then more rows per
  // thread (more cos/sin reuse, fewer index computations), up to kMaxRowsPerThread. A power of
  // two, so that it divides typical head counts and fills whole batches of kRowBatch rows.
  const int64_t wave = static_cast<int64_t>(num_sms > 0 ? num_sms : 1) * kThreadsPerSm;
  int64_t rows_per_thread = 1;
  while (rows_per_thread < kMaxRowsPerThread && 2 * rows_per_thread * wave <= lane_rows) {
    rows_per_thread *= 2;
  }

  Params params;
  describe(first, rot_lanes[0], lanes[0], rows_per_thread, params.problem[0]);
  if (second != nullptr) {
    describe(*second, rot_lanes[1], lanes[1], rows_per_thread, params.problem[1]);
  }
  params.tables.cos = tables.cos;
  params.tables.sin = tables.sin;
  params.tables.max_seq_len = tables.max_seq_len;
  params.tables.stride = tables.table_stride;
  params.tables.vector_loads = table_vector_loads<table_t, Shape::kPlanes>(tables);
  params.inverse = inverse;
  params.first_blocks = ceil_div(params.problem[0].work, kBlockThreads);
  blocks = params.first_blocks + ceil_div(params.problem[1].work, kBlockThreads);
  return params;
}

template <typename scalar_t, typename table_t, bool kInterleaved, bool kVector>
cudaError_t launch(const RotationArgs& first, const RotationArgs* second, const TableArgs& tables,
                   bool inverse, int num_sms, cudaStream_t stream) {
  int64_t blocks = 0;
  Params params = make_params<scalar_t, table_t, kInterleaved, kVector>(first, second, tables,
                                                                        inverse, num_sms, blocks);
  if (blocks == 0) {
    return cudaSuccess;  // empty input: never launch a zero-sized grid
  }
  if (blocks > 0x7fffffff) {
    return cudaErrorInvalidConfiguration;  // beyond grid.x; needs > 5e11 lanes, so unreachable
  }
  void* kernel_args[] = {&params};
  return cudaLaunchKernel(
      reinterpret_cast<const void*>(&rope_kernel<scalar_t, table_t, kInterleaved, kVector>),
      dim3(static_cast<unsigned int>(blocks)), dim3(kBlockThreads), kernel_args, 0, stream);
}

template <typename scalar_t, typename table_t>
cudaError_t launch_layout(const RotationArgs& first, const RotationArgs* second,
                          const TableArgs& tables, RotationMode mode, int num_sms,
                          cudaStream_t stream) {
  // The vector path needs both tensors aligned; a pair where one is not (rare: an odd slice)
  // takes the scalar path for both, keeping a single launch.
  const bool vec = vector_path_fits<scalar_t>(first, mode.interleaved) &&
                   (second == nullptr || vector_path_fits<scalar_t>(*second, mode.interleaved));
  if (mode.interleaved) {
    return vec ? launch<scalar_t, table_t, true, true>(first, second, tables, mode.inverse,
                                                       num_sms, stream)
               : launch<scalar_t, table_t, true, false>(first, second, tables, mode.inverse,
                                                        num_sms, stream);
  }
  return vec ? launch<scalar_t, table_t, false, true>(first, second, tables, mode.inverse,
                                                      num_sms, stream)
             : launch<scalar_t, table_t, false, false>(first, second, tables, mode.inverse,
                                                       num_sms, stream);
}

}  // namespace kernel

// Rotates `first` and, when `second` is not null, `second` (apply_qk: q and k, which may differ
// in head count and layout) in one kernel launch on `stream`. scalar_t is the storage type of
// in/out: double, float, __half or __nv_bfloat16. Tables are float or double as TableArgs says.
// num_sms (the device's multiprocessor count) sizes the per-thread work. Does not synchronize;
// returns the launch status. Positions outside [0, max_seq_len) trip ROPE_DEVICE_ASSERT.
template <typename scalar_t>
cudaError_t rotate(const RotationArgs& first, const RotationArgs* second, const TableArgs& tables,
                   RotationMode mode, int num_sms, cudaStream_t stream) {
  static_assert(std::is_same_v<scalar_t, double> || std::is_same_v<scalar_t, float> ||
                    std::is_same_v<scalar_t, __half> || std::is_same_v<scalar_t, __nv_bfloat16>,
                "rope::cuda::rotate: storage must be double, float, __half or __nv_bfloat16");
  if (tables.tables_are_double) {
    return kernel::launch_layout<scalar_t, double>(first, second, tables, mode, num_sms, stream);
  }
  return kernel::launch_layout<scalar_t, float>(first, second, tables, mode, num_sms, stream);
}

}  // namespace rope::cuda
