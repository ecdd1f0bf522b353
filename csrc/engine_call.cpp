// SPDX-License-Identifier: BSD-3-Clause
#include "engine_call.h"

#include <c10/util/Exception.h>
#include <torch_rope/ops.h>

#include "rope_validation.h"

namespace rope::detail {
namespace {

// Unique names: librope's sources are compiled in unity batches.
constexpr const char* kEngineCallName = "rope.rotary_embedding";

// x as (..., num_heads, head_size), a view of its memory; `...` is positions' shape.
at::Tensor engine_heads(const char* name, const at::Tensor& x, const at::Tensor& positions,
                        int64_t head_size) {
  const auto shape = x.sizes();
  const auto lead = positions.sizes();
  const int64_t n = static_cast<int64_t>(lead.size());
  if (x.dim() == n + 2 && shape.back() == head_size && shape.slice(0, n) == lead) {
    return x;
  }
  if (x.dim() == n + 1 && head_size > 0 && shape.back() % head_size == 0 &&
      shape.slice(0, n) == lead) {
    c10::SmallVector<int64_t, 6> sizes(lead.begin(), lead.end());
    sizes.push_back(shape.back() / head_size);
    sizes.push_back(head_size);
    return x.view(sizes);
  }
  TORCH_CHECK_VALUE(false, kEngineCallName, ": ", name,
                    " must be (..., num_heads * head_size) or (..., num_heads, head_size) with the "
                    "leading dims of positions ",
                    lead, " and head_size = ", head_size, ", got shape ", shape);
}

// The cache's cos and sin halves (views), after its checks against head_size.
std::pair<at::Tensor, at::Tensor> cache_halves(const at::Tensor& cache, int64_t head_size) {
  TORCH_CHECK_VALUE(cache.dim() == 2 && cache.size(-1) % 2 == 0, kEngineCallName,
                    ": cos_sin_cache must be (max_position, rotary_dim) with rotary_dim even (cos "
                    "in the first half of each row, sin in the second), got shape ",
                    cache.sizes());
  const int64_t half = cache.size(1) / 2;
  TORCH_CHECK_VALUE(2 * half <= head_size, kEngineCallName,
                    ": rope_dim_offset + rotary_dim must be within head_size = ", head_size,
                    ", got rope_dim_offset = 0 and rotary_dim = ", 2 * half);
  return {cache.narrow(1, 0, half), cache.narrow(1, half, half)};
}

// Positions broadcast over the heads; one position (a decode step of one token) as it is.
at::Tensor over_heads(const at::Tensor& positions) {
  return positions.numel() == 1 ? positions : positions.unsqueeze(-1);
}

}  // namespace

void rotate_heads_in_place(const at::Tensor& positions, const at::Tensor& query,
                           const std::optional<at::Tensor>& key, int64_t head_size,
                           const at::Tensor& cos_sin_cache, bool interleaved) {
  const auto [cos, sin] = cache_halves(cos_sin_cache, head_size);
  at::Tensor q = engine_heads("query", query, positions, head_size);
  at::Tensor k = key.has_value() ? engine_heads("key", *key, positions, head_size) : at::Tensor();
  const at::Tensor pos = over_heads(positions);
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
  const auto [cos, sin] = cache_halves(cos_sin_cache, head_size);
  const at::Tensor q = engine_heads("query", query, positions, head_size);
  const at::Tensor k = engine_heads("key", key, positions, head_size);
  auto [q_out, k_out] =
      rope::apply_qk(q, k, cos, sin, over_heads(positions), interleaved, /*inverse=*/false);
  // Back to the callers' shapes ((..., num_heads * head_size) inputs get flat heads back).
  return {q_out.view(query.sizes()), k_out.view(key.sizes())};
}

}  // namespace rope::detail
