// SPDX-License-Identifier: BSD-3-Clause
#include <c10/util/Exception.h>

#include "common_optional.h"
#include "kv_cache_norm_body.h"
#include "rms_norm_validation.h"

namespace rope::detail {
at::ScalarType check_rms_norm_apply_qk_cache(const char* op, const KvCacheNormInputs& in) {
  const KvCacheInputs& c = in.cache;
  check_apply_qk_cache(op, c);
  check_norm_weights(op, c.q, c.k, in.q_weight, in.k_weight, in.eps, in.weight_offset);
  const at::ScalarType q_dtype = in.q_dtype.value_or(c.q.scalar_type());
  TORCH_CHECK(q_dtype == c.q.scalar_type() || is_fp8(q_dtype), op, ": q_dtype must be q's dtype ",
              c.q.scalar_type(), " or float8 (torch.float8_e4m3fn, torch.float8_e5m2), got ",
              q_dtype);
  if (is_fp8(q_dtype)) {
    check_scale_tensor(op, "q_scale", in.q_scale, c.q.device());
  } else {
    TORCH_CHECK(!given(in.q_scale), op, ": q_scale applies to a float8 q_dtype only; q_out is ",
                q_dtype, " (stored unscaled), so pass q_scale=None");
  }
  // The caches must not share memory with the weights or q's scale either (the rest is
  // check_apply_qk_cache's).
  NamedTensors written = {{"k_cache", &c.k_cache}};
  if (given(c.v_cache)) {
    written.emplace_back("v_cache", &*c.v_cache);
  }
  NamedTensors read = {{"q_weight", &in.q_weight}, {"k_weight", &in.k_weight}};
  if (given(in.q_scale)) {
    read.emplace_back("q_scale", &*in.q_scale);
  }
  check_writes_disjoint(op, written, read);
  return q_dtype;
}

}  // namespace rope::detail
