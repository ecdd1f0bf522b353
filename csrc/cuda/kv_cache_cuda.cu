// SPDX-License-Identifier: BSD-3-Clause
// CUDA backend of rope.apply_qk_cache: the shared op body (kv_cache_body.h: checks, allocation,
// arguments) and the torch-free kernel of kv_cache_kernel.cuh, on the current stream of q's
// device. Nothing here synchronizes: positions and slots are range-checked inside the kernel
// (CUDA_KERNEL_ASSERT), and a repeated slot is not detected (unspecified which token's row stays).
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/macros/Macros.h>
#include <torch/library.h>

#define ROPE_DEVICE_ASSERT(cond) CUDA_KERNEL_ASSERT(cond)
#include "../kv_cache_body.h"
#include "kv_cache_kernel.cuh"

namespace rope::cuda {
namespace {

template <typename T>
struct Storage {
  using type = T;
};
template <>
struct Storage<c10::Half> {
  using type = __half;
};
template <>
struct Storage<c10::BFloat16> {
  using type = __nv_bfloat16;
};

struct CudaKvBackend {
  static void check_positions(const char*, const at::Tensor&, int64_t,
                              const detail::MultiAxisArgs&) {}
  static void check_slots(const char*, const at::Tensor&, int64_t) {}
  static void write_cache(c10::ScalarType dtype, const detail::PreparedKvCache& p,
                          bool interleaved) {
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    cudaError_t status = cudaSuccess;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "rope_apply_qk_cache", [&] {
      status = rope::cuda::apply_qk_cache<typename Storage<scalar_t>::type>(p.args, p.tables.args,
                                                                            interleaved, stream);
    });
    C10_CUDA_CHECK(status);
  }
};

at::Tensor apply_qk_cache_cuda(const at::Tensor& q, const at::Tensor& k,
                               const std::optional<at::Tensor>& v, const at::Tensor& cos,
                               const at::Tensor& sin, const at::Tensor& positions,
                               const at::Tensor& k_cache, const std::optional<at::Tensor>& v_cache,
                               const at::Tensor& slot_mapping, bool interleaved,
                               const std::optional<at::Tensor>& k_scale,
                               const std::optional<at::Tensor>& v_scale) {
  const c10::cuda::OptionalCUDAGuard guard(q.is_cuda() ? std::optional<c10::Device>(q.device())
                                                       : std::nullopt);
  return detail::apply_qk_cache_body<CudaKvBackend>(
      {q, k, v, cos, sin, positions, k_cache, v_cache, slot_mapping, k_scale, v_scale},
      interleaved);
}

}  // namespace
}  // namespace rope::cuda

TORCH_LIBRARY_IMPL(rope, CUDA, m) { m.impl("apply_qk_cache", &rope::cuda::apply_qk_cache_cuda); }
