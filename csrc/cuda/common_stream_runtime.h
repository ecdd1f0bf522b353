// SPDX-License-Identifier: BSD-3-Clause
// The real runtime (common_runtime.h) with the launch of the row streams' kernel
// (common_stream_kernel.cuh, declared in common_launchers.h): the runtime of every serving
// fusion's glue (qk_fp8_cuda.cpp, ...), which all run that one kernel. Plain C++, no nvcc.
#pragma once

#include <ATen/Dispatch.h>

#include "common_launchers.h"
#include "common_runtime.h"

namespace rope::cuda {

struct StreamsRuntime : TorchCudaRuntime {
  static int launch_streams(c10::ScalarType dtype, const StreamArgs& args, const TableArgs& tables,
                            Stream stream) {
    cudaError_t status = cudaSuccess;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "rope_row_streams", [&] {
      status = run_row_streams<typename CudaStorage<scalar_t>::type>(args, tables, stream);
    });
    return static_cast<int>(status);
  }
};

}  // namespace rope::cuda
