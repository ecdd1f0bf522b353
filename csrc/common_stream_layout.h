// SPDX-License-Identifier: BSD-3-Clause
// A tensor of rope.apply_qk's shapes, (..., head_dim) with positions broadcast to x.shape[:-1]
// (docs/api.md), as the (tokens, heads, width) rows of one row stream (common_row_streams.h), so
// that the ops of those shapes (rope.rms_norm_apply_qk) run on the streams' engine too.
//
// The rows split into two groups of dims, each merged into one dim of the stream:
//   tokens: the dims where positions vary (size > 1 after broadcasting), their position stride
//           that of positions (a copy of positions when its dims do not merge);
//   heads:  the other dims of x (positions broadcast there, stride 0), whose rows share their
//           token's angles.
// (B, S, H, D) with positions (B, S, 1), (S, 1) or (S, H) and (B, H, S, D) with positions (S,)
// map straight on. Where a group does not merge in the output (contiguous, of x's shape), e.g.
// (B, S, H, D) with positions (S, 1): B broadcasts but sits apart from H, positions are expanded
// over every dim up to the last one where they vary (the tokens, a small int tensor) and the dims
// after it are the heads. x is read through its strides, or from a contiguous copy where its
// dims do not merge as the output's do.
#pragma once

#include <ATen/core/Tensor.h>

#include "common_stream_prepare.h"

namespace rope::detail {

struct StreamRows {
  at::Tensor src;        // x, or a contiguous copy of it where x's dims do not merge
  at::Tensor positions;  // what the stream reads: the caller's positions, or an expanded copy
  int64_t tokens = 1;
  int64_t heads = 1;
  int64_t width = 0;
  int64_t src_token_stride = 0;  // elements of src
  int64_t src_head_stride = 0;
  int64_t out_token_stride = 0;  // elements of out
  int64_t out_head_stride = 0;
  PositionStrides pos;  // token and axis strides in `positions`; head stride 0
  bool expanded = false;
};

// x (..., width) with unit-stride-capable rows; out a fresh contiguous tensor of x's shape;
// positions validated against x (one-axis, or multi-axis with the axis dim last). `expand`: take
// the expanded form even where the direct one would do (so that q and k can share positions).
StreamRows stream_rows(const at::Tensor& x, const at::Tensor& out, const at::Tensor& positions,
                       bool multi_axis, bool expand);

}  // namespace rope::detail
