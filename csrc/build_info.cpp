// SPDX-License-Identifier: BSD-3-Clause
// What this build of librope contains and which of its kernels this process runs.
#include <torch_rope/ops.h>

#include "cpu/common_kernel_choice.h"

namespace rope {

bool compiled_with_cuda() {
#ifdef TORCH_ROPE_WITH_CUDA
  return true;
#else
  return false;
#endif
}

std::string cpu_kernel_isa() { return cpu::row_kernel_name(); }

std::string cpu_kernel_variant() { return cpu::row_kernel_variant(); }

}  // namespace rope
