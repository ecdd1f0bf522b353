// SPDX-License-Identifier: BSD-3-Clause
// Multi-axis positions (M-RoPE) turned into one-axis ones before the row kernel runs.
//
// The heads of a token share its positions: x (B, H, S, D) with positions (B, 1, S, A) has H rows
// per distinct position. Gathering each row's angles from A table rows (common_mixed_rows.h) then
// repeats the same gather H times, and in the order the rows are visited (heads outermost) no cache
// can keep it. Here each distinct position's angles are gathered once, in parallel, into a compact
// table of one row per distinct position, and the positions become an index into it: the one-axis
// kernel then does all the rest, at the one-axis speed. The extra traffic is one table row per
// distinct position (measured: prefill (4, 32, 2048, 128) with (4, 1, 2048, 3) positions gathers
// 8192 rows of 64 planes, 4 MiB, against 64-128 MiB of x).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "../common_kernel_args.h"

namespace rope::cpu {

// The rotation of `args` with multi-axis `tables`, restated over one-axis tables. `storage` owns
// the memory the structs point to (one allocation: the compact cos and sin tables, (distinct
// positions, rotary_dim / 2) each in the tables' dtype, then the int64 row index 0, 1, ... that
// the compact position strides read) and must outlive the rotation.
struct SharedAngles {
  RotationArgs args;
  TableArgs tables;
  at::Tensor storage;
};

// nullopt when the positions are one-axis, when too few rows share each position for the gather
// to pay, or when the rows that share a position are consecutive: the row kernel's own gather
// (common_mixed_rows.h) is then the cheaper one.
// Positions must already be range-checked.
std::optional<SharedAngles> share_angles(const RotationArgs& args, const TableArgs& tables);

}  // namespace rope::cpu
