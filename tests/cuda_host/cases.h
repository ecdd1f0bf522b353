// SPDX-License-Identifier: BSD-3-Clause
// Random calls for the host run of the CUDA kernel: ops, dtypes, layouts and views of every input,
// positions, tables, and the simulated device. Each case is a pure function of (seed, index), so a
// failure reruns alone with `--seed S --only I`.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "host_kernel.h"

namespace rope_host {

enum class Op { kApply, kApplyInPlace, kApplyOut, kApplyQK };

const char* op_name(Op op);

// A tensor handed to an op, and the buffer it is a view of. The buffer is larger than the view
// (padding, offsets, guard elements at the end), so writes outside the view show as changed bytes.
struct Viewed {
  at::Tensor view;
  at::Tensor buffer;  // 1-D, the view's storage; may be shared with another Viewed (fused qkv)
  std::string layout;
};

struct Case {
  uint64_t seed = 0;
  int64_t index = 0;
  Op op = Op::kApply;
  at::ScalarType dtype = at::kFloat;
  at::ScalarType table_dtype = at::kFloat;
  bool interleaved = true;
  bool inverse = false;
  int64_t head_dim = 0;
  int64_t rotary_dim = 0;
  Viewed x;               // q for apply_qk
  Viewed k;               // apply_qk only
  Viewed out;             // apply.out only: the caller's buffer, any strides
  bool fused_qk = false;  // q and k are slices of one qkv buffer
  Viewed cos;
  Viewed sin;
  Viewed positions;
  // Multi-axis positions (M-RoPE): planes per axis, empty for one-axis positions. positions then
  // has a trailing axis dim of mrope_section.size() entries.
  std::vector<int64_t> mrope_section;
  bool mrope_interleaved = false;  // the Qwen3-VL layout (3 axes)
  std::string sections_layout;     // how mrope_section was drawn
  bool positions_in_range = true;  // false: one position was set outside [0, max_seq_len)
  int64_t bad_position = 0;        // that position
  int64_t bad_axis = 0;            // its axis (multi-axis positions)

  int64_t num_axes() const { return static_cast<int64_t>(mrope_section.size()); }
  // What the ops take for mrope_section.
  at::OptionalIntArrayRef section_arg() const {
    return mrope_section.empty() ? at::OptionalIntArrayRef() : at::IntArrayRef(mrope_section);
  }
  Device device;

  std::string describe() const;
};

Case make_case(uint64_t seed, int64_t index);

}  // namespace rope_host
