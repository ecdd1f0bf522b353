// SPDX-License-Identifier: BSD-3-Clause
// The KV-cache write as row streams (common_row_streams.h): what rope.apply_qk_cache runs for
// multi-axis positions (its own cache kernel has no axis map) and what
// rope.rms_norm_apply_qk_cache always runs (the streams normalise a row before rotating it). One
// stream per source: q into q_out, k into k_cache's slot rows, v into v_cache's.
#include "kv_cache_body.h"

namespace rope::detail {

PreparedStreams prepare_kv_cache_streams(const KvCacheInputs& in, const at::Tensor& q_out,
                                         const std::optional<at::Tensor>& q_scale, bool interleaved,
                                         const StreamNorm* norm) {
  const int64_t rotary_dim = 2 * in.cos.size(1);
  PreparedStreams p;
  const PositionStrides pos =
      p.begin(in.cos, in.sin, in.positions, in.axes, in.q.size(0), interleaved, in.slot_mapping);
  // The caches' rows hold (heads, head_dim): two row dims after the slot dims.
  constexpr int64_t kRowDims = 2;
  RowStream& q = p.add(in.q, rotary_dim, pos, tensor_target(q_out, q_scale, ScaleRule::kDivide));
  RowStream& k = p.add(in.k, rotary_dim, pos,
                       cache_target(in.k_cache, kRowDims, 0, in.k_scale, ScaleRule::kDivide));
  if (norm != nullptr) {
    p.args.eps = norm->eps;
    q.weight = norm->q_weight.const_data_ptr();
    k.weight = norm->k_weight.const_data_ptr();
  }
  if (in.v.has_value() && in.v->defined()) {
    p.add(*in.v, 0, pos, cache_target(*in.v_cache, kRowDims, 0, in.v_scale, ScaleRule::kDivide));
  }
  return p;
}

}  // namespace rope::detail
