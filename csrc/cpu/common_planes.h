// SPDX-License-Identifier: BSD-3-Clause
// The vector planes of one row, the widest code this CPU copy was compiled for: the intrinsics of
// common_planes_avx512.h / common_planes_avx2.h in the x86 copies, portable at::vec code in
// DEFAULT (and non-x86 builds). Float math and float tables; whole vectors of planes only, the
// caller's scalar loop finishes the rest. Shared by the rotation's row kernel (rope_rows.cpp) and
// the row streams' (common_stream_rows.cpp), which rotate a row with the same instructions and so
// the same bits: a' = fma(a, c, -(b * s)), b' = fma(a, s, b * c), rounded once to the storage type.
// Included once per copy (each copy is a translation unit compiled with its CPU_CAPABILITY).
#pragma once

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <tuple>
#include <type_traits>

#if defined(CPU_CAPABILITY_AVX512)
#include "common_planes_avx512.h"
#elif defined(CPU_CAPABILITY_AVX2)
#include "common_planes_avx2.h"
#endif

namespace rope::cpu::CPU_CAPABILITY {
namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kW = Vec::size();  // floats per vector: 8 (DEFAULT, AVX2) or 16 (AVX512)

// ---- float <-> storage conversion, kW or 2*kW elements at a time -------------------------------

template <typename scalar_t>
inline void load_one(const scalar_t* p, Vec& v) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    v = Vec::loadu(p);
  } else {
    at::vec::load_to_float<scalar_t>(p, v);
  }
}

template <typename scalar_t>
inline void load_two(const scalar_t* p, Vec& lo, Vec& hi) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    lo = Vec::loadu(p);
    hi = Vec::loadu(p + kW);
  } else {
    at::vec::load_to_float<scalar_t>(p, lo, hi);
  }
}

template <typename scalar_t>
inline void store_one(scalar_t* p, const Vec& v) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    v.store(p);
  } else {
    at::vec::convert_from_float<scalar_t>(v, v).store(p, kW);
  }
}

template <typename scalar_t>
inline void store_two(scalar_t* p, const Vec& lo, const Vec& hi) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    lo.store(p);
    hi.store(p + kW);
  } else {
    at::vec::convert_from_float<scalar_t>(lo, hi).store(p);
  }
}

// ---- the vector planes of one row, portable (DEFAULT copy and non-x86 builds) --------------

// Whole vectors of planes with at::vec, float math, float tables. Returns the first plane left for
// the scalar loop.
template <bool kInterleaved, bool kInverse, typename scalar_t>
inline int64_t rotate_planes_generic(const scalar_t* in, scalar_t* out, const float* cos,
                                     const float* sin, int64_t half) {
  const Vec sign(kInverse ? -1.0f : 1.0f);
  int64_t k = 0;
  for (; k + kW <= half; k += kW) {
    const Vec c = Vec::loadu(cos + k);
    const Vec s = Vec::loadu(sin + k) * sign;
    Vec a, b;
    if constexpr (kInterleaved) {
      // 2*kW features hold kW planes as (a0, b0, a1, b1, ...): split, rotate, re-interleave.
      Vec lo, hi;
      load_two(in + 2 * k, lo, hi);
      std::tie(a, b) = at::vec::deinterleave2(lo, hi);
    } else {
      load_one(in + k, a);
      load_one(in + half + k, b);
    }
    const Vec ra = at::vec::fmsub(a, c, b * s);  // a cos - b sin
    const Vec rb = at::vec::fmadd(a, s, b * c);  // a sin + b cos
    if constexpr (kInterleaved) {
      const auto [lo, hi] = at::vec::interleave2(ra, rb);
      store_two(out + 2 * k, lo, hi);
    } else {
      store_one(out + k, ra);
      store_one(out + half + k, rb);
    }
  }
  return k;
}

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
constexpr bool kHasIntrinsics = true;
#else
constexpr bool kHasIntrinsics = false;
#endif

// The widest vector code this copy was compiled for.
template <bool kInterleaved, bool kInverse, typename scalar_t>
inline int64_t rotate_planes_vec(const scalar_t* in, scalar_t* out, const float* cos,
                                 const float* sin, int64_t half) {
#if defined(CPU_CAPABILITY_AVX512)
  return avx512::rotate_planes<kInterleaved, kInverse>(in, out, cos, sin, half, 0);
#elif defined(CPU_CAPABILITY_AVX2)
  return avx2::rotate_planes<kInterleaved, kInverse>(in, out, cos, sin, half, 0);
#else
  return rotate_planes_generic<kInterleaved, kInverse>(in, out, cos, sin, half);
#endif
}

}  // namespace
}  // namespace rope::cpu::CPU_CAPABILITY
