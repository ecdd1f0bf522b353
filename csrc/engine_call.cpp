// SPDX-License-Identifier: BSD-3-Clause
#include "engine_call.h"

#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>
#include <c10/util/strides.h>
#include <torch_rope/ops.h>

#include "rope_validation.h"

namespace rope::detail {
namespace {

// Unique names: librope's sources are compiled in unity batches.
constexpr const char* kEngineCallName = "rope.rotary_embedding";

// Whether the call's views may be made without the dispatcher: none of the tensors carries
// autograd metadata (no requires_grad, no forward-mode tangent, not a tracked view of a tensor that
// has one), as under inference_mode and for plain tensors. Autograd then has nothing to record,
// and a view built from the storage (as at::alias does) is all rope.apply_ needs. Otherwise the
// views go through the dispatcher, so that autograd sees an in-place op on a view of query.
bool untracked(const at::Tensor& t) { return t.unsafeGetTensorImpl()->autograd_meta() == nullptr; }

// A view of src's memory: `sizes`, `strides` and `offset` over src's storage. With `fast`
// (untracked() held for every tensor of the call), a TensorImpl made from the storage, sharing
// src's version counter so that an in-place write bumps src's version as a view's would; a
// decode step's call makes seven views, a few hundred nanoseconds each through the dispatcher,
// which was most of what the engines' call cost over rope.apply_qk at one token.
at::Tensor view_of(const at::Tensor& src, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                   int64_t offset, bool fast) {
  if (!fast) {
    return src.as_strided(sizes, strides, offset);
  }
  auto impl = c10::make_intrusive<c10::TensorImpl>(
      c10::TensorImpl::VIEW, c10::Storage(src.storage()), src.key_set(), src.dtype());
  impl->set_sizes_and_strides(sizes, strides, offset);
  impl->set_version_counter(src.unsafeGetTensorImpl()->version_counter());
  return at::Tensor(std::move(impl));
}

// x as (..., num_heads, head_size), a view of its memory; `...` is positions' shape.
at::Tensor engine_heads(const char* name, const at::Tensor& x, const at::Tensor& positions,
                        int64_t head_size, bool fast) {
  const auto shape = x.sizes();
  const auto lead = positions.sizes();
  const int64_t n = static_cast<int64_t>(lead.size());
  if (x.dim() == n + 2 && shape.back() == head_size && shape.slice(0, n) == lead) {
    return x;
  }
  if (x.dim() == n + 1 && head_size > 0 && shape.back() % head_size == 0 &&
      shape.slice(0, n) == lead) {
    // The last dim split in two: always a view, whatever x's strides.
    c10::SmallVector<int64_t, 6> sizes(lead.begin(), lead.end());
    c10::SmallVector<int64_t, 6> strides(x.strides().begin(), x.strides().end() - 1);
    const int64_t step = x.stride(-1);
    sizes.push_back(shape.back() / head_size);
    sizes.push_back(head_size);
    strides.push_back(head_size * step);
    strides.push_back(step);
    return view_of(x, sizes, strides, x.storage_offset(), fast);
  }
  TORCH_CHECK_VALUE(false, kEngineCallName, ": ", name,
                    " must be (..., num_heads * head_size) or (..., num_heads, head_size) with the "
                    "leading dims of positions ",
                    lead, " and head_size = ", head_size, ", got shape ", shape);
}

// The cache's cos and sin halves (views), after its checks against head_size.
std::pair<at::Tensor, at::Tensor> cache_halves(const at::Tensor& cache, int64_t head_size,
                                               bool fast) {
  TORCH_CHECK_VALUE(cache.dim() == 2 && cache.size(-1) % 2 == 0, kEngineCallName,
                    ": cos_sin_cache must be (max_position, rotary_dim) with rotary_dim even (cos "
                    "in the first half of each row, sin in the second), got shape ",
                    cache.sizes());
  const int64_t half = cache.size(1) / 2;
  TORCH_CHECK_VALUE(2 * half <= head_size, kEngineCallName,
                    ": rope_dim_offset + rotary_dim must be within head_size = ", head_size,
                    ", got rope_dim_offset = 0 and rotary_dim = ", 2 * half);
  const int64_t sizes[] = {cache.size(0), half};
  const auto offset = cache.storage_offset();
  return {view_of(cache, sizes, cache.strides(), offset, fast),
          view_of(cache, sizes, cache.strides(), offset + half * cache.stride(1), fast)};
}

// Positions broadcast over the heads; one position (a decode step of one token) as it is.
at::Tensor over_heads(const at::Tensor& positions, bool fast) {
  if (positions.numel() == 1) {
    return positions;
  }
  c10::SmallVector<int64_t, 6> sizes(positions.sizes().begin(), positions.sizes().end());
  c10::SmallVector<int64_t, 6> strides(positions.strides().begin(), positions.strides().end());
  sizes.push_back(1);
  strides.push_back(1);
  return view_of(positions, sizes, strides, positions.storage_offset(), fast);
}

// out (..., num_heads, head_size), new and contiguous, in the shape of the caller's `like`.
at::Tensor in_callers_shape(const at::Tensor& out, const at::Tensor& like, bool fast) {
  if (out.dim() == like.dim()) {
    return out;
  }
  return fast && out.is_contiguous()
             ? view_of(out, like.sizes(), c10::contiguous_strides(like.sizes()),
                       out.storage_offset(), true)
             : out.view(like.sizes());
}

}  // namespace

void rotate_heads_in_place(const at::Tensor& positions, const at::Tensor& query,
                           const std::optional<at::Tensor>& key, int64_t head_size,
                           const at::Tensor& cos_sin_cache, bool interleaved) {
  const bool fast = untracked(query) && (!key.has_value() || untracked(*key)) &&
                    untracked(cos_sin_cache) && untracked(positions);
  const auto [cos, sin] = cache_halves(cos_sin_cache, head_size, fast);
  at::Tensor q = engine_heads("query", query, positions, head_size, fast);
  at::Tensor k =
      key.has_value() ? engine_heads("key", *key, positions, head_size, fast) : at::Tensor();
  const at::Tensor pos = over_heads(positions, fast);
  if (k.defined()) {
    // Everything rope.apply_ would refuse in key but not in query, before query is written
    // (positions and tables are shared: they fail on query first).
    TORCH_CHECK_VALUE(at::isFloatingType(k.scalar_type()), kEngineCallName,
                      ": key must be float64, float32, float16 or bfloat16, got ", k.scalar_type());
    TORCH_CHECK_VALUE(k.device() == q.device(), kEngineCallName, ": key must be on query's device ",
                      q.device(), ", got ", k.device());
    check_rotated(kEngineCallName, "key", k, cos, sin, pos);
    check_writable_arg(kEngineCallName, "key", k);
  }
  rope::apply_(q, cos, sin, pos, interleaved, /*inverse=*/false);
  if (k.defined()) {
    rope::apply_(k, cos, sin, pos, interleaved, /*inverse=*/false);
  }
}

std::tuple<at::Tensor, at::Tensor> rotate_heads(const at::Tensor& positions,
                                                const at::Tensor& query, const at::Tensor& key,
                                                int64_t head_size, const at::Tensor& cos_sin_cache,
                                                bool interleaved) {
  const bool fast =
      untracked(query) && untracked(key) && untracked(cos_sin_cache) && untracked(positions);
  const auto [cos, sin] = cache_halves(cos_sin_cache, head_size, fast);
  const at::Tensor q = engine_heads("query", query, positions, head_size, fast);
  const at::Tensor k = engine_heads("key", key, positions, head_size, fast);
  auto [q_out, k_out] =
      rope::apply_qk(q, k, cos, sin, over_heads(positions, fast), interleaved, /*inverse=*/false);
  // Back to the callers' shapes ((..., num_heads * head_size) inputs get flat heads back). The
  // outputs are new: untracked when the inputs were (grad mode aside, they then carry no graph).
  const bool out_fast = untracked(q_out) && untracked(k_out);
  return {in_callers_shape(q_out, query, out_fast), in_callers_shape(k_out, key, out_fast)};
}

}  // namespace rope::detail
