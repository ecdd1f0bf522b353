// SPDX-License-Identifier: BSD-3-Clause
// CUDA backend of rope.rms_norm_apply_qk: registration, and the kernel's launch added to the real
// runtime (common_runtime.h) of the glue that every CUDA op shares (common_glue.h: device guard,
// current stream, error check), as rope_cuda.cpp does for the rotation ops. The kernel is
// rms_norm_kernel.cuh. Nothing here synchronizes.
#include <ATen/Dispatch.h>
#include <c10/macros/Macros.h>
#include <torch/library.h>

#include "common_glue.h"
#include "common_launchers.h"
#include "common_runtime.h"

namespace rope::cuda {
namespace {

struct RmsNormRuntime : TorchCudaRuntime {
  static int launch_norm(c10::ScalarType dtype, const NormRotationArgs& q,
                         const NormRotationArgs& k, const TableArgs& tables, RotationMode mode,
                         NormParams params, Stream stream) {
    cudaError_t status = cudaSuccess;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "rope_norm_cuda", [&] {
      status =
          norm_rotate<typename CudaStorage<scalar_t>::type>(q, k, tables, mode, params, stream);
    });
    return static_cast<int>(status);
  }
};

}  // namespace
}  // namespace rope::cuda

TORCH_LIBRARY_IMPL(rope, CUDA, m) {
  m.impl("rms_norm_apply_qk", &rope::cuda::glue::rms_norm_apply_qk<rope::cuda::RmsNormRuntime>);
}
