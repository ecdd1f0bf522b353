// SPDX-License-Identifier: BSD-3-Clause
// float32 -> bfloat16 rounding in SIMD registers, bit-identical to c10::BFloat16(float):
// round-to-nearest-even on the bit pattern for every non-NaN value (subnormals included), and
// 0x7FC0 for every NaN whatever its sign and payload.
//
// Included only by rope_rows.cpp, once per CPU capability; the AVX2 functions are compiled in
// the AVX2 and AVX512 copies, the AVX512 ones only in the AVX512 copies. Two tiers per ISA:
//   *_fast:  correct for every non-NaN input (and, with native BF16, for every normal, zero or
//            infinite input). Callers test their inputs with *_needs_exact first.
//   *_exact: correct for every input, NaN included; the rare slow path.
// Splitting them lets the common case skip the NaN blend (and the native instruction's fix-ups),
// which is most of the conversion's cost on AVX2.
#pragma once

#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
#include <immintrin.h>

namespace rope::cpu::CPU_CAPABILITY {
namespace {

// ---- AVX2: 8 floats --------------------------------------------------------------------------

// The float's bits plus the round-to-nearest-even bias, 0x7FFF + lsb, where lsb is bit 16 (the
// last bit the bfloat16 keeps). The bfloat16 is the upper 16 bits of the result. Wrong for NaN.
inline __m256i bf16_round_avx2_fast(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  return _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)));
}

// As bf16_round_avx2_fast, and NaN lanes become 0x7FC0'0000 (c10's NaN in the upper half).
inline __m256i bf16_round_avx2_exact(__m256 v) {
  const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
  return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(bf16_round_avx2_fast(v)),
                                              _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)),
                                              nan));
}

// True when a or b has a NaN lane, i.e. when the fast rounding would be wrong.
inline bool bf16_avx2_needs_exact(__m256 a, __m256 b) {
  return _mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_UNORD_Q)) != 0;
}

// ---- AVX512: 16 floats -----------------------------------------------------------------------
#if defined(CPU_CAPABILITY_AVX512)

inline __m512i bf16_round_512_fast(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  return _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
}

inline __m512i bf16_round_512_exact(__m512 v) {
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_mov_epi32(bf16_round_512_fast(v), nan, _mm512_set1_epi32(0x7FC00000));
}

#if defined(__AVX512BF16__)
// The native VCVTNE2PS2BF16 rounds to nearest even too, but it treats subnormal inputs as zero
// and keeps NaN payloads (quietened), where c10 keeps subnormals and writes 0x7FC0. Those lanes
// take the exact integer path. VFPCLASSPS classes: 0x01 QNaN, 0x20 subnormal, 0x80 SNaN.
constexpr int kBf16NativeMisfits = 0x01 | 0x20 | 0x80;

inline bool bf16_512_needs_exact(__m512 a, __m512 b) {
  return (_mm512_fpclass_ps_mask(a, kBf16NativeMisfits) |
          _mm512_fpclass_ps_mask(b, kBf16NativeMisfits)) != 0;
}

// 32 bfloat16: lo's 16 values, then hi's.
inline __m512i bf16_pack_512_native(__m512 lo, __m512 hi) {
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}
#else
inline bool bf16_512_needs_exact(__m512 a, __m512 b) {
  return (_mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(b, b, _CMP_UNORD_Q)) != 0;
}
#endif  // __AVX512BF16__

#endif  // CPU_CAPABILITY_AVX512

}  // namespace
}  // namespace rope::cpu::CPU_CAPABILITY

#endif  // CPU_CAPABILITY_AVX2 || CPU_CAPABILITY_AVX512
