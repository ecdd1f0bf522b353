// SPDX-License-Identifier: BSD-3-Clause
// The row streams on CUDA (common_row_streams.h): the kernel of rope.apply_qk_fp8,
// rope.rms_norm_apply_qk_cache and rope.mla_apply_cache, and its launcher. Torch-free, like the
// other kernels, over common_device.cuh's helpers, so tests/cuda_host runs it on the host (its
// threads as cooperative fibers, which check the norm's shuffles and masks).
//
// Work: the streams' rows are cut into lanes of kStreamChunk (16) elements, one thread per
// (stream, token, head, lane), the streams' segments one after another in one grid, each starting
// on a warp boundary:
//   rotating lanes  interleaved: features [16 l, 16 l + 16) of the rotary run (8 planes);
//                   half split: planes [16 l, 16 l + 16), i.e. features a = [16 l, ...) and
//                   b = [rotary_dim / 2 + 16 l, ...);
//   tail lanes      features [rotary_dim + 16 l, ... + 16) (copied, normalised, quantized).
// A stream with an RMSNorm weight needs the whole row's sum of squares before any output: a
// half-warp of 16 threads per row. Thread j of the row sums the partial p_j of the specification
// (features 16 m + j: the half-warp reads 16 consecutive elements at a time), four shuffles fold
// the 16 partials in the specification's tree, and the row's 16 threads then run its lanes
// (thread j: lanes j, j + 16, ...; the row is in L1 by then). A row the checks drop (a position
// outside the tables, a skipped slot) drops all 16 threads together, before the shuffles; the
// shuffles' mask is the row's half-warp, so the other row of the warp carries on alone.
//
// Dynamic fp8 scales (common_row_streams.h) need a scale group's amax before any store: such a
// stream gets a half-warp per group too (a (token, head) row, or every head of a token with
// per-token scales). The group's threads run its lanes twice: first folding the values into
// their amax (no store), then, after four shuffles fold the 16 maxima, storing them quantized
// with the group's scale, which thread 0 of the group writes out. The second pass re-reads the
// rows from L1.
//
// Vector path: when a stream's source and target rows are 16-byte aligned (pointers, strides,
// the target's feature offset) and its lanes are whole (rotary run and tail multiples of the
// lane), every access of its lanes is 16 bytes wide: a lane of bf16 loads two 16-byte vectors and
// stores one 16-byte vector of fp8 (two of bf16). Otherwise the same lanes run element by element
// (the scalar path), with the same arithmetic, so both give the same bits. scripts/sass_report.py
// requires the 16-byte accesses, the norm's shuffles (and no local memory) in every variant.
//
// A token whose slot is negative writes nothing to its by_slot targets; a slot past the cache, or
// a position outside the tables, trips ROPE_DEVICE_ASSERT and writes nothing for that row (its
// lanes return before any store). Two tokens with one slot race (the CPU backend refuses them).
#pragma once

#include "../common_row_streams.h"
#include "common_device.cuh"

namespace rope::cuda {
namespace streams {

using namespace ::rope::cuda::device;

constexpr int kBlockThreads = 256;
constexpr int kChunk = static_cast<int>(kStreamChunk);
// The threads of a norm stream's row: one per partial sum of the specification, a half-warp.
constexpr int kRowLanes = static_cast<int>(kStreamChunk);
constexpr int kWarpSize = 32;

// How one stream's threads are laid out.
struct StreamPlan {
  int64_t begin = 0;      // its first thread in the grid (a multiple of the warp size)
  int64_t threads = 0;    // T * heads * lanes, or T * heads * kRowLanes for a norm stream
  int64_t span = 0;       // threads rounded up to whole warps: the segment's size in the grid
  int64_t rot_lanes = 0;  // rotating lanes per row
  int64_t lanes = 0;      // rotating + tail lanes per row
  bool norm = false;      // its rows' sum of squares first
  bool dynamic = false;   // its scale groups' amax first (dynamic fp8 scales)
  // A half-warp per row (norm) or per scale group (dynamic); the group's heads: 1, or every head
  // of a token (per-token dynamic scales).
  bool cooperative = false;
  int64_t group_heads = 1;
  bool vector = false;  // 16-byte accesses (see the file comment)
};

struct StreamKernelParams {
  StreamArgs args;
  TableArgs tables;
  StreamPlan plan[kMaxStreams];
  int64_t total = 0;
};

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
inline bool stride_ok(int64_t elements, int64_t bytes) { return (elements * bytes) % 16 == 0; }

// Whether a stream can take the vector path: whole lanes, and every row of source and target on
// a 16-byte boundary.
inline bool vector_path(const RowStream& s, bool interleaved, int64_t source_bytes) {
  const int64_t rot_run = interleaved ? s.rotary_dim : s.rotary_dim / 2;
  if (rot_run % kChunk != 0 || (s.width - s.rotary_dim) % kChunk != 0) {
    return false;
  }
  const StreamTarget& t = s.target;
  const int64_t tb = target_element_bytes(t, source_bytes);
  const bool source_ok = aligned16(s.src) && stride_ok(s.token_stride, source_bytes) &&
                         stride_ok(s.head_stride, source_bytes);
  const bool target_ok =
      aligned16(t.data) && stride_ok(t.feature_offset, tb) && stride_ok(t.head_stride, tb) &&
      (t.by_slot ? stride_ok(t.block_stride, tb) && stride_ok(t.offset_stride, tb)
                 : stride_ok(t.token_stride, tb));
  return source_ok && target_ok;
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The grid of one call; total == 0: nothing to launch.
inline StreamKernelParams plan(const StreamArgs& args, const TableArgs& tables,
                               int64_t source_bytes) {
  StreamKernelParams p;
  p.args = args;
  p.tables = tables;
  int64_t begin = 0;
  for (int32_t i = 0; i < args.num_streams; ++i) {
    const RowStream& s = args.streams[i];
    StreamPlan& sp = p.plan[i];
    sp.begin = begin;
    sp.rot_lanes =
        ceil_div(args.interleaved ? s.rotary_dim : s.rotary_dim / 2, static_cast<int64_t>(kChunk));
    sp.lanes = sp.rot_lanes + ceil_div(s.width - s.rotary_dim, static_cast<int64_t>(kChunk));
    sp.norm = s.weight != nullptr;
    sp.dynamic = s.target.scales != nullptr;
    sp.cooperative = sp.norm || sp.dynamic;
    sp.group_heads = sp.dynamic && s.target.per_token ? s.heads : 1;
    sp.vector = vector_path(s, args.interleaved, source_bytes);
    const int64_t rows = args.num_tokens * s.heads;
    const int64_t groups = sp.group_heads == 1 ? rows : args.num_tokens;
    // A dynamic stream writes its groups' scales even when its rows are empty (scale 1).
    sp.threads = sp.dynamic      ? groups * kRowLanes
                 : sp.lanes == 0 ? 0
                 : sp.norm       ? rows * kRowLanes
                                 : rows * sp.lanes;
    sp.span = ceil_div(sp.threads, static_cast<int64_t>(kWarpSize)) * kWarpSize;
    begin += sp.span;
  }
  p.total = begin;
  return p;
}

// ---- one lane ----------------------------------------------------------------------------------

// 16 elements of a row into `dst` (as the math type): 16-byte loads on the vector path, else one
// element at a time, only those below `end` (the others are 0, never stored).
template <bool kVector, typename T, typename A>
__device__ __forceinline__ void load_chunk(const T* row, int64_t first, int64_t end,
                                           A (&dst)[kChunk]) {
  if constexpr (kVector) {
    constexpr int kPer = 16 / static_cast<int>(sizeof(T));
#pragma unroll
    for (int c = 0; c < kChunk / kPer; ++c) {
      T part[kPer];
      load_vector(row + first + c * kPer, part);  // sass: stream load
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        dst[c * kPer + j] = to_acc(part[j]);
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
      dst[j] = first + j < end ? to_acc(load_scalar(row + first + j)) : A(0);
    }
  }
}

// 16 values stored at features [first, first + 16) of a target row (below `end`): rounded to the
// storage type, or quantized to fp8 with `scale` (the target's static one, or its group's dynamic
// one) and the target's rule.
template <bool kVector, typename T, typename A>
__device__ __forceinline__ void store_chunk(const StreamTarget& t, void* row, int64_t first,
                                            int64_t end, const A (&v)[kChunk], float scale) {
  if (t.format == CacheFormat::kSame) {
    T out[kChunk];
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
      out[j] = from_acc<T>(v[j]);
    }
    T* dst = static_cast<T*>(row) + first;
    if constexpr (kVector) {
      constexpr int kPer = 16 / static_cast<int>(sizeof(T));
#pragma unroll
      for (int c = 0; c < kChunk / kPer; ++c) {
        T part[kPer];
#pragma unroll
        for (int j = 0; j < kPer; ++j) {
          part[j] = out[c * kPer + j];
        }
        store_vector(dst + c * kPer, part);  // sass: stream store
      }
    } else {
#pragma unroll
      for (int j = 0; j < kChunk; ++j) {
        if (first + j < end) {
          store_scalar(dst + j, out[j]);
        }
      }
    }
    return;
  }
  uint8_t out[kChunk];
#pragma unroll
  for (int j = 0; j < kChunk; ++j) {
    out[j] = quantize_fp8(v[j], scale, t.format, t.rule);
  }
  uint8_t* dst = static_cast<uint8_t*>(row) + first;
  if constexpr (kVector) {
    store_vector(dst, out);  // sass: stream store
  } else {
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
      if (first + j < end) {
        store_scalar(dst + j, out[j]);
      }
    }
  }
}

// Features [first, first + 16) (below `end`) copied bit for bit, NaN payloads included: a tail
// lane with no norm into a target of the source's dtype (common_row_streams.h).
template <bool kVector, typename T>
__device__ __forceinline__ void copy_chunk(const T* src, T* dst, int64_t first, int64_t end) {
  if constexpr (kVector) {
    constexpr int kPer = 16 / static_cast<int>(sizeof(T));
#pragma unroll
    for (int c = 0; c < kChunk / kPer; ++c) {
      T part[kPer];
      load_vector(src + first + c * kPer, part);   // sass: stream load
      store_vector(dst + first + c * kPer, part);  // sass: stream store
    }
  } else {
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
      if (first + j < end) {
        store_scalar(dst + first + j, load_scalar(src + first + j));
      }
    }
  }
}

// Where a lane's values go: into the target (scale: the fp8 scale to store with), or, in the first
// pass of a dynamic scale (measure), into the thread's amax.
template <typename A>
struct LaneSink {
  float scale = 1.0f;
  bool measure = false;
  A amax = A(0);
};

// The lane's values [first, first + 16) (below `end`) to the sink: stored, or folded into amax.
template <bool kVector, typename T, typename A>
__device__ __forceinline__ void emit_chunk(const StreamTarget& t, void* row, int64_t first,
                                           int64_t end, const A (&v)[kChunk], LaneSink<A>& sink) {
  if (sink.measure) {
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
      if (first + j < end) {
        sink.amax = fold_amax(sink.amax, v[j]);
      }
    }
    return;
  }
  store_chunk<kVector, T>(t, row, first, end, v, sink.scale);
}

// (x * r) * w in place, for the norm: `w` holds the features [first, first + 16) of the weight.
template <typename A>
__device__ __forceinline__ void normalise(A (&v)[kChunk], const A* w, int64_t first, int64_t end,
                                          A r) {
#pragma unroll
  for (int j = 0; j < kChunk; ++j) {
    if (first + j < end) {
      v[j] = (v[j] * r) * __ldg(w + first + j);
    }
  }
}

// cos and sin of plane k of a row whose table rows (per axis) are `rows`; the sine negated for the
// inverse rotation (common_row_streams.h).
// The tables' type (float or double) is read at run time, not made a template parameter: only these
// two loads differ, and one kernel per storage type and pair layout, not two, cuts the nvcc time
// of the row streams (four storage types, five architectures: 40-47 s per launcher on the 2-core
// VM, 59-77 s before).
template <typename A>
__device__ __forceinline__ void angle_of(const TableArgs& tb, const int64_t (&rows)[kMaxAxes],
                                         int64_t k, bool inverse, A& c, A& s) {
  const int32_t axis = tb.axes.num_axes > 0 ? plane_axis(tb.axes, k) : 0;
  const int64_t at = pick_axis(rows, axis) + k;
  if (tb.tables_are_double) {
    c = static_cast<A>(__ldg(static_cast<const double*>(tb.cos) + at));
    s = static_cast<A>(__ldg(static_cast<const double*>(tb.sin) + at));
  } else {
    c = static_cast<A>(__ldg(static_cast<const float*>(tb.cos) + at));
    s = static_cast<A>(__ldg(static_cast<const float*>(tb.sin) + at));
  }
  if (inverse) {
    s = -s;
  }
}

// Lane `lane` of one row: src and dst point at the row's feature 0; r and w are the norm's factor
// and weight (w == nullptr: no norm).
template <typename T, bool kInterleaved, bool kVector>
__device__ __forceinline__ void run_lane(const RowStream& st, const StreamPlan& sp,
                                         const TableArgs& tb, bool inverse, const T* src, void* dst,
                                         int64_t lane, const int64_t (&rows)[kMaxAxes],
                                         typename AccType<T>::type r,
                                         const typename AccType<T>::type* w,
                                         LaneSink<typename AccType<T>::type>& sink) {
  using A = typename AccType<T>::type;
  const int64_t R = st.rotary_dim;
  if (lane >= sp.rot_lanes) {
    const int64_t first = R + (lane - sp.rot_lanes) * kChunk;
    if (w == nullptr && st.target.format == CacheFormat::kSame) {
      copy_chunk<kVector>(src, static_cast<T*>(dst), first, st.width);
      return;
    }
    A v[kChunk];
    load_chunk<kVector>(src, first, st.width, v);
    if (w != nullptr) {
      normalise(v, w, first, st.width, r);
    }
    emit_chunk<kVector, T>(st.target, dst, first, st.width, v, sink);
    return;
  }
  if constexpr (kInterleaved) {
    // 16 features: 8 planes (2k, 2k + 1).
    const int64_t first = lane * kChunk;
    A v[kChunk];
    load_chunk<kVector>(src, first, R, v);
    if (w != nullptr) {
      normalise(v, w, first, R, r);
    }
#pragma unroll
    for (int j = 0; j < kChunk / 2; ++j) {
      if (first + 2 * j < R) {
        A c;
        A s;
        angle_of<A>(tb, rows, first / 2 + j, inverse, c, s);
        A ra;
        A rb;
        rotate_plane(v[2 * j], v[2 * j + 1], c, s, ra, rb);
        v[2 * j] = ra;
        v[2 * j + 1] = rb;
      }
    }
    emit_chunk<kVector, T>(st.target, dst, first, R, v, sink);
  } else {
    // 16 planes (k, k + R / 2): a 16-element chunk of each half.
    const int64_t half = R / 2;
    const int64_t first = lane * kChunk;
    A a[kChunk];
    A b[kChunk];
    load_chunk<kVector>(src, first, half, a);
    load_chunk<kVector>(src + half, first, half, b);
    if (w != nullptr) {
      normalise(a, w, first, half, r);
      normalise(b, w + half, first, half, r);
    }
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
      if (first + j < half) {
        A c;
        A s;
        angle_of<A>(tb, rows, first + j, inverse, c, s);
        A ra;
        A rb;
        rotate_plane(a[j], b[j], c, s, ra, rb);
        a[j] = ra;
        b[j] = rb;
      }
    }
    const int64_t tbytes = target_element_bytes(st.target, static_cast<int64_t>(sizeof(T)));
    emit_chunk<kVector, T>(st.target, dst, first, half, a, sink);
    emit_chunk<kVector, T>(st.target, static_cast<char*>(dst) + half * tbytes, first, half, b,
                           sink);
  }
}

// ---- one thread
// ----------------------------------------------------------------------------------

// The table rows (position * table_stride, per axis) of row (t, h) of a rotating stream; false
// (after the assert) when a position is outside the tables.
__device__ __forceinline__ bool row_angles(const StreamArgs& a, const TableArgs& tb,
                                           const RowStream& st, int64_t t, int64_t h,
                                           int64_t (&rows)[kMaxAxes]) {
#pragma unroll
  for (int i = 0; i < kMaxAxes; ++i) {
    rows[i] = 0;
  }
  if (st.rotary_dim == 0) {
    return true;
  }
  const int64_t pos_off = t * st.pos_token_stride + h * st.pos_head_stride;
  if (tb.axes.num_axes == 0) {
    int64_t pos;
    if (!load_position(a, tb, pos_off, pos)) {
      return false;
    }
    rows[0] = pos * tb.table_stride;
    return true;
  }
  return load_axis_rows(a, tb, pos_off, a.axis_stride, tb.table_stride, rows);
}

// The target row of (t, h): false for a skipped token (negative slot) and, after the assert, for a
// slot past the cache.
template <typename T>
__device__ __forceinline__ bool target_row(const StreamArgs& a, const StreamTarget& tg, int64_t t,
                                           int64_t h, void*& row) {
  int64_t offset;
  if (tg.by_slot) {
    const int64_t slot = static_cast<int64_t>(
        __ldg(reinterpret_cast<const long long*>(a.slots) + t * a.slot_stride));
    if (slot < 0) {
      return false;  // padding
    }
    ROPE_DEVICE_ASSERT(slot < tg.num_slots);
    if (slot >= tg.num_slots) {
      return false;
    }
    offset = slot_row(tg, slot, h);
  } else {
    offset = token_row(tg, t, h);
  }
  row = tg.format == CacheFormat::kSame
            ? static_cast<void*>(static_cast<T*>(tg.data) + offset)
            : static_cast<void*>(static_cast<uint8_t*>(tg.data) + offset);
  return true;
}

// One step of the partial sums' fold across the row's half-warp: p_j + p_{j ^ kStep}, always
// written (lower lane's value) + (upper lane's value), i.e. p_j += p_{j + kStep} of the
// specification, so that every lane of the row ends with the same bits, NaN payloads included.
template <int kStep, typename A>
__device__ __forceinline__ A fold_lanes(A p, unsigned mask, int lane) {
  const A other = __shfl_xor_sync(mask, p, kStep, kRowLanes);
  const bool upper = (lane & kStep) != 0;
  const A lo = upper ? other : p;
  const A hi = upper ? p : other;
  return lo + hi;
}

// The norm's 1 / sqrt(mean(x^2) + eps) of a row, summed in the order of common_row_streams.h by
// the row's 16 threads: thread `lane` sums p_lane over the whole chunks, the butterfly folds the
// 16 partials (8, 4, 2, 1), and every thread adds the tail features itself, in order.
template <typename T>
__device__ __forceinline__ typename AccType<T>::type inverse_rms(const T* src, int64_t width,
                                                                 double eps, int lane) {
  using A = typename AccType<T>::type;
  const unsigned mask = 0xffffu << (threadIdx.x & 16u);  // the row's half-warp
  const int64_t whole = width / kChunk * kChunk;
  A p = A(0);
  for (int64_t i = lane; i < whole; i += kChunk) {
    const A x = to_acc(load_scalar(src + i));
    p = fused(x, x, p);
  }
  p = fold_lanes<8>(p, mask, lane);
  p = fold_lanes<4>(p, mask, lane);
  p = fold_lanes<2>(p, mask, lane);
  p = fold_lanes<1>(p, mask, lane);
  A s = p;
  for (int64_t i = whole; i < width; ++i) {
    const A x = to_acc(load_scalar(src + i));
    s = fused(x, x, s);
  }
  return A(1) / acc_sqrt(s / static_cast<A>(width) + static_cast<A>(eps));
}

// The amax of a scale group: the 16 threads' maxima folded by the butterfly (8, 4, 2, 1); max is
// exact, so every thread ends with the same value (a NaN, if any thread met one).
template <typename A>
__device__ __forceinline__ A group_amax(A m) {
  const unsigned mask = 0xffffu << (threadIdx.x & 16u);  // the group's half-warp
#pragma unroll
  for (int step = 8; step >= 1; step /= 2) {
    m = fold_amax(m, __shfl_xor_sync(mask, m, step, kRowLanes));
  }
  return m;
}

// Whether any thread of the half-warp holds `v`.
__device__ __forceinline__ bool group_any(bool v) {
  const unsigned mask = 0xffffu << (threadIdx.x & 16u);  // this half-warp
  int x = v ? 1 : 0;
#pragma unroll
  for (int step = 8; step >= 1; step /= 2) {
    x |= __shfl_xor_sync(mask, x, step, kRowLanes);
  }
  return x != 0;
}

// The source and target rows and the angle rows of (t, h); false for a row the checks drop.
template <typename T>
__device__ __forceinline__ bool row_of(const StreamKernelParams& p, const RowStream& st, int64_t t,
                                       int64_t h, const T*& src, void*& dst,
                                       int64_t (&rows)[kMaxAxes]) {
  if (!row_angles(p.args, p.tables, st, t, h, rows) ||
      !target_row<T>(p.args, st.target, t, h, dst)) {
    return false;
  }
  src = static_cast<const T*>(st.src) + t * st.token_stride + h * st.head_stride;
  return true;
}

// A half-warp's share of one row (norm) or scale group (dynamic): see the file comment. The
// group's (head, lane) pairs are dealt out to its 16 threads in turn (a row's lanes j, j + 16, ...;
// a per-token group's pairs head by head), so a per-token group keeps all 16 busy. A norm row's
// sum of squares comes first (a norm stream's groups are single rows). A row the checks drop (a
// position out of range) drops its whole group, agreed by group_any before any store. One call
// site of run_lane for every cooperative stream: a second one (the norm's loop beside this one)
// made ptxas spill the float64 half-split lanes.
template <typename T, bool kInterleaved, bool kVector>
__device__ __forceinline__ void cooperative_thread(const StreamKernelParams& p, const RowStream& st,
                                                   const StreamPlan& sp, int64_t w) {
  using A = typename AccType<T>::type;
  const int64_t group = w / kRowLanes;
  const int lane = static_cast<int>(w % kRowLanes);
  int64_t t = group;
  int64_t h0 = 0;
  if (sp.group_heads == 1) {
    const QuotRem th = div_rem(group, st.heads);
    t = th.quot;
    h0 = th.rem;
  }
  const StreamTarget& tg = st.target;
  LaneSink<A> sink;
  if (!sp.dynamic && tg.format != CacheFormat::kSame && tg.scale != nullptr) {
    sink.scale = __ldg(tg.scale);
  }
  // Pass 0 (dynamic scales only) measures the group, pass 1 stores it.
  for (int pass = sp.dynamic ? 0 : 1; pass < 2; ++pass) {
    sink.measure = pass == 0;
    int64_t rows[kMaxAxes];
    const T* src = nullptr;
    void* dst = nullptr;
    int64_t row_h = -1;  // the head whose rows are loaded
    A r = A(1);
    const A* weight = nullptr;
    if (sp.norm) {
      if (!row_of<T>(p, st, t, h0, src, dst, rows)) {
        return;  // the whole row: (t, h0) is the same for its 16 threads
      }
      row_h = h0;
      r = inverse_rms<T>(src, st.width, p.args.eps, lane);
      weight = static_cast<const A*>(st.weight);
    }
    bool dropped = false;
    for (int64_t i = lane; i < sp.group_heads * sp.lanes; i += kRowLanes) {
      const QuotRem hl = sp.group_heads == 1 ? QuotRem{0, i} : div_rem(i, sp.lanes);
      if (h0 + hl.quot != row_h) {
        row_h = h0 + hl.quot;
        if (!row_of<T>(p, st, t, row_h, src, dst, rows)) {
          dropped = true;
          break;
        }
      }
      run_lane<T, kInterleaved, kVector>(st, sp, p.tables, p.args.inverse, src, dst, hl.rem, rows,
                                         r, weight, sink);
    }
    if (pass == 1) {
      return;
    }
    if (group_any(dropped)) {
      return;
    }
    sink.scale = dynamic_fp8_scale(group_amax(sink.amax), tg.format, tg.pow2_scale);
    if (lane == 0) {
      store_scalar(tg.scales + t * tg.scale_token_stride + h0 * tg.scale_head_stride, sink.scale);
    }
  }
}

template <typename T, bool kInterleaved, bool kVector>
__device__ __forceinline__ void stream_thread(const StreamKernelParams& p, const RowStream& st,
                                              const StreamPlan& sp, int64_t w) {
  using A = typename AccType<T>::type;
  if (sp.cooperative) {
    cooperative_thread<T, kInterleaved, kVector>(p, st, sp, w);
    return;
  }
  const QuotRem lr = div_rem(w, sp.lanes);
  const QuotRem th = div_rem(lr.quot, st.heads);
  const int64_t t = th.quot;
  const int64_t h = th.rem;
  int64_t rows[kMaxAxes];
  if (!row_angles(p.args, p.tables, st, t, h, rows)) {
    return;
  }
  void* dst;
  if (!target_row<T>(p.args, st.target, t, h, dst)) {
    return;
  }
  const T* src = static_cast<const T*>(st.src) + t * st.token_stride + h * st.head_stride;
  LaneSink<A> sink;
  if (st.target.format != CacheFormat::kSame && st.target.scale != nullptr) {
    sink.scale = __ldg(st.target.scale);
  }
  run_lane<T, kInterleaved, kVector>(st, sp, p.tables, p.args.inverse, src, dst, lr.rem, rows, A(1),
                                     nullptr, sink);
}

// One resident block per SM is all the register budget asks for: a half-split lane holds 32 values
// and their angles, and at the 128 registers of two blocks ptxas spilled them to local memory
// (24-128 B of stack on sm_90), which scripts/sass_report.py refuses. The half-split variants use
// about 180 registers (1 block of 256 threads per SM on sm_90); not measured on a GPU yet.
template <typename T, bool kInterleaved>
__global__ void __launch_bounds__(kBlockThreads, 1)
    stream_kernel(const __grid_constant__ StreamKernelParams params) {
  int64_t w = grid_thread_index<kBlockThreads>();
  if (w >= params.total) {
    return;
  }
#pragma unroll
  for (int i = 0; i < kMaxStreams; ++i) {
    if (i < params.args.num_streams) {
      const StreamPlan& sp = params.plan[i];
      if (w < sp.span) {
        if (w < sp.threads) {
          const RowStream& st = params.args.streams[i];
          if (sp.vector) {
            stream_thread<T, kInterleaved, true>(params, st, sp, w);
          } else {
            stream_thread<T, kInterleaved, false>(params, st, sp, w);
          }
        }
        return;  // the segment's padding to a whole warp
      }
      w -= sp.span;
    }
  }
}

}  // namespace streams

// Launches the row streams of one call on `stream`; scalar_t is the storage type of every source
// (double, float, __half, __nv_bfloat16). Does not synchronize; returns the launch status.
template <typename scalar_t>
cudaError_t run_row_streams(const StreamArgs& args, const TableArgs& tables, cudaStream_t stream) {
  const streams::StreamKernelParams params =
      streams::plan(args, tables, static_cast<int64_t>(sizeof(scalar_t)));
  const int64_t blocks = device::blocks_for<streams::kBlockThreads>(params.total);
  const auto launch = [&](auto kernel) {
    return device::launch_grid(kernel, blocks, streams::kBlockThreads, params, stream);
  };
  return args.interleaved ? launch(streams::stream_kernel<scalar_t, true>)
                          : launch(streams::stream_kernel<scalar_t, false>);
}

}  // namespace rope::cuda
