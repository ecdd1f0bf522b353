// SPDX-License-Identifier: BSD-3-Clause
// csrc/common_exact_angle.h, what only C++ reaches: steps 1 and 2 in constant expressions, the
// 32-bit limb form of step 2 (bit-identical to the 64-bit one, scalar and as a GCC vector), and the
// polynomial core instantiated with at::vec::Vectorized<double>, as the CPU kernel will. The
// accuracy against mpmath is tests/python/kernels/test_exact_angle.py; the device code's host run
// is tests/cuda_host/exact_angle_host.cpp.
#include <ATen/cpu/vec/vec.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>

#include "common_exact_angle.h"

namespace {

namespace ea = rope::exact_angle;

// 1/(2pi) = 0.28be60db9391054a 7f09d5f47d4d3770 ... in hex: 2/pi's well-known digits
// a2f9836e4e441529 fc2757d1f534ddc0 ..., divided by 4. frac(1 / 2pi) is 1/(2pi) itself.
static_assert(ea::turn_fraction(1.0).hi == 0x28be60db9391054aull);
static_assert(ea::turn_fraction(1.0).lo == 0x7f09d5f47d4d3770ull);
// f = 2: the same bits shifted by one (the bit shifted out is an integer part).
static_assert(ea::turn_fraction(2.0).hi == 0x517cc1b727220a94ull);
static_assert(ea::turn_fraction(2.0).lo == 0xfe13abe8fa9a6ee0ull);  // the bit after: 0
// Negative frequencies: the complement. Zero, tiny and non-finite ones: 0 (-tiny: all ones).
static_assert(ea::turn_fraction(-1.0).hi == ~0x28be60db9391054aull);
static_assert(ea::turn_fraction(0.0).hi == 0 && ea::turn_fraction(-0.0).lo == 0);
static_assert(ea::turn_fraction(0x1p-200).hi == 0 && ea::turn_fraction(0x1p-200).lo == 0);
static_assert(ea::turn_fraction(-0x1p-200).hi == ~0ull && ea::turn_fraction(-0x1p-200).lo == ~0ull);
static_assert(ea::turn_fraction(__builtin_inf()).hi == 0);
// Step 2: p = 1 is G's top word, p = 2 its double with the carry of the low word.
static_assert(ea::turns_at(1, ea::turn_fraction(1.0)) == 0x28be60db9391054aull);
static_assert(ea::turns_at(2, ea::turn_fraction(1.0)) == 0x517cc1b727220a94ull);
static_assert(ea::turns_at(0, ea::turn_fraction(3.0)) == 0);

TEST(ExactAngle, LimbFormOfTheTurnIsBitIdentical) {
  std::mt19937_64 rng(34);
  for (int i = 0; i < 200000; ++i) {
    const uint64_t p = rng() >> (1 + rng() % 63);  // p < 2^63, every magnitude
    const ea::TurnFraction g{rng(), rng()};
    ASSERT_EQ(ea::turns_at_limbs<uint64_t>(p, g.hi, g.lo), ea::turns_at(static_cast<int64_t>(p), g))
        << p;
  }
  for (const uint64_t p : {0ull, 1ull, (1ull << 62), (1ull << 63) - 1}) {
    const ea::TurnFraction g{~0ull, ~0ull};
    EXPECT_EQ(ea::turns_at_limbs<uint64_t>(p, g.hi, g.lo),
              ea::turns_at(static_cast<int64_t>(p), g));
  }
}

#if defined(__GNUC__)
TEST(ExactAngle, LimbFormRunsOnGccVectors) {
  typedef uint64_t U2 __attribute__((vector_size(16)));  // SSE2 width: no ABI note
  std::mt19937_64 rng(35);
  for (int i = 0; i < 10000; ++i) {
    U2 p;
    U2 hi;
    U2 lo;
    for (int l = 0; l < 2; ++l) {
      p[l] = rng() >> (1 + rng() % 63);
      hi[l] = rng();
      lo[l] = rng();
    }
    const U2 t = ea::turns_at_limbs<U2>(p, hi, lo);
    for (int l = 0; l < 2; ++l) {
      ASSERT_EQ(t[l], ea::turns_at(static_cast<int64_t>(p[l]), ea::TurnFraction{hi[l], lo[l]}));
    }
  }
}
#endif

// The template core with at::vec's vector type: the same values as the scalar double core. In
// this (DEFAULT capability) translation unit at::vec's fmadd is a * b + c, two roundings, so the
// lanes may differ from the fused scalar by an ulp; the AVX2 / AVX-512 copies fuse and agree.
TEST(ExactAngle, PolynomialCoreInstantiatesWithVectorized) {
  using Vec = at::vec::Vectorized<double>;
  constexpr int kLanes = Vec::size();
  std::mt19937_64 rng(36);
  for (int i = 0; i < 2000; ++i) {
    double his[kLanes];
    double los[kLanes];
    for (int l = 0; l < kLanes; ++l) {
      const ea::ReducedAngle r = ea::reduce_turns(rng());
      his[l] = r.hi;
      los[l] = r.lo;
    }
    Vec s;
    Vec c;
    ea::sincos_core(Vec::loadu(his), Vec::loadu(los), s, c);
    double sv[kLanes];
    double cv[kLanes];
    s.store(sv);
    c.store(cv);
    for (int l = 0; l < kLanes; ++l) {
      double s1 = 0.0;
      double c1 = 0.0;
      ea::sincos_core(his[l], los[l], s1, c1);
      EXPECT_LE(std::fabs(sv[l] - s1), std::ldexp(std::fabs(s1), -52)) << his[l];
      EXPECT_LE(std::fabs(cv[l] - c1), std::ldexp(std::fabs(c1), -52)) << his[l];
      EXPECT_LE(std::fabs(s1 - std::sin(his[l] + los[l])), std::ldexp(1.0, -52));
      EXPECT_LE(std::fabs(c1 - std::cos(his[l] + los[l])), std::ldexp(1.0, -52));
    }
  }
}

// The reduction's quadrant edges: t = j/4 turns +- 1 (r = -2^61 and 2^61 - 1) and the exact
// quarter turns, whose sine and cosine are exactly 0 and +-1.
TEST(ExactAngle, QuarterTurnsAreExact) {
  for (uint64_t j = 0; j < 4; ++j) {
    const ea::SinCos64 cs = ea::sincos_turns(j << 62);
    const double c[4] = {1, 0, -1, 0};
    const double s[4] = {0, 1, 0, -1};
    EXPECT_EQ(cs.cos, c[j]);
    EXPECT_EQ(cs.sin, s[j]);
    const ea::SinCos32 f = ea::sincos_turns_f32(j << 62);
    EXPECT_EQ(f.cos.hi, static_cast<float>(c[j]));
    EXPECT_EQ(f.sin.hi, static_cast<float>(s[j]));
    EXPECT_EQ(f.cos.lo, 0.0f);
    EXPECT_EQ(f.sin.lo, 0.0f);
  }
}

}  // namespace
