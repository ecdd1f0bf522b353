// SPDX-License-Identifier: BSD-3-Clause
// CUDA backend: registers rope.apply, rope.apply.out, rope.apply_ and rope.apply_qk, and their
// frequency and packed-sequence overloads (rope_forms.h), for the CUDA dispatch key.
//
// Thin glue, mirroring csrc/cpu/rope_cpu.cpp: the op bodies (checks, allocation, argument
// preparation) are shared through rope_body.h; the kernel and its launcher are rope_kernel.cuh,
// which knows nothing of torch, and the launch planning is rope_launch_plan.h, plain C++. The
// device guard, the choice of stream and the error check are common_glue.h, templates over a
// runtime, so that tests/cuda_host runs that very glue (with a simulated runtime) on a machine
// without a GPU. This file adds the kernel's launch to the real runtime (common_runtime.h).
// Nothing here synchronizes.
#include <ATen/Dispatch.h>
#include <c10/macros/Macros.h>
#include <torch/library.h>

#include "common_glue.h"
#include "common_launchers.h"
#include "common_runtime.h"

namespace rope::cuda {
namespace {

struct RopeRuntime : TorchCudaRuntime {
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
};

}  // namespace
}  // namespace rope::cuda

TORCH_LIBRARY_IMPL(rope, CUDA, m) {
  using Runtime = rope::cuda::RopeRuntime;
  m.impl("apply", &rope::cuda::glue::apply<Runtime>);
  m.impl("apply_", &rope::cuda::glue::apply_inplace<Runtime>);
  m.impl("apply.out", &rope::cuda::glue::apply_out<Runtime>);
  m.impl("apply_qk", &rope::cuda::glue::apply_qk<Runtime>);
  rope::detail::register_forms<rope::cuda::glue::Forms<Runtime>>(m);
}
