// SPDX-License-Identifier: BSD-3-Clause
// CUDA backend of rope.apply_qk_fp8, rope.apply_qk_fp8_dynamic and their out= overloads:
// registration of the glue every CUDA op shares (common_glue.h: device guard, current stream of
// q's device, error check) over the row streams' runtime (common_stream_runtime.h; the kernel is
// common_stream_kernel.cuh). Nothing here synchronizes: positions are range-checked inside the
// kernel.
#include <torch/library.h>

#include "common_glue.h"
#include "common_stream_runtime.h"

TORCH_LIBRARY_IMPL(rope, CUDA, m) {
  m.impl("apply_qk_fp8", &rope::cuda::glue::apply_qk_fp8<rope::cuda::StreamsRuntime>);
  m.impl("apply_qk_fp8.out", &rope::cuda::glue::apply_qk_fp8_out<rope::cuda::StreamsRuntime>);
  m.impl("apply_qk_fp8_dynamic",
         &rope::cuda::glue::apply_qk_fp8_dynamic<rope::cuda::StreamsRuntime>);
  m.impl("apply_qk_fp8_dynamic.out",
         &rope::cuda::glue::apply_qk_fp8_dynamic_out<rope::cuda::StreamsRuntime>);
}
