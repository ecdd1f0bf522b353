// SPDX-License-Identifier: BSD-3-Clause
// Rows of float64 cos / sin of exact angles (rope_angle_rows.h), compiled once per CPU capability
// (CMakeLists.txt's rope_add_cpu_kernel). Steps 2 and 3a of csrc/common_exact_angle.h: the turn
// t = frac(p G / 2^128) top 64 bits (turns_at_limbs: 32 x 32 -> 64-bit multiplies only, one
// vpmuludq each), the quarter-turn reduction and the polynomial core (sincos_core, instantiated
// on lane vectors), for 4 planes at a time on AVX2 and 8 on AVX-512; the remainder, and the whole
// row in the portable copy, with the header's scalar functions. Both give the same bits (the
// lane form converts the reduced angle without int64 -> double instructions, which AVX2 lacks,
// through the exponent trick, exactly; benchmarks/exact_angle_bench.cpp checks the same identity).
//
// Everything the lanes use is defined here, inside this copy's namespace: no inline function of
// another copy, compiled for another instruction set, can stand in for one of these.
#include "rope_angle_rows.h"

#include <cstring>
#include <optional>
#include <vector>

#include "../common_exact_angle.h"

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
#include <immintrin.h>
#endif

#ifndef CPU_CAPABILITY
#error \
    "rope_angle_rows.cpp must be compiled with -DCPU_CAPABILITY=<DEFAULT|AVX2|AVX512|AVX512_BF16>"
#endif

namespace rope::cpu::CPU_CAPABILITY {
namespace {

namespace ea = ::rope::exact_angle;

// Planes per lane vector: 8 doubles (AVX-512), 4 (AVX2); 0: scalar only.
#if defined(CPU_CAPABILITY_AVX512)
constexpr int kLanes = 8;
#elif defined(CPU_CAPABILITY_AVX2)
constexpr int kLanes = 4;
#else
constexpr int kLanes = 0;
#endif

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
typedef uint64_t RawU __attribute__((vector_size(8 * kLanes)));
typedef double RawD __attribute__((vector_size(8 * kLanes)));

// The unsigned lanes turns_at_limbs needs: &, >>, <<, + and the 32 x 32 -> 64-bit product
// (found by argument-dependent lookup, instead of the header's generic one).
struct VecU {
  RawU v;
};
inline VecU operator&(VecU a, uint64_t m) { return {a.v & m}; }
inline VecU operator>>(VecU a, int n) { return {a.v >> n}; }
inline VecU operator<<(VecU a, int n) { return {a.v << n}; }
inline VecU operator+(VecU a, VecU b) { return {a.v + b.v}; }
inline VecU mul_32x32(VecU a, VecU b) {
#if defined(CPU_CAPABILITY_AVX512)
  return {(RawU)_mm512_mul_epu32((__m512i)a.v, (__m512i)b.v)};
#else
  return {(RawU)_mm256_mul_epu32((__m256i)a.v, (__m256i)b.v)};
#endif
}

// The double lanes sincos_core needs: T(double), +, -, * and a fused fmadd.
struct VecD {
  RawD v;
  VecD() = default;
  VecD(double x) : v(RawD{} + x) {}  // NOLINT: a broadcast, as at::vec's Vectorized(double)
  VecD(RawD x) : v(x) {}             // NOLINT
};
inline VecD operator+(VecD a, VecD b) { return a.v + b.v; }
inline VecD operator-(VecD a, VecD b) { return a.v - b.v; }
inline VecD operator*(VecD a, VecD b) { return a.v * b.v; }
inline VecD fmadd(VecD a, VecD b, VecD c) {
#if defined(CPU_CAPABILITY_AVX512)
  return VecD(_mm512_fmadd_pd(a.v, b.v, c.v));
#else
  return VecD(_mm256_fmadd_pd(a.v, b.v, c.v));
#endif
}
inline VecD fmsub(VecD a, VecD b, VecD c) {  // a * b - c, one rounding
#if defined(CPU_CAPABILITY_AVX512)
  return VecD(_mm512_fmsub_pd(a.v, b.v, c.v));
#else
  return VecD(_mm256_fmsub_pd(a.v, b.v, c.v));
#endif
}

// kLanes planes of one row: positions p (per lane), turn fractions at g_hi / g_lo. The header's
// reduce_turns and sincos_turns, lane by lane: t + 2^61 modulo 2^62 is r + 2^61 in [0, 2^62),
// whose two 32-bit halves become the exact doubles H and L of reduce_turns through the exponent
// trick (2^84 and 2^52).
inline void sincos_lanes(RawU p, const uint64_t* g_hi, const uint64_t* g_lo, double af,
                         double* cos_out, double* sin_out) {
  VecU hi;
  VecU lo;
  std::memcpy(&hi.v, g_hi, sizeof hi.v);
  std::memcpy(&lo.v, g_lo, sizeof lo.v);
  const RawU t = ea::turns_at_limbs<VecU>(VecU{p}, hi, lo).v;
  const RawU biased = t + (uint64_t{1} << 61);
  const RawU j = biased >> 62;
  const RawU ub = biased & ((uint64_t{1} << 62) - 1);
  const RawD high = (RawD)((ub >> 32) | uint64_t{0x4530000000000000}) - (0x1p84 + 0x1p61);
  const RawD low = (RawD)((ub & 0xffffffffu) | uint64_t{0x4330000000000000}) - 0x1p52;
  const RawD a = high + low;        // r rounded
  const RawD b = low - (a - high);  // r - a, exactly
  constexpr double kHi = ROPE_EXACT_ANGLE_PI_HI * 0x1p-63;
  constexpr double kLo = ROPE_EXACT_ANGLE_PI_LO * 0x1p-63;
  const RawD prod = a * kHi;
  const RawD rest =
      fmsub(VecD(a), VecD(kHi), VecD(prod)).v + fmadd(VecD(a), VecD(kLo), VecD(b * kHi)).v;
  const RawD th = prod + rest;
  const RawD tl = rest - (th - prod);
  VecD s;
  VecD c;
  ea::sincos_core(VecD(th), VecD(tl), s, c);
  // Quadrant j: odd swaps cos and sin; sin changes sign for j & 2, cos for j in {1, 2}.
  const auto swap = (j & 1) != 0;
  const RawU sin_bits = (RawU)(swap ? c.v : s.v) ^ ((j & 2) << 62);
  const RawU cos_bits = (RawU)(swap ? s.v : c.v) ^ (((j + 1) & 2) << 62);
  const RawD sin_v = (RawD)sin_bits * af;
  const RawD cos_v = (RawD)cos_bits * af;
  std::memcpy(sin_out, &sin_v, sizeof sin_v);
  std::memcpy(cos_out, &cos_v, sizeof cos_v);
}
#endif

// Planes [k, half) of one row, one at a time: the header's scalar functions.
inline void sincos_scalar(const AngleRowsArgs& a, const int64_t* plane_pos, int64_t one_pos,
                          double* c, double* s, int64_t k) {
  for (; k < a.half; ++k) {
    const int64_t p = plane_pos != nullptr ? plane_pos[k] : one_pos;
    const ea::SinCos64 cs = ea::sincos_turns(
        ea::turns_at(p, ea::TurnFraction{a.fraction_hi[k], a.fraction_lo[k]}), a.attention_factor);
    c[k] = cs.cos;
    s[k] = cs.sin;
  }
}

// One row: every plane at position one_pos, or plane k at plane_pos[k] (multi-axis positions).
inline void fill_row(const AngleRowsArgs& a, const int64_t* plane_pos, int64_t one_pos, double* c,
                     double* s) {
  int64_t k = 0;
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  for (; k + kLanes <= a.half; k += kLanes) {
    RawU p;
    if (plane_pos != nullptr) {
      std::memcpy(&p, plane_pos + k, sizeof p);
    } else {
      p = RawU{} + static_cast<uint64_t>(one_pos);
    }
    sincos_lanes(p, a.fraction_hi + k, a.fraction_lo + k, a.attention_factor, c + k, s + k);
  }
#endif
  sincos_scalar(a, plane_pos, one_pos, c, s, k);
}

int64_t read_index(const void* p, bool is64, int64_t i) {
  return is64 ? static_cast<const int64_t*>(p)[i]
              : static_cast<int64_t>(static_cast<const int32_t*>(p)[i]);
}

}  // namespace
}  // namespace rope::cpu::CPU_CAPABILITY

#include "rope_packed_lookup.h"

namespace rope::cpu::CPU_CAPABILITY {

void angle_rows(const AngleRowsArgs& a, int64_t row_begin, int64_t row_end) {
  std::vector<int64_t> plane_pos;
  if (a.packed == nullptr && a.num_axes > 1) {
    plane_pos.resize(static_cast<size_t>(a.half));
  }
  std::optional<PackedLookup> lookup;
  if (a.packed != nullptr) {
    lookup.emplace(*a.packed);
  }
  for (int64_t r = row_begin; r < row_end; ++r) {
    double* c = a.cos + r * a.half;
    double* s = a.sin + r * a.half;
    if (lookup.has_value()) {
      fill_row(a, nullptr, (*lookup)(r), c, s);
    } else if (a.num_axes <= 1) {
      fill_row(a, nullptr, read_index(a.positions, a.positions_are_int64, r), c, s);
    } else {
      for (int64_t k = 0; k < a.half; ++k) {
        plane_pos[k] =
            read_index(a.positions, a.positions_are_int64, r * a.num_axes + a.plane_axis[k]);
      }
      fill_row(a, plane_pos.data(), 0, c, s);
    }
  }
}

}  // namespace rope::cpu::CPU_CAPABILITY
