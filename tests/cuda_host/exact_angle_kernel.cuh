// SPDX-License-Identifier: BSD-3-Clause
// One kernel over every device-side step of csrc/common_exact_angle.h: for each (position, plane)
// thread, frac(f / 2pi), the turn at the position, cos / sin with FP32 arithmetic only (scaled by
// the attention factor) and the rotation of one pair. Compiled twice, never copied: by nvcc
// (exact_angle_device.cu, whose machine code check_exact_angle_sass.py reads for FP64
// instructions) and by the host compiler against the shims (exact_angle_host.cpp, which runs it
// and checks the results).
#pragma once

#include <cuda_runtime.h>

#include "common_exact_angle.h"

// positions: [num_positions] int64 >= 0; freqs: [num_planes] float64; x, out: [num_positions *
// num_planes] pairs; cos_sin: [num_positions * num_planes] (cos.hi, cos.lo, sin.hi, sin.lo).
__global__ void exact_angle_kernel(const int64_t* __restrict__ positions,
                                   const double* __restrict__ freqs, int num_positions,
                                   int num_planes, float af_hi, float af_lo,
                                   const float2* __restrict__ x, float2* __restrict__ out,
                                   float4* __restrict__ cos_sin) {
  namespace ea = rope::exact_angle;
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= num_positions * num_planes) {
    return;
  }
  const int k = i % num_planes;
  const ea::TurnFraction g = ea::turn_fraction(freqs[k]);
  const uint64_t t = ea::turns_at(positions[i / num_planes], g);
  const ea::SinCos32 cs = ea::sincos_turns_f32(t, af_hi, af_lo);
  cos_sin[i] = float4{cs.cos.hi, cs.cos.lo, cs.sin.hi, cs.sin.lo};
  float ya = 0.0f;
  float yb = 0.0f;
  ea::rotate_f32(x[i].x, x[i].y, cs, ya, yb);
  out[i] = float2{ya, yb};
}
