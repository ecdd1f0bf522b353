// SPDX-License-Identifier: BSD-3-Clause
// The row streams' CPU driver: which copy of common_stream_rows.cpp runs (the one matching the
// rotation kernel's, common_kernel_choice.h), and the parallel region over a call's tokens.
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>

#include "common_kernel_choice.h"
#include "common_stream_rows.h"
#include "rope_parallel.h"  // kGrainFeatures

namespace rope::cpu {

StreamRowsFn stream_row_kernel() {
  static const StreamRowsFn fn = [] {
#ifdef TORCH_ROPE_CPU_X86_DISPATCH
    [[maybe_unused]] const char* v = row_kernel_variant();
#if ROPE_CPU_HAS_AVX512_BF16
    if (std::strcmp(v, "AVX512_BF16") == 0) return &AVX512_BF16::stream_rows;
#endif
#if ROPE_CPU_HAS_AVX512
    if (std::strcmp(v, "AVX512") == 0) return &AVX512::stream_rows;
#endif
#if ROPE_CPU_HAS_AVX2
    if (std::strcmp(v, "AVX2") == 0) return &AVX2::stream_rows;
#endif
#endif
    return &DEFAULT::stream_rows;
  }();
  return fn;
}

void run_streams(c10::ScalarType dtype, const StreamArgs& args, const TableArgs& tables) {
  int64_t per_token = 0;
  for (int32_t i = 0; i < args.num_streams; ++i) {
    per_token += args.streams[i].heads * args.streams[i].width;
  }
  const int64_t grain = std::max<int64_t>(1, kGrainFeatures / std::max<int64_t>(1, per_token));
  const StreamRowsFn rows = stream_row_kernel();
  at::parallel_for(0, args.num_tokens, grain,
                   [&](int64_t begin, int64_t end) { rows(dtype, args, tables, begin, end); });
}

}  // namespace rope::cpu
