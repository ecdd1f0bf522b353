// SPDX-License-Identifier: BSD-3-Clause
// Compile-only checks that the shims refuse what the host launch cannot model (ctest
// cuda_host_refuses_*: each must fail to compile with the shim's message). Built without any
// ROPE_REFUSE_* macro it is a valid kernel, the control that the failures are the refusals.
#include <cuda_runtime.h>

#if defined(ROPE_REFUSE_COOPERATIVE_GROUPS)
#include <cooperative_groups.h>
#endif
#if defined(ROPE_REFUSE_LIBCUDACXX_BARRIER)
#include <cuda/barrier>
#endif

__global__ void kernel(float* out, const float* in) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
#if defined(ROPE_REFUSE_SHARED_MEMORY)
  // The raw qualifier would make a per-thread local here; ROPE_BLOCK_SHARED is the block's.
  __shared__ float staged[256];
  staged[threadIdx.x] = in[i];
  out[i] = staged[threadIdx.x];
#elif defined(ROPE_REFUSE_ACTIVEMASK)
  // Which lanes happen to be converged: the fibers do not model it.
  out[i] = static_cast<float>(__activemask());
#elif defined(ROPE_REFUSE_ATOMIC)
  atomicAdd(out, in[i]);
#else
  out[i] = in[i];
#endif
}

int main() {
  float in[256] = {};
  float out[256];
  float* out_ptr = out;
  const float* in_ptr = in;
  void* args[] = {&out_ptr, &in_ptr};
  return cudaLaunchKernel(kernel, dim3(1), dim3(256), args, 0, nullptr) == cudaSuccess ? 0 : 1;
}
