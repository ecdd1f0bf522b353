// SPDX-License-Identifier: BSD-3-Clause
// kW or 2 * kW elements of float, half or bfloat16 storage as float vectors, and back: the loads
// and stores the per-capability row kernels that work in float share (kv_cache_fp8_rows.cpp,
// common_stream_rows.cpp). Include it inside rope::cpu::CPU_CAPABILITY's
// files, after at::vec, like the kernels' other per-copy helpers.
//
// The x86 copies convert 16-bit storage with the rotation kernel's intrinsics
// (common_planes_avx2.h / common_planes_avx512.h: c10's rounding, the native bfloat16 instruction
// in the AVX512_BF16 copy): at::vec's conversions are 2-3x slower and made the norm kernel
// compute-bound on rows in cache. A pair (2 * kW elements) is one whole 16-bit vector; at::vec's
// kW-element 16-bit load and store go through a temporary buffer.
#pragma once

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <type_traits>

#if defined(CPU_CAPABILITY_AVX512)
#include "common_planes_avx512.h"
#elif defined(CPU_CAPABILITY_AVX2)
#include "common_planes_avx2.h"
#endif

namespace rope::cpu::CPU_CAPABILITY {
namespace {

template <typename scalar_t>
inline at::vec::Vectorized<float> load_floats(const scalar_t* p) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    return at::vec::Vectorized<float>::loadu(p);
  } else {
    at::vec::Vectorized<float> v;
    at::vec::load_to_float<scalar_t>(p, v);
    return v;
  }
}

// kW floats rounded once to the storage type (c10's rounding).
template <typename scalar_t>
inline void store_floats(scalar_t* p, const at::vec::Vectorized<float>& v) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    v.store(p);
  } else {
    at::vec::convert_from_float<scalar_t>(v, v).store(p, at::vec::Vectorized<float>::size());
  }
}

// 2 * kW elements as two float vectors (lo: the first kW).
template <typename scalar_t>
inline void load_float_pair(const scalar_t* p, at::vec::Vectorized<float>& lo,
                            at::vec::Vectorized<float>& hi) {
  constexpr int64_t kW = at::vec::Vectorized<float>::size();
  if constexpr (std::is_same_v<scalar_t, float>) {
    lo = at::vec::Vectorized<float>::loadu(p);
    hi = at::vec::Vectorized<float>::loadu(p + kW);
#if defined(CPU_CAPABILITY_AVX512)
  } else if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
    lo = avx512::load16_bf16(p);
    hi = avx512::load16_bf16(p + kW);
  } else if constexpr (std::is_same_v<scalar_t, c10::Half>) {
    lo = avx512::load16(p);
    hi = avx512::load16(p + kW);
#elif defined(CPU_CAPABILITY_AVX2)
  } else if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
    lo = avx2::load8_bf16(p);
    hi = avx2::load8_bf16(p + kW);
  } else if constexpr (std::is_same_v<scalar_t, c10::Half>) {
    lo = avx2::load8(p);
    hi = avx2::load8(p + kW);
#endif
  } else {
    at::vec::load_to_float<scalar_t>(p, lo, hi);
  }
}

// 2 * kW floats rounded once to the storage type (c10's rounding).
template <typename scalar_t>
inline void store_float_pair(scalar_t* p, const at::vec::Vectorized<float>& lo,
                             const at::vec::Vectorized<float>& hi) {
  constexpr int64_t kW = at::vec::Vectorized<float>::size();
  if constexpr (std::is_same_v<scalar_t, float>) {
    lo.store(p);
    hi.store(p + kW);
#if defined(CPU_CAPABILITY_AVX512)
  } else if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
    _mm512_storeu_si512(reinterpret_cast<void*>(p), avx512::bf16_pack32(lo, hi));
  } else if constexpr (std::is_same_v<scalar_t, c10::Half>) {
    avx512::store16(p, lo);
    avx512::store16(p + kW, hi);
#elif defined(CPU_CAPABILITY_AVX2)
  } else if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
    __m256i ulo, uhi;
    avx2::bf16_round_pair(lo, hi, ulo, uhi);
    avx2::store8_bf16(p, ulo);
    avx2::store8_bf16(p + kW, uhi);
  } else if constexpr (std::is_same_v<scalar_t, c10::Half>) {
    avx2::store8(p, lo);
    avx2::store8(p + kW, hi);
#endif
  } else {
    at::vec::convert_from_float<scalar_t>(lo, hi).store(p);
  }
}

}  // namespace
}  // namespace rope::cpu::CPU_CAPABILITY
