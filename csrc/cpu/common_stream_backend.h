// SPDX-License-Identifier: BSD-3-Clause
// The CPU backend policy of the op bodies that run the row streams (qk_fp8_body.h and the other
// serving fusions' bodies): the host-side value checks every CPU call makes before it
// writes anything (positions in range, slots in range and none twice), and the streams' parallel
// driver (common_stream_rows.h).
#pragma once

#include <ATen/core/Tensor.h>

#include "../common_stream_prepare.h"
#include "../kv_cache_body.h"  // check_slots_on_host
#include "common_stream_rows.h"

namespace rope::cpu {

struct CpuStreamsBackend {
  static void check_positions(const char* op, const at::Tensor& positions, int64_t max_seq_len,
                              const detail::MultiAxisArgs& axes) {
    detail::check_positions_in_range(op, positions, max_seq_len, axes);
  }
  static void check_slots(const char* op, const at::Tensor& slot_mapping, int64_t num_slots) {
    detail::check_slots_on_host(op, slot_mapping, num_slots);
  }
  static void run_streams(c10::ScalarType dtype, const detail::PreparedStreams& p) {
    cpu::run_streams(dtype, p.args, p.tables.args);
  }
};

}  // namespace rope::cpu
