// SPDX-License-Identifier: BSD-3-Clause
// The host run of exact_angle_kernel.cuh (csrc/common_exact_angle.h's device steps): compiled
// against the shims like the rope kernel (no torch, no CUDA toolkit, -ffp-contract=off, ASan +
// UBSan), launched serially, and checked against the double path of the same header, an independent
// algorithm (quarter-turn polynomials, no table) whose own error (1 ulp of double) is allowed for:
//   - cos / sin: |hi + lo - af cos| <= 2^-35 af, |hi - af cos| <= 0.5 ulp + 2^-35 af;
//   - the rotation: |y - af (xa cos - xb sin)| <= 2^-24 (1 + 2^-10) af (|xa| + |xb|) + 2^-147, the
//     bound rotate_f32 proves (the contract allows twice as much);
//   - the turn equals turns_at_limbs's (the vector-friendly form of step 2);
//   - every step with the device branches (this file: the shim defines
//     ROPE_HOST_RUNS_DEVICE_BRANCHES, so __umul64hi, __ldg of the constant tables, __fmul_rn, ...)
//     gives the bits of the same step with the host branches (exact_angle_host_branches.cpp, the
//     CPU kernels' code), non-finite frequencies included.
// The mpmath checks of every step are tests/python/kernels/test_exact_angle.py; this run shows
// that the device code, as the GPU would run it thread by thread, computes the same things.
//
//   exact_angle_host [--positions N] [--seed S]
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "exact_angle_branches.h"
#include "exact_angle_kernel.cuh"

namespace {

namespace ea = rope::exact_angle;

double ulp_of_float(double v) {
  if (v == 0.0) {
    return std::ldexp(1.0, -149);
  }
  int e = 0;
  std::frexp(v, &e);  // |v| in [2^(e-1), 2^e)
  return std::ldexp(1.0, std::max(e - 24, -149));
}

struct Failures {
  int64_t count = 0;
  void report(const char* what, int64_t p, double f, double got, double want, double bound) {
    if (count++ < 10) {
      std::fprintf(stderr,
                   "FAIL %s: position %lld, freq %.17g: got %.17g, want %.17g (bound %.3g)\n", what,
                   static_cast<long long>(p), f, got, want, bound);
    }
  }
};

std::vector<double> frequencies(std::mt19937_64& rng) {
  std::vector<double> f;
  for (int k = 0; k < 64; ++k) {
    f.push_back(std::pow(10000.0, -2.0 * k / 128.0));  // theta 1e4, d = 128
  }
  std::uniform_real_distribution<double> exponent(-40.0, 40.0);
  for (int k = 0; k < 24; ++k) {
    const double v = std::exp2(exponent(rng));
    f.push_back(k % 3 == 0 ? -v : v);
  }
  for (double v : {0.0, -0.0, 5e-324, 1e-300, 2.0 * M_PI, 1e300, 1.7976931348623157e308}) {
    f.push_back(v);
  }
  return f;
}

std::vector<int64_t> positions(std::mt19937_64& rng, int64_t n_random) {
  std::vector<int64_t> p = {0, 1, 2, 3};
  for (int k = 1; k <= 62; ++k) {
    p.push_back((int64_t{1} << k) - 1);
    p.push_back(int64_t{1} << k);
    if (k < 62) {
      p.push_back((int64_t{1} << k) + 1);
    }
  }
  std::uniform_real_distribution<double> log2p(0.0, 62.0);
  for (int64_t i = 0; i < n_random; ++i) {
    p.push_back(static_cast<int64_t>(std::exp2(log2p(rng))));
  }
  return p;
}

// Pairs of every magnitude: zeros, equal, huge ratios, subnormals.
float2 random_pair(std::mt19937_64& rng) {
  std::uniform_int_distribution<int> kind(0, 5);
  std::uniform_int_distribution<int> exp(-149, 100);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  const auto value = [&]() {
    const float m = mant(rng) * (rng() & 1 ? 1.0f : -1.0f);
    return std::ldexp(m, exp(rng));
  };
  switch (kind(rng)) {
    case 0:
      return float2{value(), 0.0f};
    case 1: {
      const float v = value();
      return float2{v, v};
    }
    case 2:
      return float2{std::ldexp(mant(rng), -140), std::ldexp(mant(rng), -145)};
    default:
      return float2{value(), value()};
  }
}

// exact_angle_branches::host_branches with this translation unit's (device) branches.
exact_angle_branches::Steps device_branches(int64_t p, double f, double af, float xa, float xb) {
  exact_angle_branches::Steps s;
  const ea::TurnFraction g = ea::turn_fraction(f);
  s.g_hi = g.hi;
  s.g_lo = g.lo;
  s.t = ea::turns_at(p, g);
  s.bits = ea::double_bits(f);
  s.finite = ea::is_finite(f) ? 1 : 0;
  const ea::SinCos64 c64 = ea::sincos_turns(s.t, af);
  s.cos64 = c64.cos;
  s.sin64 = c64.sin;
  ea::rotate_f64(xa, xb, c64, s.ya64, s.yb64);
  s.flipped = ea::flip_sign(c64.cos, 1);
  const ea::FloatFloat af_ff = ea::split_double(af);
  const ea::SinCos32 c32 = ea::sincos_turns_f32(s.t, af_ff.hi, af_ff.lo);
  s.cos_hi = c32.cos.hi;
  s.cos_lo = c32.cos.lo;
  s.sin_hi = c32.sin.hi;
  s.sin_lo = c32.sin.lo;
  ea::rotate_f32(xa, xb, c32, s.ya, s.yb);
  s.dot = ea::dot2_f32(xa, c32.cos, xb, c32.sin);
  return s;
}

// The device and host branches of every step, bit for bit (the records have no padding).
static_assert(sizeof(exact_angle_branches::Steps) == 4 * 8 + 5 * 8 + 7 * 4 + 4);
void compare_branches(int64_t p, double f, double af, float xa, float xb, Failures& fail) {
  const exact_angle_branches::Steps d = device_branches(p, f, af, xa, xb);
  const exact_angle_branches::Steps h = exact_angle_branches::host_branches(p, f, af, xa, xb);
  if (std::memcmp(&d, &h, sizeof d) != 0) {
    const char* what = d.g_hi != h.g_hi || d.g_lo != h.g_lo                       ? "turn_fraction"
                       : d.t != h.t                                               ? "turns_at"
                       : d.bits != h.bits                                         ? "double_bits"
                       : d.finite != h.finite                                     ? "is_finite"
                       : std::memcmp(&d.cos64, &h.cos64, 2 * sizeof(double)) != 0 ? "sincos_turns"
                       : std::memcmp(&d.ya64, &h.ya64, 2 * sizeof(double)) != 0   ? "rotate_f64"
                       : std::memcmp(&d.flipped, &h.flipped, sizeof(double)) != 0 ? "flip_sign"
                       : std::memcmp(&d.cos_hi, &h.cos_hi, 4 * sizeof(float)) != 0
                           ? "sincos_turns_f32"
                       : std::memcmp(&d.ya, &h.ya, 2 * sizeof(float)) != 0 ? "rotate_f32"
                                                                           : "dot2_f32";
    fail.report((std::string("device branches differ from host branches: ") + what).c_str(), p, f,
                d.cos64, h.cos64, 0);
  }
}

int64_t run(int64_t n_random, uint64_t seed, double af, Failures& fail) {
  std::mt19937_64 rng(seed);
  const std::vector<int64_t> pos = positions(rng, n_random);
  const std::vector<double> freqs = frequencies(rng);
  const int P = static_cast<int>(pos.size());
  const int K = static_cast<int>(freqs.size());
  const int n = P * K;
  std::vector<float2> x(n);
  for (auto& v : x) {
    v = random_pair(rng);
  }
  std::vector<float2> out(n, float2{NAN, NAN});
  std::vector<float4> cos_sin(n, float4{NAN, NAN, NAN, NAN});
  const ea::FloatFloat af_ff = ea::split_double(af);
  const int64_t* pos_ptr = pos.data();
  const double* freq_ptr = freqs.data();
  const float2* x_ptr = x.data();
  float2* out_ptr = out.data();
  float4* cs_ptr = cos_sin.data();
  void* args[] = {&pos_ptr,
                  &freq_ptr,
                  const_cast<int*>(&P),
                  const_cast<int*>(&K),
                  const_cast<float*>(&af_ff.hi),
                  const_cast<float*>(&af_ff.lo),
                  &x_ptr,
                  &out_ptr,
                  &cs_ptr};
  const int block = 128;
  if (cudaLaunchKernel(exact_angle_kernel, dim3((n + block - 1) / block), dim3(block), args) !=
      cudaSuccess) {
    std::fprintf(stderr, "launch failed\n");
    std::exit(1);
  }
  for (int i = 0; i < n; ++i) {
    const int64_t p = pos[i / K];
    const double f = freqs[i % K];
    compare_branches(p, f, af, x[i].x, x[i].y, fail);
    const ea::TurnFraction g = ea::turn_fraction(f);
    const uint64_t t = ea::turns_at(p, g);
    if (ea::turns_at_limbs<uint64_t>(static_cast<uint64_t>(p), g.hi, g.lo) != t) {
      fail.report("turns_at_limbs", p, f, 0, 0, 0);
    }
    const ea::SinCos64 ref = ea::sincos_turns(t, af);
    const double ref_err = 2.0 * std::ldexp(1.0, -53) * af;  // the double path's own error
    const float4 got = cos_sin[i];
    const double pairs[2][3] = {{got.x, got.y, ref.cos}, {got.z, got.w, ref.sin}};
    for (const auto& c : pairs) {
      const double ff_err = std::fabs(c[0] + c[1] - c[2]);
      const double ff_bound = std::ldexp(af, -35) + ref_err;
      if (!(ff_err <= ff_bound)) {
        fail.report("cos/sin hi + lo", p, f, c[0] + c[1], c[2], ff_bound);
      }
      const double hi_bound = 0.5 * ulp_of_float(c[2]) + ff_bound;
      if (!(std::fabs(c[0] - c[2]) <= hi_bound)) {
        fail.report("cos/sin hi", p, f, c[0], c[2], hi_bound);
      }
    }
    const double xa = x[i].x;
    const double xb = x[i].y;
    const double mag = std::fabs(xa) + std::fabs(xb);
    // rotate_f32's proven bound, half of the contract's 2^-23 af (|xa| + |xb|) (a rotation with
    // plain rounded cos / sin would need all of it).
    const double bound = std::ldexp(af * mag, -24) * (1 + std::ldexp(1.0, -10)) +
                         std::ldexp(1.0, -147) + 4 * ref_err * mag;
    const double want_a = xa * ref.cos - xb * ref.sin;
    const double want_b = xa * ref.sin + xb * ref.cos;
    if (!(std::fabs(out[i].x - want_a) <= bound)) {
      fail.report("rotation ya", p, f, out[i].x, want_a, bound);
    }
    if (!(std::fabs(out[i].y - want_b) <= bound)) {
      fail.report("rotation yb", p, f, out[i].y, want_b, bound);
    }
  }
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t n_random = 200;
  uint64_t seed = 34;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    // --cases is --positions, and --max-failures / --no-coverage-gate are accepted and ignored,
    // so that the mutation check runs this binary with the other host runs' arguments.
    if ((arg == "--positions" || arg == "--cases") && i + 1 < argc) {
      n_random = std::atoll(argv[++i]);
    } else if (arg == "--seed" && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (arg == "--max-failures" && i + 1 < argc) {
      ++i;
    } else if (arg == "--no-coverage-gate") {
    } else {
      std::fprintf(stderr, "usage: %s [--positions N] [--seed S]\n", argv[0]);
      return 2;
    }
  }
  Failures fail;
  int64_t threads = 0;
  for (double af : {1.0, 1.1386294361119891, 0.7}) {
    // Both orders of the serial launch (the kernel's threads are independent: same results).
    rope_shim::state().reverse_order = !rope_shim::state().reverse_order;
    threads += run(n_random, seed, af, fail);
  }
  // The branches also on what the kernel run does not draw: non-finite and extreme frequencies,
  // every sin-table entry (positions that land on each 1/256 of a turn).
  for (const double f : {HUGE_VAL, -HUGE_VAL, std::nan(""), 1.0 / (1ll << 40), 2 * M_PI / 256.0}) {
    for (int64_t p = 0; p < 300; ++p) {
      compare_branches(p, f, 1.0, 1.5f, -0.25f, fail);
    }
  }
  std::printf("exact_angle host run: %lld (position, plane) threads, %lld failures (seed %llu)\n",
              static_cast<long long>(threads), static_cast<long long>(fail.count),
              static_cast<unsigned long long>(seed));
  return fail.count == 0 ? 0 : 1;
}
