// SPDX-License-Identifier: BSD-3-Clause
// rope.rms_norm_apply_qk as row streams (common_row_streams.h): q and k, of any of rope.apply_qk's
// shapes, laid out as (tokens, heads, width) rows (common_stream_layout.h), each normalised with
// its weight, rotated and written to its fresh output in one pass.
#include <c10/util/Exception.h>

#include "common_stream_layout.h"
#include "rms_norm_body.h"

namespace rope::detail {
namespace {

// Whether the streams of q and k can be one call: one token count and one positions tensor (the
// caller's, or copies of it of one shape: the same values) read with the same strides.
bool share_positions(const StreamRows& a, const StreamRows& b, const at::Tensor& positions) {
  if (a.tokens != b.tokens || a.pos.token != b.pos.token || a.pos.axis != b.pos.axis) {
    return false;
  }
  if (a.positions.is_same(b.positions)) {
    return true;
  }
  return !a.positions.is_same(positions) && !b.positions.is_same(positions) &&
         a.positions.sizes().equals(b.positions.sizes()) &&
         a.positions.strides().equals(b.positions.strides());
}

// A stream normalising and rotating `rows` into out (fresh, contiguous, the source's dtype).
void add_norm_stream(PreparedStreams& p, const StreamRows& rows, const at::Tensor& out,
                     const at::Tensor& weight, int64_t rotary_dim) {
  TORCH_INTERNAL_ASSERT(p.args.num_streams < kMaxStreams, "row streams: more than ", kMaxStreams);
  RowStream& s = p.args.streams[p.args.num_streams++];
  s.src = rows.src.const_data_ptr();
  s.token_stride = rows.src_token_stride;
  s.head_stride = rows.src_head_stride;
  s.heads = rows.heads;
  s.width = rows.width;
  s.rotary_dim = rotary_dim;
  s.weight = weight.const_data_ptr();
  s.pos_token_stride = rows.pos.token;
  s.pos_head_stride = 0;
  StreamTarget& t = s.target;
  t.data = out.data_ptr();
  t.format = CacheFormat::kSame;
  t.by_slot = false;
  t.token_stride = rows.out_token_stride;
  t.head_stride = rows.out_head_stride;
}

}  // namespace

void for_each_rms_norm_call(const RmsNormStreamInputs& in,
                            c10::function_ref<void(const PreparedStreams&)> run) {
  const bool multi_axis = in.axes.active();
  const int64_t rotary_dim = 2 * in.cos.size(1);
  const bool has_q = in.q.numel() > 0;
  const bool has_k = in.k.numel() > 0;
  auto begin = [&](PreparedStreams& p, const StreamRows& rows) {
    p.begin(in.cos, in.sin, rows.positions, in.axes, rows.tokens, in.mode.interleaved, {});
    p.args.inverse = in.mode.inverse;
    p.args.eps = in.eps;
  };
  auto alone = [&](const StreamRows& rows, const at::Tensor& out, const at::Tensor& weight) {
    PreparedStreams p;
    begin(p, rows);
    add_norm_stream(p, rows, out, weight, rotary_dim);
    run(p);
  };
  if (has_q != has_k) {
    const StreamRows rows = has_q ? stream_rows(in.q, in.q_out, in.positions, multi_axis, false)
                                  : stream_rows(in.k, in.k_out, in.positions, multi_axis, false);
    alone(rows, has_q ? in.q_out : in.k_out, has_q ? in.q_weight : in.k_weight);
    return;
  }
  StreamRows q = stream_rows(in.q, in.q_out, in.positions, multi_axis, false);
  StreamRows k = stream_rows(in.k, in.k_out, in.positions, multi_axis, false);
  if (!share_positions(q, k, in.positions)) {
    // One took a copy of positions and the other not: both take the expanded one.
    q = stream_rows(in.q, in.q_out, in.positions, multi_axis, true);
    k = stream_rows(in.k, in.k_out, in.positions, multi_axis, true);
  }
  if (!share_positions(q, k, in.positions)) {
    alone(q, in.q_out, in.q_weight);
    alone(k, in.k_out, in.k_weight);
    return;
  }
  PreparedStreams p;
  begin(p, q);
  add_norm_stream(p, q, in.q_out, in.q_weight, rotary_dim);
  add_norm_stream(p, k, in.k_out, in.k_weight, rotary_dim);
  run(p);
}

}  // namespace rope::detail
