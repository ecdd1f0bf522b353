// SPDX-License-Identifier: BSD-3-Clause
// The inference engines' in-place call, `rotary_embedding(positions, query, key, head_size,
// cos_sin_cache, is_neox)` (vLLM, SGLang; FlashInfer's apply_rope_with_cos_sin_cache_inplace), as
// one C++ function for the eager path of torch_rope.compat: the cache split into its cos and sin
// halves, query and key viewed as heads, then two rope.apply_ calls through the dispatcher. The
// engines make this call twice per layer and decode step, where the views cost more than the
// rotation if they are made in Python (4 us each on a 2-core VM, against 8 us for apply_qk of one
// token), so they are made here: through the dispatcher (a few hundred nanoseconds each) when
// autograd must see them, else straight from the storage (no tensor of the call carries autograd
// metadata: inference_mode, plain tensors), sharing the caller's version counter.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

namespace rope::detail {

// Rotates query and key (if given) in place. positions (...) int32/int64; query and key
// (..., num_heads * head_size) or (..., num_heads, head_size) with positions' leading dims;
// cos_sin_cache (max_position, rotary_dim) float32 or float64, cos in the first half of each row
// and sin in the second, rotary_dim <= head_size (the features past it pass through). Every check
// of key runs before query is written; errors name the engines' arguments (query, key,
// cos_sin_cache) except those of query's rotation, which name it `x`, as rope.apply_ does.
void rotate_heads_in_place(const at::Tensor& positions, const at::Tensor& query,
                           const std::optional<at::Tensor>& key, int64_t head_size,
                           const at::Tensor& cos_sin_cache, bool interleaved);

// The out-of-place form (FlashInfer's apply_rope_with_cos_sin_cache): rotated copies of query and
// key, new contiguous tensors of their shapes, from one rope.apply_qk call.
std::tuple<at::Tensor, at::Tensor> rotate_heads(const at::Tensor& positions,
                                                const at::Tensor& query, const at::Tensor& key,
                                                int64_t head_size, const at::Tensor& cos_sin_cache,
                                                bool interleaved);

}  // namespace rope::detail
