// SPDX-License-Identifier: BSD-3-Clause
// The ops' optional tensor arguments (v, v_cache, out=, scales, weights): "given" is present and
// defined, since C++ callers and the dispatcher may pass an undefined tensor for "none"; and the
// autograd state of a given one, which the cache-writing ops refuse.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

namespace rope {

inline bool given(const std::optional<at::Tensor>& t) { return t.has_value() && t->defined(); }

inline bool requires_grad(const std::optional<at::Tensor>& t) {
  return given(t) && t->requires_grad();
}

inline bool has_forward_grad(const std::optional<at::Tensor>& t) {
  return given(t) && t->_fw_grad(/*level=*/0).defined();
}

}  // namespace rope
