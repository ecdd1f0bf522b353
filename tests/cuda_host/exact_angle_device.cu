// SPDX-License-Identifier: BSD-3-Clause
// csrc/common_exact_angle.h under nvcc, for every CUDA architecture of the build: the device steps
// in exact_angle_kernel.cuh, and the host-only double path in host code of the same translation
// unit. Built, never run (no GPU needed): check_exact_angle_sass.py reads its machine code.
#include "exact_angle_kernel.cuh"

// The CPU path through nvcc's host compiler pass (its functions are host-only: a device call to
// them would not compile).
double exact_angle_host_path(int64_t position, double freq) {
  namespace ea = rope::exact_angle;
  const ea::SinCos64 cs = ea::sincos_turns(ea::turns_at(position, ea::turn_fraction(freq)), 1.0);
  float ya = 0.0f;
  float yb = 0.0f;
  ea::rotate_via_f64(1.0f, 0.0f, cs, ya, yb);
  return cs.cos + cs.sin + ya + yb;
}
