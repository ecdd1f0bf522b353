// SPDX-License-Identifier: BSD-3-Clause
// Rotary position embedding on CUDA: the kernel and its launcher, free of torch.
//
// Like FlashInfer's include/flashinfer/pos_enc.cuh, this header sees only raw pointers, int64
// element strides and a cudaStream_t, and reports failure as a cudaError_t. The torch glue
// (rope_cuda.cpp, common_glue.h) validates the tensors, fills the structs of common_kernel_args.h,
// picks the stream and turns the status into an error. How rows, lanes and threads are planned is
// rope_launch_plan.h, plain C++ shared with the unit tests; the device helpers the three kernels
// share (loads and stores, rounding, the plane rotation, positions) are common_device.cuh.
//
// It computes exactly the function of the CPU kernel (csrc/cpu/rope_rows.cpp): plane k is
// (2k, 2k+1) interleaved or (k, k + rotary_dim/2) half split; x'_a = a cos - b sin,
// x'_b = a sin + b cos; `inverse` negates sin; features [rotary_dim, head_dim) are copied when
// the output is a new tensor; math in float (double for double storage). With multi-axis
// positions (M-RoPE, TableArgs::axes), plane k takes the table row of axis axis_of_plane(k) of
// its token's position.
//
// This header is also compiled as host C++ by tests/cuda_host, with shims for the CUDA built-ins
// and a launch that runs the threads of each block as cooperative fibers, under ASan and UBSan.
// The rotation needs no collective (each plane is its own), so its threads never talk to each
// other. The ROPE_TRACE_* hooks of common_device.cuh let the host run see every global load and
// store.
#pragma once

#include <atomic>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "../common_exact_angle.h"
#include "common_device.cuh"
#include "rope_launch_plan.h"

// Register budget of the vector kernels: minimum resident blocks per SM for __launch_bounds__.
// 0 (the default) means the per-layout value below; scripts/gpu_check.sh overrides it to compare.
#ifndef ROPE_CUDA_MIN_BLOCKS_PER_SM
#define ROPE_CUDA_MIN_BLOCKS_PER_SM 0
#endif

namespace rope::cuda {
namespace kernel {

using namespace ::rope::cuda::device;

// ---- device helpers of this kernel (the shared ones are common_device.cuh's) ------------------

// N elements at p: one 128-bit access on the vector path, N / 2 32-bit ones on the paired path,
// N scalar ones otherwise.
template <Access kAccess, typename T, int N>
__device__ __forceinline__ void load_elems(const T* p, T (&dst)[N]) {
  if constexpr (kAccess == Access::kVector) {
    load_vector(p, dst);
  } else if constexpr (kAccess == Access::kPair) {
    static_assert(N % 2 == 0, "a paired access moves two elements");
#pragma unroll
    for (int j = 0; j < N; j += 2) {
      load_pair(p + j, dst + j);
    }
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) {
      dst[j] = load_scalar(p + j);
    }
  }
}

template <Access kAccess, typename T, int N>
__device__ __forceinline__ void store_elems(T* p, const T (&src)[N]) {
  if constexpr (kAccess == Access::kVector) {
    store_vector(p, src);
  } else if constexpr (kAccess == Access::kPair) {
    static_assert(N % 2 == 0, "a paired access moves two elements");
#pragma unroll
    for (int j = 0; j < N; j += 2) {
      store_pair(p + j, src + j);
    }
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) {
      store_scalar(p + j, src[j]);
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

// N consecutive cos (or sin) values of one table row, converted to the math type. Tables are
// read-only for the whole launch, so they go through the non-coherent (__ldg) path.
template <int N, typename table_t, typename acc_t>
__device__ __forceinline__ void load_table(const table_t* __restrict__ p, bool vector_loads,
                                           acc_t (&dst)[N]) {
  constexpr int kPiece = static_cast<int>(table_piece(sizeof(table_t), N));
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

// ---- multi-axis positions (M-RoPE) -------------------------------------------------------------

// The cos and sin of planes [k0, k0 + P) of a multi-axis position: each plane from the table row
// of its axis, in its own column. A lane whose planes all read one axis loads its slice of that
// row like a one-axis lane (vector loads where the plan allows them); a lane across a section
// boundary, or of the interleaved layout, loads plane by plane.
template <int P, typename table_t, typename acc_t>
__device__ __forceinline__ bool load_axis_angles(const TensorPlan& t, const TablePlan& tb,
                                                 int64_t pos_off, int64_t k0, acc_t (&c)[P],
                                                 acc_t (&s)[P]) {
  int64_t rows[kMaxAxes];
  if (!load_axis_rows(t, tb, pos_off, t.axis_stride, tb.stride, rows)) {
    return false;
  }
  const auto* cos = static_cast<const table_t*>(tb.cos);
  const auto* sin = static_cast<const table_t*>(tb.sin);
  int32_t axis[P];
  bool one_axis = true;
#pragma unroll
  for (int j = 0; j < P; ++j) {
    axis[j] = plane_axis(tb.axes, k0 + j);
    one_axis = one_axis && axis[j] == axis[0];
  }
  if (one_axis) {
    const int64_t row = pick_axis(rows, axis[0]) + k0;
    load_table<P>(cos + row, tb.vector_loads, c);
    load_table<P>(sin + row, tb.vector_loads, s);
    return true;
  }
#pragma unroll
  for (int j = 0; j < P; ++j) {
    const int64_t at = pick_axis(rows, axis[j]) + k0 + j;
    c[j] = static_cast<acc_t>(__ldg(cos + at));
    s[j] = static_cast<acc_t>(__ldg(sin + at));
  }
  return true;
}

// Offsets of the current shared row of a thread; stepping is additions only.
struct RowWalker {
  int64_t in;
  int64_t out;
  int64_t inner;  // index along the inner shared dim

  __device__ __forceinline__ void step(const TensorPlan& t) {
    in += t.shared_in_inner;
    out += t.shared_out_inner;
    if (++inner == t.shared_inner) {
      inner = 0;
      in += t.shared_in_wrap;
      out += t.shared_out_wrap;
    }
  }
};

// The shape of a rotating lane on path kAccess (rope_launch_plan.h's lane_shape): planes turned and
// contiguous elements per run.
template <typename scalar_t, bool kInterleaved, Access kAccess>
struct RotLane {
  static constexpr int kPlanes = static_cast<int>(
      lane_shape(kAccess, static_cast<int>(sizeof(scalar_t)), kInterleaved).planes);
  // Interleaved: one run of (a, b) pairs; half split: one run from each half.
  static constexpr int kElems = kInterleaved ? 2 * kPlanes : kPlanes;
};

// Whether storage type T has the paired path (two elements in 4 bytes).
template <typename T>
constexpr bool kHasPairs = sizeof(T) * 2 == kPairBytes;

// Rotates one lane of rows [h_begin, h_end) of one token. kMultiAxis: the token's position has
// several axes (TablePlan::axes); its angles are gathered before any x is loaded, since gathering
// from up to kMaxAxes table rows with a batch of x in registers spilled the vector kernels at
// their register budgets. One-axis positions (kMultiAxis false) load theirs after the first x
// loads, so their latency overlaps those loads.
template <typename scalar_t, typename table_t, bool kInterleaved, Access kAccess, bool kMultiAxis,
          bool kPacked>
__device__ __forceinline__ void rotate_lane(const TensorPlan& t, const TablePlan& tb, bool inverse,
                                            int64_t lane, int64_t pos_off, RowWalker walker,
                                            int64_t h_begin, int64_t h_end) {
  using Lane = RotLane<scalar_t, kInterleaved, kAccess>;
  using acc_t = typename AccType<scalar_t>::type;
  constexpr int P = Lane::kPlanes;
  constexpr int E = Lane::kElems;

  const auto* in = static_cast<const scalar_t*>(t.in);
  auto* out = static_cast<scalar_t*>(t.out);
  // Feature of this lane's first a. Interleaved, its b's are in the same run; half split, they
  // start rotary_dim / 2 further on.
  const int64_t a_feature = kInterleaved ? lane * (2 * P) : lane * P;
  [[maybe_unused]] const int64_t b_feature = a_feature + t.rotary_dim / 2;  // half split only

  acc_t c[P];
  acc_t s[P];
  bool have_angles = false;
  if constexpr (kMultiAxis) {
    if (!load_axis_angles<P, table_t>(t, tb, pos_off, lane * P, c, s)) {
      return;
    }
    if (inverse) {
#pragma unroll
      for (int j = 0; j < P; ++j) {
        s[j] = -s[j];
      }
    }
    have_angles = true;
  }
  for (int64_t h = h_begin; h < h_end; h += kRowBatch) {
    int64_t src[kRowBatch];
    int64_t dst[kRowBatch];
#pragma unroll
    for (int u = 0; u < kRowBatch; ++u) {
      src[u] = walker.in;
      dst[u] = walker.out;
      walker.step(t);  // past h_end only offsets that are never used
    }
    // Every load of the batch before any store: independent loads in flight, and reading a
    // row fully before writing it keeps in == out (rope.apply_) correct.
    scalar_t xa[kRowBatch][E];
    [[maybe_unused]] scalar_t xb[kRowBatch][E];
#pragma unroll
    for (int u = 0; u < kRowBatch; ++u) {
      if (h + u < h_end) {
        load_elems<kAccess>(in + src[u] + a_feature, xa[u]);  // sass: rotated load
        if constexpr (!kInterleaved) {
          load_elems<kAccess>(in + src[u] + b_feature, xb[u]);  // sass: rotated load
        }
      }
    }
    // The angles after the first x loads, so their latency overlaps those loads.
    if (!have_angles) {
      int64_t pos;
      if (!load_row_position<kPacked>(t, tb, pos_off, pos)) {
        return;
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
          acc_t ra;
          acc_t rb;
          if constexpr (kInterleaved) {
            rotate_plane(to_acc(xa[u][2 * j]), to_acc(xa[u][2 * j + 1]), c[j], s[j], ra, rb);
            ya[2 * j] = from_acc<scalar_t>(ra);
            ya[2 * j + 1] = from_acc<scalar_t>(rb);
          } else {
            rotate_plane(to_acc(xa[u][j]), to_acc(xb[u][j]), c[j], s[j], ra, rb);
            ya[j] = from_acc<scalar_t>(ra);
            yb[j] = from_acc<scalar_t>(rb);
          }
        }
        store_elems<kAccess>(out + dst[u] + a_feature, ya);  // sass: rotated store
        if constexpr (!kInterleaved) {
          store_elems<kAccess>(out + dst[u] + b_feature, yb);  // sass: rotated store
        }
      }
    }
  }
}

// rotate_lane for one-axis or multi-axis positions, behind a branch uniform over the launch: the
// one-axis instance is the code it was before multi-axis positions existed (same registers, same
// schedule), the multi-axis one a copy of it with the angles gathered up front.
template <typename scalar_t, typename table_t, bool kInterleaved, Access kAccess, bool kPacked>
__device__ __forceinline__ void rotate_lane_of(const TensorPlan& t, const TablePlan& tb,
                                               bool inverse, int64_t lane, int64_t pos_off,
                                               RowWalker walker, int64_t h_begin, int64_t h_end) {
  if (tb.axes.num_axes == 0) {
    rotate_lane<scalar_t, table_t, kInterleaved, kAccess, false, kPacked>(
        t, tb, inverse, lane, pos_off, walker, h_begin, h_end);
  } else {
    rotate_lane<scalar_t, table_t, kInterleaved, kAccess, true, kPacked>(
        t, tb, inverse, lane, pos_off, walker, h_begin, h_end);
  }
}

// The position of a row of tensor t (load_row_position). The table form's kernels choose its
// source at compile time (kPacked: rope_packed_kernel, so that the positions form's code carries
// none of the cu_seqlens lookup's registers); the frequency form's one kernel (kFreqs) reads
// t.position_kind at run time, so that its angle code is not compiled once per source.
template <bool kFreqs, bool kPacked>
__device__ __forceinline__ bool load_token_position(const TensorPlan& t, const TablePlan& tb,
                                                    int64_t pos_off, int64_t& pos) {
  if constexpr (kFreqs) {
    if (t.position_kind == PositionKind::kPacked) {
      return load_row_position<true>(t, tb, pos_off, pos);
    }
  }
  return load_row_position<kPacked>(t, tb, pos_off, pos);
}

// ---- the frequency form (table-free) -----------------------------------------------------------
// A rotating lane computes the cos / sin of its planes itself, once for all the rows it walks
// (the heads of its token), from the float64 frequencies read as bits: csrc/common_exact_angle.h's
// exact reduction (turn_fraction_bits, turns_at: integer arithmetic only), then, for 16- and
// 32-bit storage, sincos_turns_f32 (FP32 arithmetic only, float-float results) and rotate_f32,
// every output within 2^-23 af (|a| + |b|) of the exact rotation, with no FP64 instruction
// (scripts/sass_report.py checks); for float64 storage the double paths, sincos_turns and
// rotate_f64.

template <typename A>
struct FreqAngle {
  using type = ::rope::exact_angle::SinCos32;
};
template <>
struct FreqAngle<double> {
  using type = ::rope::exact_angle::SinCos64;
};

// The frequency of plane k, as its bits.
__device__ __forceinline__ uint64_t frequency_bits(const TablePlan& tb, int64_t k) {
  return static_cast<uint64_t>(__ldg(reinterpret_cast<const long long*>(tb.frequencies.freqs) +
                                     k * tb.frequencies.freq_stride));
}

__device__ __forceinline__ bool finite_bits(uint64_t bits) {
  return ((bits >> 52) & 0x7ff) != 0x7ff;
}

// Plane k's cos / sin at position pos (>= 0), times the attention factor, for the float path.
// A non-finite frequency gives NaN, as a NaN in a table would.
__device__ __forceinline__ void plane_angle(const TablePlan& tb, int64_t k, int64_t pos,
                                            bool inverse, ::rope::exact_angle::SinCos32& out) {
  namespace ea = ::rope::exact_angle;
  const uint64_t bits = frequency_bits(tb, k);
  ea::SinCos32 cs = ea::sincos_turns_f32(ea::turns_at(pos, ea::turn_fraction_bits(bits)),
                                         tb.frequencies.af_hi, tb.frequencies.af_lo);
  if (!finite_bits(bits)) {
    constexpr float nan = std::numeric_limits<float>::quiet_NaN();
    cs = ea::SinCos32{ea::FloatFloat{nan, 0.0f}, ea::FloatFloat{nan, 0.0f}};
  }
  out = inverse ? ea::inverse(cs) : cs;
}

// The same for the float64 path.
__device__ __forceinline__ void plane_angle(const TablePlan& tb, int64_t k, int64_t pos,
                                            bool inverse, ::rope::exact_angle::SinCos64& out) {
  namespace ea = ::rope::exact_angle;
  const uint64_t bits = frequency_bits(tb, k);
  ea::SinCos64 cs = ea::sincos_turns(ea::turns_at(pos, ea::turn_fraction_bits(bits)),
                                     tb.frequencies.attention_factor);
  if (!finite_bits(bits)) {
    constexpr double nan = std::numeric_limits<double>::quiet_NaN();
    cs = ea::SinCos64{nan, nan};
  }
  if (inverse) {
    cs.sin = -cs.sin;
  }
  out = cs;
}

__device__ __forceinline__ void rotate_exact(float a, float b,
                                             const ::rope::exact_angle::SinCos32& cs, float& ra,
                                             float& rb) {
  ::rope::exact_angle::rotate_f32(a, b, cs, ra, rb);
}
__device__ __forceinline__ void rotate_exact(double a, double b,
                                             const ::rope::exact_angle::SinCos64& cs, double& ra,
                                             double& rb) {
  ::rope::exact_angle::rotate_f64(a, b, cs, ra, rb);
}

// rotate_lane for the frequency form: the lane's angles first (its position, or every axis of a
// multi-axis one, then each plane's cos / sin), then the rows in batches as rotate_lane does. One
// instance serves every position source (packed or not, one axis or several), deciding at run
// time: the angles are computed before any row is loaded either way, and the float-float sincos
// inlined per plane is most of this kernel's code. With one copy per source (four), the frequency
// kernels were 47% of the bf16 launcher's SASS on sm_90 (138k of 296k instructions) and of its
// compile time. A one-axis position is axis 0 of every plane.
template <typename scalar_t, bool kInterleaved, Access kAccess>
__device__ __forceinline__ void rotate_freqs_lane(const TensorPlan& t, const TablePlan& tb,
                                                  bool inverse, int64_t lane, int64_t pos_off,
                                                  RowWalker walker, int64_t h_begin,
                                                  int64_t h_end) {
  using Lane = RotLane<scalar_t, kInterleaved, kAccess>;
  using acc_t = typename AccType<scalar_t>::type;
  using Angle = typename FreqAngle<acc_t>::type;
  constexpr int P = Lane::kPlanes;
  constexpr int E = Lane::kElems;

  const auto* in = static_cast<const scalar_t*>(t.in);
  auto* out = static_cast<scalar_t*>(t.out);
  const int64_t a_feature = kInterleaved ? lane * (2 * P) : lane * P;
  [[maybe_unused]] const int64_t b_feature = a_feature + t.rotary_dim / 2;  // half split only

  int64_t axis_pos[kMaxAxes] = {};
  if (tb.axes.num_axes == 0) {
    if (!load_token_position<true, false>(t, tb, pos_off, axis_pos[0])) {
      return;
    }
  } else if (!load_axis_positions(t, tb, pos_off, t.axis_stride, axis_pos)) {
    return;
  }
  Angle cs[P];
#pragma unroll
  for (int j = 0; j < P; ++j) {
    const int64_t k = lane * P + j;
    const int32_t axis = tb.axes.num_axes > 0 ? plane_axis(tb.axes, k) : 0;
    plane_angle(tb, k, pick_axis(axis_pos, axis), inverse, cs[j]);
  }
  for (int64_t h = h_begin; h < h_end; h += kRowBatch) {
    int64_t src[kRowBatch];
    int64_t dst[kRowBatch];
#pragma unroll
    for (int u = 0; u < kRowBatch; ++u) {
      src[u] = walker.in;
      dst[u] = walker.out;
      walker.step(t);
    }
    scalar_t xa[kRowBatch][E];
    [[maybe_unused]] scalar_t xb[kRowBatch][E];
#pragma unroll
    for (int u = 0; u < kRowBatch; ++u) {
      if (h + u < h_end) {
        load_elems<kAccess>(in + src[u] + a_feature, xa[u]);  // sass: rotated load
        if constexpr (!kInterleaved) {
          load_elems<kAccess>(in + src[u] + b_feature, xb[u]);  // sass: rotated load
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kRowBatch; ++u) {
      if (h + u < h_end) {
        scalar_t ya[E];
        [[maybe_unused]] scalar_t yb[E];
#pragma unroll
        for (int j = 0; j < P; ++j) {
          acc_t ra;
          acc_t rb;
          if constexpr (kInterleaved) {
            rotate_exact(to_acc(xa[u][2 * j]), to_acc(xa[u][2 * j + 1]), cs[j], ra, rb);
            ya[2 * j] = from_acc<scalar_t>(ra);
            ya[2 * j + 1] = from_acc<scalar_t>(rb);
          } else {
            rotate_exact(to_acc(xa[u][j]), to_acc(xb[u][j]), cs[j], ra, rb);
            ya[j] = from_acc<scalar_t>(ra);
            yb[j] = from_acc<scalar_t>(rb);
          }
        }
        store_elems<kAccess>(out + dst[u] + a_feature, ya);  // sass: rotated store
        if constexpr (!kInterleaved) {
          store_elems<kAccess>(out + dst[u] + b_feature, yb);  // sass: rotated store
        }
      }
    }
  }
}

// The rotating lane of either angle source: tables (rotate_lane_of) or frequencies.
template <typename scalar_t, typename table_t, bool kInterleaved, Access kAccess, bool kFreqs,
          bool kPacked>
__device__ __forceinline__ void rotate_any_lane(const TensorPlan& t, const TablePlan& tb,
                                                bool inverse, int64_t lane, int64_t pos_off,
                                                RowWalker walker, int64_t h_begin, int64_t h_end) {
  if constexpr (kFreqs) {
    rotate_freqs_lane<scalar_t, kInterleaved, kAccess>(t, tb, inverse, lane, pos_off, walker,
                                                       h_begin, h_end);
  } else {
    rotate_lane_of<scalar_t, table_t, kInterleaved, kAccess, kPacked>(t, tb, inverse, lane, pos_off,
                                                                      walker, h_begin, h_end);
  }
}

// Copies E features from `feature` on of rows [h_begin, h_end) of one token: part of the tail
// [rotary_dim, head_dim), one access of kAccess's width (16 bytes, 4 bytes or one element).
template <typename scalar_t, Access kAccess>
__device__ __forceinline__ void copy_lane(const TensorPlan& t, int64_t feature, RowWalker walker,
                                          int64_t h_begin, int64_t h_end) {
  constexpr int E = static_cast<int>(access_bytes(kAccess, static_cast<int>(sizeof(scalar_t))) /
                                     sizeof(scalar_t));
  const auto* in = static_cast<const scalar_t*>(t.in);
  auto* out = static_cast<scalar_t*>(t.out);
  for (int64_t h = h_begin; h < h_end; h += kRowBatch) {
    int64_t src[kRowBatch];
    int64_t dst[kRowBatch];
#pragma unroll
    for (int u = 0; u < kRowBatch; ++u) {
      src[u] = walker.in;
      dst[u] = walker.out;
      walker.step(t);
    }
    scalar_t x[kRowBatch][E];
#pragma unroll
    for (int u = 0; u < kRowBatch; ++u) {
      if (h + u < h_end) {
        load_elems<kAccess>(in + src[u] + feature, x[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < kRowBatch; ++u) {
      if (h + u < h_end) {
        store_elems<kAccess>(out + dst[u] + feature, x[u]);  // sass: tail store
      }
    }
  }
}

// The work of thread w of one tensor; kFreqs: the frequency form (table_t unused, and its
// position source read at run time: load_token_position); kPacked: the table form's cu_seqlens.
template <typename scalar_t, typename table_t, bool kInterleaved, bool kVectorKernel, bool kFreqs,
          bool kPacked>
__device__ __forceinline__ void rope_thread(const TensorPlan& t, const TablePlan& tb, bool inverse,
                                            int64_t w) {
  if (w >= t.num_threads) {
    return;
  }
  const QuotRem by_lane = div_rem(w, t.lanes);
  const int64_t lane = by_lane.rem;
  const QuotRem by_token = div_rem(by_lane.quot, t.num_tokens);
  const int64_t row_group = by_token.quot;

  // Unravel the token index over the token dims, innermost first; the outermost index is what
  // is left, so it needs no division.
  int64_t in_off = 0;
  int64_t out_off = 0;
  int64_t pos_off = 0;
  int64_t token = by_token.rem;
  for (int d = t.token_ndim - 1; d > 0; --d) {
    const QuotRem qr = div_rem(token, t.token_sizes[d]);
    in_off += qr.rem * t.token_in_strides[d];
    out_off += qr.rem * t.token_out_strides[d];
    pos_off += qr.rem * t.token_pos_strides[d];
    token = qr.quot;
  }
  if (t.token_ndim > 0) {
    in_off += token * t.token_in_strides[0];
    out_off += token * t.token_out_strides[0];
    pos_off += token * t.token_pos_strides[0];
  }

  // This thread's shared rows.
  const int64_t h_begin = row_group * t.rows_per_thread;
  const int64_t h_stop = h_begin + t.rows_per_thread;
  const int64_t h_end = h_stop < t.shared_rows ? h_stop : t.shared_rows;
  const QuotRem h = div_rem(h_begin, t.shared_inner);
  const RowWalker walker{in_off + h.quot * t.shared_in_outer + h.rem * t.shared_in_inner,
                         out_off + h.quot * t.shared_out_outer + h.rem * t.shared_out_inner, h.rem};

  if (lane < t.rot_lanes) {
    if constexpr (kVectorKernel) {
      if (t.rot_access == Access::kVector) {
        rotate_any_lane<scalar_t, table_t, kInterleaved, Access::kVector, kFreqs, kPacked>(
            t, tb, inverse, lane, pos_off, walker, h_begin, h_end);
        return;
      }
    }
    if constexpr (kHasPairs<scalar_t>) {
      if (t.rot_access == Access::kPair) {
        rotate_any_lane<scalar_t, table_t, kInterleaved, Access::kPair, kFreqs, kPacked>(
            t, tb, inverse, lane, pos_off, walker, h_begin, h_end);
        return;
      }
    }
    rotate_any_lane<scalar_t, table_t, kInterleaved, Access::kScalar, kFreqs, kPacked>(
        t, tb, inverse, lane, pos_off, walker, h_begin, h_end);
    return;
  }
  // With no rotating lane nobody else reads this token's position; it must still be in range,
  // as on the CPU (every axis of a multi-axis one). Only then is anything written.
  if (t.rot_lanes == 0) {
    if (tb.axes.num_axes == 0) {
      int64_t pos;
      if (!load_token_position<kFreqs, kPacked>(t, tb, pos_off, pos)) {
        return;
      }
    } else if (kFreqs) {
      int64_t positions[kMaxAxes];
      if (!load_axis_positions(t, tb, pos_off, t.axis_stride, positions)) {
        return;
      }
    } else {
      int64_t rows[kMaxAxes];
      if (!load_axis_rows(t, tb, pos_off, t.axis_stride, tb.stride, rows)) {
        return;
      }
    }
  }
  constexpr int64_t kVecElems = kVectorBytes / static_cast<int64_t>(sizeof(scalar_t));
  constexpr int64_t kPairElems = 2;
  const int64_t copy = lane - t.rot_lanes;
  if (copy < t.vec_copy_lanes) {
    copy_lane<scalar_t, Access::kVector>(t, t.rotary_dim + copy * kVecElems, walker, h_begin,
                                         h_end);
    return;
  }
  // Pair copy lanes (16-bit storage only; none planned otherwise): two elements each.
  const int64_t after_vectors = t.rotary_dim + t.vec_copy_lanes * kVecElems;
  const int64_t pair_copy = copy - t.vec_copy_lanes;
  if constexpr (kHasPairs<scalar_t>) {
    if (pair_copy < t.pair_copy_lanes) {
      copy_lane<scalar_t, Access::kPair>(t, after_vectors + pair_copy * kPairElems, walker, h_begin,
                                         h_end);
      return;
    }
  }
  // Scalar copy lanes: the rest of the tail, one element each. A lane past them is the
  // position-check lane of a row that has nothing to write; its work ended above.
  const int64_t scalar_copy = pair_copy - t.pair_copy_lanes;
  if (scalar_copy < t.scalar_copy_lanes) {
    copy_lane<scalar_t, Access::kScalar>(
        t, after_vectors + t.pair_copy_lanes * kPairElems + scalar_copy, walker, h_begin, h_end);
  }
}

// Minimum resident blocks per SM, i.e. a register budget. The vector kernels hold kRowBatch
// rows of 16 bytes (32 half split) in flight per thread: 3 blocks (<= 80 registers) interleaved,
// 2 (<= 128) half split, which has more live registers. The scalar-only kernels need fewer.
//
// Per architecture (the device pass of each arch sees its own __CUDA_ARCH__): sm_75 holds only
// 1024 threads (4 blocks) per SM, and 3 blocks' 80-register cap spilled there (the fp64 and the
// interleaved vector kernels, up to 32 STL/LDL): 2 on sm_75. On sm_100 the interleaved vector
// kernels with float64 tables spilled 16 bytes at 80 registers: 2 for them there. Not timed on
// those GPUs yet; scripts/gpu_check.sh's tuning step compares budgets where one is at hand.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
constexpr bool kSmallSm = true;
#else
constexpr bool kSmallSm = false;
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
constexpr bool kBlackwell = true;
#else
constexpr bool kBlackwell = false;
#endif
//
// The scalar-only kernels of 16-bit and float32 storage: 4 on sm_80 / sm_90 (64 registers). They
// fitted in 59-63 by themselves while each kernel inlined its per-thread work twice; with one copy
// (for_block_tensor) ptxas took 68 under a cap of 3 blocks' 80, a quarter fewer resident threads,
// so the cap says 4, as the occupancy was (no spill at 64). float64 storage spills at 64 (8-16
// bytes on sm_90) and Blackwell used 65-75 before: 3 for them, as they were.
template <bool kInterleaved, bool kVectorKernel, bool kWideTables, bool kWideStorage>
constexpr int kMinBlocksPerSm = ROPE_CUDA_MIN_BLOCKS_PER_SM > 0 ? ROPE_CUDA_MIN_BLOCKS_PER_SM
                                : kSmallSm                      ? 2
                                : !kVectorKernel ? (kBlackwell || kWideStorage ? 3 : 4)
                                : kInterleaved   ? (kBlackwell && kWideTables ? 2 : 3)
                                                 : 2;

// Runs `work(plan, thread)`: the plan of the tensor this block serves and the thread's index
// among that tensor's threads (blocks [0, first_blocks) serve tensor[0], the rest tensor[1]).
// One call site, so each kernel holds one copy of the per-thread work: a call per tensor inlined
// it twice, which doubled every kernel's code (about 11,000 SASS instructions a kernel on sm_90)
// and nvcc's time on it. The plan is then picked by a runtime index (uniform per block) and its
// fields read with register-indexed constant loads instead of immediate operands: a few registers
// more. Not on sm_75, whose half-split vector kernels were at their 128-register cap already (the
// extra registers spilled 16 bytes there): its pass keeps a call per tensor.
template <typename Work>
__device__ __forceinline__ void for_block_tensor(const KernelParams& params, Work&& work) {
  const int64_t block = blockIdx.x;
  if constexpr (kSmallSm) {
    if (block < params.first_blocks) {
      work(params.tensor[0], block * kBlockThreads + threadIdx.x);
    } else {
      work(params.tensor[1], (block - params.first_blocks) * kBlockThreads + threadIdx.x);
    }
  } else {
    const bool second = block >= params.first_blocks;
    work(params.tensor[second ? 1 : 0],
         (second ? block - params.first_blocks : block) * kBlockThreads + threadIdx.x);
  }
}

// __grid_constant__: the parameter block is read in place from constant memory even where the
// code indexes its arrays with a runtime index (token dims, the tensor), instead of being copied
// to local memory first.
template <typename scalar_t, typename table_t, bool kInterleaved, bool kVectorKernel>
__global__ void __launch_bounds__(
    kBlockThreads,
    kMinBlocksPerSm<kInterleaved, kVectorKernel, (sizeof(table_t) > 4), (sizeof(scalar_t) > 4)>)
    rope_kernel(const __grid_constant__ KernelParams params) {
  for_block_tensor(params, [&](const TensorPlan& t, int64_t w) {
    rope_thread<scalar_t, table_t, kInterleaved, kVectorKernel, false, false>(t, params.tables,
                                                                              params.inverse, w);
  });
}

// The tables with packed sequences (rope.*.varlen): the same work, each token's position found
// from cu_seqlens (load_row_position<true>). A kernel of its own so that the lookup's registers
// stay out of the positions form's (both spilled on sm_75 and sm_80/90 when one kernel held
// both), with one block per SM as its floor: the lookup runs once per thread, and a spill there
// would cost more than the occupancy.
template <typename scalar_t, typename table_t, bool kInterleaved, bool kVectorKernel>
__global__ void __launch_bounds__(kBlockThreads,
                                  ROPE_CUDA_MIN_BLOCKS_PER_SM > 0 ? ROPE_CUDA_MIN_BLOCKS_PER_SM : 1)
    rope_packed_kernel(const __grid_constant__ KernelParams params) {
  for_block_tensor(params, [&](const TensorPlan& t, int64_t w) {
    rope_thread<scalar_t, table_t, kInterleaved, kVectorKernel, false, true>(t, params.tables,
                                                                             params.inverse, w);
  });
}

// The frequency form's kernel: the same work, with the angles computed by each rotating lane
// (rotate_freqs_lane), for every position source. Its own register budget: a lane holds its
// planes' cos / sin as float-float pairs (doubles for float64 storage), twice the table kernel's
// angle registers.
template <bool kInterleaved, bool kVectorKernel>
constexpr int kFreqsMinBlocksPerSm = ROPE_CUDA_MIN_BLOCKS_PER_SM > 0 ? ROPE_CUDA_MIN_BLOCKS_PER_SM
                                     : kSmallSm || !kVectorKernel    ? 2
                                     : kInterleaved                  ? 2
                                                                     : 1;

template <typename scalar_t, bool kInterleaved, bool kVectorKernel>
__global__ void __launch_bounds__(kBlockThreads, kFreqsMinBlocksPerSm<kInterleaved, kVectorKernel>)
    rope_freqs_kernel(const __grid_constant__ KernelParams params) {
  for_block_tensor(params, [&](const TensorPlan& t, int64_t w) {
    rope_thread<scalar_t, float, kInterleaved, kVectorKernel, true, false>(t, params.tables,
                                                                           params.inverse, w);
  });
}

// ---- host side ---------------------------------------------------------------------------------

// Resident blocks per SM of `kernel` on the current device, asked of the runtime once per device
// and kernel (the answer depends only on the kernel's registers and the device). Cached per
// template instance, i.e. per kernel, for device ordinals below kMaxCachedDevices.
template <typename scalar_t, typename table_t, bool kInterleaved, bool kVectorKernel,
          bool kFreqs = false, bool kPacked = false>
cudaError_t resident_blocks_per_sm(int& blocks) {
  constexpr int kMaxCachedDevices = 64;
  static std::atomic<int> cache[kMaxCachedDevices] = {};
  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) {
    return status;
  }
  const bool cacheable = device >= 0 && device < kMaxCachedDevices;
  if (cacheable) {
    blocks = cache[device].load(std::memory_order_relaxed);
    if (blocks > 0) {
      return cudaSuccess;
    }
  }
  if constexpr (kFreqs) {
    status = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &blocks, rope_freqs_kernel<scalar_t, kInterleaved, kVectorKernel>, kBlockThreads, 0);
  } else if constexpr (kPacked) {
    status = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &blocks, rope_packed_kernel<scalar_t, table_t, kInterleaved, kVectorKernel>, kBlockThreads,
        0);
  } else {
    status = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &blocks, rope_kernel<scalar_t, table_t, kInterleaved, kVectorKernel>, kBlockThreads, 0);
  }
  if (status == cudaSuccess && cacheable && blocks > 0) {
    cache[device].store(blocks, std::memory_order_relaxed);
  }
  return status;
}

template <typename scalar_t, typename table_t, bool kInterleaved, bool kVectorKernel, bool kPacked>
cudaError_t launch_tables(const RotationArgs& first, const RotationArgs* second,
                          const TableArgs& tables, bool inverse, int num_sms, cudaStream_t stream) {
  int resident = 0;
  const cudaError_t status =
      resident_blocks_per_sm<scalar_t, table_t, kInterleaved, kVectorKernel, false, kPacked>(
          resident);
  if (status != cudaSuccess) {
    return status;
  }
  const ElementSizes sizes{static_cast<int>(sizeof(scalar_t)), static_cast<int>(sizeof(table_t))};
  LaunchPlan plan = plan_launch(first, second, tables, RotationMode{kInterleaved, inverse}, sizes,
                                kVectorKernel, DeviceShape{num_sms, resident});
  // Past grid.x's limit needs > 5e11 lanes, so that error is unreachable.
  if constexpr (kPacked) {
    return launch_grid(rope_packed_kernel<scalar_t, table_t, kInterleaved, kVectorKernel>,
                       plan.blocks, kBlockThreads, plan.params, stream);
  } else {
    return launch_grid(rope_kernel<scalar_t, table_t, kInterleaved, kVectorKernel>, plan.blocks,
                       kBlockThreads, plan.params, stream);
  }
}

template <typename scalar_t, typename table_t, bool kInterleaved, bool kVectorKernel>
cudaError_t launch(const RotationArgs& first, const RotationArgs* second, const TableArgs& tables,
                   bool inverse, int num_sms, cudaStream_t stream) {
  if (first.position_kind == PositionKind::kPacked) {
    return launch_tables<scalar_t, table_t, kInterleaved, kVectorKernel, true>(
        first, second, tables, inverse, num_sms, stream);
  }
  return launch_tables<scalar_t, table_t, kInterleaved, kVectorKernel, false>(
      first, second, tables, inverse, num_sms, stream);
}

// The frequency form's launch: the same plan (a thread takes kMaxRowsPerThread shared rows).
template <typename scalar_t, bool kInterleaved, bool kVectorKernel>
cudaError_t launch_freqs(const RotationArgs& first, const RotationArgs* second,
                         const TableArgs& tables, bool inverse, int num_sms, cudaStream_t stream) {
  int resident = 0;
  const cudaError_t status =
      resident_blocks_per_sm<scalar_t, float, kInterleaved, kVectorKernel, true>(resident);
  if (status != cudaSuccess) {
    return status;
  }
  const ElementSizes sizes{static_cast<int>(sizeof(scalar_t)), static_cast<int>(sizeof(float))};
  LaunchPlan plan = plan_launch(first, second, tables, RotationMode{kInterleaved, inverse}, sizes,
                                kVectorKernel, DeviceShape{num_sms, resident});
  return launch_grid(rope_freqs_kernel<scalar_t, kInterleaved, kVectorKernel>, plan.blocks,
                     kBlockThreads, plan.params, stream);
}

template <typename scalar_t, bool kInterleaved>
cudaError_t launch_freqs_layout(const RotationArgs& first, const RotationArgs* second,
                                const TableArgs& tables, bool inverse, int num_sms,
                                cudaStream_t stream) {
  const ElementSizes sizes{static_cast<int>(sizeof(scalar_t)), static_cast<int>(sizeof(float))};
  if (wants_vector_kernel(first, second, sizes, kInterleaved)) {
    return launch_freqs<scalar_t, kInterleaved, true>(first, second, tables, inverse, num_sms,
                                                      stream);
  }
  return launch_freqs<scalar_t, kInterleaved, false>(first, second, tables, inverse, num_sms,
                                                     stream);
}

template <typename scalar_t, typename table_t, bool kInterleaved>
cudaError_t launch_layout(const RotationArgs& first, const RotationArgs* second,
                          const TableArgs& tables, bool inverse, int num_sms, cudaStream_t stream) {
  const ElementSizes sizes{static_cast<int>(sizeof(scalar_t)), static_cast<int>(sizeof(table_t))};
  if (wants_vector_kernel(first, second, sizes, kInterleaved)) {
    return launch<scalar_t, table_t, kInterleaved, true>(first, second, tables, inverse, num_sms,
                                                         stream);
  }
  return launch<scalar_t, table_t, kInterleaved, false>(first, second, tables, inverse, num_sms,
                                                        stream);
}

}  // namespace kernel

// Rotates `first` and, when `second` is not null, `second` (apply_qk: q and k, which may differ
// in head count and layout) in one kernel launch on `stream`. scalar_t is the storage type of
// in/out: double, float, __half or __nv_bfloat16. Tables are float or double as TableArgs says.
// num_sms (the device's multiprocessor count) and the kernel's occupancy size the per-thread
// work. Does not synchronize; returns the launch status. Positions outside [0, max_seq_len) trip
// ROPE_DEVICE_ASSERT.
template <typename scalar_t>
cudaError_t rotate(const RotationArgs& first, const RotationArgs* second, const TableArgs& tables,
                   RotationMode mode, int num_sms, cudaStream_t stream) {
  static_assert(std::is_same_v<scalar_t, double> || std::is_same_v<scalar_t, float> ||
                    std::is_same_v<scalar_t, __half> || std::is_same_v<scalar_t, __nv_bfloat16>,
                "rope::cuda::rotate: storage must be double, float, __half or __nv_bfloat16");
  if (tables.from_frequencies()) {
    return mode.interleaved ? kernel::launch_freqs_layout<scalar_t, true>(
                                  first, second, tables, mode.inverse, num_sms, stream)
                            : kernel::launch_freqs_layout<scalar_t, false>(
                                  first, second, tables, mode.inverse, num_sms, stream);
  }
  if (tables.tables_are_double) {
    return mode.interleaved ? kernel::launch_layout<scalar_t, double, true>(
                                  first, second, tables, mode.inverse, num_sms, stream)
                            : kernel::launch_layout<scalar_t, double, false>(
                                  first, second, tables, mode.inverse, num_sms, stream);
  }
  return mode.interleaved ? kernel::launch_layout<scalar_t, float, true>(
                                first, second, tables, mode.inverse, num_sms, stream)
                          : kernel::launch_layout<scalar_t, float, false>(
                                first, second, tables, mode.inverse, num_sms, stream);
}

}  // namespace rope::cuda
