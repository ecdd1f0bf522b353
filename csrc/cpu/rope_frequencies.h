// SPDX-License-Identifier: BSD-3-Clause
// The frequency form (table-free) on the CPU: each distinct position's (each packed token's)
// float64 cos / sin of its exact angles is computed once, into compact tables that the row kernel
// then reads for every head of q and k, with the exact rotation (TableArgs::exact_rotation).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include "../common_kernel_args.h"

namespace rope::cpu {

// Rotates every row of `first` and, if given, of `second` (apply_qk) by the frequencies of
// `freqs` (TableArgs::frequencies, with the multi-axis map in freqs.axes). With positions
// (PositionKind kTensor) each RotationArgs reads `*_positions`, a contiguous tensor (its
// elements are the distinct positions; with multi-axis positions, the trailing axis dim of
// freqs.axes.num_axes entries); with packed sequences the positions are unused. Positions must
// already be checked (>= 0) and freqs finite.
void rotate_frequencies(c10::ScalarType dtype, const RotationArgs& first,
                        const at::Tensor& first_positions, const RotationArgs* second,
                        const at::Tensor* second_positions, const TableArgs& freqs,
                        RotationMode mode);

}  // namespace rope::cpu
