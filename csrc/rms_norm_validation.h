// SPDX-License-Identifier: BSD-3-Clause
// The checks of rope.rms_norm_apply_qk, shared by every backend (CPU, CUDA, Meta) and by the
// autograd kernel: rope.apply_qk's checks, then the two weights, eps and weight_offset.
// Metadata only (SymInt-aware), as rope_validation.h.
#pragma once

#include <ATen/core/Tensor.h>

#include "rope_validation.h"

namespace rope::detail {

// The norm's own arguments against checked q and k: the two weights, eps and weight_offset
// (rope.rms_norm_apply_qk_cache runs them after apply_qk_cache's checks).
void check_norm_weights(const char* op, const at::Tensor& q, const at::Tensor& k,
                        const at::Tensor& q_weight, const at::Tensor& k_weight, double eps,
                        double weight_offset);

void check_rms_norm_apply_qk(const char* op, const at::Tensor& q, const at::Tensor& k,
                             const at::Tensor& q_weight, const at::Tensor& k_weight,
                             const at::Tensor& cos, const at::Tensor& sin,
                             const at::Tensor& positions, double eps, double weight_offset,
                             const MultiAxisArgs& axes = {});

// weight + weight_offset in the math type (float; double for double rows), contiguous: what the
// row streams read.
at::Tensor norm_weight_in_math_type(const at::Tensor& weight, double offset,
                                    at::ScalarType row_dtype);

}  // namespace rope::detail
