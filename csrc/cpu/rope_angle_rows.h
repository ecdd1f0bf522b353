// SPDX-License-Identifier: BSD-3-Clause
// The angles of the frequency form on the CPU: rows of float64 cos / sin of exact angles, one row
// per distinct position (or per token of packed sequences), which the row kernel then reads as
// tables (rope_frequencies.cpp builds them; docs/architecture.md, "Angle sources and position
// sources"). Compiled once per CPU capability beside rope_rows.cpp (the same CPU_CAPABILITY
// namespaces), with steps 2 and 3a of csrc/common_exact_angle.h on 4 (AVX2) or 8 (AVX-512) lanes.
#pragma once

#include <cstdint>

#include "../common_kernel_args.h"

namespace rope::cpu {

struct AngleRowsArgs {
  // Per plane: floor(2^128 frac(freqs[k] / 2pi)) as hi and lo words (turn_fraction).
  const uint64_t* fraction_hi = nullptr;
  const uint64_t* fraction_lo = nullptr;
  int64_t half = 0;  // planes per row
  double attention_factor = 1.0;
  // Where row r's positions come from: positions (contiguous, num_axes per row, or 1 for
  // one-axis positions: row r at positions[r * num_axes + plane_axis[k]] for plane k), or, when
  // packed is set, the packed sequences' rule at token r.
  const void* positions = nullptr;
  bool positions_are_int64 = true;
  int32_t num_axes = 1;
  const int8_t* plane_axis = nullptr;  // num_axes > 1: the axis of each plane
  const PackedSequenceArgs* packed = nullptr;
  // Row r: cos at cos + r * half, sin at sin + r * half.
  double* cos = nullptr;
  double* sin = nullptr;
};

// Fills rows [row_begin, row_end).
using AngleRowsFn = void (*)(const AngleRowsArgs& args, int64_t row_begin, int64_t row_end);

#define ROPE_DECLARE_ANGLE_ROWS void angle_rows(const AngleRowsArgs&, int64_t, int64_t);
namespace DEFAULT {
ROPE_DECLARE_ANGLE_ROWS
}
#ifdef TORCH_ROPE_CPU_X86_DISPATCH
namespace AVX2 {
ROPE_DECLARE_ANGLE_ROWS
}
namespace AVX512 {
ROPE_DECLARE_ANGLE_ROWS
}
namespace AVX512_BF16 {
ROPE_DECLARE_ANGLE_ROWS
}
#endif
#undef ROPE_DECLARE_ANGLE_ROWS

// The copy matching the rotation kernel common_kernel_choice.h chose (row_kernel_variant()).
AngleRowsFn angle_row_kernel();

}  // namespace rope::cpu
