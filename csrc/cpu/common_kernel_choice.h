// SPDX-License-Identifier: BSD-3-Clause
// Which compiled copy of the CPU row kernel (rope_rows.cpp, built once per instruction set)
// this process runs.
#pragma once

#include "common_kernel_copies.h"  // ROPE_CPU_HAS_<copy>
#include "rope_rows.h"

namespace rope::cpu {

// The row kernel for this process: the widest copy that the CPU really supports, that torch's
// capability setting allows (at::get_cpu_capability(), which honours the ATEN_CPU_CAPABILITY
// environment variable), and that TORCH_ROPE_CPU_KERNEL allows when set (default, avx2, avx512 or
// avx512_bf16: a ceiling, so tests and benchmarks can run the plain AVX512 copy on a CPU with
// AVX512-BF16), among the copies this build holds (common_kernel_copies.h). Chosen once and
// cached.
RotateRowsFn row_kernel();

// The instruction set of the chosen copy as torch names capabilities: "AVX512", "AVX2" or
// "DEFAULT" (both AVX-512 copies report "AVX512").
const char* row_kernel_name();

// The chosen copy itself: "AVX512_BF16" (AVX-512 with native bfloat16 conversion), "AVX512",
// "AVX2" or "DEFAULT".
const char* row_kernel_variant();

}  // namespace rope::cpu
