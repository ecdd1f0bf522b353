// SPDX-License-Identifier: BSD-3-Clause
// The torch-free arguments of rope.rms_norm_apply_qk's kernels (CPU and CUDA): one rotation of
// common_kernel_args.h plus the RMSNorm weight of its rows.
//
// Each row x (head_dim features) becomes y = x / sqrt(mean(x^2) + eps) * (weight + weight_offset),
// the mean over the whole head_dim, in the math type (float; double for double storage); then
// the first rotary_dim features of y are rotated exactly as rope.apply rotates, the rest are
// left as they are, and everything is rounded once to the storage type.
#pragma once

#include "common_kernel_args.h"

namespace rope {

struct NormRotationArgs {
  RotationArgs rot;  // copy_tail is true: the tail is always written (normalised)
  // head_dim values, contiguous, of the math type (float, or double for double storage). The CPU
  // backend passes weight + weight_offset (NormParams::weight_offset is then 0); the CUDA glue
  // passes the weight and the kernel adds the offset.
  const void* weight = nullptr;
};

struct NormParams {
  double eps = 1e-6;
  double weight_offset = 0.0;
};

}  // namespace rope
