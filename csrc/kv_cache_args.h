// SPDX-License-Identifier: BSD-3-Clause
// How the row streams' targets (common_row_streams.h) store a value: in the source's dtype, or as
// fp8 with a per-tensor scale, and that fp8 quantization, written once for the CPU kernel
// (csrc/cpu/common_stream_rows.cpp), the CUDA kernel (csrc/cuda/common_stream_kernel.cuh) and its
// host run (tests/cuda_host), so nothing here includes torch.
#pragma once

#include <cstdint>
#include <cstring>

#include "common_kernel_args.h"  // ROPE_HOST_DEVICE, TableArgs

namespace rope {

// How a cache stores a value.
enum class CacheFormat : int32_t {
  kSame = 0,     // the source's dtype (k's or v's): the value rounded once
  kFp8E4M3 = 1,  // float8_e4m3fn: saturate(value / scale), rounded to nearest even
  kFp8E5M2 = 2,  // float8_e5m2: the same with e5m2's range
};

// ---- fp8 ---------------------------------------------------------------------------------------
// Quantization is `(x / scale).clamp(-max, max).to(fp8)` of PyTorch, bit for bit: an IEEE
// division in the math type (float32; float64 for float64 inputs, then rounded to float32 as
// torch's double -> fp8 conversion does), saturation to the largest finite value (NaN stays NaN),
// then round to nearest even with c10's algorithm (c10/util/Float8_e4m3fn.h, Float8_e5m2.h).

constexpr float kFp8E4M3Max = 448.0f;
constexpr float kFp8E5M2Max = 57344.0f;

ROPE_HOST_DEVICE inline uint32_t fp32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}

ROPE_HOST_DEVICE inline float fp32_from(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

// float -> float8_e4m3fn bits, as c10: NaN -> 0x7f, overflow -> 0x7e (the max), subnormals by a
// float addition that rounds to nearest even.
ROPE_HOST_DEVICE inline uint8_t fp8_e4m3_from_float(float f) {
  uint32_t bits = fp32_bits(f);
  const uint32_t sign = bits & 0x80000000u;
  bits ^= sign;
  uint8_t result;
  if (bits >= (1087u << 20)) {  // >= 480: NaN, inf or overflow
    result = bits > 0x7F800000u ? 0x7F : 0x7E;
  } else if (bits < (121u << 23)) {  // below 2^-6: subnormal or zero
    constexpr uint32_t kDenormMask = 141u << 23;
    result =
        static_cast<uint8_t>(fp32_bits(fp32_from(bits) + fp32_from(kDenormMask)) - kDenormMask);
  } else {
    const uint32_t mant_odd = (bits >> 20) & 1u;
    bits += (static_cast<uint32_t>(7 - 127) << 23) + 0x7FFFFu;
    bits += mant_odd;
    result = static_cast<uint8_t>(bits >> 20);
    if (result == 0x7F) {
      result = 0x7E;
    }
  }
  return static_cast<uint8_t>(result | (sign >> 24));
}

// float -> float8_e5m2 bits, as c10: NaN -> 0x7f, overflow -> 0x7c (inf).
ROPE_HOST_DEVICE inline uint8_t fp8_e5m2_from_float(float f) {
  uint32_t bits = fp32_bits(f);
  const uint32_t sign = bits & 0x80000000u;
  bits ^= sign;
  uint8_t result;
  if (bits >= (143u << 23)) {  // >= 65536: NaN, inf or overflow
    result = bits > 0x7F800000u ? 0x7F : 0x7C;
  } else if (bits < (113u << 23)) {  // below 2^-14: subnormal or zero
    constexpr uint32_t kDenormMask = 134u << 23;
    result =
        static_cast<uint8_t>(fp32_bits(fp32_from(bits) + fp32_from(kDenormMask)) - kDenormMask);
  } else {
    const uint32_t mant_odd = (bits >> 21) & 1u;
    bits += (static_cast<uint32_t>(15 - 127) << 23) + 0xFFFFFu;
    bits += mant_odd;
    result = static_cast<uint8_t>(bits >> 21);
  }
  return static_cast<uint8_t>(result | (sign >> 24));
}

template <typename A>
ROPE_HOST_DEVICE inline A saturate(A x, A max) {
  return x > max ? max : (x < -max ? -max : x);  // NaN compares false: stays NaN
}

// How an fp8 value meets its per-tensor scale. torch-rope's own convention divides (the value is
// stored as value / scale, as torch's scaled_mm scales and vLLM's caches read it); FlashInfer's
// rope_quantize_fp8 family multiplies (value * quant_scale). The two are not interchangeable:
// value * (1 / s) and value / s round differently, so the compat layer needs the multiply itself.
enum class ScaleRule : int32_t {
  kDivide = 0,    // stored = saturate(value / scale)
  kMultiply = 1,  // stored = saturate(value * scale)
};

// value / scale or value * scale, one IEEE operation in the math type.
template <typename A>
ROPE_HOST_DEVICE inline A apply_scale(A value, A scale, ScaleRule rule) {
  return rule == ScaleRule::kMultiply ? value * scale : value / scale;
}

// The stored byte of `value` (float32 math) in an fp8 cache with `scale`.
ROPE_HOST_DEVICE inline uint8_t quantize_fp8(float value, float scale, CacheFormat format,
                                             ScaleRule rule = ScaleRule::kDivide) {
  const float x = apply_scale(value, scale, rule);
  if (format == CacheFormat::kFp8E4M3) {
    return fp8_e4m3_from_float(saturate(x, kFp8E4M3Max));
  }
  return fp8_e5m2_from_float(saturate(x, kFp8E5M2Max));
}

// float64 math: scaled and saturated in float64, then rounded to float32 and to fp8.
ROPE_HOST_DEVICE inline uint8_t quantize_fp8(double value, float scale, CacheFormat format,
                                             ScaleRule rule = ScaleRule::kDivide) {
  const double x = apply_scale(value, static_cast<double>(scale), rule);
  if (format == CacheFormat::kFp8E4M3) {
    return fp8_e4m3_from_float(static_cast<float>(saturate(x, double{kFp8E4M3Max})));
  }
  return fp8_e5m2_from_float(static_cast<float>(saturate(x, double{kFp8E5M2Max})));
}

// ---- dynamic scales -----------------------------------------------------------------------------
// A dynamic scale is computed from the values it quantizes (docs/quant_formats.md, "Dynamic
// per-row and per-token float8"): amax = max |value| over the scale's rows, NaN propagating;
// scale = amax / fp8 max, one float32 rounding; then, with pow2, rounded up to a power of two
// (UE8M0) and clamped to E8M0's [2^-127, 2^127]. The edges: amax 0 gives 1; a positive amax whose
// quotient underflows gives 2^-149 (never 0); +inf gives +inf (2^127 with pow2); NaN gives NaN.
// The values are then stored with ScaleRule::kDivide, as a static scale.

// The running amax: |value| folded in with NaN propagating (a NaN anywhere makes it NaN; once NaN
// it stays NaN). max is exact, so any order of folding gives the same bits but a NaN's payload.
template <typename A>
ROPE_HOST_DEVICE inline A fold_amax(A amax, A value) {
  const A a = value < A(0) ? -value : value;
  return (a > amax || a != a) ? a : amax;
}

// The least power of two >= a positive float32 scale, clamped to [2^-127, 2^127]; NaN stays NaN.
// Adding the mantissa mask carries every scale that is not a power of two into the next exponent
// (subnormals too: (2^-127, 2^-126) goes to 2^-126).
ROPE_HOST_DEVICE inline float pow2_scale_up(float scale) {
  if (scale != scale) {
    return scale;
  }
  constexpr float kMin = 5.877471754111438e-39f;   // 2^-127
  constexpr float kMax = 1.7014118346046923e+38f;  // 2^127
  if (scale <= kMin) {
    return kMin;
  }
  if (scale >= kMax) {
    return kMax;  // inf too: UE8M0 has none
  }
  return fp32_from((fp32_bits(scale) + 0x007FFFFFu) & 0xFF800000u);
}

// The dynamic scale of rows whose amax (in the math type) is `amax`, for `format`.
template <typename A>
ROPE_HOST_DEVICE inline float dynamic_fp8_scale(A amax, CacheFormat format, bool pow2) {
  const A fmax = format == CacheFormat::kFp8E4M3 ? A(kFp8E4M3Max) : A(kFp8E5M2Max);
  float scale = static_cast<float>(amax / fmax);  // double math: rounded once more, to float32
  if (amax == A(0)) {
    scale = 1.0f;
  } else if (scale == 0.0f) {
    scale = 1.401298464324817e-45f;  // 2^-149: a positive amax never gives scale 0
  } else if (amax != amax) {
    scale = fp32_from(0x7FC00000u);  // one NaN, whichever NaN the fold kept
  }
  return pow2 ? pow2_scale_up(scale) : scale;
}

}  // namespace rope
