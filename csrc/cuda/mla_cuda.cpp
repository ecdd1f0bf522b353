// SPDX-License-Identifier: BSD-3-Clause
// CUDA backend of rope.mla_apply_cache: registration of the glue every CUDA op shares
// (common_glue.h: device guard, current stream of q_pe's device, error check) over the row
// streams' runtime (common_stream_runtime.h; the kernel is common_stream_kernel.cuh). Nothing here
// synchronizes: positions and slots are range-checked inside the kernel, and a repeated slot is
// not detected (which token's row stays is unspecified).
#include <torch/library.h>

#include "common_glue.h"
#include "common_stream_runtime.h"

TORCH_LIBRARY_IMPL(rope, CUDA, m) {
  m.impl("mla_apply_cache", &rope::cuda::glue::mla_apply_cache<rope::cuda::StreamsRuntime>);
}
