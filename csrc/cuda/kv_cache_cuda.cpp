// SPDX-License-Identifier: BSD-3-Clause
// CUDA backend of rope.apply_qk_cache and rope.rms_norm_apply_qk_cache: registration over the
// glue every CUDA op shares (common_glue.h: device guard, current stream of q's device, error
// check, over the op bodies of kv_cache_body.h and kv_cache_norm_body.h) with the row streams'
// runtime (common_stream_runtime.h; the kernel is common_stream_kernel.cuh). Nothing here
// synchronizes: positions and slots are range-checked inside the kernel (CUDA_KERNEL_ASSERT), and
// a repeated slot is not detected (unspecified which token's row stays).
#include <torch/library.h>

#include "common_glue.h"
#include "common_stream_runtime.h"

TORCH_LIBRARY_IMPL(rope, CUDA, m) {
  m.impl("apply_qk_cache", &rope::cuda::glue::apply_qk_cache<rope::cuda::StreamsRuntime>);
  m.impl("rms_norm_apply_qk_cache",
         &rope::cuda::glue::rms_norm_apply_qk_cache<rope::cuda::StreamsRuntime>);
}
