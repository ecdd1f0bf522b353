// SPDX-License-Identifier: BSD-3-Clause
// The row streams' CPU kernel (see common_stream_rows.h and csrc/common_row_streams.h for the math
// every backend computes). Compiled once per CPU capability, like rope_rows.cpp, and with
// -ffp-contract=off (CMakeLists.txt): every fused multiply-add here is written out, as the CUDA
// kernel writes them, and no other product may be fused behind our back.
//
// One row at a time, in four steps over an L1 scratch row of the math type: widen the source,
// normalise it (RMSNorm streams), rotate its first rotary_dim features in place, store it
// (rounded to the storage type, or quantized to fp8 with kv_cache_fp8_rows.cpp's helpers of this
// copy; with dynamic scales, after the row's amax, or the token's rows' amax for per-token scales,
// which keep the token's rows in a scratch of their own until then). The source is read from memory
// once and the target written once; the scratch row and the table rows stay in L1. Two shortcuts
// with the same bits: a row only rotated into its own dtype goes from source to target in
// registers, and a float-math norm row into its own dtype takes two passes (widen while summing,
// then normalise, rotate and round in one).
#include "common_stream_rows.h"

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>
#include <type_traits>

#include "common_load_floats.h"
#include "common_planes.h"  // Vec, kW, rotate_planes_vec
#include "kv_cache_fp8_rows.h"

#ifndef CPU_CAPABILITY
#error \
    "common_stream_rows.cpp must be compiled with -DCPU_CAPABILITY=<DEFAULT|AVX2|AVX512|AVX512_BF16>"
#endif

namespace rope::cpu::CPU_CAPABILITY {
namespace {

static_assert(kStreamChunk % kW == 0, "the norm's partial sums are whole vectors");

// Norm rows summed side by side (sum_squares_rows).
constexpr int64_t kNormBlock = 4;

// ---- widen and store -------------------------------------------------------------------------

template <typename scalar_t, typename A>
inline void widen(const scalar_t* src, A* buf, int64_t n) {
  if constexpr (std::is_same_v<scalar_t, A>) {
    std::memcpy(buf, src, sizeof(A) * n);
  } else {
    int64_t i = 0;
    for (; i + 2 * kW <= n; i += 2 * kW) {
      Vec lo, hi;
      load_float_pair(src + i, lo, hi);
      lo.store(buf + i);
      hi.store(buf + i + kW);
    }
    for (; i + kW <= n; i += kW) {
      load_floats(src + i).store(buf + i);
    }
    for (; i < n; ++i) {
      buf[i] = static_cast<float>(src[i]);
    }
  }
}

// The row rounded once to the storage type (c10's rounding).
template <typename scalar_t, typename A>
inline void store_same(const A* buf, scalar_t* dst, int64_t n) {
  if constexpr (std::is_same_v<scalar_t, A>) {
    std::memcpy(dst, buf, sizeof(A) * n);
  } else {
    int64_t i = 0;
    for (; i + 2 * kW <= n; i += 2 * kW) {
      store_float_pair(dst + i, Vec::loadu(buf + i), Vec::loadu(buf + i + kW));
    }
    for (; i + kW <= n; i += kW) {
      store_floats(dst + i, Vec::loadu(buf + i));
    }
    for (; i < n; ++i) {
      dst[i] = static_cast<scalar_t>(buf[i]);
    }
  }
}

// ---- the norm
// ------------------------------------------------------------------------------------

// p_j += p_{j + 8}, then 4, 2, 1 (j below the step): the fold of common_row_streams.h, with
// constant steps, so that it unrolls into registers (a loop over the step ran through the stack,
// a sixth of a bf16 row's time).
template <typename A>
inline void fold_partial_sums(A (&p)[kStreamChunk]) {
  static_assert(kStreamChunk == 16, "the fold below is written for 16 partial sums");
  for (int64_t j = 0; j < 8; ++j) {
    p[j] = p[j] + p[j + 8];
  }
  for (int64_t j = 0; j < 4; ++j) {
    p[j] = p[j] + p[j + 4];
  }
  p[0] = p[0] + p[2];
  p[1] = p[1] + p[3];
  p[0] = p[0] + p[1];
}

// The sum of squares in the order of common_row_streams.h: 16 partial sums over the whole
// 16-element chunks (16 / kW vectors of them), the tree, then the rest one by one.
inline float sum_squares(const float* x, int64_t n) {
  constexpr int64_t kVecs = kStreamChunk / kW;
  const int64_t whole = n / kStreamChunk * kStreamChunk;
  Vec acc[kVecs];
  for (int64_t v = 0; v < kVecs; ++v) {
    acc[v] = Vec(0.0f);
  }
  for (int64_t i = 0; i < whole; i += kStreamChunk) {
    for (int64_t v = 0; v < kVecs; ++v) {
      const Vec x_v = Vec::loadu(x + i + v * kW);
      acc[v] = at::vec::fmadd(x_v, x_v, acc[v]);
    }
  }
  alignas(64) float p[kStreamChunk];
  for (int64_t v = 0; v < kVecs; ++v) {
    acc[v].store(p + v * kW);
  }
  fold_partial_sums(p);
  float s = p[0];
  for (int64_t i = whole; i < n; ++i) {
    s = std::fma(x[i], x[i], s);
  }
  return s;
}

inline double sum_squares(const double* x, int64_t n) {
  const int64_t whole = n / kStreamChunk * kStreamChunk;
  double p[kStreamChunk] = {};
  for (int64_t i = 0; i < whole; i += kStreamChunk) {
    for (int64_t j = 0; j < kStreamChunk; ++j) {
      p[j] = std::fma(x[i + j], x[i + j], p[j]);
    }
  }
  fold_partial_sums(p);
  double s = p[0];
  for (int64_t i = whole; i < n; ++i) {
    s = std::fma(x[i], x[i], s);
  }
  return s;
}

// x = (x * r) * w, r = 1 / sqrt(mean(x^2) + eps).
template <typename A>
inline void normalise(A* x, const A* w, int64_t n, double eps) {
  const A r = A(1) / std::sqrt(sum_squares(x, n) / static_cast<A>(n) + static_cast<A>(eps));
  int64_t i = 0;
  if constexpr (std::is_same_v<A, float>) {
    const Vec vr(r);
    for (; i + kW <= n; i += kW) {
      ((Vec::loadu(x + i) * vr) * Vec::loadu(w + i)).store(x + i);
    }
  }
  for (; i < n; ++i) {
    x[i] = (x[i] * r) * w[i];
  }
}

// The first pass of N norm rows stored in their own dtype: each row's sum of squares in the order
// of sum_squares (vector q of a row feeds its partial-sum vector q % (16 / kW)), the N rows side by
// side so that their N chains of dependent multiply-adds overlap (one row's chain is latency-bound:
// 8 dependent FMAs for 128 features in the AVX512 copy). 16-bit rows are widened into their
// scratch rows `buf[b]` on the way (whole 16-bit vectors, 2 * kW elements, where they can: a
// kW-element 16-bit load goes through a temporary); float rows are only read.
template <int N, int64_t kN, typename scalar_t>
inline void sum_squares_rows(const scalar_t* const (&src)[N], float* const (&buf)[N], int64_t n_rt,
                             float (&ss)[N]) {
  const int64_t n = kN != 0 ? kN : n_rt;  // kN: the width as a constant (the loops unroll)
  constexpr bool kWiden = !std::is_same_v<scalar_t, float>;
  constexpr int64_t kVecs = kStreamChunk / kW;
  const int64_t whole = n / kStreamChunk * kStreamChunk;
  Vec acc[N][kVecs];
  for (int b = 0; b < N; ++b) {
    for (int64_t v = 0; v < kVecs; ++v) {
      acc[b][v] = Vec(0.0f);
    }
  }
  int64_t i = 0;
  for (; i + 2 * kW <= whole; i += 2 * kW) {
    for (int b = 0; b < N; ++b) {
      Vec lo, hi;
      if constexpr (kWiden) {
        load_float_pair(src[b] + i, lo, hi);
        lo.store(buf[b] + i);
        hi.store(buf[b] + i + kW);
      } else {
        lo = Vec::loadu(src[b] + i);
        hi = Vec::loadu(src[b] + i + kW);
      }
      acc[b][0] = at::vec::fmadd(lo, lo, acc[b][0]);
      acc[b][kVecs - 1] = at::vec::fmadd(hi, hi, acc[b][kVecs - 1]);
    }
  }
  for (; i < whole; i += kW) {  // one chunk left (AVX512: a chunk is one vector)
    for (int b = 0; b < N; ++b) {
      Vec x_v;
      if constexpr (kWiden) {
        x_v = load_floats(src[b] + i);
        x_v.store(buf[b] + i);
      } else {
        x_v = Vec::loadu(src[b] + i);
      }
      acc[b][(i / kW) % kVecs] = at::vec::fmadd(x_v, x_v, acc[b][(i / kW) % kVecs]);
    }
  }
  for (int b = 0; b < N; ++b) {
    alignas(64) float p[kStreamChunk];
    for (int64_t v = 0; v < kVecs; ++v) {
      acc[b][v].store(p + v * kW);
    }
    fold_partial_sums(p);
    float s = p[0];
    for (int64_t j = whole; j < n; ++j) {
      const float x = static_cast<float>(src[b][j]);
      if constexpr (kWiden) {
        buf[b][j] = x;
      }
      s = std::fma(x, x, s);
    }
    ss[b] = s;
  }
}

// The second pass of a norm row stored in its own dtype: y = (x * r) * w, its first 2 * half
// features rotated (a' = fma(a, c, -(b * s)), b' = fma(a, s, b * c)), everything rounded once into
// dst. The math of normalise, rotate and store_same in one pass over the row (in L1), so a norm
// row costs two passes, not four: the same bits.
// flatten: every conversion inlined (GCC kept bf16_pack32 out of line in the unrolled row, a
// call per 32 features: a seventh of a bf16 decode call).
template <bool kInterleaved, int64_t kWidth, typename scalar_t>
__attribute__((flatten)) inline void normalise_rotate_store(const float* x, const float* w, float r,
                                                            const float* cos, const float* sin,
                                                            int64_t half_rt, int64_t width_rt,
                                                            scalar_t* dst) {
  // kWidth: a fully rotated row of that constant width (the loops unroll), else 0.
  const int64_t width = kWidth != 0 ? kWidth : width_rt;
  const int64_t half = kWidth != 0 ? kWidth / 2 : half_rt;
  const Vec vr(r);
  const auto norm = [&](int64_t i) { return (Vec::loadu(x + i) * vr) * Vec::loadu(w + i); };
  const auto planes = [&](int64_t k, Vec& ra, Vec& rb) {
    const Vec c = Vec::loadu(cos + k);
    const Vec s = Vec::loadu(sin + k);
    Vec a, b;
    if constexpr (kInterleaved) {
      std::tie(a, b) = at::vec::deinterleave2(norm(2 * k), norm(2 * k + kW));
    } else {
      a = norm(k);
      b = norm(half + k);
    }
    ra = at::vec::fmsub(a, c, b * s);
    rb = at::vec::fmadd(a, s, b * c);
  };
  int64_t k = 0;
  if constexpr (kInterleaved) {
    for (; k + kW <= half; k += kW) {
      Vec ra, rb;
      planes(k, ra, rb);
      const auto [lo, hi] = at::vec::interleave2(ra, rb);
      store_float_pair(dst + 2 * k, lo, hi);
    }
  } else {
    for (; k + 2 * kW <= half; k += 2 * kW) {
      Vec ra0, rb0, ra1, rb1;
      planes(k, ra0, rb0);
      planes(k + kW, ra1, rb1);
      store_float_pair(dst + k, ra0, ra1);
      store_float_pair(dst + half + k, rb0, rb1);
    }
    for (; k + kW <= half; k += kW) {
      Vec ra, rb;
      planes(k, ra, rb);
      store_floats(dst + k, ra);
      store_floats(dst + half + k, rb);
    }
  }
  if constexpr (kWidth == 0 || (kWidth / 2) % kW != 0) {
    for (; k < half; ++k) {
      const int64_t ia = kInterleaved ? 2 * k : k;
      const int64_t ib = kInterleaved ? 2 * k + 1 : k + half;
      const float a = (x[ia] * r) * w[ia];
      const float b = (x[ib] * r) * w[ib];
      dst[ia] = static_cast<scalar_t>(std::fma(a, cos[k], -(b * sin[k])));
      dst[ib] = static_cast<scalar_t>(std::fma(a, sin[k], b * cos[k]));
    }
  }
  if constexpr (kWidth == 0) {  // a constant width is a full rotation: no tail
    int64_t d = 2 * half;
    for (; d + 2 * kW <= width; d += 2 * kW) {
      store_float_pair(dst + d, norm(d), norm(d + kW));
    }
    for (; d + kW <= width; d += kW) {
      store_floats(dst + d, norm(d));
    }
    for (; d < width; ++d) {
      dst[d] = static_cast<scalar_t>((x[d] * r) * w[d]);
    }
  }
}

// ---- dynamic scales --------------------------------------------------------------------------

// The NaN-propagating max of |x_i| folded into `amax` (kv_cache_args.h's fold_amax): whole
// vectors with at::vec's maximum (which propagates NaN), the lanes by one horizontal maximum
// (shuffles), the rest one by one. Folding the lanes one by one was a branch per lane,
// mispredicted on real rows: about a sixth of a dynamic-scale prefill on a Zen 2. Any NaN's
// payload may come out: dynamic_fp8_scale makes every NaN scale the one NaN.
template <typename A>
inline A row_amax(const A* x, int64_t n, A amax) {
  int64_t i = 0;
  if constexpr (std::is_same_v<A, float>) {
    if (n >= kW) {
      Vec m(0.0f);
      for (; i + kW <= n; i += kW) {
        m = at::vec::maximum(m, Vec::loadu(x + i).abs());
      }
      const auto max = [](const Vec& a, const Vec& b) { return at::vec::maximum(a, b); };
      amax = fold_amax(amax, at::vec::vec_reduce_all<float>(max, m));
    }
  }
  for (; i < n; ++i) {
    amax = fold_amax(amax, x[i]);
  }
  return amax;
}

// ---- the rotation ----------------------------------------------------------------------------

// Planes [k, half) of a row, one at a time: from `in` (storage or math type) into `out`, in the
// math type A, each rounded once to out's type.
template <bool kInterleaved, typename A, typename in_t, typename out_t>
inline void rotate_scalar(const in_t* in, out_t* out, const A* cos, const A* sin, int64_t half,
                          int64_t k) {
  for (; k < half; ++k) {
    const int64_t ia = kInterleaved ? 2 * k : k;
    const int64_t ib = kInterleaved ? 2 * k + 1 : k + half;
    const A a = static_cast<A>(in[ia]);
    const A b = static_cast<A>(in[ib]);
    out[ia] = static_cast<out_t>(std::fma(a, cos[k], -(b * sin[k])));
    out[ib] = static_cast<out_t>(std::fma(a, sin[k], b * cos[k]));
  }
}

// Whole vectors of planes from `in` into `out` (common_planes.h), with the plane count known at
// compile time for the common rotary dims (64, 128, 256), as the rotation kernel's rows have it:
// the plane loop unrolls. Returns the first plane left for rotate_scalar.
template <bool kInterleaved, typename scalar_t>
inline int64_t rotate_planes_sized(const scalar_t* in, scalar_t* out, const float* cos,
                                   const float* sin, int64_t half) {
  if constexpr (kHasIntrinsics) {
    switch (half) {
      case 32:
        return rotate_planes_vec<kInterleaved, false>(in, out, cos, sin, 32);
      case 64:
        return rotate_planes_vec<kInterleaved, false>(in, out, cos, sin, 64);
      case 128:
        return rotate_planes_vec<kInterleaved, false>(in, out, cos, sin, 128);
      default:
        break;
    }
  }
  return rotate_planes_vec<kInterleaved, false>(in, out, cos, sin, half);
}

// Rotates the first 2 * half features of x in place with the planes' cos and sin: whole vectors
// of planes with the rotation kernel's plane code (common_planes.h: in-lane shuffles, not the
// cross-lane permutes of at::vec's deinterleave), the rest one at a time.
template <bool kInterleaved, typename A>
inline void rotate(A* x, const A* cos, const A* sin, int64_t half) {
  int64_t k = 0;
  if constexpr (std::is_same_v<A, float>) {
    k = rotate_planes_vec<kInterleaved, false>(x, x, cos, sin, half);
  }
  rotate_scalar<kInterleaved>(x, x, cos, sin, half, k);
}

// The cos and sin rows of one rotating row, in the math type: the table rows themselves
// (one-axis positions, tables of the math type), or gathered into `cos_buf` / `sin_buf` (the
// plane's axis's row for multi-axis positions; a conversion for tables of the other type; the
// sines negated for the inverse rotation, once per token, so the rotation code is the forward
// one).
template <typename A, typename pos_t>
class Angles {
 public:
  Angles(const StreamArgs& a, const TableArgs& tb, int64_t half, A* cos_buf, A* sin_buf,
         const int8_t* plane_axis)
      : a_(a),
        tb_(tb),
        half_(half),
        cos_buf_(cos_buf),
        sin_buf_(sin_buf),
        plane_axis_(plane_axis) {}

  // Sets cos / sin for the row whose positions start at pos_off.
  void at(int64_t pos_off, const A*& cos, const A*& sin) const {
    const auto* positions = static_cast<const pos_t*>(a_.positions) + pos_off;
    const bool native = tb_.tables_are_double == std::is_same_v<A, double>;
    if (tb_.axes.num_axes == 0 && native && !a_.inverse) {
      const int64_t row = static_cast<int64_t>(positions[0]) * tb_.table_stride;
      cos = static_cast<const A*>(tb_.cos) + row;
      sin = static_cast<const A*>(tb_.sin) + row;
      return;
    }
    if (tb_.tables_are_double) {
      gather(static_cast<const double*>(tb_.cos), static_cast<const double*>(tb_.sin), positions);
    } else {
      gather(static_cast<const float*>(tb_.cos), static_cast<const float*>(tb_.sin), positions);
    }
    cos = cos_buf_;
    sin = sin_buf_;
  }

 private:
  template <typename table_t>
  void gather(const table_t* c, const table_t* s, const pos_t* positions) const {
    int64_t rows[kMaxAxes] = {};
    const int32_t axes = tb_.axes.num_axes == 0 ? 1 : tb_.axes.num_axes;
    for (int32_t axis = 0; axis < axes; ++axis) {
      rows[axis] = static_cast<int64_t>(positions[axis * a_.axis_stride]) * tb_.table_stride;
    }
    const A sign = a_.inverse ? A(-1) : A(1);
    for (int64_t k = 0; k < half_; ++k) {
      const int64_t at = rows[plane_axis_ != nullptr ? plane_axis_[k] : 0] + k;
      cos_buf_[k] = static_cast<A>(c[at]);
      sin_buf_[k] = sign * static_cast<A>(s[at]);
    }
  }

  const StreamArgs& a_;
  const TableArgs& tb_;
  int64_t half_;
  A* cos_buf_;
  A* sin_buf_;
  const int8_t* plane_axis_;
};

// ---- one call's tokens ---------------------------------------------------------------------

template <typename scalar_t, bool kInterleaved, typename pos_t>
void rows_of_tokens(const StreamArgs& a, const TableArgs& tb, int64_t t0, int64_t t1) {
  using A = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
  const c10::ScalarType acc_dtype = std::is_same_v<A, double> ? c10::kDouble : c10::kFloat;
  int64_t max_width = 0;
  int64_t half = 0;
  for (int32_t i = 0; i < a.num_streams; ++i) {
    max_width = std::max(max_width, a.streams[i].width);
    half = std::max(half, a.streams[i].rotary_dim / 2);  // every rotating stream shares the tables
  }
  // A stream with per-token dynamic scales keeps a token's rows until their common scale is known.
  int64_t token_rows = 0;
  for (int32_t i = 0; i < a.num_streams; ++i) {
    const RowStream& st = a.streams[i];
    if (st.target.scales != nullptr && st.target.per_token) {
      token_rows = std::max(token_rows, st.heads * st.width);
    }
  }
  c10::SmallVector<A, 1024> buf(static_cast<size_t>(max_width));
  // The scratch rows of a block of norm rows (16-bit storage, float math), on the stack for rows
  // up to 256 wide: a heap block per call, freed at its end, was trimmed and faulted in again on
  // every decode call (a 2 KiB scratch doubled a bf16 decode call).
  c10::SmallVector<float, 4 * 256> block_buf(std::is_same_v<A, float> &&
                                                     !std::is_same_v<scalar_t, float>
                                                 ? static_cast<size_t>(kNormBlock * max_width)
                                                 : 0);
  c10::SmallVector<A, 16> token_buf(static_cast<size_t>(token_rows));
  c10::SmallVector<A, 512> cos_buf(static_cast<size_t>(half));
  c10::SmallVector<A, 512> sin_buf(static_cast<size_t>(half));
  c10::SmallVector<int8_t, 256> plane_axis;
  if (tb.axes.num_axes > 0) {
    plane_axis.resize(static_cast<size_t>(half));
    for (int64_t k = 0; k < half; ++k) {
      plane_axis[k] = static_cast<int8_t>(axis_of_plane(tb.axes, k));
    }
  }
  const Angles<A, pos_t> angles(a, tb, half, cos_buf.data(), sin_buf.data(),
                                plane_axis.empty() ? nullptr : plane_axis.data());
  // The angle rows of the last position offset read: rows of one token share them (positions
  // broadcast over heads, and every rotating stream reads the same positions and tables), so a
  // multi-axis gather or a table conversion runs once per token, not once per row.
  int64_t angles_off = -1;
  const A* cos = nullptr;
  const A* sin = nullptr;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t slot = a.slots != nullptr ? a.slots[t * a.slot_stride] : 0;
    for (int32_t i = 0; i < a.num_streams; ++i) {
      const RowStream& st = a.streams[i];
      const StreamTarget& tg = st.target;
      if (tg.by_slot && (slot < 0 || slot >= tg.num_slots)) {
        continue;  // padding (a slot past the cache was refused before the call)
      }
      const float scale = tg.scale != nullptr ? *tg.scale : 1.0f;
      // A row that is only rotated (no norm) into its own dtype goes from source to target in
      // registers, as the rotation kernel's rows do: no pass through the scratch row (which
      // made apply_qk_cache's decode rows twice as slow as the rotation of the same rows).
      const bool direct =
          std::is_same_v<A, float> && st.weight == nullptr && tg.format == CacheFormat::kSame;
      // Per-token dynamic scales: the token's rows wait in token_buf while amax grows.
      const bool dynamic_token = tg.scales != nullptr && tg.per_token;
      A amax = A(0);
      // The token's first target row: one division of the slot per token and stream, not per
      // head (a 64-bit division per row was a fifth of a decode call's time).
      const int64_t row0 = tg.by_slot ? slot_row(tg, slot, 0) : token_row(tg, t, 0);
      for (int64_t h = 0; h < st.heads; ++h) {
        const auto* src =
            static_cast<const scalar_t*>(st.src) + t * st.token_stride + h * st.head_stride;
        const int64_t row = row0 + h * tg.head_stride;
        if (direct) {
          auto* dst = static_cast<scalar_t*>(tg.data) + row;
          const int64_t R = st.rotary_dim;
          if (R > 0) {
            const int64_t off = t * st.pos_token_stride + h * st.pos_head_stride;
            if (off != angles_off) {
              angles.at(off, cos, sin);
              angles_off = off;
            }
            if constexpr (std::is_same_v<A, float>) {
              const int64_t k = rotate_planes_sized<kInterleaved>(src, dst, cos, sin, R / 2);
              rotate_scalar<kInterleaved>(src, dst, cos, sin, R / 2, k);
            }
          }
          if (st.width > R) {
            // Neither normalised nor rotated: copied bit for bit (common_row_streams.h).
            std::memcpy(dst + R, src + R, sizeof(scalar_t) * (st.width - R));
          }
          continue;
        }
        if constexpr (std::is_same_v<A, float>) {
          if (st.weight != nullptr && tg.format == CacheFormat::kSame) {
            // Norm rows into their own dtype: two passes, kNormBlock rows at a time (their sums of
            // squares overlap), no scratch rows for float storage.
            const int64_t nb = std::min<int64_t>(kNormBlock, st.heads - h);
            const float eps_f = static_cast<float>(a.eps);
            const auto block = [&](auto width_constant) {
              constexpr int64_t kWidth = decltype(width_constant)::value;
              const scalar_t* srcs[kNormBlock];
              float* bufs[kNormBlock];
              float ss[kNormBlock];
              for (int64_t b = 0; b < kNormBlock; ++b) {
                const int64_t hb = h + std::min(b, nb - 1);  // a short block repeats its last row
                srcs[b] = static_cast<const scalar_t*>(st.src) + t * st.token_stride +
                          hb * st.head_stride;
                bufs[b] = block_buf.empty() ? nullptr : block_buf.data() + b * st.width;
              }
              if (nb == kNormBlock) {
                sum_squares_rows<kNormBlock, kWidth>(srcs, bufs, st.width, ss);
              } else {
                for (int64_t b = 0; b < nb; ++b) {
                  const scalar_t* const one_src[1] = {srcs[b]};
                  float* const one_buf[1] = {bufs[b]};
                  float one_ss[1];
                  sum_squares_rows<1, kWidth>(one_src, one_buf, st.width, one_ss);
                  ss[b] = one_ss[0];
                }
              }
              // The block's factors first: their divisions and square roots overlap, instead of
              // each row's second pass waiting on its own (a third of a bf16 row in cache).
              float rs[kNormBlock];
              for (int64_t b = 0; b < nb; ++b) {
                rs[b] = 1.0f / std::sqrt(ss[b] / static_cast<float>(st.width) + eps_f);
              }
              for (int64_t b = 0; b < nb; ++b) {
                const float r = rs[b];
                if (st.rotary_dim > 0) {
                  const int64_t off = t * st.pos_token_stride + (h + b) * st.pos_head_stride;
                  if (off != angles_off) {
                    angles.at(off, cos, sin);
                    angles_off = off;
                  }
                }
                const float* x = bufs[b];
                if constexpr (std::is_same_v<scalar_t, float>) {
                  x = srcs[b];
                }
                normalise_rotate_store<kInterleaved, kWidth>(
                    x, static_cast<const float*>(st.weight), r, cos, sin, st.rotary_dim / 2,
                    st.width, static_cast<scalar_t*>(tg.data) + row + b * tg.head_stride);
              }
            };
            // The common full rotations get constant widths, as the rotation kernel's rows do.
            switch (st.rotary_dim == st.width ? st.width : 0) {
              case 64:
                block(std::integral_constant<int64_t, 64>{});
                break;
              case 128:
                block(std::integral_constant<int64_t, 128>{});
                break;
              case 256:
                block(std::integral_constant<int64_t, 256>{});
                break;
              default:
                block(std::integral_constant<int64_t, 0>{});
                break;
            }
            h += nb - 1;
            continue;
          }
        }
        A* x = dynamic_token ? token_buf.data() + h * st.width : buf.data();
        widen(src, x, st.width);
        if (st.weight != nullptr) {
          normalise(x, static_cast<const A*>(st.weight), st.width, a.eps);
        }
        if (st.rotary_dim > 0) {
          const int64_t off = t * st.pos_token_stride + h * st.pos_head_stride;
          if (off != angles_off) {
            angles.at(off, cos, sin);
            angles_off = off;
          }
          rotate<kInterleaved>(x, cos, sin, st.rotary_dim / 2);
        }
        if (dynamic_token) {
          amax = row_amax(x, st.width, amax);
          continue;  // stored below, once the token's scale is known
        }
        float row_scale = scale;
        if (tg.scales != nullptr) {
          row_scale = dynamic_fp8_scale(row_amax(x, st.width, A(0)), tg.format, tg.pow2_scale);
          tg.scales[t * tg.scale_token_stride + h * tg.scale_head_stride] = row_scale;
        }
        if (tg.format == CacheFormat::kSame) {
          store_same(x, static_cast<scalar_t*>(tg.data) + row, st.width);
        } else {
          quantize_fp8_row(acc_dtype, x, static_cast<uint8_t*>(tg.data) + row, st.width, row_scale,
                           tg.format, tg.rule);
        }
      }
      if (dynamic_token) {
        const float token_scale = dynamic_fp8_scale(amax, tg.format, tg.pow2_scale);
        tg.scales[t * tg.scale_token_stride] = token_scale;
        for (int64_t h = 0; h < st.heads; ++h) {
          quantize_fp8_row(acc_dtype, token_buf.data() + h * st.width,
                           static_cast<uint8_t*>(tg.data) + row0 + h * tg.head_stride, st.width,
                           token_scale, tg.format, tg.rule);
        }
      }
    }
  }
}

template <typename scalar_t>
void rows_typed(const StreamArgs& a, const TableArgs& tb, int64_t t0, int64_t t1) {
  if (a.interleaved) {
    return a.positions_are_int64 ? rows_of_tokens<scalar_t, true, int64_t>(a, tb, t0, t1)
                                 : rows_of_tokens<scalar_t, true, int32_t>(a, tb, t0, t1);
  }
  return a.positions_are_int64 ? rows_of_tokens<scalar_t, false, int64_t>(a, tb, t0, t1)
                               : rows_of_tokens<scalar_t, false, int32_t>(a, tb, t0, t1);
}

}  // namespace

void stream_rows(c10::ScalarType dtype, const StreamArgs& args, const TableArgs& tables,
                 int64_t token_begin, int64_t token_end) {
  switch (dtype) {
    case c10::kDouble:
      return rows_typed<double>(args, tables, token_begin, token_end);
    case c10::kFloat:
      return rows_typed<float>(args, tables, token_begin, token_end);
    case c10::kHalf:
      return rows_typed<c10::Half>(args, tables, token_begin, token_end);
    case c10::kBFloat16:
      return rows_typed<c10::BFloat16>(args, tables, token_begin, token_end);
    default:
      TORCH_INTERNAL_ASSERT(false, "stream_rows: unexpected dtype ", dtype);
  }
}

}  // namespace rope::cpu::CPU_CAPABILITY
