// SPDX-License-Identifier: BSD-3-Clause
// Host stand-in for the CUDA toolkit's cuda_bf16.h (tests/cuda_host only): bfloat16 storage (the
// top half of a float) and the two conversions the kernel uses, rounding to nearest even.
#pragma once

#include <cstdint>
#include <cstring>

#include "rope_host_shim.h"

struct alignas(2) __nv_bfloat16 {
  uint16_t bits;
};

inline float __bfloat162float(__nv_bfloat16 h) {
  const uint32_t bits = static_cast<uint32_t>(h.bits) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(bits));
  return out;
}

inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  if ((x & 0x7fffffffu) > 0x7f800000u) {
    return {static_cast<uint16_t>((x >> 16) | 0x0040u)};  // NaN stays NaN (quiet)
  }
  x += 0x7fffu + ((x >> 16) & 1u);  // round half to even on the 16 dropped bits
  return {static_cast<uint16_t>(x >> 16)};
}
