// SPDX-License-Identifier: BSD-3-Clause
// CUDA backend of rope.rms_norm_apply_qk: registration and the real runtime for rms_norm_glue.h
// (device guard, current stream, error check), as rope_cuda.cu does for the rotation ops. The
// kernel is rms_norm_kernel.cuh. Nothing here synchronizes.
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/macros/Macros.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#define ROPE_DEVICE_ASSERT(cond) CUDA_KERNEL_ASSERT(cond)
#include "rms_norm_glue.h"
#include "rms_norm_kernel.cuh"

namespace rope::cuda {
namespace {

template <typename T>
struct NormStorage {
  using type = T;
};
template <>
struct NormStorage<c10::Half> {
  using type = __half;
};
template <>
struct NormStorage<c10::BFloat16> {
  using type = __nv_bfloat16;
};

struct TorchCudaNormRuntime {
  using Guard = c10::cuda::OptionalCUDAGuard;
  using Stream = cudaStream_t;
  static std::optional<c10::Device> device_of(const at::Tensor& t) {
    return t.is_cuda() ? std::optional<c10::Device>(t.device()) : std::nullopt;
  }
  static Stream current_stream() { return at::cuda::getCurrentCUDAStream(); }
  static int launch_norm(c10::ScalarType dtype, const NormRotationArgs& q,
                         const NormRotationArgs& k, const TableArgs& tables, RotationMode mode,
                         NormParams params, Stream stream) {
    cudaError_t status = cudaSuccess;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "rope_norm_cuda", [&] {
      status =
          norm_rotate<typename NormStorage<scalar_t>::type>(q, k, tables, mode, params, stream);
    });
    return static_cast<int>(status);
  }
  static void check(int status) { C10_CUDA_CHECK(static_cast<cudaError_t>(status)); }
};

}  // namespace
}  // namespace rope::cuda

TORCH_LIBRARY_IMPL(rope, CUDA, m) {
  m.impl("rms_norm_apply_qk",
         &rope::cuda::glue::rms_norm_apply_qk<rope::cuda::TorchCudaNormRuntime>);
}
