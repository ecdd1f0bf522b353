// SPDX-License-Identifier: BSD-3-Clause
// An fp8 codec written from the formats' definitions, independent of c10's algorithm and of
// kv_cache_args.h: the value of every code, and the nearest code to a value by search over all of
// them (ties to the even code). The torch-free host runs hold the kernels' quantization to it.
#pragma once

#include <cmath>
#include <cstdint>

namespace rope_host::fp8 {

// e4m3fn: bias 7, no infinity, S.1111.111 is NaN. e5m2: bias 15, IEEE-like.
inline double value(uint8_t code, bool e4m3) {
  const int mbits = e4m3 ? 3 : 2;
  const int bias = e4m3 ? 7 : 15;
  const int e = (code & 0x7f) >> mbits;
  const int m = code & ((1 << mbits) - 1);
  const double sign = (code & 0x80) ? -1.0 : 1.0;
  if (e4m3 && (code & 0x7f) == 0x7f) {
    return NAN;
  }
  if (!e4m3 && e == 31) {
    return m == 0 ? sign * INFINITY : NAN;
  }
  if (e == 0) {
    return sign * std::ldexp(m, 1 - bias - mbits);
  }
  return sign * std::ldexp((1 << mbits) + m, e - bias - mbits);
}

inline double max_finite(bool e4m3) { return e4m3 ? 448.0 : 57344.0; }

// The finite code nearest to x (|x| <= max) among the codes of x's sign, ties to the even code:
// round to nearest even, keeping the sign of zero.
inline uint8_t nearest_code(double x, bool e4m3) {
  const int sign = std::signbit(x) ? 0x80 : 0;
  const double ax = std::fabs(x);
  int best = 0;
  double best_err = INFINITY;
  for (int c = 0; c < 128; ++c) {
    const double v = value(static_cast<uint8_t>(c), e4m3);
    if (!std::isfinite(v)) {
      continue;
    }
    const double err = std::fabs(v - ax);
    if (err < best_err || (err == best_err && (c & 1) == 0)) {
      best = c;
      best_err = err;
    }
  }
  return static_cast<uint8_t>(best | sign);
}

}  // namespace rope_host::fp8
