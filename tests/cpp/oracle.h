// SPDX-License-Identifier: BSD-3-Clause
// The C++ suite's one oracle: plain loops in double over accessors. Nothing here calls the library,
// so a bug in the kernels or the table builder cannot hide in the expected values. (The Python
// suite's oracle is tests/python/support/references.py; the op matrix is tested there.)
//
// The math (README.md, "What it computes"): plane k of a row at position p turns by angle p *
// inv_freq[k], inv_freq[k] = theta^(-2k / rotary_dim); interleaved pairs features (2k, 2k+1), half
// split pairs (k, k + rotary_dim/2); features from rotary_dim on pass through; inverse turns by the
// negative angle.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <vector>

namespace rope_test {

struct Tables {
  torch::Tensor cos;  // (max_seq_len, rotary_dim / 2)
  torch::Tensor sin;
};

// cos/sin tables computed in double with std::pow, std::cos and std::sin, then stored as `dtype`.
inline Tables reference_tables(int64_t max_seq_len, int64_t rotary_dim, double theta = 10000.0,
                               torch::Dtype dtype = torch::kFloat) {
  auto cos = torch::empty({max_seq_len, rotary_dim / 2}, torch::kDouble);
  auto sin = torch::empty_like(cos);
  auto c = cos.accessor<double, 2>();
  auto s = sin.accessor<double, 2>();
  for (int64_t p = 0; p < max_seq_len; ++p) {
    for (int64_t k = 0; k < rotary_dim / 2; ++k) {
      const double inv_freq =
          std::pow(theta, -2.0 * static_cast<double>(k) / static_cast<double>(rotary_dim));
      const double angle = static_cast<double>(p) * inv_freq;
      c[p][k] = std::cos(angle);
      s[p][k] = std::sin(angle);
    }
  }
  return {cos.to(dtype), sin.to(dtype)};
}

// The position of every row of x.shape[:-1] (row-major flat order), by NumPy broadcasting of
// `positions` aligned from the right. Written out by hand rather than with Tensor::expand.
inline std::vector<int64_t> broadcast_positions(const torch::Tensor& positions,
                                                at::IntArrayRef row_shape) {
  const torch::Tensor pos = positions.cpu().to(torch::kLong).contiguous();
  const int64_t* data = pos.data_ptr<int64_t>();
  const int64_t nrow = static_cast<int64_t>(row_shape.size());
  const int64_t npos = pos.dim();
  if (npos > nrow) {
    ADD_FAILURE() << "oracle: positions has more dims than x.shape[:-1]";
    return {};
  }
  for (int64_t j = 0; j < npos; ++j) {
    const int64_t size = pos.size(j);
    const int64_t target = row_shape[nrow - npos + j];
    if (size != 1 && size != target) {
      ADD_FAILURE() << "oracle: positions " << pos.sizes() << " not broadcastable to " << row_shape;
      return {};
    }
  }
  int64_t num_rows = 1;
  for (const int64_t s : row_shape) {
    num_rows *= s;
  }
  std::vector<int64_t> out(static_cast<size_t>(num_rows));
  std::vector<int64_t> idx(static_cast<size_t>(nrow), 0);
  for (int64_t r = 0; r < num_rows; ++r) {
    int64_t rem = r;
    for (int64_t d = nrow - 1; d >= 0; --d) {
      idx[d] = rem % row_shape[d];
      rem /= row_shape[d];
    }
    int64_t offset = 0;
    int64_t stride = 1;
    for (int64_t j = npos - 1; j >= 0; --j) {
      const int64_t size = pos.size(j);
      const int64_t i = size == 1 ? 0 : idx[nrow - npos + j];
      offset += i * stride;
      stride *= size;
    }
    out[r] = data[offset];
  }
  return out;
}

// x rotated by the rows of the given tables (any values: they need not be a rotation), as a
// float64 tensor of x's shape on the CPU, whatever x's dtype and device.
inline torch::Tensor reference_rope(const torch::Tensor& x, const torch::Tensor& cos,
                                    const torch::Tensor& sin, const torch::Tensor& positions,
                                    bool interleaved = true, bool inverse = false) {
  const int64_t head_dim = x.size(-1);
  const int64_t half = cos.size(1);
  const auto row_shape = x.sizes().slice(0, x.dim() - 1);
  const std::vector<int64_t> pos = broadcast_positions(positions, row_shape);

  torch::Tensor rows_in = x.detach().cpu().to(torch::kDouble).contiguous().reshape({-1, head_dim});
  torch::Tensor rows_out = torch::empty_like(rows_in);
  const torch::Tensor cos_d = cos.detach().cpu().to(torch::kDouble).contiguous();
  const torch::Tensor sin_d = sin.detach().cpu().to(torch::kDouble).contiguous();
  auto in = rows_in.accessor<double, 2>();
  auto out = rows_out.accessor<double, 2>();
  auto c = cos_d.accessor<double, 2>();
  auto s = sin_d.accessor<double, 2>();
  const double sign = inverse ? -1.0 : 1.0;

  for (int64_t r = 0; r < rows_in.size(0); ++r) {
    const int64_t p = pos[r];
    for (int64_t d = 0; d < head_dim; ++d) {
      out[r][d] = in[r][d];
    }
    for (int64_t k = 0; k < half; ++k) {
      const int64_t ia = interleaved ? 2 * k : k;
      const int64_t ib = interleaved ? 2 * k + 1 : k + half;
      const double a = in[r][ia];
      const double b = in[r][ib];
      const double cc = c[p][k];
      const double ss = sign * s[p][k];
      out[r][ia] = a * cc - b * ss;
      out[r][ib] = a * ss + b * cc;
    }
  }
  return rows_out.reshape(x.sizes());
}

}  // namespace rope_test
