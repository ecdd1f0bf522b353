// SPDX-License-Identifier: BSD-3-Clause
// The planes of one row, 8 at a time (4 for float64), with AVX2 + FMA + F16C intrinsics.
//
// Included by the row kernels' AVX2 and AVX512 copies (rope_rows.cpp; the others through
// common_load_floats.h's conversions); the AVX512 copy of rope_rows.cpp finishes the planes its
// 16-wide steps leave with these. Every step loads and stores whole 128- or 256-bit
// vectors of both halves or both pair members, so no masked or partial stores; each step reads
// all its inputs before it writes, so in == out (the in-place op) is safe.
//
// Layout tricks, chosen because AVX2's cross-lane shuffles are its expensive ones:
//  - float/half, adjacent pairs: in-lane shuffle_ps splits 16 features into a and b in the order
//    (0,1,4,5 | 2,3,6,7); one 64-bit permute of each 8-wide table row matches that order, and
//    in-lane unpacklo/hi put the rotated pairs back in feature order.
//  - bfloat16, adjacent pairs: a bf16 is the top half of a float, so the 32-bit word a|b<<16
//    already holds both: a = word << 16, b = word & 0xFFFF0000, and the result word is
//    round(a')>>16 | round(b') & 0xFFFF0000. No shuffles at all.
//  - bfloat16, half split: unpacking with zero widens 16 values to floats in the order
//    (0-3, 8-11 | 4-7, 12-15) in two in-lane ops; permute2f128 puts the tables in the same order
//    and packus restores feature order on the way back.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "common_simd_bf16.h"

namespace rope::cpu::CPU_CAPABILITY {
namespace {
namespace avx2 {

// One turn of 8 planes. Forward: (a c - b s, a s + b c). Inverse turns by -angle:
// (a c + b s, b c - a s); the same roundings as negating s first.
template <bool kInverse>
inline void turn(__m256 a, __m256 b, __m256 c, __m256 s, __m256& ra, __m256& rb) {
  if constexpr (kInverse) {
    ra = _mm256_fmadd_ps(a, c, _mm256_mul_ps(b, s));
    rb = _mm256_fnmadd_ps(a, s, _mm256_mul_ps(b, c));
  } else {
    ra = _mm256_fmsub_ps(a, c, _mm256_mul_ps(b, s));
    rb = _mm256_fmadd_ps(a, s, _mm256_mul_ps(b, c));
  }
}

// 8 values of float or half storage as floats, and back (F16C rounds to nearest even).
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const c10::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline void store8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
inline void store8(c10::Half* p, __m256 v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// 8 table values in the order shuffle_ps leaves a and b in: (0,1,4,5 | 2,3,6,7).
inline __m256 load_table_pair_order(const float* p) {
  return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_loadu_ps(p)), 0xD8));
}

// ---- float and half storage ----------------------------------------------------------------

template <bool kInverse, typename scalar_t>
inline int64_t half_split_float(const scalar_t* x, scalar_t* y, const float* cos, const float* sin,
                                int64_t half, int64_t k) {
  for (; k + 8 <= half; k += 8) {
    __m256 ra, rb;
    turn<kInverse>(load8(x + k), load8(x + half + k), _mm256_loadu_ps(cos + k),
                   _mm256_loadu_ps(sin + k), ra, rb);
    store8(y + k, ra);
    store8(y + half + k, rb);
  }
  return k;
}

template <bool kInverse, typename scalar_t>
inline int64_t interleaved_float(const scalar_t* x, scalar_t* y, const float* cos, const float* sin,
                                 int64_t half, int64_t k) {
  for (; k + 8 <= half; k += 8) {
    const __m256 lo = load8(x + 2 * k);
    const __m256 hi = load8(x + 2 * k + 8);
    __m256 ra, rb;
    turn<kInverse>(_mm256_shuffle_ps(lo, hi, 0x88), _mm256_shuffle_ps(lo, hi, 0xDD),
                   load_table_pair_order(cos + k), load_table_pair_order(sin + k), ra, rb);
    store8(y + 2 * k, _mm256_unpacklo_ps(ra, rb));
    store8(y + 2 * k + 8, _mm256_unpackhi_ps(ra, rb));
  }
  return k;
}

// ---- bfloat16 storage ----------------------------------------------------------------------

// Round two vectors of results to bfloat16, exactly as c10 does; the result's upper halves.
inline void bf16_round_pair(__m256 ra, __m256 rb, __m256i& ua, __m256i& ub) {
  if (__builtin_expect(bf16_avx2_needs_exact(ra, rb), 0)) {
    ua = bf16_round_avx2_exact(ra);
    ub = bf16_round_avx2_exact(rb);
  } else {
    ua = bf16_round_avx2_fast(ra);
    ub = bf16_round_avx2_fast(rb);
  }
}

template <bool kInverse>
inline int64_t interleaved_bf16(const c10::BFloat16* x, c10::BFloat16* y, const float* cos,
                                const float* sin, int64_t half, int64_t k) {
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (; k + 8 <= half; k += 8) {
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 2 * k));
    __m256 ra, rb;
    turn<kInverse>(_mm256_castsi256_ps(_mm256_slli_epi32(w, 16)),
                   _mm256_castsi256_ps(_mm256_and_si256(w, high)), _mm256_loadu_ps(cos + k),
                   _mm256_loadu_ps(sin + k), ra, rb);
    __m256i ua, ub;
    bf16_round_pair(ra, rb, ua, ub);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + 2 * k),
                        _mm256_blend_epi16(_mm256_srli_epi32(ua, 16), ub, 0xAA));
  }
  return k;
}

// 8 bfloat16 as floats in feature order.
inline __m256 load8_bf16(const c10::BFloat16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// The upper halves of 8 rounded words, as 8 bfloat16.
inline void store8_bf16(c10::BFloat16* p, __m256i rounded) {
  const __m256i v = _mm256_srli_epi32(rounded, 16);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)));
}

template <bool kInverse>
inline int64_t half_split_bf16(const c10::BFloat16* x, c10::BFloat16* y, const float* cos,
                               const float* sin, int64_t half, int64_t k) {
  const __m256i zero = _mm256_setzero_si256();
  for (; k + 16 <= half; k += 16) {
    const __m256i wa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + k));
    const __m256i wb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + half + k));
    // Planes (0-3, 8-11) and (4-7, 12-15) of this step, as floats.
    const __m256 a0 = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, wa));
    const __m256 a1 = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, wa));
    const __m256 b0 = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, wb));
    const __m256 b1 = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, wb));
    const __m256 cl = _mm256_loadu_ps(cos + k), ch = _mm256_loadu_ps(cos + k + 8);
    const __m256 sl = _mm256_loadu_ps(sin + k), sh = _mm256_loadu_ps(sin + k + 8);
    __m256 ra0, rb0, ra1, rb1;
    turn<kInverse>(a0, b0, _mm256_permute2f128_ps(cl, ch, 0x20),
                   _mm256_permute2f128_ps(sl, sh, 0x20), ra0, rb0);
    turn<kInverse>(a1, b1, _mm256_permute2f128_ps(cl, ch, 0x31),
                   _mm256_permute2f128_ps(sl, sh, 0x31), ra1, rb1);
    __m256i ua0, ua1, ub0, ub1;
    const __m256 any_nan =
        _mm256_or_ps(_mm256_cmp_ps(ra0, ra1, _CMP_UNORD_Q), _mm256_cmp_ps(rb0, rb1, _CMP_UNORD_Q));
    if (__builtin_expect(_mm256_movemask_ps(any_nan) != 0, 0)) {
      ua0 = bf16_round_avx2_exact(ra0);
      ua1 = bf16_round_avx2_exact(ra1);
      ub0 = bf16_round_avx2_exact(rb0);
      ub1 = bf16_round_avx2_exact(rb1);
    } else {
      ua0 = bf16_round_avx2_fast(ra0);
      ua1 = bf16_round_avx2_fast(ra1);
      ub0 = bf16_round_avx2_fast(rb0);
      ub1 = bf16_round_avx2_fast(rb1);
    }
    // packus interleaves per 128-bit lane, undoing the unpack order.
    _mm256_storeu_si256(
        reinterpret_cast<__m256i*>(y + k),
        _mm256_packus_epi32(_mm256_srli_epi32(ua0, 16), _mm256_srli_epi32(ua1, 16)));
    _mm256_storeu_si256(
        reinterpret_cast<__m256i*>(y + half + k),
        _mm256_packus_epi32(_mm256_srli_epi32(ub0, 16), _mm256_srli_epi32(ub1, 16)));
  }
  for (; k + 8 <= half; k += 8) {
    __m256 ra, rb;
    turn<kInverse>(load8_bf16(x + k), load8_bf16(x + half + k), _mm256_loadu_ps(cos + k),
                   _mm256_loadu_ps(sin + k), ra, rb);
    __m256i ua, ub;
    bf16_round_pair(ra, rb, ua, ub);
    store8_bf16(y + k, ua);
    store8_bf16(y + half + k, ub);
  }
  return k;
}

// ---- float64 storage (double math; float32 or float64 tables) --------------------------------

template <bool kInverse>
inline void turn(__m256d a, __m256d b, __m256d c, __m256d s, __m256d& ra, __m256d& rb) {
  if constexpr (kInverse) {
    ra = _mm256_fmadd_pd(a, c, _mm256_mul_pd(b, s));
    rb = _mm256_fnmadd_pd(a, s, _mm256_mul_pd(b, c));
  } else {
    ra = _mm256_fmsub_pd(a, c, _mm256_mul_pd(b, s));
    rb = _mm256_fmadd_pd(a, s, _mm256_mul_pd(b, c));
  }
}

// 4 table values as doubles (float32 tables widen exactly).
inline __m256d load4_table(const double* p) { return _mm256_loadu_pd(p); }
inline __m256d load4_table(const float* p) { return _mm256_cvtps_pd(_mm_loadu_ps(p)); }

template <bool kInverse, typename table_t>
inline int64_t half_split_f64(const double* x, double* y, const table_t* cos, const table_t* sin,
                              int64_t half, int64_t k) {
  for (; k + 4 <= half; k += 4) {
    __m256d ra, rb;
    turn<kInverse>(_mm256_loadu_pd(x + k), _mm256_loadu_pd(x + half + k), load4_table(cos + k),
                   load4_table(sin + k), ra, rb);
    _mm256_storeu_pd(y + k, ra);
    _mm256_storeu_pd(y + half + k, rb);
  }
  return k;
}

// Pairs: unpacklo/hi_pd split 8 features into a and b in the order (0,2 | 1,3); a 64-bit permute
// puts the tables in that order and unpacklo/hi_pd restore feature order.
template <bool kInverse, typename table_t>
inline int64_t interleaved_f64(const double* x, double* y, const table_t* cos, const table_t* sin,
                               int64_t half, int64_t k) {
  for (; k + 4 <= half; k += 4) {
    const __m256d lo = _mm256_loadu_pd(x + 2 * k);
    const __m256d hi = _mm256_loadu_pd(x + 2 * k + 4);
    __m256d ra, rb;
    turn<kInverse>(_mm256_unpacklo_pd(lo, hi), _mm256_unpackhi_pd(lo, hi),
                   _mm256_permute4x64_pd(load4_table(cos + k), 0xD8),
                   _mm256_permute4x64_pd(load4_table(sin + k), 0xD8), ra, rb);
    _mm256_storeu_pd(y + 2 * k, _mm256_unpacklo_pd(ra, rb));
    _mm256_storeu_pd(y + 2 * k + 4, _mm256_unpackhi_pd(ra, rb));
  }
  return k;
}

// Rotates planes [k, n) of a float64 row for the largest multiple-of-4 n <= half; returns n.
template <bool kInterleaved, bool kInverse, typename table_t>
inline int64_t rotate_planes_f64(const double* x, double* y, const table_t* cos, const table_t* sin,
                                 int64_t half, int64_t k) {
  return kInterleaved ? interleaved_f64<kInverse>(x, y, cos, sin, half, k)
                      : half_split_f64<kInverse>(x, y, cos, sin, half, k);
}

// ---- entry -----------------------------------------------------------------------------------

// Rotates planes [k, n) of one row for the largest n <= half this ISA's steps reach; returns n.
template <bool kInterleaved, bool kInverse, typename scalar_t>
inline int64_t rotate_planes(const scalar_t* x, scalar_t* y, const float* cos, const float* sin,
                             int64_t half, int64_t k) {
  if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
    return kInterleaved ? interleaved_bf16<kInverse>(x, y, cos, sin, half, k)
                        : half_split_bf16<kInverse>(x, y, cos, sin, half, k);
  } else {
    return kInterleaved ? interleaved_float<kInverse>(x, y, cos, sin, half, k)
                        : half_split_float<kInverse>(x, y, cos, sin, half, k);
  }
}

}  // namespace avx2
}  // namespace
}  // namespace rope::cpu::CPU_CAPABILITY
