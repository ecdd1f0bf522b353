// SPDX-License-Identifier: BSD-3-Clause
#include "rope_parallel.h"

#include <ATen/Parallel.h>

#include <algorithm>

#include "common_kernel_choice.h"
#include "common_shared_angles.h"

namespace rope::cpu {
namespace {
// Rows per parallel task: at least kGrainFeatures features (rope_parallel.h).
int64_t grain_rows(int64_t head_dim) {
  return std::max<int64_t>(1, kGrainFeatures / std::max<int64_t>(head_dim, 1));
}

}  // namespace

void rotate(c10::ScalarType dtype, const RotationArgs& args, const TableArgs& tables,
            RotationMode mode) {
  if (const auto shared = share_angles(args, tables)) {  // multi-axis positions shared by heads
    return rotate(dtype, shared->args, shared->tables, mode);
  }
  const RotateRowsFn rotate_rows = row_kernel();
  at::parallel_for(
      0, args.geometry.num_rows, grain_rows(args.head_dim),
      [&](int64_t begin, int64_t end) { rotate_rows(dtype, args, tables, mode, begin, end); });
}

void rotate_pair(c10::ScalarType dtype, const RotationArgs& q, const RotationArgs& k,
                 const TableArgs& tables, RotationMode mode) {
  // Multi-axis positions shared by heads: q and k get their own compact tables (their geometries,
  // hence the rows that share a position, differ with GQA).
  const auto q_shared = share_angles(q, tables);
  const auto k_shared = share_angles(k, tables);
  const RotationArgs& q_args = q_shared ? q_shared->args : q;
  const TableArgs& q_tables = q_shared ? q_shared->tables : tables;
  const RotationArgs& k_args = k_shared ? k_shared->args : k;
  const TableArgs& k_tables = k_shared ? k_shared->tables : tables;
  // One parallel region over q's rows followed by k's: for decode-sized inputs the thread
  // wake-up of a second region costs as much as the rotation itself.
  const RotateRowsFn rotate_rows = row_kernel();
  const int64_t q_rows = q.geometry.num_rows;
  const int64_t total = q_rows + k.geometry.num_rows;
  at::parallel_for(0, total, grain_rows(q.head_dim), [&](int64_t begin, int64_t end) {
    if (begin < q_rows) {
      rotate_rows(dtype, q_args, q_tables, mode, begin, std::min(end, q_rows));
    }
    if (end > q_rows) {
      rotate_rows(dtype, k_args, k_tables, mode, std::max(begin, q_rows) - q_rows, end - q_rows);
    }
  });
}

}  // namespace rope::cpu
