// Which compiled copy of the CPU row kernel (rotate_rows.cpp, built once per instruction set)
// this process runs.
#pragma once

#include "rotate_rows.h"

namespace rope::cpu {

// The row kernel for this process: the widest instruction set that both the CPU really supports
// and torch's capability setting allows (at::get_cpu_capability(), which honours the
// ATEN_CPU_CAPABILITY environment variable). Chosen once and cached.
RotateRowsFn row_kernel();

// The name of the chosen copy, e.g. "AVX512", "AVX2" or "DEFAULT" (for tests and benchmarks).
const char* row_kernel_name();

}  // namespace rope::cpu
