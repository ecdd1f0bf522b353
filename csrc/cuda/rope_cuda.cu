// SPDX-License-Identifier: BSD-3-Clause
// CUDA backend: registers rope.apply, rope.apply_ and rope.apply_qk for the CUDA dispatch key.
//
// Thin glue, mirroring csrc/cpu/rope_cpu.cpp: the op bodies (checks, allocation, argument
// preparation) are shared through op_bodies.h; the kernel and its launcher are rope_kernel.cuh,
// which knows nothing of torch, and the launch planning is launch_plan.h, plain C++. This file
// picks the device, the stream and the storage type, and turns the launch status into an error.
// Nothing here synchronizes with the device. tests/cuda_host runs the same kernel and planning on
// the host through a copy of this policy (its HostCudaBackend), since CI has no GPU.
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
#include "../op_bodies.h"
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

// One launch for `first` and, if given, `second` (apply_qk), on the current device and stream.
void launch(c10::ScalarType dtype, const RotationArgs& first, const RotationArgs* second,
            const TableArgs& tables, RotationMode mode) {
  // Cached by torch per device after the first call: no driver query on the hot path. The
  // kernel's resident blocks per SM, the plan's other device input, are asked of the runtime by
  // rope_kernel.cuh once per device and kernel variant.
  const int num_sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  cudaError_t status = cudaSuccess;
  // The kernel receives untyped pointers and is told the storage type here. Validation admits
  // only these four dtypes; AT_DISPATCH's own error is the backstop.
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "rope_cuda", [&] {
    status =
        rotate<typename CudaStorage<scalar_t>::type>(first, second, tables, mode, num_sms, stream);
  });
  C10_CUDA_CHECK(status);
}

struct CudaBackend {
  // The range of positions is checked inside the kernel (ROPE_DEVICE_ASSERT): a host-side check
  // would read positions back and synchronize with the device on every call.
  static void check_positions(const char* /*op*/, const at::Tensor& /*positions*/,
                              int64_t /*max_seq_len*/) {}
  static void rotate(c10::ScalarType dtype, const RotationArgs& args, const TableArgs& tables,
                     RotationMode mode) {
    launch(dtype, args, nullptr, tables, mode);
  }
  static void rotate_pair(c10::ScalarType dtype, const RotationArgs& q, const RotationArgs& k,
                          const TableArgs& tables, RotationMode mode) {
    launch(dtype, q, &k, tables, mode);
  }
};

// The device to run on. The CUDA key is also chosen when only cos or positions is on the GPU;
// then there is no guard to set, and the op body reports the device mismatch.
std::optional<c10::Device> cuda_device_of(const at::Tensor& t) {
  return t.is_cuda() ? std::optional<c10::Device>(t.device()) : std::nullopt;
}

at::Tensor apply_cuda(const at::Tensor& x,          // [..., head_dim]
                      const at::Tensor& cos,        // [max_seq_len, rotary_dim / 2]
                      const at::Tensor& sin,        // [max_seq_len, rotary_dim / 2]
                      const at::Tensor& positions,  // broadcastable to x.shape[:-1]
                      bool interleaved, bool inverse) {
  const c10::cuda::OptionalCUDAGuard guard(cuda_device_of(x));
  return detail::apply_body<CudaBackend>(x, cos, sin, positions, interleaved, inverse);
}

void apply_inplace_cuda(const at::Tensor& x,          // [..., head_dim], rotated in place
                        const at::Tensor& cos,        // [max_seq_len, rotary_dim / 2]
                        const at::Tensor& sin,        // [max_seq_len, rotary_dim / 2]
                        const at::Tensor& positions,  // broadcastable to x.shape[:-1]
                        bool interleaved, bool inverse) {
  const c10::cuda::OptionalCUDAGuard guard(cuda_device_of(x));
  detail::apply_inplace_body<CudaBackend>(x, cos, sin, positions, interleaved, inverse);
}

void apply_out_cuda(const at::Tensor& x,          // [..., head_dim]
                    const at::Tensor& cos,        // [max_seq_len, rotary_dim / 2]
                    const at::Tensor& sin,        // [max_seq_len, rotary_dim / 2]
                    const at::Tensor& positions,  // broadcastable to x.shape[:-1]
                    bool interleaved, bool inverse,
                    const at::Tensor& out) {  // x's shape and dtype, any strides
  const c10::cuda::OptionalCUDAGuard guard(cuda_device_of(x));
  detail::apply_out_body<CudaBackend>(x, cos, sin, positions, interleaved, inverse, out);
}

std::tuple<at::Tensor, at::Tensor> apply_qk_cuda(
    const at::Tensor& q,          // [..., head_dim], e.g. [T, num_heads, head_dim]
    const at::Tensor& k,          // [..., head_dim], e.g. [T, num_kv_heads, head_dim]
    const at::Tensor& cos,        // [max_seq_len, rotary_dim / 2]
    const at::Tensor& sin,        // [max_seq_len, rotary_dim / 2]
    const at::Tensor& positions,  // broadcastable to q.shape[:-1] and to k.shape[:-1]
    bool interleaved, bool inverse) {
  const c10::cuda::OptionalCUDAGuard guard(cuda_device_of(q));
  return detail::apply_qk_body<CudaBackend>(q, k, cos, sin, positions, interleaved, inverse);
}

}  // namespace
}  // namespace rope::cuda

TORCH_LIBRARY_IMPL(rope, CUDA, m) {
  m.impl("apply", &rope::cuda::apply_cuda);
  m.impl("apply_", &rope::cuda::apply_inplace_cuda);
  m.impl("apply.out", &rope::cuda::apply_out_cuda);
  m.impl("apply_qk", &rope::cuda::apply_qk_cuda);
}
