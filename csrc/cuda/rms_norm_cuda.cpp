// SPDX-License-Identifier: BSD-3-Clause
// CUDA backend of rope.rms_norm_apply_qk: registration over the glue every CUDA op shares
// (common_glue.h: device guard, current stream of q's device, error check, over the op body of
// rms_norm_body.h) with the row streams' runtime (common_stream_runtime.h; the kernel is
// common_stream_kernel.cuh: a group of lanes per row, the sum of squares folded by shuffles).
// Nothing here synchronizes: positions are range-checked inside the kernel (CUDA_KERNEL_ASSERT).
#include <torch/library.h>

#include "common_glue.h"
#include "common_stream_runtime.h"

TORCH_LIBRARY_IMPL(rope, CUDA, m) {
  m.impl("rms_norm_apply_qk", &rope::cuda::glue::rms_norm_apply_qk<rope::cuda::StreamsRuntime>);
}
