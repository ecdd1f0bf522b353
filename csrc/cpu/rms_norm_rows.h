// SPDX-License-Identifier: BSD-3-Clause
// The CPU row kernel of rope.rms_norm_apply_qk, compiled once per CPU capability beside
// rope_rows.cpp (same CPU_CAPABILITY namespaces; CMakeLists.txt's rope_add_cpu_kernel).
#pragma once

#include <c10/core/ScalarType.h>

#include "../rms_norm_args.h"

namespace rope::cpu {

// RMS-normalises and rotates rows [row_begin, row_end) of `args`; args.weight points at head_dim
// values of weight + weight_offset in the math type (float; double for double storage), and
// params.weight_offset is ignored. Rows of one call must not overlap another call's.
using NormRowsFn = void (*)(c10::ScalarType dtype, const NormRotationArgs& args,
                            const TableArgs& tables, RotationMode mode, NormParams params,
                            int64_t row_begin, int64_t row_end);

#define ROPE_DECLARE_NORM_ROWS                                                             \
  void norm_rows(c10::ScalarType, const NormRotationArgs&, const TableArgs&, RotationMode, \
                 NormParams, int64_t, int64_t);
namespace DEFAULT {
ROPE_DECLARE_NORM_ROWS
}
#ifdef TORCH_ROPE_CPU_X86_DISPATCH
namespace AVX2 {
ROPE_DECLARE_NORM_ROWS
}
namespace AVX512 {
ROPE_DECLARE_NORM_ROWS
}
namespace AVX512_BF16 {
ROPE_DECLARE_NORM_ROWS
}
#endif
#undef ROPE_DECLARE_NORM_ROWS

// The copy matching the rotation kernel common_kernel_choice.h chose (row_kernel_variant()).
NormRowsFn norm_row_kernel();

}  // namespace rope::cpu
