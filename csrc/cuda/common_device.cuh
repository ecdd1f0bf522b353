// SPDX-License-Identifier: BSD-3-Clause
// The device helpers of the CUDA kernels (rope_kernel.cuh and the row streams'
// common_stream_kernel.cuh), written once: loads and
// stores of the four storage types (scalar, 32-bit pair, 128-bit vector), the math type and its
// rounding, the square root, the plane rotation, the reading and
// range check of positions (one-axis and multi-axis), index arithmetic, and the launch of a
// one-dimensional grid. A fix made here reaches every kernel; a helper copied into a kernel header
// would not, and none of this code has ever run on a GPU in CI.
//
// Torch-free, like the kernels: tests/cuda_host compiles this header as host C++ against its
// shims and runs the threads of each block as cooperative fibers, which model warp shuffles,
// votes, __syncwarp, __syncthreads and block shared memory (declared with ROPE_BLOCK_SHARED
// below, never with a raw __shared__), and check their masks and convergence. Atomics stay out
// (the shims refuse to compile them).
//
// The hooks below are defined by whoever includes this header first: the torch glue makes
// ROPE_DEVICE_ASSERT CUDA_KERNEL_ASSERT; the host run points ROPE_TRACE_* at its access checks.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cassert>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "../common_kernel_args.h"

// Range checks of positions and slots. The torch glue defines it as CUDA_KERNEL_ASSERT, which
// stays on in release builds, before including the kernel headers.
#ifndef ROPE_DEVICE_ASSERT
#define ROPE_DEVICE_ASSERT(cond) assert(cond)
#endif
// Hooks on every global load and store of the rows a kernel rotates, normalises or copies: empty
// on the GPU; the host run checks, per element, which thread read and wrote it, and its alignment.
#ifndef ROPE_TRACE_LOAD
#define ROPE_TRACE_LOAD(ptr, bytes)
#endif
#ifndef ROPE_TRACE_STORE
#define ROPE_TRACE_STORE(ptr, bytes)
#endif
// Block shared memory, `T name[count]` for the threads of a block. The host run's shim defines
// it first (storage per simulated block, filled with poison, so that a missing barrier shows).
#ifndef ROPE_BLOCK_SHARED
#define ROPE_BLOCK_SHARED(T, name, count) __shared__ T name[count]
#endif

namespace rope::cuda::device {

// ---- the math type and its rounding ------------------------------------------------------------

// float for every storage type but double, which keeps double math.
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

// x * y + z rounded once. Written out rather than left to nvcc's contraction, so the rounding is
// the same on every compiler: the host run computes what the GPU computes, and both compute what
// the CPU kernel's vector path (at::vec::fmadd / fmsub) does.
__device__ __forceinline__ float fused(float x, float y, float z) { return fmaf(x, y, z); }
__device__ __forceinline__ double fused(double x, double y, double z) { return fma(x, y, z); }

// The square root in the math type, correctly rounded (IEEE; nvcc's default -prec-sqrt=true).
__device__ __forceinline__ float acc_sqrt(float v) { return sqrtf(v); }
__device__ __forceinline__ double acc_sqrt(double v) { return sqrt(v); }

// One plane: (a, b) -> (a cos - b sin, a sin + b cos), each with one product rounded first, in
// the order of the CPU kernel: fmsub(a, c, b * s) and fmadd(a, s, b * c).
template <typename A>
__device__ __forceinline__ void rotate_plane(A a, A b, A c, A s, A& ra, A& rb) {
  ra = fused(a, c, -(b * s));
  rb = fused(a, s, b * c);
}

// ---- loads and stores of rows -----------------------------------------------------------------

// 16 bytes as one 128-bit access. Rows are loaded with plain (coherent) loads, not __ldg: for
// rope.apply_ the same kernel writes them.
template <typename T, int N>
__device__ __forceinline__ void load_vector(const T* p, T (&dst)[N]) {
  static_assert(sizeof(T) * N == sizeof(uint4), "the vector path moves exactly 16 bytes");
  ROPE_TRACE_LOAD(p, sizeof(uint4));
  const uint4 bits = *reinterpret_cast<const uint4*>(p);  // sass: vector load
  memcpy(dst, &bits, sizeof(bits));
}

// The store goes through __stwb (st.global.wb.v4, the default write-back caching of a plain
// store), not a uint4 assignment: nvcc split the assignment into four 32-bit stores in every row
// of a batch but the first (cuobjdump -sass showed 2 STG.E.128 against 56 STG.E in a kernel).
template <typename T, int N>
__device__ __forceinline__ void store_vector(T* p, const T (&src)[N]) {
  static_assert(sizeof(T) * N == sizeof(uint4), "the vector path moves exactly 16 bytes");
  ROPE_TRACE_STORE(p, sizeof(uint4));
  uint4 bits;
  memcpy(&bits, src, sizeof(bits));
  __stwb(reinterpret_cast<uint4*>(p), bits);  // sass: vector store
}

// Two 16-bit elements as one 32-bit access: the paired path, for rows that are 4-byte but not
// 16-byte aligned (rope_launch_plan.h). Stored through __stwb like the vector path, whose host
// shim checks the alignment; the host run's trace hooks check every access's too.
template <typename T>
__device__ __forceinline__ void load_pair(const T* p, T* dst) {
  static_assert(sizeof(T) * 2 == sizeof(unsigned int), "the paired path moves two 16-bit elements");
  ROPE_TRACE_LOAD(p, sizeof(unsigned int));
  const unsigned int bits = *reinterpret_cast<const unsigned int*>(p);  // sass: pair load
  memcpy(dst, &bits, sizeof(bits));
}

template <typename T>
__device__ __forceinline__ void store_pair(T* p, const T* src) {
  static_assert(sizeof(T) * 2 == sizeof(unsigned int), "the paired path moves two 16-bit elements");
  ROPE_TRACE_STORE(p, sizeof(unsigned int));
  unsigned int bits;
  memcpy(&bits, src, sizeof(bits));
  __stwb(reinterpret_cast<unsigned int*>(p), bits);  // sass: pair store
}

// One element of any storage type (an fp8 cache's byte included).
template <typename T>
__device__ __forceinline__ T load_scalar(const T* p) {
  ROPE_TRACE_LOAD(p, sizeof(T));
  return *p;
}

template <typename T>
__device__ __forceinline__ void store_scalar(T* p, T v) {
  ROPE_TRACE_STORE(p, sizeof(T));
  *p = v;
}

// ---- index arithmetic --------------------------------------------------------------------------

struct QuotRem {
  int64_t quot;
  int64_t rem;
};

// n / d and n % d for n >= 0, d > 0. A 32-bit division when both fit, which is much cheaper than
// a 64-bit one on GPUs.
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

// The index of the running thread in a one-dimensional grid of kThreads-thread blocks, in 64
// bits: a grid may hold 2^32 threads and more (an apply_qk_cache call of 760K tokens of a 70B
// model's KV heads), where blockIdx.x * kThreads in 32 bits would wrap.
template <int kThreads>
__device__ __forceinline__ int64_t grid_thread_index() {
  return static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
}

// ---- positions ---------------------------------------------------------------------------------
// `Rows` is any argument struct with `positions` (int32 or int64 elements) and
// `positions_are_int64` (TensorPlan, RotationArgs, StreamArgs); `Tables` any with `max_seq_len`
// and `axes` (TablePlan, TableArgs).

// The position at pos_off, widened to int64 before any check.
template <typename Rows>
__device__ __forceinline__ int64_t read_position(const Rows& r, int64_t pos_off) {
  return r.positions_are_int64
             ? static_cast<int64_t>(__ldg(static_cast<const long long*>(r.positions) + pos_off))
             : static_cast<int64_t>(__ldg(static_cast<const int*>(r.positions) + pos_off));
}

// False (after the assert, which may be compiled out) when a position is outside the tables:
// the caller then writes nothing rather than read past them.
template <typename Tables>
__device__ __forceinline__ bool position_in_range(const Tables& tb, int64_t pos) {
  ROPE_DEVICE_ASSERT(pos >= 0 && pos < tb.max_seq_len);
  return pos >= 0 && pos < tb.max_seq_len;
}

// The position of a row, range-checked.
template <typename Rows, typename Tables>
__device__ __forceinline__ bool load_position(const Rows& r, const Tables& tb, int64_t pos_off,
                                              int64_t& pos) {
  pos = read_position(r, pos_off);
  return position_in_range(tb, pos);
}

// ---- packed sequences and the frequency form's positions -------------------------------------

// Element i of a read-only int32 / int64 index tensor (cu_seqlens, seq_offsets), as int64.
__device__ __forceinline__ int64_t read_index(const void* p, bool is_int64, int64_t i) {
  return is_int64 ? static_cast<int64_t>(__ldg(static_cast<const long long*>(p) + i))
                  : static_cast<int64_t>(__ldg(static_cast<const int*>(p) + i));
}

// The position of local token t of packed sequences (common_kernel_args.h's PackedSequenceArgs):
// a binary search over cu_seqlens for its sequence, then TransformerEngine's zigzag rule. What the
// host checks on the CPU is asserted here, as far as the token's own sequence shows it:
// cu_seqlens[0] == 0 and cu_seqlens[N] == num_tokens * cp_size, the sequence's boundaries in
// order, its length divisible by 2 * cp_size with context parallelism, the token inside its
// local range, seq_offsets >= 0 and a position that fits in int64. False (after the assert, which
// may be compiled out) when any fails: the caller then writes nothing for the token.
__device__ __forceinline__ bool packed_position(const PackedSequenceArgs& s, int64_t t,
                                                int64_t& pos) {
  pos = 0;
  // No sequence (cu_seqlens = [0]) holds no token: refused before reading cu_seqlens[1] or
  // seq_offsets[0], which do not exist.
  ROPE_DEVICE_ASSERT(s.num_seqs >= 1);
  if (s.num_seqs < 1) {
    return false;
  }
  const auto cu = [&](int64_t i) { return read_index(s.cu_seqlens, s.cu_seqlens_are_int64, i); };
  const int64_t cp = s.cp_size;
  const int64_t i = packed_sequence_of(s.num_seqs, cp, t, cu);
  const int64_t start = cu(i);
  const int64_t length = cu(i + 1) - start;
  const int64_t last = cu(s.num_seqs);
  const int64_t offset =
      s.seq_offsets == nullptr ? 0 : read_index(s.seq_offsets, s.seq_offsets_are_int64, i);
  const int64_t begin = start / cp;
  const int64_t j = t - begin;
  bool ok = cu(0) == 0 && last % cp == 0 && last / cp == s.num_tokens && length >= 0 &&
            start % cp == 0 && (cp == 1 || length % (2 * cp) == 0) && j >= 0 && j < length / cp &&
            offset >= 0;
  int64_t relative = 0;
  if (ok) {
    relative = packed_position_in(j, length, 0, cp, s.cp_rank);
    ok = relative <= INT64_MAX - offset;
  }
  ROPE_DEVICE_ASSERT(ok);
  // Only a checked position is formed: offset + relative may overflow otherwise.
  pos = ok ? offset + relative : 0;
  return ok;
}

// The position of a row of any position source, checked against the angle source: in the
// tables' range [0, max_seq_len), or >= 0 for the frequency form (which has no upper bound).
// kPacked (r.position_kind == kPacked): a compile-time choice, made by the launch (the table
// form's packed sequences have a kernel of their own, rope_packed_kernel), so that the positions
// form's code carries none of the lookup's registers (in one kernel both spilled on sm_75-90).
template <bool kPacked, typename Rows, typename Tables>
__device__ __forceinline__ bool load_row_position(const Rows& r, const Tables& tb, int64_t pos_off,
                                                  int64_t& pos) {
  if constexpr (kPacked) {
    if (!packed_position(r.packed, pos_off, pos)) {
      return false;
    }
  } else {
    pos = read_position(r, pos_off);
  }
  if (tb.from_frequencies) {
    ROPE_DEVICE_ASSERT(pos >= 0);
    return pos >= 0;
  }
  return position_in_range(tb, pos);
}

// ---- multi-axis positions (M-RoPE) -------------------------------------------------------------

// The axis plane k reads: axis_of_plane of common_kernel_args.h, written without its loop (the
// ends of the contiguous sections only grow, so the axis is the number of ends k has reached,
// counted over the first num_axes - 1 axes). Interleaved (Qwen3-VL, 3 axes): k % 3 picks axis 1
// or 2 while k < 3 * sections[1] or 3 * sections[2], else axis 0.
__device__ __forceinline__ int32_t plane_axis(const AxisMap& m, int64_t k) {
  if (m.interleaved) {
    const int64_t r = k % 3;
    return r == 1 && k < 3 * m.sections[1] ? 1 : r == 2 && k < 3 * m.sections[2] ? 2 : 0;
  }
  int32_t axis = 0;
  int64_t end = 0;
#pragma unroll
  for (int a = 0; a + 1 < kMaxAxes; ++a) {
    end += m.sections[a];
    axis += a + 1 < m.num_axes && k >= end ? 1 : 0;
  }
  return axis;
}

// v[a] for a run-time a < kMaxAxes, by selects: indexing a register array at a run-time index
// would put it in local memory.
__device__ __forceinline__ int64_t pick_axis(const int64_t (&v)[kMaxAxes], int32_t a) {
  int64_t r = v[0];
#pragma unroll
  for (int i = 1; i < kMaxAxes; ++i) {
    r = a == i ? v[i] : r;
  }
  return r;
}

// The table row offsets (position * row_stride) of every axis of a row's multi-axis position,
// which sits at pos_off + a * axis_stride for axis a; each position loaded once and
// range-checked. False when any is outside the tables; rows[a] is 0 for a >= num_axes.
template <typename Rows, typename Tables>
__device__ __forceinline__ bool load_axis_rows(const Rows& r, const Tables& tb, int64_t pos_off,
                                               int64_t axis_stride, int64_t row_stride,
                                               int64_t (&rows)[kMaxAxes]) {
  bool in_range = true;
#pragma unroll
  for (int a = 0; a < kMaxAxes; ++a) {
    rows[a] = 0;
    if (a < tb.axes.num_axes) {
      const int64_t pos = read_position(r, pos_off + a * axis_stride);
      in_range = position_in_range(tb, pos) && in_range;
      rows[a] = pos * row_stride;
    }
  }
  return in_range;
}

// The positions of every axis of a row's multi-axis position for the frequency form, each
// asserted >= 0; false when any is negative. positions[a] is 0 for a >= num_axes.
template <typename Rows, typename Tables>
__device__ __forceinline__ bool load_axis_positions(const Rows& r, const Tables& tb,
                                                    int64_t pos_off, int64_t axis_stride,
                                                    int64_t (&positions)[kMaxAxes]) {
  bool ok = true;
#pragma unroll
  for (int a = 0; a < kMaxAxes; ++a) {
    positions[a] = 0;
    if (a < tb.axes.num_axes) {
      positions[a] = read_position(r, pos_off + a * axis_stride);
      ROPE_DEVICE_ASSERT(positions[a] >= 0);
      ok = positions[a] >= 0 && ok;
    }
  }
  return ok;
}

// ---- host side: the launch of a one-dimensional grid -------------------------------------------

// Launches `kernel(params)` with `blocks` blocks of `block_threads` threads on `stream`: nothing
// for an empty grid (never a zero-sized one), an error past grid.x's limit.
template <typename Params>
cudaError_t launch_grid(void (*kernel)(Params), int64_t blocks, int block_threads, Params params,
                        cudaStream_t stream) {
  if (blocks == 0) {
    return cudaSuccess;
  }
  if (blocks > 0x7fffffff) {
    return cudaErrorInvalidConfiguration;
  }
  void* kernel_args[] = {&params};
  return cudaLaunchKernel(kernel, dim3(static_cast<unsigned int>(blocks)), dim3(block_threads),
                          kernel_args, 0, stream);
}

// Enough blocks of kThreads threads for `threads` threads, one per unit of work.
template <int kThreads>
constexpr int64_t blocks_for(int64_t threads) {
  return (threads + kThreads - 1) / kThreads;
}

}  // namespace rope::cuda::device
