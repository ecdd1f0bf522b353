// SPDX-License-Identifier: BSD-3-Clause
// Every step of csrc/common_exact_angle.h at one (position, frequency, pair), as one record: the
// same code compiled twice, once with the device branches (exact_angle_host.cpp, against the
// shims: the code the GPU runs) and once with the host branches (exact_angle_host_branches.cpp,
// no shim: the code the CPU kernels run). The two must agree bit for bit.
#pragma once

#include <cstdint>

namespace exact_angle_branches {

struct Steps {
  uint64_t g_hi = 0;  // turn_fraction
  uint64_t g_lo = 0;
  uint64_t t = 0;     // turns_at
  uint64_t bits = 0;  // double_bits of the frequency
  double cos64 = 0;   // sincos_turns
  double sin64 = 0;
  double ya64 = 0;  // rotate_f64
  double yb64 = 0;
  double flipped = 0;  // flip_sign(cos64, 1)
  float cos_hi = 0;    // sincos_turns_f32
  float cos_lo = 0;
  float sin_hi = 0;
  float sin_lo = 0;
  float ya = 0;  // rotate_f32
  float yb = 0;
  float dot = 0;   // dot2_f32 (xa, cos, xb, sin)
  int finite = 0;  // is_finite
};

// Every step with the host branches (exact_angle_host_branches.cpp).
Steps host_branches(int64_t p, double f, double af, float xa, float xb);

}  // namespace exact_angle_branches
