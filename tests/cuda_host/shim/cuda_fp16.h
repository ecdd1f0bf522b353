// SPDX-License-Identifier: BSD-3-Clause
// Host stand-in for the CUDA toolkit's cuda_fp16.h (tests/cuda_host only): IEEE binary16 storage
// and the two conversions the kernel uses, rounding to nearest even as the device does.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "rope_host_shim.h"

struct alignas(2) __half {
  uint16_t bits;
};

inline float __half2float(__half h) {
  const uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000u) << 16;
  const uint32_t exponent = (h.bits >> 10) & 0x1fu;
  const uint32_t mantissa = h.bits & 0x3ffu;
  float magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -24);  // zero or subnormal: exact
  } else if (exponent == 31) {
    const uint32_t bits = 0x7f800000u | (mantissa << 13);  // inf, or NaN keeping its payload
    std::memcpy(&magnitude, &bits, sizeof(bits));
  } else {
    const uint32_t bits = ((exponent + 112) << 23) | (mantissa << 13);
    std::memcpy(&magnitude, &bits, sizeof(bits));
  }
  uint32_t bits;
  std::memcpy(&bits, &magnitude, sizeof(bits));
  bits |= sign;
  float out;
  std::memcpy(&out, &bits, sizeof(bits));
  return out;
}

inline __half __float2half_rn(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t magnitude = x & 0x7fffffffu;
  if (magnitude > 0x7f800000u) {  // NaN: quiet, keep the top payload bits
    return {static_cast<uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu))};
  }
  if (magnitude >= 0x477ff000u) {  // >= 65520 (halfway above the largest half, 65504): inf
    return {static_cast<uint16_t>(sign | 0x7c00u)};
  }
  if (magnitude < 0x38800000u) {  // below 2^-14: a subnormal half (or zero)
    // |f| * 2^24 is exact; rounding it to an integer in the default mode is round-half-even.
    float abs_f;
    std::memcpy(&abs_f, &magnitude, sizeof(abs_f));
    const uint32_t units = static_cast<uint32_t>(std::nearbyint(abs_f * 16777216.0f));
    return {static_cast<uint16_t>(sign | units)};
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits half-even; a
  // carry out of the mantissa correctly bumps the exponent.
  uint32_t r = magnitude - (112u << 23);
  r += 0xfffu + ((r >> 13) & 1u);
  return {static_cast<uint16_t>(sign | (r >> 13))};
}
