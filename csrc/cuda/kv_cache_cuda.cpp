// SPDX-License-Identifier: BSD-3-Clause
// CUDA backend of rope.apply_qk_cache (and rope.rms_norm_apply_qk_cache, which runs the row
// streams of common_stream_runtime.h alone): registration, and the kernel's launch added to the
// real runtime (common_runtime.h) of the glue that every CUDA op shares (common_glue.h: device
// guard, current stream of q's device, error check, over the op body of kv_cache_body.h). The
// kernel is kv_cache_kernel.cuh. Nothing here synchronizes: positions and slots are range-checked
// inside the kernel (CUDA_KERNEL_ASSERT), and a repeated slot is not detected (unspecified which
// token's row stays).
#include <ATen/Dispatch.h>
#include <c10/macros/Macros.h>
#include <torch/library.h>

#include "common_glue.h"
#include "common_launchers.h"
#include "common_runtime.h"
#include "common_stream_runtime.h"

namespace rope::cuda {
namespace {

// The streams' runtime too: multi-axis positions, and rms_norm_apply_qk_cache, run the row
// streams (common_stream_kernel.cuh).
struct KvCacheRuntime : StreamsRuntime {
  static int launch_kv_cache(c10::ScalarType dtype, const KvCacheArgs& args,
                             const TableArgs& tables, bool interleaved, Stream stream) {
    cudaError_t status = cudaSuccess;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "rope_apply_qk_cache", [&] {
      status =
          apply_qk_cache<typename CudaStorage<scalar_t>::type>(args, tables, interleaved, stream);
    });
    return static_cast<int>(status);
  }
};

}  // namespace
}  // namespace rope::cuda

TORCH_LIBRARY_IMPL(rope, CUDA, m) {
  m.impl("apply_qk_cache", &rope::cuda::glue::apply_qk_cache<rope::cuda::KvCacheRuntime>);
  m.impl("rms_norm_apply_qk_cache",
         &rope::cuda::glue::rms_norm_apply_qk_cache<rope::cuda::StreamsRuntime>);
}
