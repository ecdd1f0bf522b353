// SPDX-License-Identifier: BSD-3-Clause
// The planes of one row, 16 or 32 at a time, with AVX-512 (F, BW, VL, DQ) intrinsics; the
// AVX512_BF16 copy of the kernel also converts to bfloat16 with the native instruction.
//
// Included by the row kernels' AVX512 copies (rope_rows.cpp; the others through
// common_load_floats.h's conversions); in rope_rows.cpp common_planes_avx2.h finishes what the wide
// steps leave (8 planes), the scalar loop the rest. Whole-vector loads and
// stores only, each step reads before it writes (in == out is safe). The layout tricks are the
// AVX2 ones (see common_planes_avx2.h), at twice the width:
//  - float/half pairs: in-lane shuffle_ps/unpck, one 64-bit permute per table vector;
//  - bfloat16 pairs: a = word << 16, b = word & 0xFFFF0000; the native conversion returns
//    [a' | b'] and one vpermw interleaves them back;
//  - bfloat16 half split: vpmovzxwd widens 16 values in feature order, so tables load as they are.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "common_planes_avx2.h"
#include "common_simd_bf16.h"

namespace rope::cpu::CPU_CAPABILITY {
namespace {
namespace avx512 {

template <bool kInverse>
inline void turn(__m512 a, __m512 b, __m512 c, __m512 s, __m512& ra, __m512& rb) {
  if constexpr (kInverse) {
    ra = _mm512_fmadd_ps(a, c, _mm512_mul_ps(b, s));
    rb = _mm512_fnmadd_ps(a, s, _mm512_mul_ps(b, c));
  } else {
    ra = _mm512_fmsub_ps(a, c, _mm512_mul_ps(b, s));
    rb = _mm512_fmadd_ps(a, s, _mm512_mul_ps(b, c));
  }
}

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const c10::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline void store16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
inline void store16(c10::Half* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// 16 table values in the order shuffle_ps leaves a and b in: pairs (0,4,1,5,2,6,3,7).
inline __m512 load_table_pair_order(const float* p) {
  const __m512i order = _mm512_setr_epi64(0, 4, 1, 5, 2, 6, 3, 7);
  return _mm512_castpd_ps(_mm512_permutexvar_pd(order, _mm512_castps_pd(_mm512_loadu_ps(p))));
}

// ---- float and half storage ----------------------------------------------------------------

template <bool kInverse, typename scalar_t>
inline int64_t half_split_float(const scalar_t* x, scalar_t* y, const float* cos, const float* sin,
                                int64_t half, int64_t k) {
  for (; k + 16 <= half; k += 16) {
    __m512 ra, rb;
    turn<kInverse>(load16(x + k), load16(x + half + k), _mm512_loadu_ps(cos + k),
                   _mm512_loadu_ps(sin + k), ra, rb);
    store16(y + k, ra);
    store16(y + half + k, rb);
  }
  return avx2::half_split_float<kInverse>(x, y, cos, sin, half, k);
}

template <bool kInverse, typename scalar_t>
inline int64_t interleaved_float(const scalar_t* x, scalar_t* y, const float* cos, const float* sin,
                                 int64_t half, int64_t k) {
  for (; k + 16 <= half; k += 16) {
    const __m512 lo = load16(x + 2 * k);
    const __m512 hi = load16(x + 2 * k + 16);
    __m512 ra, rb;
    turn<kInverse>(_mm512_shuffle_ps(lo, hi, 0x88), _mm512_shuffle_ps(lo, hi, 0xDD),
                   load_table_pair_order(cos + k), load_table_pair_order(sin + k), ra, rb);
    store16(y + 2 * k, _mm512_unpacklo_ps(ra, rb));
    store16(y + 2 * k + 16, _mm512_unpackhi_ps(ra, rb));
  }
  return avx2::interleaved_float<kInverse>(x, y, cos, sin, half, k);
}

// ---- bfloat16 storage ----------------------------------------------------------------------

// 16 bfloat16 as floats in feature order.
inline __m512 load16_bf16(const c10::BFloat16* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// 32 bfloat16 (lo's 16 values, then hi's), rounded exactly as c10 does.
inline __m512i bf16_pack32(__m512 lo, __m512 hi) {
#if defined(__AVX512BF16__)
  if (__builtin_expect(!bf16_512_needs_exact(lo, hi), 1)) {
    return bf16_pack_512_native(lo, hi);
  }
  const __m512i ulo = bf16_round_512_exact(lo), uhi = bf16_round_512_exact(hi);
#else
  __m512i ulo, uhi;
  if (__builtin_expect(bf16_512_needs_exact(lo, hi), 0)) {
    ulo = bf16_round_512_exact(lo);
    uhi = bf16_round_512_exact(hi);
  } else {
    ulo = bf16_round_512_fast(lo);
    uhi = bf16_round_512_fast(hi);
  }
#endif
  // packus interleaves 64-bit groups per 128-bit lane; the permute restores lo-then-hi order.
  const __m512i packed =
      _mm512_packus_epi32(_mm512_srli_epi32(ulo, 16), _mm512_srli_epi32(uhi, 16));
  return _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), packed);
}

// Words a'|b'<<16 from two vectors of results: the bfloat16 pairs back in feature order.
inline __m512i bf16_pack_pairs(__m512 ra, __m512 rb) {
#if defined(__AVX512BF16__)
  if (__builtin_expect(!bf16_512_needs_exact(ra, rb), 1)) {
    alignas(64) static constexpr uint16_t kInterleave[32] = {
        0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
        8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    return _mm512_permutexvar_epi16(_mm512_load_si512(kInterleave), bf16_pack_512_native(ra, rb));
  }
  const __m512i ua = bf16_round_512_exact(ra), ub = bf16_round_512_exact(rb);
#else
  __m512i ua, ub;
  if (__builtin_expect(bf16_512_needs_exact(ra, rb), 0)) {
    ua = bf16_round_512_exact(ra);
    ub = bf16_round_512_exact(rb);
  } else {
    ua = bf16_round_512_fast(ra);
    ub = bf16_round_512_fast(rb);
  }
#endif
  // (ua >> 16) | (ub & 0xFFFF0000) in one ternary-logic op: A | (B & C).
  return _mm512_ternarylogic_epi32(_mm512_srli_epi32(ua, 16), ub,
                                   _mm512_set1_epi32(static_cast<int>(0xFFFF0000u)), 0xF8);
}

template <bool kInverse>
inline int64_t interleaved_bf16(const c10::BFloat16* x, c10::BFloat16* y, const float* cos,
                                const float* sin, int64_t half, int64_t k) {
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (; k + 16 <= half; k += 16) {
    const __m512i w = _mm512_loadu_si512(x + 2 * k);
    __m512 ra, rb;
    turn<kInverse>(_mm512_castsi512_ps(_mm512_slli_epi32(w, 16)),
                   _mm512_castsi512_ps(_mm512_and_si512(w, high)), _mm512_loadu_ps(cos + k),
                   _mm512_loadu_ps(sin + k), ra, rb);
    _mm512_storeu_si512(y + 2 * k, bf16_pack_pairs(ra, rb));
  }
  return avx2::interleaved_bf16<kInverse>(x, y, cos, sin, half, k);
}

template <bool kInverse>
inline int64_t half_split_bf16(const c10::BFloat16* x, c10::BFloat16* y, const float* cos,
                               const float* sin, int64_t half, int64_t k) {
  for (; k + 32 <= half; k += 32) {
    __m512 ra0, rb0, ra1, rb1;
    turn<kInverse>(load16_bf16(x + k), load16_bf16(x + half + k), _mm512_loadu_ps(cos + k),
                   _mm512_loadu_ps(sin + k), ra0, rb0);
    turn<kInverse>(load16_bf16(x + k + 16), load16_bf16(x + half + k + 16),
                   _mm512_loadu_ps(cos + k + 16), _mm512_loadu_ps(sin + k + 16), ra1, rb1);
    _mm512_storeu_si512(y + k, bf16_pack32(ra0, ra1));
    _mm512_storeu_si512(y + half + k, bf16_pack32(rb0, rb1));
  }
  if (k + 16 <= half) {
    // 16 planes: the a and b results share one 32-value conversion, stored as two 256-bit halves.
    __m512 ra, rb;
    turn<kInverse>(load16_bf16(x + k), load16_bf16(x + half + k), _mm512_loadu_ps(cos + k),
                   _mm512_loadu_ps(sin + k), ra, rb);
    const __m512i both = bf16_pack32(ra, rb);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + k), _mm512_castsi512_si256(both));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + half + k),
                        _mm512_extracti64x4_epi64(both, 1));
    k += 16;
  }
  return avx2::half_split_bf16<kInverse>(x, y, cos, sin, half, k);
}

// ---- entry -----------------------------------------------------------------------------------

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

}  // namespace avx512
}  // namespace
}  // namespace rope::cpu::CPU_CAPABILITY
