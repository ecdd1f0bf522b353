// SPDX-License-Identifier: BSD-3-Clause
// Walks the rows of a RowGeometry in order, keeping the element offsets of x, out and positions
// current with additions only (one unravel per parallel chunk, not one per row). The kernel moves
// along the innermost dim itself and calls skip() once per run of rows.
#pragma once

#include <cstdint>

#include "../common_kernel_args.h"

// In the CPU copies' namespace: it is compiled into each copy with that copy's instruction set.
namespace rope::cpu::CPU_CAPABILITY {

class RowCursor {
 public:
  RowCursor(const RowGeometry& g, int64_t row) : g_(g) {
    for (int32_t d = g.ndim - 1; d >= 0; --d) {
      idx_[d] = row % g.row_sizes[d];
      row /= g.row_sizes[d];
      in_ += idx_[d] * g.in_strides[d];
      out_ += idx_[d] * g.out_strides[d];
      pos_ += idx_[d] * g.pos_strides[d];
    }
  }

  int64_t index(int32_t d) const { return idx_[d]; }
  int64_t in() const { return in_; }
  int64_t out() const { return out_; }
  int64_t pos() const { return pos_; }

  // Rows from the current one to the end of the innermost dim (1 for a single row).
  int64_t rows_left_in_run() const {
    return g_.ndim > 0 ? g_.row_sizes[g_.ndim - 1] - idx_[g_.ndim - 1] : 1;
  }

  // Moves n rows on, 0 < n <= rows_left_in_run(): along the innermost dim, then one carry.
  void skip(int64_t n) {
    const int32_t d = g_.ndim - 1;
    if (d < 0) {
      return;
    }
    if (n < g_.row_sizes[d] - idx_[d]) {
      idx_[d] += n;
      in_ += n * g_.in_strides[d];
      out_ += n * g_.out_strides[d];
      pos_ += n * g_.pos_strides[d];
      return;
    }
    // To the last row of the run, then next() carries into the outer dims.
    const int64_t m = n - 1;
    idx_[d] += m;
    in_ += m * g_.in_strides[d];
    out_ += m * g_.out_strides[d];
    pos_ += m * g_.pos_strides[d];
    next();
  }

  void next() {
    for (int32_t d = g_.ndim - 1; d >= 0; --d) {
      in_ += g_.in_strides[d];
      out_ += g_.out_strides[d];
      pos_ += g_.pos_strides[d];
      if (++idx_[d] < g_.row_sizes[d]) {
        return;
      }
      // carry into the next outer dim
      in_ -= g_.in_strides[d] * g_.row_sizes[d];
      out_ -= g_.out_strides[d] * g_.row_sizes[d];
      pos_ -= g_.pos_strides[d] * g_.row_sizes[d];
      idx_[d] = 0;
    }
  }

 private:
  const RowGeometry& g_;
  int64_t idx_[kMaxRowDims] = {};
  int64_t in_ = 0;
  int64_t out_ = 0;
  int64_t pos_ = 0;
};

}  // namespace rope::cpu::CPU_CAPABILITY
