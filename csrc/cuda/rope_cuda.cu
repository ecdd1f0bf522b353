// CUDA backend: registers rope.apply, rope.apply_ and rope.apply_qk for the CUDA dispatch key.
//
// Thin glue, mirroring csrc/cpu/rope_cpu.cpp: the op bodies (checks, allocation, argument
// preparation) are shared through op_bodies.h; the kernel and its launcher are rope_kernel.cuh,
// which knows nothing of torch, and the launch planning is launch_plan.h, plain C++. This file
// picks the device, the stream and the storage type, and turns the launch status into an error.
// Nothing here synchronizes with the device. tests/cuda_host runs the same kernel and planning on
// the host through a copy of this policy (its HostCudaBackend), since CI has no GPU.
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
#include "rope_kernel.cuh"

#include "../op_bodies.h"

namespace rope::cuda {
namespace {

// One launch for `first` and, if given, `second` (apply_qk), on the current device and stream.
void launch(c10::ScalarType dtype, const RotationArgs& first, const RotationArgs* second,
            const TableArgs& tables, RotationMode mode) {
  // Cached by torch per device after the first call: no driver query on the hot path. The
  // kernel's resident blocks per SM, the plan's other device input, are asked of the runtime by
  // rope_kernel.cuh once per device and kernel variant.
  const int num_sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  cudaError_t status = cudaSuccess;
  // c10::Half / c10::BFloat16 storage is bit-compatible with __half / __nv_bfloat16; the kernel
  // receives untyped pointers and is told the type here.
  switch (dtype) {
    case c10::ScalarType::Double:
      status = rotate<double>(first, second, tables, mode, num_sms, stream);
      break;
    case c10::ScalarType::Float:
      status = rotate<float>(first, second, tables, mode, num_sms, stream);
      break;
    case c10::ScalarType::Half:
      status = rotate<__half>(first, second, tables, mode, num_sms, stream);
      break;
    case c10::ScalarType::BFloat16:
      status = rotate<__nv_bfloat16>(first, second, tables, mode, num_sms, stream);
      break;
    default:
      // Only these four storage types have a kernel. Validation is to reject every other dtype
      // (float8 included) before the launch; one that gets here is a hole in those checks.
      TORCH_INTERNAL_ASSERT(false, "rope cuda kernel: unsupported dtype ", dtype);
  }
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
                    const at::Tensor& out) {      // x's shape and dtype, any strides
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
