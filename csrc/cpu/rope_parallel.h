// SPDX-License-Identifier: BSD-3-Clause
// The parallel drivers of the CPU row kernel: split the rows across torch's intra-op threads and
// run the kernel copy that common_kernel_choice.h picked on each range.
#pragma once

#include <c10/core/ScalarType.h>

#include "../common_kernel_args.h"

namespace rope::cpu {

// Rotates every row of `args`, split across torch's intra-op threads (at::parallel_for), with the
// widest kernel this CPU supports (honours ATEN_CPU_CAPABILITY like PyTorch's own kernels).
void rotate(c10::ScalarType dtype, const RotationArgs& args, const TableArgs& tables,
            RotationMode mode);

// Rotates every row of q and then of k in one parallel region.
void rotate_pair(c10::ScalarType dtype, const RotationArgs& q, const RotationArgs& k,
                 const TableArgs& tables, RotationMode mode);

}  // namespace rope::cpu
