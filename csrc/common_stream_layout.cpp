// SPDX-License-Identifier: BSD-3-Clause
#include "common_stream_layout.h"

#include <c10/util/SmallVector.h>

namespace rope::detail {
namespace {

using Dims = c10::SmallVector<int64_t, 8>;

// `dims` (in order) of a tensor with `sizes` and `strides` as one dim: true, with the product of
// their sizes and the innermost one's stride, when each stride is the span of the next dim (the
// dims need not be adjacent: the size-1 dims and the other group's dims are not in the list).
// No dims: size 1, stride 0.
bool merge_dims(const Dims& dims, at::IntArrayRef sizes, at::IntArrayRef strides, int64_t& size,
                int64_t& stride) {
  size = 1;
  stride = 0;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i + 1 < dims.size() && strides[dims[i]] != sizes[dims[i + 1]] * strides[dims[i + 1]]) {
      return false;
    }
    size *= sizes[dims[i]];
  }
  if (!dims.empty()) {
    stride = strides[dims.back()];
  }
  return true;
}

bool merges(const Dims& dims, const at::Tensor& t) {
  int64_t size = 0;
  int64_t stride = 0;
  return merge_dims(dims, t.sizes(), t.strides(), size, stride);
}

// positions' sizes and strides over x's n row dims, aligned right (size 1, stride 0 where
// positions has no dim or broadcasts).
struct AlignedPositions {
  Dims sizes;
  Dims strides;
};

AlignedPositions align(const at::Tensor& positions, int64_t n, bool multi_axis) {
  const int64_t pd = positions.dim() - (multi_axis ? 1 : 0);
  AlignedPositions a{Dims(static_cast<size_t>(n), 1), Dims(static_cast<size_t>(n), 0)};
  for (int64_t d = 0; d < n; ++d) {
    const int64_t p = d - (n - pd);
    if (p >= 0 && positions.size(p) != 1) {
      a.sizes[d] = positions.size(p);
      a.strides[d] = positions.stride(p);
    }
  }
  return a;
}

}  // namespace

StreamRows stream_rows(const at::Tensor& x, const at::Tensor& out, const at::Tensor& positions,
                       bool multi_axis, bool expand) {
  const int64_t n = x.dim() - 1;
  const int64_t width = x.size(-1);
  at::Tensor src = width <= 1 || x.stride(-1) == 1 ? x : x.contiguous();
  // Leading size-1 dims of positions beyond x's row dims broadcast away.
  at::Tensor pos = positions;
  while (pos.dim() - (multi_axis ? 1 : 0) > n) {
    pos = pos.squeeze(0);
  }
  AlignedPositions aligned = align(pos, n, multi_axis);
  int64_t last_varying = -1;
  for (int64_t d = 0; d < n; ++d) {
    if (aligned.sizes[d] > 1) {
      last_varying = d;
    }
  }
  Dims token_dims;
  Dims head_dims;
  bool direct = !expand;
  if (direct) {
    for (int64_t d = 0; d < n; ++d) {
      if (x.size(d) != 1) {
        (aligned.sizes[d] > 1 ? token_dims : head_dims).push_back(d);
      }
    }
    direct = merges(token_dims, out) && merges(head_dims, out);
  }
  StreamRows r;
  if (direct) {
    int64_t size = 0;
    int64_t stride = 0;
    if (!merge_dims(token_dims, aligned.sizes, aligned.strides, size, stride)) {
      pos = pos.contiguous();  // its varying dims, in order, then merge
      aligned = align(pos, n, multi_axis);
    }
  } else {
    token_dims.clear();
    head_dims.clear();
    for (int64_t d = 0; d < n; ++d) {
      if (x.size(d) != 1) {
        (d <= last_varying ? token_dims : head_dims).push_back(d);
      }
    }
    // positions over x.shape[:last_varying + 1] (+ the axis dim), contiguous.
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().begin() + n);
    if (multi_axis) {
      shape.push_back(pos.size(-1));
    }
    at::Tensor expanded = pos.expand(shape);
    for (int64_t d = n - 1; d > last_varying; --d) {
      expanded = expanded.select(d, 0);
    }
    pos = expanded.contiguous();
    aligned.sizes.assign(static_cast<size_t>(n), 1);
    aligned.strides.assign(static_cast<size_t>(n), 0);
    for (int64_t d = 0; d <= last_varying; ++d) {
      aligned.sizes[d] = x.size(d);
      aligned.strides[d] = pos.stride(d);
    }
    r.expanded = true;
  }
  if (token_dims.empty() && head_dims.size() > 1) {
    // Positions the same for every row (a decode step's one position): the outer dims become the
    // tokens (position stride 0), so the CPU's parallel loop over tokens has more than one, and
    // the rows of one token still share its angles.
    token_dims.assign(head_dims.begin(), head_dims.end() - 1);
    head_dims.erase(head_dims.begin(), head_dims.end() - 1);
    if (!merges(token_dims, out)) {
      head_dims.insert(head_dims.begin(), token_dims.begin(), token_dims.end());
      token_dims.clear();
    }
  }
  if (!merges(token_dims, src) || !merges(head_dims, src)) {
    src = src.contiguous();  // then its dims merge as out's do
  }
  r.src = src;
  r.width = width;
  merge_dims(token_dims, src.sizes(), src.strides(), r.tokens, r.src_token_stride);
  merge_dims(head_dims, src.sizes(), src.strides(), r.heads, r.src_head_stride);
  int64_t out_size = 0;
  merge_dims(token_dims, out.sizes(), out.strides(), out_size, r.out_token_stride);
  merge_dims(head_dims, out.sizes(), out.strides(), out_size, r.out_head_stride);
  int64_t pos_size = 0;
  int64_t pos_token_stride = 0;
  merge_dims(token_dims, aligned.sizes, aligned.strides, pos_size, pos_token_stride);
  r.positions = pos;
  r.pos.token = r.tokens > 1 ? pos_token_stride : 0;
  r.pos.head = 0;
  r.pos.axis = multi_axis ? pos.stride(-1) : 0;
  return r;
}

}  // namespace rope::detail
