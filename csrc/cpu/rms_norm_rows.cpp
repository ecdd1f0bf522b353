// SPDX-License-Identifier: BSD-3-Clause
// The CPU row kernel of rope.rms_norm_apply_qk (see rms_norm_rows.h). Compiled once per CPU
// capability, like rope_rows.cpp; vectorised with at::vec, whose width follows the copy.
//
// One row: pass 1 converts the row to the math type into a scratch row (L1) while summing the
// squares; pass 2 reads the scratch row, scales each feature by r = 1 / sqrt(mean + eps) and by
// its weight, rotates the first rotary_dim features as rope_rows.cpp does (fmsub(a, c, b * s),
// fmadd(a, s, b * c)) and rounds once to the storage type. x is read from memory once.
#include "rms_norm_rows.h"

#include <ATen/OpMathType.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <type_traits>

// The float loads and stores of 16-bit rows (store_floats, load_float_pair, store_float_pair)
// convert with the rotation kernel's intrinsics in the x86 copies: see common_load_floats.h.
#include "common_load_floats.h"
#include "common_mixed_rows.h"
#include "common_row_cursor.h"

#ifndef CPU_CAPABILITY
#error "rms_norm_rows.cpp must be compiled with -DCPU_CAPABILITY=<DEFAULT|AVX2|AVX512|AVX512_BF16>"
#endif

namespace rope::cpu::CPU_CAPABILITY {
namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kW = Vec::size();

// Pass 1 of a 16-bit row: scratch = float(x), returns sum(x^2).
template <typename scalar_t>
inline float load_row(const scalar_t* x, float* buf, int64_t n) {
  Vec acc0(0.0f);
  Vec acc1(0.0f);
  int64_t d = 0;
  for (; d + 2 * kW <= n; d += 2 * kW) {
    Vec lo, hi;
    load_float_pair(x + d, lo, hi);
    lo.store(buf + d);
    hi.store(buf + d + kW);
    acc0 = at::vec::fmadd(lo, lo, acc0);
    acc1 = at::vec::fmadd(hi, hi, acc1);
  }
  for (; d + kW <= n; d += kW) {
    const Vec v = load_floats(x + d);
    v.store(buf + d);
    acc0 = at::vec::fmadd(v, v, acc0);
  }
  float ss =
      at::vec::vec_reduce_all<float>([](const Vec& a, const Vec& b) { return a + b; }, acc0 + acc1);
  for (; d < n; ++d) {
    const float v = static_cast<float>(x[d]);
    buf[d] = v;
    ss += v * v;
  }
  return ss;
}

// Pass 1 of a float row: sum(x^2) only (pass 2 reads x itself, now in L1).
inline float sum_squares(const float* x, int64_t n) {
  Vec acc0(0.0f);
  Vec acc1(0.0f);
  int64_t d = 0;
  for (; d + 2 * kW <= n; d += 2 * kW) {
    const Vec lo = Vec::loadu(x + d);
    const Vec hi = Vec::loadu(x + d + kW);
    acc0 = at::vec::fmadd(lo, lo, acc0);
    acc1 = at::vec::fmadd(hi, hi, acc1);
  }
  for (; d + kW <= n; d += kW) {
    const Vec v = Vec::loadu(x + d);
    acc0 = at::vec::fmadd(v, v, acc0);
  }
  float ss =
      at::vec::vec_reduce_all<float>([](const Vec& a, const Vec& b) { return a + b; }, acc0 + acc1);
  for (; d < n; ++d) {
    ss += x[d] * x[d];
  }
  return ss;
}

// Pass 1 of a float-math row: sum(x^2) over head_dim, and the row the rotation reads: x itself
// for float storage (now in L1), else `buf`, x converted to float.
template <int64_t kHead, typename scalar_t>
inline float norm_pass1(const scalar_t* x, float* buf, int64_t head_dim_rt, const float*& src) {
  const int64_t head_dim = kHead != 0 ? kHead : head_dim_rt;
  if constexpr (std::is_same_v<scalar_t, float>) {
    src = x;
    return sum_squares(x, head_dim);
  } else {
    src = buf;
    return load_row(x, buf, head_dim);
  }
}

inline float inverse_rms(float ss, int64_t head_dim, float eps) {
  return 1.0f / std::sqrt(ss / static_cast<float>(head_dim) + eps);
}

// Pass 2 of a float-math row (float, half, bfloat16 storage; float tables): src scaled by
// r = 1 / sqrt(mean + eps) and the weights, rotated, rounded once into y. kHalf / kHead: the
// planes and features when compile-time constants (the common full rotations: head_dim 64, 128,
// 256), else 0, so those rows' loops unroll. r is folded into cos and sin (one multiply per table
// vector instead of one per feature vector): y_a = (x_a w_a) (c r) - (x_b w_b) (s r).
template <bool kInterleaved, bool kInverse, int64_t kHalf, int64_t kHead, typename scalar_t>
inline void norm_pass2(const float* src, scalar_t* y, float r, const float* w, const float* cos,
                       const float* sin, int64_t head_dim_rt, int64_t half_rt) {
  const int64_t head_dim = kHead != 0 ? kHead : head_dim_rt;
  const int64_t half = kHalf != 0 ? kHalf : half_rt;
  const Vec vr(r);
  const Vec vsr(kInverse ? -r : r);
  int64_t k = 0;
  if constexpr (!kInterleaved) {
    // Half split: 2 * kW planes per step, so each half is stored as whole vectors.
    const auto planes = [&](int64_t j, Vec& ra, Vec& rb) {
      const Vec c = Vec::loadu(cos + j) * vr;
      const Vec s = Vec::loadu(sin + j) * vsr;
      const Vec a = Vec::loadu(src + j) * Vec::loadu(w + j);
      const Vec b = Vec::loadu(src + half + j) * Vec::loadu(w + half + j);
      ra = at::vec::fmsub(a, c, b * s);
      rb = at::vec::fmadd(a, s, b * c);
    };
    for (; k + 2 * kW <= half; k += 2 * kW) {
      Vec ra0, rb0, ra1, rb1;
      planes(k, ra0, rb0);
      planes(k + kW, ra1, rb1);
      store_float_pair(y + k, ra0, ra1);
      store_float_pair(y + half + k, rb0, rb1);
    }
  }
  for (; k + kW <= half; k += kW) {
    const Vec c = Vec::loadu(cos + k) * vr;
    const Vec s = Vec::loadu(sin + k) * vsr;
    Vec a, b;
    if constexpr (kInterleaved) {
      const Vec lo = Vec::loadu(src + 2 * k) * Vec::loadu(w + 2 * k);
      const Vec hi = Vec::loadu(src + 2 * k + kW) * Vec::loadu(w + 2 * k + kW);
      std::tie(a, b) = at::vec::deinterleave2(lo, hi);
    } else {
      a = Vec::loadu(src + k) * Vec::loadu(w + k);
      b = Vec::loadu(src + half + k) * Vec::loadu(w + half + k);
    }
    const Vec ra = at::vec::fmsub(a, c, b * s);
    const Vec rb = at::vec::fmadd(a, s, b * c);
    if constexpr (kInterleaved) {
      const auto [lo, hi] = at::vec::interleave2(ra, rb);
      store_float_pair(y + 2 * k, lo, hi);
    } else {
      store_floats(y + k, ra);
      store_floats(y + half + k, rb);
    }
  }
  if constexpr (kHalf == 0 || kHalf % kW != 0) {
    for (; k < half; ++k) {
      const int64_t ia = kInterleaved ? 2 * k : k;
      const int64_t ib = kInterleaved ? 2 * k + 1 : k + half;
      const float c = cos[k] * r;
      const float s = (kInverse ? -sin[k] : sin[k]) * r;
      const float a = src[ia] * w[ia];
      const float b = src[ib] * w[ib];
      y[ia] = static_cast<scalar_t>(std::fma(a, c, -(b * s)));
      y[ib] = static_cast<scalar_t>(std::fma(a, s, b * c));
    }
  }
  if constexpr (kHead == 0 || kHead != 2 * kHalf) {
    int64_t d = 2 * half;
    for (; d + 2 * kW <= head_dim; d += 2 * kW) {
      store_float_pair(y + d, Vec::loadu(src + d) * Vec::loadu(w + d) * vr,
                       Vec::loadu(src + d + kW) * Vec::loadu(w + d + kW) * vr);
    }
    for (; d + kW <= head_dim; d += kW) {
      store_floats(y + d, Vec::loadu(src + d) * Vec::loadu(w + d) * vr);
    }
    for (; d < head_dim; ++d) {
      y[d] = static_cast<scalar_t>(src[d] * w[d] * r);
    }
  }
}

// One float-math row: both passes.
template <bool kInterleaved, bool kInverse, int64_t kHalf, int64_t kHead, typename scalar_t>
inline void norm_row_float(const scalar_t* x, scalar_t* y, float* buf, const float* w,
                           const float* cos, const float* sin, float eps, int64_t head_dim_rt,
                           int64_t half_rt) {
  const float* src;
  const float ss = norm_pass1<kHead>(x, buf, head_dim_rt, src);
  norm_pass2<kInterleaved, kInverse, kHalf, kHead>(
      src, y, inverse_rms(ss, kHead != 0 ? kHead : head_dim_rt, eps), w, cos, sin, head_dim_rt,
      half_rt);
}

// Rows normalised as one block: pass 1 of every row, then all their 1 / sqrt(mean + eps) in one
// vector square root and division, then pass 2 of every row. Row by row, each row's reduction,
// square root and division form a serial chain as long as a pass (measured: most of a 128-feature
// row's time on this chain); a block's chains run side by side. A vector sqrt and division round
// as the scalar ones do (IEEE), so the result is bit for bit that of norm_row_float.
constexpr int64_t kBlockRows = 8;
static_assert(kBlockRows <= kW, "one vector holds the block's sums");

template <bool kInterleaved, bool kInverse, int64_t kHalf, int64_t kHead, typename scalar_t>
inline void norm_block_float(const scalar_t* x, int64_t in_step, scalar_t* y, int64_t out_step,
                             float* buf, const float* w, const float* cos, const float* sin,
                             const int64_t* offsets, float eps, int64_t head_dim_rt,
                             int64_t half_rt) {
  const int64_t head_dim = kHead != 0 ? kHead : head_dim_rt;
  alignas(64) float ss[kW] = {};
  const float* src[kBlockRows];
  for (int64_t j = 0; j < kBlockRows; ++j) {
    ss[j] = norm_pass1<kHead>(x + j * in_step, buf + j * head_dim, head_dim_rt, src[j]);
  }
  const Vec mean = Vec::loadu(ss) / Vec(static_cast<float>(head_dim));
  alignas(64) float r[kW];
  (Vec(1.0f) / (mean + Vec(eps)).sqrt()).store(r);
  for (int64_t j = 0; j < kBlockRows; ++j) {
    norm_pass2<kInterleaved, kInverse, kHalf, kHead>(src[j], y + j * out_step, r[j], w,
                                                     cos + offsets[j], sin + offsets[j],
                                                     head_dim_rt, half_rt);
  }
}

// A whole row in scalar code: double storage (double math), or double tables (math in the
// storage's math type, as rope_rows.cpp's scalar loop).
template <bool kInterleaved, bool kInverse, typename scalar_t, typename table_t>
inline void norm_rotate_row_scalar(const scalar_t* x, scalar_t* y, const table_t* cos,
                                   const table_t* sin, const at::opmath_type<scalar_t>* w,
                                   at::opmath_type<scalar_t>* buf, int64_t head_dim, int64_t half,
                                   double eps) {
  using acc_t = at::opmath_type<scalar_t>;
  acc_t ss = 0;
  for (int64_t d = 0; d < head_dim; ++d) {
    const acc_t v = static_cast<acc_t>(x[d]);
    buf[d] = v;
    ss += v * v;
  }
  const acc_t r = acc_t(1) / std::sqrt(ss / static_cast<acc_t>(head_dim) + static_cast<acc_t>(eps));
  for (int64_t k = 0; k < half; ++k) {
    const int64_t ia = kInterleaved ? 2 * k : k;
    const int64_t ib = kInterleaved ? 2 * k + 1 : k + half;
    const acc_t c = static_cast<acc_t>(cos[k]);
    const acc_t s = kInverse ? -static_cast<acc_t>(sin[k]) : static_cast<acc_t>(sin[k]);
    const acc_t a = buf[ia] * r * w[ia];
    const acc_t b = buf[ib] * r * w[ib];
    y[ia] = static_cast<scalar_t>(std::fma(a, c, -(b * s)));
    y[ib] = static_cast<scalar_t>(std::fma(a, s, b * c));
  }
  for (int64_t d = 2 * half; d < head_dim; ++d) {
    y[d] = static_cast<scalar_t>(buf[d] * r * w[d]);
  }
}

template <typename scalar_t, bool kInterleaved, bool kInverse, int64_t kHalf, int64_t kHead,
          typename pos_t, typename Angles>
void norm_rows_runs(const NormRotationArgs& nargs, Angles& angles, double eps, int64_t row_begin,
                    int64_t row_end) {
  using acc_t = at::opmath_type<scalar_t>;
  const RotationArgs& args = nargs.rot;
  const TableArgs& tables = angles.tables();
  const auto* in = static_cast<const scalar_t*>(args.in);
  auto* out = static_cast<scalar_t*>(args.out);
  const auto* positions = static_cast<const pos_t*>(args.positions);
  const auto* w = static_cast<const acc_t*>(nargs.weight);
  const RowGeometry& g = args.geometry;
  const int32_t inner = g.ndim - 1;
  const int64_t in_step = inner >= 0 ? g.in_strides[inner] : 0;
  const int64_t out_step = inner >= 0 ? g.out_strides[inner] : 0;
  const int64_t pos_step = inner >= 0 ? g.pos_strides[inner] : 0;
  const int64_t head_dim = args.head_dim;
  const int64_t half = args.rotary_dim / 2;
  c10::SmallVector<acc_t, 512> scratch(static_cast<size_t>(kBlockRows * head_dim));  // a block
  acc_t* buf = scratch.data();
  constexpr bool kFloatMath = std::is_same_v<acc_t, float>;
  const bool vector_path = kFloatMath && !tables.tables_are_double;
  RowCursor cur(g, row_begin);
  for (int64_t row = row_begin; row < row_end;) {
    const int64_t run = std::min(row_end - row, cur.rows_left_in_run());
    const scalar_t* x = in + cur.in();
    scalar_t* y = out + cur.out();
    const pos_t* p = positions + cur.pos();
    int64_t i = 0;
    // The constant-size rows (one-axis positions only: OneAxisAngles::row has no state, so a
    // block's table offsets can all be taken before any is used) go kBlockRows at a time.
    if constexpr (kFloatMath && kHalf != 0) {
      if (vector_path) {
        for (; i + kBlockRows <= run; i += kBlockRows, x += kBlockRows * in_step,
                                      y += kBlockRows * out_step, p += kBlockRows * pos_step) {
          int64_t offsets[kBlockRows];
          for (int64_t j = 0; j < kBlockRows; ++j) {
            offsets[j] = angles.row(p + j * pos_step) * tables.table_stride;
          }
          norm_block_float<kInterleaved, kInverse, kHalf, kHead>(
              x, in_step, y, out_step, buf, w, static_cast<const float*>(tables.cos),
              static_cast<const float*>(tables.sin), offsets, static_cast<float>(eps), head_dim,
              half);
        }
      }
    }
    for (; i < run; ++i, x += in_step, y += out_step, p += pos_step) {
      const int64_t offset = angles.row(p) * tables.table_stride;
      if constexpr (kFloatMath) {
        if (vector_path) {
          norm_row_float<kInterleaved, kInverse, kHalf, kHead>(
              x, y, buf, w, static_cast<const float*>(tables.cos) + offset,
              static_cast<const float*>(tables.sin) + offset, static_cast<float>(eps), head_dim,
              half);
          continue;
        }
      }
      if (tables.tables_are_double) {
        norm_rotate_row_scalar<kInterleaved, kInverse>(
            x, y, static_cast<const double*>(tables.cos) + offset,
            static_cast<const double*>(tables.sin) + offset, w, buf, head_dim, half, eps);
      } else {
        norm_rotate_row_scalar<kInterleaved, kInverse>(
            x, y, static_cast<const float*>(tables.cos) + offset,
            static_cast<const float*>(tables.sin) + offset, w, buf, head_dim, half, eps);
      }
    }
    row += run;
    cur.skip(run);
  }
}

template <typename scalar_t, bool kInterleaved, bool kInverse, int64_t kHalf, int64_t kHead,
          typename pos_t>
void norm_rows_positioned(const NormRotationArgs& args, const TableArgs& tables, double eps,
                          int64_t row_begin, int64_t row_end) {
  if (tables.axes.num_axes == 0) {
    OneAxisAngles<pos_t> angles(tables);
    return norm_rows_runs<scalar_t, kInterleaved, kInverse, kHalf, kHead, pos_t>(
        args, angles, eps, row_begin, row_end);
  }
  if constexpr (kHalf == 0) {  // multi-axis rows are not specialised (norm_rows_sized)
    if (tables.tables_are_double) {
      MixedRows<double, pos_t> angles(args.rot, tables, 0);
      return norm_rows_runs<scalar_t, kInterleaved, kInverse, 0, 0, pos_t>(args, angles, eps,
                                                                           row_begin, row_end);
    }
    MixedRows<float, pos_t> angles(args.rot, tables, 0);
    norm_rows_runs<scalar_t, kInterleaved, kInverse, 0, 0, pos_t>(args, angles, eps, row_begin,
                                                                  row_end);
  }
}

template <typename scalar_t, bool kInterleaved, bool kInverse, int64_t kHalf, int64_t kHead>
void norm_rows_typed(const NormRotationArgs& args, const TableArgs& tables, double eps,
                     int64_t row_begin, int64_t row_end) {
  if (args.rot.positions_are_int64) {
    norm_rows_positioned<scalar_t, kInterleaved, kInverse, kHalf, kHead, int64_t>(
        args, tables, eps, row_begin, row_end);
  } else {
    norm_rows_positioned<scalar_t, kInterleaved, kInverse, kHalf, kHead, int32_t>(
        args, tables, eps, row_begin, row_end);
  }
}

// The common full rotations (head_dim == rotary_dim of 64, 128, 256, float tables, one-axis
// positions, float math) get their own copies with constant sizes; anything else the general one.
template <typename scalar_t, bool kInterleaved, bool kInverse>
void norm_rows_sized(const NormRotationArgs& args, const TableArgs& tables, double eps,
                     int64_t row_begin, int64_t row_end) {
  if constexpr (!std::is_same_v<scalar_t, double>) {
    if (!tables.tables_are_double && tables.axes.num_axes == 0 &&
        args.rot.head_dim == args.rot.rotary_dim) {
      switch (args.rot.head_dim) {
        case 64:
          return norm_rows_typed<scalar_t, kInterleaved, kInverse, 32, 64>(args, tables, eps,
                                                                           row_begin, row_end);
        case 128:
          return norm_rows_typed<scalar_t, kInterleaved, kInverse, 64, 128>(args, tables, eps,
                                                                            row_begin, row_end);
        case 256:
          return norm_rows_typed<scalar_t, kInterleaved, kInverse, 128, 256>(args, tables, eps,
                                                                             row_begin, row_end);
        default:
          break;
      }
    }
  }
  norm_rows_typed<scalar_t, kInterleaved, kInverse, 0, 0>(args, tables, eps, row_begin, row_end);
}

template <typename scalar_t>
void norm_rows_layout(const NormRotationArgs& args, const TableArgs& tables, RotationMode mode,
                      double eps, int64_t row_begin, int64_t row_end) {
  if (mode.interleaved) {
    if (mode.inverse) {
      norm_rows_sized<scalar_t, true, true>(args, tables, eps, row_begin, row_end);
    } else {
      norm_rows_sized<scalar_t, true, false>(args, tables, eps, row_begin, row_end);
    }
  } else {
    if (mode.inverse) {
      norm_rows_sized<scalar_t, false, true>(args, tables, eps, row_begin, row_end);
    } else {
      norm_rows_sized<scalar_t, false, false>(args, tables, eps, row_begin, row_end);
    }
  }
}

}  // namespace

void norm_rows(c10::ScalarType dtype, const NormRotationArgs& args, const TableArgs& tables,
               RotationMode mode, NormParams params, int64_t row_begin, int64_t row_end) {
  switch (dtype) {
    case c10::ScalarType::Double:
      return norm_rows_layout<double>(args, tables, mode, params.eps, row_begin, row_end);
    case c10::ScalarType::Float:
      return norm_rows_layout<float>(args, tables, mode, params.eps, row_begin, row_end);
    case c10::ScalarType::Half:
      return norm_rows_layout<c10::Half>(args, tables, mode, params.eps, row_begin, row_end);
    case c10::ScalarType::BFloat16:
      return norm_rows_layout<c10::BFloat16>(args, tables, mode, params.eps, row_begin, row_end);
    default:
      TORCH_INTERNAL_ASSERT(false, "rope cpu norm kernel: unsupported dtype ", dtype);
  }
}

}  // namespace rope::cpu::CPU_CAPABILITY
