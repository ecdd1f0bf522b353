// SPDX-License-Identifier: BSD-3-Clause
// csrc/common_exact_angle.h with its host branches (no shim is included:
// ROPE_HOST_RUNS_DEVICE_BRANCHES is not defined), for exact_angle_host.cpp's bit-for-bit comparison
// with the device branches.
#include "common_exact_angle.h"
#include "exact_angle_branches.h"

namespace exact_angle_branches {

Steps host_branches(int64_t p, double f, double af, float xa, float xb) {
  namespace ea = rope::exact_angle;
  Steps s;
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

}  // namespace exact_angle_branches
