// SPDX-License-Identifier: BSD-3-Clause
// The vectorised fp8 row quantizer of the row streams' fp8 targets (common_stream_rows.cpp),
// compiled once per CPU capability beside rope_rows.cpp (same CPU_CAPABILITY namespaces;
// CMakeLists.txt's rope_add_cpu_kernel).
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>

#include "../kv_cache_args.h"

namespace rope::cpu {

// dst[i] = quantize_fp8(src[i], scale, format, rule) of kv_cache_args.h, bit for bit, for i < n:
// saturate(src / scale) (or saturate(src * scale) with ScaleRule::kMultiply) rounded to the fp8
// format as c10 rounds (a float32 division or product for float, Half and BFloat16 src; a float64
// one for double src). `dtype` is src's type.
#define ROPE_DECLARE_FP8_ROWS                                                                \
  void quantize_fp8_row(c10::ScalarType, const void*, uint8_t*, int64_t, float, CacheFormat, \
                        ScaleRule);
namespace DEFAULT {
ROPE_DECLARE_FP8_ROWS
}
#ifdef TORCH_ROPE_CPU_X86_DISPATCH
namespace AVX2 {
ROPE_DECLARE_FP8_ROWS
}
namespace AVX512 {
ROPE_DECLARE_FP8_ROWS
}
namespace AVX512_BF16 {
ROPE_DECLARE_FP8_ROWS
}
#endif
#undef ROPE_DECLARE_FP8_ROWS

}  // namespace rope::cpu
