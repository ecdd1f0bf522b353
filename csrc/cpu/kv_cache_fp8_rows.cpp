// SPDX-License-Identifier: BSD-3-Clause
// The fp8 row helper of the row streams' fp8 targets (see kv_cache_fp8_rows.h).
// Compiled once per CPU capability, like rope_rows.cpp.
//
// The quotients x / scale (or products x * scale, ScaleRule::kMultiply) are IEEE operations, lane
// by lane (at::vec), so they are the scalar ones; the rounding to fp8 is c10's algorithm. Every
// copy divides a chunk of the row into an L1 buffer, then rounds it with encode_saturated below,
// c10's algorithm without branches, a loop the compiler vectorises for AVX-512 (a plain `?:` on
// the float sum is not if-converted, masks are) and the AVX2 copy runs as explicit intrinsics
// (encode8: GCC left its loop scalar). Row tails (and float64 rows,
// divided in float64 first) take the same scalar form.
//
// Saturation: the quantized value is saturate(x / scale), then rounded as c10 rounds.
// encode_saturated clamps the magnitude, keeping NaN (torch's vectorised e4m3fn conversion does
// not saturate in every version, and e5m2's overflow is inf).
//
// Not torch's at::vec::convert to Float8 (ATen/cpu/vec/vec512/vec512_float8.h), which the AVX-512
// copies used until 2026-11-28: it branches on whether a vector holds an fp8 subnormal, and for
// activations (values near 2^-7 and below are common) the branch mispredicts. Measured on an AMD
// EPYC (Zen 4, AVX512_BF16 copy, one thread), apply_qk_cache of a bf16 prefill chunk (2048 tokens,
// q 32 x 128, k and v 8 x 128) into float8 caches: 5.87 ms with torch's conversion against
// 3.62 ms with encode_saturated at scale 1, 4.89 against 3.69 ms at scale 0.05;
// rms_norm_apply_qk_cache with float8 q and caches 14.96 against 8.86 ms.
#include "kv_cache_fp8_rows.h"

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#if defined(CPU_CAPABILITY_AVX2)
#include <immintrin.h>
#endif
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "common_load_floats.h"

#ifndef CPU_CAPABILITY
#error \
    "kv_cache_fp8_rows.cpp must be compiled with -DCPU_CAPABILITY=<DEFAULT|AVX2|AVX512|AVX512_BF16>"
#endif

namespace rope::cpu::CPU_CAPABILITY {
namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kW = Vec::size();
// Values per chunk: the float quotients (1 KiB) between the division and
// the rounding.
constexpr int64_t kChunk = 256;

// Bit casts of this copy (kv_cache_args.h's inline ones are shared by every copy).
inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
inline float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// c10's constants (c10/util/Float8_e4m3fn.h, Float8_e5m2.h) and the saturation bound.
struct E4M3 {
  using type = c10::Float8_e4m3fn;
  static constexpr uint32_t kShift = 20;  // 23 - 3 mantissa bits
  static constexpr uint32_t kBias = (static_cast<uint32_t>(7 - 127) << 23) + 0x7FFFFu;
  static constexpr uint32_t kNormalMin = 121u << 23;  // 2^-6: below it subnormal (or zero)
  static constexpr uint32_t kDenormMagic = 141u << 23;
  static constexpr float kMax = kFp8E4M3Max;
  static constexpr uint32_t kMaxBits = 0x43E00000u;  // 448.0f
  static constexpr uint32_t kMaxCode = 0x7Eu;
};
struct E5M2 {
  using type = c10::Float8_e5m2;
  static constexpr uint32_t kShift = 21;  // 23 - 2 mantissa bits
  static constexpr uint32_t kBias = (static_cast<uint32_t>(15 - 127) << 23) + 0xFFFFFu;
  static constexpr uint32_t kNormalMin = 113u << 23;  // 2^-14
  static constexpr uint32_t kDenormMagic = 134u << 23;
  static constexpr float kMax = kFp8E5M2Max;
  static constexpr uint32_t kMaxBits = 0x47600000u;  // 57344.0f
  static constexpr uint32_t kMaxCode = 0x7Bu;
};

// The fp8 byte of saturate(x): c10's rounding (round to nearest even on the bit pattern for
// normal values, a float addition for subnormals) of the saturated magnitude, without branches.
// `lim < |x| ? lim : |x|` keeps NaN (it compares false), whose `normal` is then above 0x7F: the
// min with 0x7F gives c10's NaN. Below the max c10's own overflow and round-to-NaN fix-ups never
// fire, so they are left out.
template <typename F>
inline uint8_t encode_saturated(float x) {
  const uint32_t bits = bits_of(x);
  const float magnitude = float_of(bits & 0x7FFFFFFFu);
  const float saturated = F::kMax < magnitude ? F::kMax : magnitude;
  const uint32_t mag = bits_of(saturated);
  uint32_t normal = (mag + F::kBias + ((mag >> F::kShift) & 1u)) >> F::kShift;
  normal = normal < 0x7Fu ? normal : 0x7Fu;
  const uint32_t subnormal = bits_of(saturated + float_of(F::kDenormMagic)) - F::kDenormMagic;
  const uint32_t is_subnormal = 0u - static_cast<uint32_t>(mag < F::kNormalMin);
  const uint32_t r = (subnormal & is_subnormal) | (normal & ~is_subnormal);
  return static_cast<uint8_t>(r | ((bits >> 24) & 0x80u));
}

// x / s or x * s, one IEEE operation per lane.
template <ScaleRule kRule, typename V>
inline V scaled(V x, V s) {
  if constexpr (kRule == ScaleRule::kMultiply) {
    return x * s;
  } else {
    return x / s;
  }
}

// out[i] = the value quantize_fp8 (kv_cache_args.h) rounds: src[i] / scale (src[i] * scale) in
// float32, or for double src float(src[i] / scale) in float64. (quantize_fp8 saturates the
// float64 value before rounding it to float32; float rounding is monotonic and the max is a
// float, so saturating after gives the same value.)
template <ScaleRule kRule, typename scalar_t>
inline void scale_chunk(const scalar_t* src, float* out, int64_t n, float scale) {
  if constexpr (std::is_same_v<scalar_t, double>) {
    const double s = static_cast<double>(scale);
    for (int64_t i = 0; i < n; ++i) {
      out[i] = static_cast<float>(scaled<kRule>(src[i], s));
    }
  } else {
    const Vec vs(scale);
    int64_t i = 0;
    for (; i + kW <= n; i += kW) {
      scaled<kRule>(load_floats(src + i), vs).store(out + i);
    }
    for (; i < n; ++i) {
      out[i] = scaled<kRule>(static_cast<float>(src[i]), scale);
    }
  }
}

#if defined(CPU_CAPABILITY_AVX2)
// encode_saturated of 8 values, in AVX2 registers: GCC does not vectorise the scalar loop for
// AVX2 (it keeps a branch per value: 42% of apply_qk_fp8's bf16 prefill on a Zen 2, 31 ms where
// apply_qk of the same rows takes 2.9 ms). The same steps lane by lane: the magnitude saturated
// (a compare that is false for NaN keeps it), c10's normal rounding on the bits, the subnormal
// by a float addition, a blend, the sign; then the 8 codes (each <= 0xFF) packed to bytes.
template <typename F>
inline void encode8(const float* x, uint8_t* dst) {
  const __m256i bits = _mm256_castps_si256(_mm256_loadu_ps(x));
  const __m256 magnitude =
      _mm256_castsi256_ps(_mm256_and_si256(bits, _mm256_set1_epi32(0x7FFFFFFF)));
  const __m256 limit = _mm256_set1_ps(F::kMax);
  const __m256 saturated =
      _mm256_blendv_ps(magnitude, limit, _mm256_cmp_ps(limit, magnitude, _CMP_LT_OQ));
  const __m256i mag = _mm256_castps_si256(saturated);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(mag, F::kShift), _mm256_set1_epi32(1));
  __m256i normal = _mm256_add_epi32(_mm256_add_epi32(mag, _mm256_set1_epi32(F::kBias)), odd);
  normal = _mm256_min_epu32(_mm256_srli_epi32(normal, F::kShift), _mm256_set1_epi32(0x7F));
  const __m256i magic = _mm256_set1_epi32(F::kDenormMagic);
  const __m256i subnormal = _mm256_sub_epi32(
      _mm256_castps_si256(_mm256_add_ps(saturated, _mm256_castsi256_ps(magic))), magic);
  // mag has no sign bit, so the signed compare is the unsigned one.
  const __m256i is_subnormal = _mm256_cmpgt_epi32(_mm256_set1_epi32(F::kNormalMin), mag);
  __m256i r = _mm256_blendv_epi8(normal, subnormal, is_subnormal);
  r = _mm256_or_si256(r, _mm256_and_si256(_mm256_srli_epi32(bits, 24), _mm256_set1_epi32(0x80)));
  const __m128i words = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(dst), _mm_packus_epi16(words, words));
}
#endif

template <typename F>
inline void encode_chunk(const float* x, uint8_t* dst, int64_t n) {
  int64_t i = 0;
#if defined(CPU_CAPABILITY_AVX2)
  for (; i + 8 <= n; i += 8) {
    encode8<F>(x + i, dst + i);
  }
#endif
  for (; i < n; ++i) {
    dst[i] = encode_saturated<F>(x[i]);
  }
}

template <ScaleRule kRule, typename scalar_t, typename F>
void quantize_typed(const scalar_t* src, uint8_t* dst, int64_t n, float scale) {
  alignas(64) float chunk[kChunk];
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t m = std::min(kChunk, n - i);
    scale_chunk<kRule>(src + i, chunk, m, scale);
    encode_chunk<F>(chunk, dst + i, m);
  }
}

template <typename scalar_t, typename F>
void quantize_ruled(const scalar_t* src, uint8_t* dst, int64_t n, float scale, ScaleRule rule) {
  if (rule == ScaleRule::kMultiply) {
    quantize_typed<ScaleRule::kMultiply, scalar_t, F>(src, dst, n, scale);
  } else {
    quantize_typed<ScaleRule::kDivide, scalar_t, F>(src, dst, n, scale);
  }
}

template <typename scalar_t>
void quantize_format(const void* src, uint8_t* dst, int64_t n, float scale, CacheFormat format,
                     ScaleRule rule) {
  const auto* s = static_cast<const scalar_t*>(src);
  if (format == CacheFormat::kFp8E4M3) {
    quantize_ruled<scalar_t, E4M3>(s, dst, n, scale, rule);
  } else {
    TORCH_INTERNAL_ASSERT(format == CacheFormat::kFp8E5M2);
    quantize_ruled<scalar_t, E5M2>(s, dst, n, scale, rule);
  }
}

}  // namespace

void quantize_fp8_row(c10::ScalarType dtype, const void* src, uint8_t* dst, int64_t n, float scale,
                      CacheFormat format, ScaleRule rule) {
  switch (dtype) {
    case c10::kDouble:
      return quantize_format<double>(src, dst, n, scale, format, rule);
    case c10::kFloat:
      return quantize_format<float>(src, dst, n, scale, format, rule);
    case c10::kHalf:
      return quantize_format<c10::Half>(src, dst, n, scale, format, rule);
    case c10::kBFloat16:
      return quantize_format<c10::BFloat16>(src, dst, n, scale, format, rule);
    default:
      TORCH_INTERNAL_ASSERT(false, "quantize_fp8_row: unexpected dtype ", dtype);
  }
}

}  // namespace rope::cpu::CPU_CAPABILITY
