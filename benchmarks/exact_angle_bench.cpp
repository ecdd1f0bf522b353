// SPDX-License-Identifier: BSD-3-Clause
// The cost of a table-free angle on the CPU: steps 2 (turn at a position) and 3a (double cos /
// sin) of csrc/common_exact_angle.h per (position, plane), one core, at prefill shape (8192
// positions x 64 planes of a theta-10000, d = 128 model), the (position, plane) work that all heads
// of a token share. Three forms: the header's scalar functions; the same computation on GCC vectors
// of 4 lanes (AVX2) and 8 lanes (AVX-512), where step 2 is turns_at_limbs with 32 x 32 -> 64-bit
// multiplies (vpmuludq) and step 3a is the header's sincos_core template instantiated with a
// small vector wrapper, as the CPU kernel would instantiate it with at::vec::Vectorized<double>.
// The vector results are compared with the scalar ones bit for bit. Not a test; torch-free.
//
//   g++ -O2 -fno-tree-vectorize -std=c++17 -mavx2 -mfma -Icsrc benchmarks/exact_angle_bench.cpp \
//       -o /tmp/ea_avx2
//   g++ -O2 -fno-tree-vectorize -std=c++17 -mavx512f -mavx512dq -mavx512vl -mavx2 -mfma -Icsrc \
//       benchmarks/exact_angle_bench.cpp -o /tmp/ea_avx512
//   /tmp/ea_avx2; /tmp/ea_avx512            # [--positions N] [--repeats R]
//
// -fno-tree-vectorize keeps the scalar loop scalar (GCC's partial vectorisation of it, with
// gathers and scatters, was 2-3 times slower); the vector forms are explicit and unaffected.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "common_exact_angle.h"

namespace ea = rope::exact_angle;

// ---- GCC vector types and the wrapper sincos_core needs ----------------------------------------
template <int W>
struct Lanes {
  typedef uint64_t U __attribute__((vector_size(8 * W)));
  typedef int64_t I __attribute__((vector_size(8 * W)));
  typedef double D __attribute__((vector_size(8 * W)));
};

// T(double), +, -, * and fmadd: what sincos_core asks of its arithmetic type.
template <int W>
struct VecD {
  using D = typename Lanes<W>::D;
  D v;
  VecD() = default;
  VecD(double x) : v(D{} + x) {}  // NOLINT: broadcast, as Vectorized<double>(double)
  VecD(D x) : v(x) {}             // NOLINT
};
template <int W>
inline VecD<W> operator+(VecD<W> a, VecD<W> b) {
  return a.v + b.v;
}
template <int W>
inline VecD<W> operator-(VecD<W> a, VecD<W> b) {
  return a.v - b.v;
}
template <int W>
inline VecD<W> operator*(VecD<W> a, VecD<W> b) {
  return a.v * b.v;
}
inline VecD<4> fmadd(VecD<4> a, VecD<4> b, VecD<4> c) {
  return VecD<4>(_mm256_fmadd_pd(a.v, b.v, c.v));
}
inline VecD<4> fmsub(VecD<4> a, VecD<4> b, VecD<4> c) {  // a * b - c
  return VecD<4>(_mm256_fmsub_pd(a.v, b.v, c.v));
}
#if defined(__AVX512F__)
inline VecD<8> fmadd(VecD<8> a, VecD<8> b, VecD<8> c) {
  return VecD<8>(_mm512_fmadd_pd(a.v, b.v, c.v));
}
inline VecD<8> fmsub(VecD<8> a, VecD<8> b, VecD<8> c) {
  return VecD<8>(_mm512_fmsub_pd(a.v, b.v, c.v));
}
#endif

// 32 x 32 -> 64-bit products of the low halves: one vpmuludq (GCC's generic 64-bit vector
// multiply would emulate a full 64 x 64 product).
namespace rope::exact_angle {
template <>
inline Lanes<4>::U mul_32x32<Lanes<4>::U>(Lanes<4>::U a, Lanes<4>::U b) {
  return (Lanes<4>::U)_mm256_mul_epu32((__m256i)a, (__m256i)b);
}
#if defined(__AVX512F__)
template <>
inline Lanes<8>::U mul_32x32<Lanes<8>::U>(Lanes<8>::U a, Lanes<8>::U b) {
  return (Lanes<8>::U)_mm512_mul_epu32((__m512i)a, (__m512i)b);
}
#endif
}  // namespace rope::exact_angle

// Steps 2 and 3a for W planes at one position: the header's reduce_turns / sincos_turns written
// with lane operations. The reduced angle's two halves are converted without int64 -> double
// instructions (AVX2 has none): t + 2^61 modulo 2^62 is r + 2^61 in [0, 2^62), whose 32-bit halves
// become doubles through the exponent trick (2^84 and 2^52), exactly.
template <int W>
inline void sincos_lanes(typename Lanes<W>::U p, const uint64_t* g_hi, const uint64_t* g_lo,
                         double* cos_out, double* sin_out) {
  using U = typename Lanes<W>::U;
  using D = typename Lanes<W>::D;
  U hi;
  U lo;
  std::memcpy(&hi, g_hi, sizeof hi);
  std::memcpy(&lo, g_lo, sizeof lo);
  const U t = ea::turns_at_limbs<U>(p, hi, lo);
  const U biased = t + (uint64_t{1} << 61);
  const U j = biased >> 62;
  const U ub = biased & ((uint64_t{1} << 62) - 1);  // r + 2^61, in [0, 2^62)
  // r = H + L as reduce_turns splits it, both converted exactly by the exponent trick:
  // (2^84 + (ub >> 32) 2^32) - (2^84 + 2^61) = H, (2^52 + L) - 2^52 = L.
  const D high = (D)((ub >> 32) | uint64_t{0x4530000000000000}) - (0x1p84 + 0x1p61);
  const D low = (D)((ub & 0xffffffffu) | uint64_t{0x4330000000000000}) - 0x1p52;
  const D a = high + low;
  const D b = low - (a - high);
  constexpr double kHi = ROPE_EXACT_ANGLE_PI_HI * 0x1p-63;
  constexpr double kLo = ROPE_EXACT_ANGLE_PI_LO * 0x1p-63;
  const D prod = a * kHi;
  const D rest = fmsub(VecD<W>(a), VecD<W>(kHi), VecD<W>(prod)).v +
                 fmadd(VecD<W>(a), VecD<W>(kLo), VecD<W>(b * kHi)).v;
  const D th = prod + rest;  // renormalised, as reduce_turns does
  const D tl = rest - (th - prod);
  VecD<W> s;
  VecD<W> c;
  ea::sincos_core(VecD<W>(th), VecD<W>(tl), s, c);
  // quadrant j: odd swaps cos and sin; sin changes sign for j & 2, cos for j in {1, 2}
  const auto swap = (j & 1) != 0;
  const U sin_bits = (U)(swap ? c.v : s.v) ^ ((j & 2) << 62);
  const U cos_bits = (U)(swap ? s.v : c.v) ^ (((j + 1) & 2) << 62);
  std::memcpy(sin_out, &sin_bits, sizeof sin_bits);
  std::memcpy(cos_out, &cos_bits, sizeof cos_bits);
}

template <int W>
inline void turns_lanes(typename Lanes<W>::U p, const uint64_t* g_hi, const uint64_t* g_lo,
                        uint64_t* out) {
  using U = typename Lanes<W>::U;
  U hi;
  U lo;
  std::memcpy(&hi, g_hi, sizeof hi);
  std::memcpy(&lo, g_lo, sizeof lo);
  const U t = ea::turns_at_limbs<U>(p, hi, lo);
  std::memcpy(out, &t, sizeof t);
}

// ---- the benchmark ------------------------------------------------------------------------------
constexpr int kPlanes = 64;

struct Planes {
  alignas(64) uint64_t hi[kPlanes];
  alignas(64) uint64_t lo[kPlanes];
};

// One token's cos / sin buffer, as the kernel keeps it for all the token's heads.
struct Row {
  alignas(64) double cos[kPlanes];
  alignas(64) double sin[kPlanes];
  alignas(64) uint64_t turns[kPlanes];
};

double checksum(const Row& r) {
  double s = 0;
  for (int k = 0; k < kPlanes; ++k) {
    s += r.cos[k] + r.sin[k] + static_cast<double>(r.turns[k] >> 40);
  }
  return s;
}

template <typename F>
double time_ns_per_pair(const std::vector<int64_t>& positions, int repeats, F&& body) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    body();
    const auto t1 = std::chrono::steady_clock::now();
    const double ns = std::chrono::duration<double, std::nano>(t1 - t0).count();
    best = std::min(best, ns / (static_cast<double>(positions.size()) * kPlanes));
  }
  return best;
}

int main(int argc, char** argv) {
  int64_t n_positions = 8192;
  int repeats = 30;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--positions" && i + 1 < argc) {
      n_positions = std::atoll(argv[++i]);
    } else if (arg == "--repeats" && i + 1 < argc) {
      repeats = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--positions N] [--repeats R]\n", argv[0]);
      return 2;
    }
  }
  Planes planes;
  for (int k = 0; k < kPlanes; ++k) {
    const ea::TurnFraction g = ea::turn_fraction(std::pow(10000.0, -2.0 * k / (2 * kPlanes)));
    planes.hi[k] = g.hi;
    planes.lo[k] = g.lo;
  }
  std::vector<int64_t> positions(n_positions);
  for (int64_t i = 0; i < n_positions; ++i) {
    positions[i] = i;  // prefill; the cost does not depend on the position
  }
  Row row;
  double sink = 0;

  // Scalar: the header's functions as they are.
  const double scalar_turns = time_ns_per_pair(positions, repeats, [&] {
    for (const int64_t p : positions) {
      for (int k = 0; k < kPlanes; ++k) {
        row.turns[k] = ea::turns_at(p, ea::TurnFraction{planes.hi[k], planes.lo[k]});
      }
      sink += static_cast<double>(row.turns[p & 63] >> 50);
    }
  });
  const double scalar = time_ns_per_pair(positions, repeats, [&] {
    for (const int64_t p : positions) {
      for (int k = 0; k < kPlanes; ++k) {
        const ea::SinCos64 cs =
            ea::sincos_turns(ea::turns_at(p, ea::TurnFraction{planes.hi[k], planes.lo[k]}));
        row.cos[k] = cs.cos;
        row.sin[k] = cs.sin;
      }
      sink += row.cos[p & 63];
    }
  });
  std::printf("scalar:        step 2 %.2f ns, steps 2+3a %.2f ns per (position, plane)\n",
              scalar_turns, scalar);

  // Vector forms: checked against the scalar results first, bit for bit.
  const auto run_lanes = [&](auto width, const char* name) {
    constexpr int W = decltype(width)::value;
    using U = typename Lanes<W>::U;
    int64_t mismatches = 0;
    for (const int64_t p :
         {int64_t{0}, int64_t{1}, int64_t{12345}, int64_t{1} << 40, (int64_t{1} << 62) - 3}) {
      Row v;
      for (int k = 0; k < kPlanes; k += W) {
        const U pv = U{} + static_cast<uint64_t>(p);
        sincos_lanes<W>(pv, planes.hi + k, planes.lo + k, v.cos + k, v.sin + k);
        turns_lanes<W>(pv, planes.hi + k, planes.lo + k, v.turns + k);
      }
      for (int k = 0; k < kPlanes; ++k) {
        const ea::TurnFraction g{planes.hi[k], planes.lo[k]};
        const ea::SinCos64 cs = ea::sincos_turns(ea::turns_at(p, g));
        mismatches += v.turns[k] != ea::turns_at(p, g);
        mismatches +=
            std::memcmp(&v.cos[k], &cs.cos, 8) != 0 || std::memcmp(&v.sin[k], &cs.sin, 8) != 0;
      }
    }
    const double turns = time_ns_per_pair(positions, repeats, [&] {
      for (const int64_t p : positions) {
        const U pv = U{} + static_cast<uint64_t>(p);
        for (int k = 0; k < kPlanes; k += W) {
          turns_lanes<W>(pv, planes.hi + k, planes.lo + k, row.turns + k);
        }
        sink += static_cast<double>(row.turns[p & 63] >> 50);
      }
    });
    const double both = time_ns_per_pair(positions, repeats, [&] {
      for (const int64_t p : positions) {
        const U pv = U{} + static_cast<uint64_t>(p);
        for (int k = 0; k < kPlanes; k += W) {
          sincos_lanes<W>(pv, planes.hi + k, planes.lo + k, row.cos + k, row.sin + k);
        }
        sink += row.cos[p & 63];
      }
    });
    std::printf(
        "%s step 2 %.2f ns, steps 2+3a %.2f ns per (position, plane); %lld mismatches "
        "with the scalar path\n",
        name, turns, both, static_cast<long long>(mismatches));
    return mismatches;
  };
  int64_t bad = run_lanes(std::integral_constant<int, 4>{}, "4 lanes (AVX2):");
#if defined(__AVX512F__)
  bad += run_lanes(std::integral_constant<int, 8>{}, "8 lanes (AVX-512):");
#endif
  std::printf("(%lld positions x %d planes, best of %d; checksum %g)\n",
              static_cast<long long>(n_positions), kPlanes, repeats, sink + checksum(row));
  return bad == 0 ? 0 : 1;
}
