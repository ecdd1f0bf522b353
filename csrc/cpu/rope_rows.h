// SPDX-License-Identifier: BSD-3-Clause
// The CPU row kernel, compiled once per CPU capability (see CMakeLists.txt: the same
// rope_rows.cpp is built with DEFAULT, AVX2, AVX512 and AVX512_BF16 flags into separate
// namespaces). common_kernel_choice.h picks the copy at run time; rope_parallel.h drives it.
#pragma once

#include <c10/core/ScalarType.h>

#include "../common_kernel_args.h"

namespace rope::cpu {

// Rotates rows [row_begin, row_end) of `args` with the tables; `dtype` is the storage type of
// args.in / args.out. Not thread-safe across overlapping row ranges of the same output.
using RotateRowsFn = void (*)(c10::ScalarType dtype, const RotationArgs& args,
                              const TableArgs& tables, RotationMode mode, int64_t row_begin,
                              int64_t row_end);

namespace DEFAULT {
void rotate_rows(c10::ScalarType, const RotationArgs&, const TableArgs&, RotationMode, int64_t,
                 int64_t);
}
#ifdef TORCH_ROPE_CPU_X86_DISPATCH
namespace AVX2 {
void rotate_rows(c10::ScalarType, const RotationArgs&, const TableArgs&, RotationMode, int64_t,
                 int64_t);
}
namespace AVX512 {
void rotate_rows(c10::ScalarType, const RotationArgs&, const TableArgs&, RotationMode, int64_t,
                 int64_t);
}
// The AVX512 copy compiled with -mavx512bf16: native float -> bfloat16 conversion.
namespace AVX512_BF16 {
void rotate_rows(c10::ScalarType, const RotationArgs&, const TableArgs&, RotationMode, int64_t,
                 int64_t);
}
#endif

}  // namespace rope::cpu
