// SPDX-License-Identifier: BSD-3-Clause
// The parallel drivers of the CPU row kernel: split the rows across torch's intra-op threads and
// run the kernel copy that common_kernel_choice.h picked on each range.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>

#include "../common_kernel_args.h"

namespace rope::cpu {

// Features per parallel task of every CPU driver: at least 32768, the threshold
// (at::internal::GRAIN_SIZE) that torch's own elementwise kernels, clone among them, use. Below it
// the whole call runs on the calling thread: waking the OpenMP team costs microseconds, as much as
// rotating a decode step of a few heads (B=1..8, 32 heads of 128). Above it each task is big enough
// to amortise the wake-up.
constexpr int64_t kGrainFeatures = 32768;

// Rotates every row of `args`, split across torch's intra-op threads (at::parallel_for), with the
// widest kernel this CPU supports (honours ATEN_CPU_CAPABILITY like PyTorch's own kernels).
void rotate(c10::ScalarType dtype, const RotationArgs& args, const TableArgs& tables,
            RotationMode mode);

// Rotates every row of q and then of k in one parallel region.
void rotate_pair(c10::ScalarType dtype, const RotationArgs& q, const RotationArgs& k,
                 const TableArgs& tables, RotationMode mode);

}  // namespace rope::cpu
