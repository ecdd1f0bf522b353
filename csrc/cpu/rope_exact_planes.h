// SPDX-License-Identifier: BSD-3-Clause
// The exact rotation of the frequency form (table-free): planes of a float, half or bfloat16 row
// turned by float64 cos / sin of exact angles (the compact tables rope_frequencies.cpp builds), in
// double, each result rounded once to float and then, for 16-bit storage, once more to the storage
// type exactly as c10 rounds (the "float32 result rounded once" of docs/architecture.md).
//
// Per plane (a, b) with cos c and sin s: ya = fma(a, c, -(b s)), yb = fma(a, s, b c) in double,
// which is csrc/common_exact_angle.h's rotate_via_f64, whose proof puts every float32 output within
// 2^-24 (1 + 2^-10) af (|a| + |b|) of the exact rotation: half the 2^-23 af (|a| + |b|) the
// frequency form promises. (The table kernels' float rotation, fmsub(a, c, b * s) with c and s
// rounded to float, is not within that bound: the roundings of cos and sin add up to another ulp
// where |cos| or |sin| is near 1.) The scalar loop of rope_rows.cpp (rotate_planes_exact_scalar)
// computes the same bits, so the result does not depend on which planes the vectors take.
//
// Included only by rope_rows.cpp in its AVX2 and AVX512 copies, after common_planes_avx2.h, whose
// loads, stores and bfloat16 rounding it reuses: 4 planes per step (one __m256d of a's, one of
// b's). Each step reads its features before it writes them (in == out is safe).
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "common_planes_avx2.h"

namespace rope::cpu::CPU_CAPABILITY {
namespace {
namespace exact {

// 8 features of any of the three storage types as floats, in feature order.
template <typename scalar_t>
inline __m256 load8f(const scalar_t* p) {
  if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
    return avx2::load8_bf16(p);
  } else {
    return avx2::load8(p);
  }
}

// 8 float results stored, rounded to the storage type as c10 rounds (bfloat16: the exact
// integer rounding, NaN included; half: F16C, round to nearest even).
template <typename scalar_t>
inline void store8f(scalar_t* p, __m256 v) {
  if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
    const bool nan = _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0;
    avx2::store8_bf16(p, nan ? bf16_round_avx2_exact(v) : bf16_round_avx2_fast(v));
  } else {
    avx2::store8(p, v);
  }
}

// Two vectors of 4 double results as 8 floats (lo's first), each rounded once.
inline __m256 to_floats(__m256d lo, __m256d hi) {
  return _mm256_set_m128(_mm256_cvtpd_ps(hi), _mm256_cvtpd_ps(lo));
}

// Half split: 8 planes per step, a's at x + k, b's at x + half + k.
template <bool kInverse, typename scalar_t>
inline int64_t half_split(const scalar_t* x, scalar_t* y, const double* cos, const double* sin,
                          int64_t half, int64_t k) {
  for (; k + 8 <= half; k += 8) {
    const __m256 a = load8f(x + k);
    const __m256 b = load8f(x + half + k);
    __m256d ra0, rb0, ra1, rb1;
    avx2::turn<kInverse>(_mm256_cvtps_pd(_mm256_castps256_ps128(a)),
                         _mm256_cvtps_pd(_mm256_castps256_ps128(b)), _mm256_loadu_pd(cos + k),
                         _mm256_loadu_pd(sin + k), ra0, rb0);
    avx2::turn<kInverse>(_mm256_cvtps_pd(_mm256_extractf128_ps(a, 1)),
                         _mm256_cvtps_pd(_mm256_extractf128_ps(b, 1)), _mm256_loadu_pd(cos + k + 4),
                         _mm256_loadu_pd(sin + k + 4), ra1, rb1);
    store8f(y + k, to_floats(ra0, ra1));
    store8f(y + half + k, to_floats(rb0, rb1));
  }
  return k;
}

// Pairs: 4 planes (8 features) per step. The widened features (a0 b0 a1 b1 | a2 b2 a3 b3) split
// into a = (a0 a2 a1 a3) and b by unpacklo / unpackhi_pd; a 64-bit permute puts the tables in that
// order, and unpacklo / unpackhi_pd restore feature order, as common_planes_avx2.h's float64 pairs.
template <bool kInverse, typename scalar_t>
inline int64_t interleaved(const scalar_t* x, scalar_t* y, const double* cos, const double* sin,
                           int64_t half, int64_t k) {
  for (; k + 4 <= half; k += 4) {
    const __m256 v = load8f(x + 2 * k);
    const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
    const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
    __m256d ra, rb;
    avx2::turn<kInverse>(_mm256_unpacklo_pd(lo, hi), _mm256_unpackhi_pd(lo, hi),
                         _mm256_permute4x64_pd(_mm256_loadu_pd(cos + k), 0xD8),
                         _mm256_permute4x64_pd(_mm256_loadu_pd(sin + k), 0xD8), ra, rb);
    store8f(y + 2 * k, to_floats(_mm256_unpacklo_pd(ra, rb), _mm256_unpackhi_pd(ra, rb)));
  }
  return k;
}

// Rotates planes [k, n) of one float / half / bfloat16 row exactly, for the largest n <= half
// the steps reach; returns n (the scalar loop does the rest).
template <bool kInterleaved, bool kInverse, typename scalar_t>
inline int64_t rotate_planes(const scalar_t* x, scalar_t* y, const double* cos, const double* sin,
                             int64_t half, int64_t k) {
  return kInterleaved ? interleaved<kInverse>(x, y, cos, sin, half, k)
                      : half_split<kInverse>(x, y, cos, sin, half, k);
}

}  // namespace exact
}  // namespace
}  // namespace rope::cpu::CPU_CAPABILITY
