// SPDX-License-Identifier: BSD-3-Clause
// The checks of rope.rms_norm_apply_qk, shared by every backend (CPU, CUDA, Meta) and by the
// autograd kernel: rope.apply_qk's checks, then the two weights, eps and weight_offset.
// Metadata only (SymInt-aware), as rope_validation.h.
#pragma once

#include <ATen/core/Tensor.h>

#include "rope_validation.h"

namespace rope::detail {

void check_rms_norm_apply_qk(const char* op, const at::Tensor& q, const at::Tensor& k,
                             const at::Tensor& q_weight, const at::Tensor& k_weight,
                             const at::Tensor& cos, const at::Tensor& sin,
                             const at::Tensor& positions, double eps, double weight_offset,
                             const MultiAxisArgs& axes = {});

}  // namespace rope::detail
