// SPDX-License-Identifier: BSD-3-Clause
// The real CUDA runtime of common_glue.h, shared by the three glue files (rope_cuda.cpp,
// rms_norm_cuda.cpp, kv_cache_cuda.cpp): device guard, current stream, SM count, error check, and
// the kernels' storage type of each torch dtype. Each .cu derives its runtime from this one and
// adds only its kernel's launch. Every member is a one-liner with no choice in it: the decisions
// are common_glue.h's, which tests/cuda_host runs with a simulated runtime. Compiled by the host
// compiler only (common_launchers.h says why no torch header goes through nvcc).
#pragma once

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <optional>

namespace rope::cuda {

// The kernel's storage type for a torch dtype: c10::Half and c10::BFloat16 are bit-compatible
// with CUDA's __half and __nv_bfloat16, which the torch-free kernel headers use.
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
  static void check(int status) { C10_CUDA_CHECK(static_cast<cudaError_t>(status)); }
  // A CPU tensor (packed sequences) on like's device. Blocking: from pinned memory a
  // non-blocking copy would still be in flight when the call returns, and a serving loop that
  // refills its pinned cu_seqlens buffer right after the call would have the kernel read the new
  // values. The host checked these values anyway, so the call has already waited on them.
  static at::Tensor to_device(const at::Tensor& host, const at::Tensor& like) {
    return host.to(like.device(), /*non_blocking=*/false);
  }
};

}  // namespace rope::cuda
