// SPDX-License-Identifier: BSD-3-Clause
// The row streams on the CPU (csrc/common_row_streams.h): the kernel of rope.apply_qk_fp8,
// rope.rms_norm_apply_qk_cache and rope.mla_apply_cache. common_stream_rows.cpp is compiled once
// per CPU capability beside rope_rows.cpp (same CPU_CAPABILITY namespaces; CMakeLists.txt's
// rope_add_cpu_kernel); common_stream_cpu.cpp picks the copy and runs it over the tokens.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>

#include "../common_row_streams.h"

namespace rope::cpu {

// Every stream's rows of tokens [token_begin, token_end); `dtype` is the sources' storage type.
// The slots of by_slot targets must have been checked (in range, none twice): a negative slot
// skips the token, a slot past the cache skips it too. Rows of one call's token ranges never
// overlap, so disjoint ranges may run on different threads.
using StreamRowsFn = void (*)(c10::ScalarType dtype, const StreamArgs& args,
                              const TableArgs& tables, int64_t token_begin, int64_t token_end);

#define ROPE_DECLARE_STREAM_ROWS \
  void stream_rows(c10::ScalarType, const StreamArgs&, const TableArgs&, int64_t, int64_t);
namespace DEFAULT {
ROPE_DECLARE_STREAM_ROWS
}
#ifdef TORCH_ROPE_CPU_X86_DISPATCH
namespace AVX2 {
ROPE_DECLARE_STREAM_ROWS
}
namespace AVX512 {
ROPE_DECLARE_STREAM_ROWS
}
namespace AVX512_BF16 {
ROPE_DECLARE_STREAM_ROWS
}
#endif
#undef ROPE_DECLARE_STREAM_ROWS

// The copy matching the rotation kernel common_kernel_choice.h chose (row_kernel_variant()).
StreamRowsFn stream_row_kernel();

// Runs every token of a call: one parallel region (at::parallel_for) over tokens.
void run_streams(c10::ScalarType dtype, const StreamArgs& args, const TableArgs& tables);

}  // namespace rope::cpu
