// SPDX-License-Identifier: BSD-3-Clause
// CUDA backend: registers rope.apply, rope.apply.out, rope.apply_ and rope.apply_qk for the CUDA
// dispatch key.
//
// Thin glue, mirroring csrc/cpu/rope_cpu.cpp: the op bodies (checks, allocation, argument
// preparation) are shared through rope_body.h; the kernel and its launcher are rope_kernel.cuh,
// which knows nothing of torch, and the launch planning is rope_launch_plan.h, plain C++. The
// device guard, the choice of stream and the error check are common_glue.h, templates over a
// runtime, so that tests/cuda_host runs that very glue (with a simulated runtime) on a machine
// without a GPU. This file supplies the real runtime and the storage type. Nothing here
// synchronizes.
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/macros/Macros.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

// Positions outside [0, max_seq_len) trip CUDA_KERNEL_ASSERT inside the kernel, as PyTorch's own
// indexing kernels do: it stays on in release builds and costs no device-to-host sync.
#define ROPE_DEVICE_ASSERT(cond) CUDA_KERNEL_ASSERT(cond)
#include "common_glue.h"
#include "rope_kernel.cuh"

namespace rope::cuda {
namespace {

// The kernel's storage type for a torch dtype: c10::Half and c10::BFloat16 are bit-compatible
// with CUDA's __half and __nv_bfloat16, which the torch-free kernel header uses.
template <typename T>
struct CudaStorage {
  using type = T;
};
template <>
struct CudaStorage<c10::Half> {
  using type = __half;
};
template <>
struct CudaStorage<c10::BFloat16> {
  using type = __nv_bfloat16;
};

// The real CUDA runtime for the glue of common_glue.h, which holds every decision (guard, stream,
// error); these are one-liners. tests/cuda_host drives the same glue with a simulated runtime.
struct TorchCudaRuntime {
  using Guard = c10::cuda::OptionalCUDAGuard;
  using Stream = cudaStream_t;
  // The CUDA key is also chosen when only cos or positions is on the GPU: then no device.
  static std::optional<c10::Device> device_of(const at::Tensor& t) {
    return t.is_cuda() ? std::optional<c10::Device>(t.device()) : std::nullopt;
  }
  // The current stream of the current device (the guard's).
  static Stream current_stream() { return at::cuda::getCurrentCUDAStream(); }
  // Cached by torch per device after the first call: no driver query on the hot path.
  static int multiprocessor_count() {
    return at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  }
  static int launch(c10::ScalarType dtype, const RotationArgs& first, const RotationArgs* second,
                    const TableArgs& tables, RotationMode mode, int num_sms, Stream stream) {
    cudaError_t status = cudaSuccess;
    // The kernel receives untyped pointers and is told the storage type here. Validation admits
    // only these four dtypes; AT_DISPATCH's own error is the backstop.
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "rope_cuda", [&] {
      status = rotate<typename CudaStorage<scalar_t>::type>(first, second, tables, mode, num_sms,
                                                            stream);
    });
    return static_cast<int>(status);
  }
  static void check(int status) { C10_CUDA_CHECK(static_cast<cudaError_t>(status)); }
};

}  // namespace
}  // namespace rope::cuda

TORCH_LIBRARY_IMPL(rope, CUDA, m) {
  using Runtime = rope::cuda::TorchCudaRuntime;
  m.impl("apply", &rope::cuda::glue::apply<Runtime>);
  m.impl("apply_", &rope::cuda::glue::apply_inplace<Runtime>);
  m.impl("apply.out", &rope::cuda::glue::apply_out<Runtime>);
  m.impl("apply_qk", &rope::cuda::glue::apply_qk<Runtime>);
}
