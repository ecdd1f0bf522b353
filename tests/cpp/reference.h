// An independent scalar oracle for the rope tests: plain loops in double over accessors. Nothing
// here calls the library, so a bug in the kernels cannot hide in the expected values.
//
// The math (DESIGN.md section 1): plane k of a row at position p turns by angle p * inv_freq[k];
// interleaved pairs features (2k, 2k+1), half split pairs (k, k + rotary_dim/2); features from
// rotary_dim on pass through; inverse turns by the negative angle.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <sstream>
#include <string>
#include <vector>

namespace rope_test {

// ---- tables --------------------------------------------------------------------------------

struct Tables {
  torch::Tensor cos;  // (max_seq_len, rotary_dim / 2)
  torch::Tensor sin;
  int64_t rotary_dim() const { return 2 * cos.size(1); }
  int64_t max_seq_len() const { return cos.size(0); }
};

inline double reference_angle(double theta, int64_t rotary_dim, int64_t position, int64_t plane) {
  const double inv_freq =
      std::pow(theta, -2.0 * static_cast<double>(plane) / static_cast<double>(rotary_dim));
  return static_cast<double>(position) * inv_freq;
}

// cos/sin tables computed in double with std::cos/std::sin, then stored as `dtype`.
inline Tables reference_tables(int64_t max_seq_len, int64_t rotary_dim, double theta = 10000.0,
                               torch::Dtype dtype = torch::kFloat) {
  auto cos = torch::empty({max_seq_len, rotary_dim / 2}, torch::kDouble);
  auto sin = torch::empty_like(cos);
  auto c = cos.accessor<double, 2>();
  auto s = sin.accessor<double, 2>();
  for (int64_t p = 0; p < max_seq_len; ++p) {
    for (int64_t k = 0; k < rotary_dim / 2; ++k) {
      const double angle = reference_angle(theta, rotary_dim, p, k);
      c[p][k] = std::cos(angle);
      s[p][k] = std::sin(angle);
    }
  }
  return {cos.to(dtype), sin.to(dtype)};
}

// Arbitrary, non-trigonometric tables (cos^2 + sin^2 != 1, unrelated entries): a kernel that swaps
// cos and sin, reads the wrong column, or leans on the identity is caught by these.
inline Tables random_tables(int64_t max_seq_len, int64_t rotary_dim,
                            torch::Dtype dtype = torch::kFloat) {
  return {torch::randn({max_seq_len, rotary_dim / 2}, torch::dtype(dtype)),
          torch::randn({max_seq_len, rotary_dim / 2}, torch::dtype(dtype))};
}

// ---- broadcasting of positions --------------------------------------------------------------

// The position of every row of x.shape[:-1] (row-major flat order), by NumPy broadcasting of
// `positions` aligned from the right. Written out by hand rather than with Tensor::expand.
inline std::vector<int64_t> broadcast_positions(const torch::Tensor& positions,
                                                at::IntArrayRef row_shape) {
  const torch::Tensor pos = positions.cpu().to(torch::kLong).contiguous();
  const int64_t* data = pos.data_ptr<int64_t>();
  const int64_t nrow = static_cast<int64_t>(row_shape.size());
  const int64_t npos = pos.dim();
  if (npos > nrow) {
    ADD_FAILURE() << "reference: positions has more dims than x.shape[:-1]";
    return {};
  }
  for (int64_t j = 0; j < npos; ++j) {
    const int64_t size = pos.size(j);
    const int64_t target = row_shape[nrow - npos + j];
    if (size != 1 && size != target) {
      ADD_FAILURE() << "reference: positions " << pos.sizes() << " not broadcastable to "
                    << row_shape;
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

// ---- the rotation ---------------------------------------------------------------------------

// Returns x rotated, as a float64 tensor of x's shape (on the CPU), whatever x's dtype.
inline torch::Tensor reference_rope(const torch::Tensor& x, const torch::Tensor& cos,
                                    const torch::Tensor& sin, const torch::Tensor& positions,
                                    bool interleaved = true, bool inverse = false) {
  const int64_t head_dim = x.size(-1);
  const int64_t half = cos.size(1);
  const auto row_shape = x.sizes().slice(0, x.dim() - 1);
  const std::vector<int64_t> pos = broadcast_positions(positions, row_shape);

  torch::Tensor rows_in = x.cpu().to(torch::kDouble).contiguous().reshape({-1, head_dim});
  torch::Tensor rows_out = torch::empty_like(rows_in);
  const torch::Tensor cos_d = cos.cpu().to(torch::kDouble).contiguous();
  const torch::Tensor sin_d = sin.cpu().to(torch::kDouble).contiguous();
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

// ---- comparisons ----------------------------------------------------------------------------

struct Tolerance {
  double rtol;
  double atol;
};

// Outputs are rounded once to the storage dtype from float32 (float64) math.
inline Tolerance tolerance_for(torch::Dtype dtype) {
  switch (dtype) {
    case torch::kDouble:
      return {1e-12, 1e-12};
    case torch::kFloat:
      return {1e-5, 1e-5};
    case torch::kHalf:
      return {2e-3, 1e-3};
    case torch::kBFloat16:
      return {1.6e-2, 1e-2};
    default:
      return {0.0, 0.0};
  }
}

// |actual - expected| <= atol + rtol * |expected| elementwise, compared in float64 on the CPU, with
// the worst element named on failure.
inline ::testing::AssertionResult all_close(const torch::Tensor& actual,
                                            const torch::Tensor& expected, Tolerance tol) {
  if (actual.sizes() != expected.sizes()) {
    return ::testing::AssertionFailure()
           << "shape mismatch: actual " << actual.sizes() << " vs expected " << expected.sizes();
  }
  if (actual.numel() == 0) {
    return ::testing::AssertionSuccess();
  }
  const auto a = actual.detach().cpu().to(torch::kDouble);
  const auto e = expected.detach().cpu().to(torch::kDouble);
  const auto err = (a - e).abs();
  const auto bound = tol.atol + tol.rtol * e.abs();
  const auto excess = err - bound;
  const int64_t worst = excess.flatten().argmax().item<int64_t>();
  const double worst_excess = excess.flatten()[worst].item<double>();
  if (worst_excess <= 0 && !err.isnan().any().item<bool>()) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "max |actual - expected| = " << err.max().item<double>() << " (rtol " << tol.rtol
         << ", atol " << tol.atol << "); worst at flat index " << worst << ": actual "
         << a.flatten()[worst].item<double>() << ", expected " << e.flatten()[worst].item<double>()
         << (err.isnan().any().item<bool>() ? "; NaN present" : "");
}

inline ::testing::AssertionResult all_close(const torch::Tensor& actual,
                                            const torch::Tensor& expected, torch::Dtype dtype) {
  return all_close(actual, expected, tolerance_for(dtype));
}

// Exact equality with a readable failure.
inline ::testing::AssertionResult bitwise_equal(const torch::Tensor& actual,
                                                const torch::Tensor& expected) {
  if (actual.sizes() != expected.sizes() || actual.scalar_type() != expected.scalar_type()) {
    return ::testing::AssertionFailure()
           << "actual " << actual.sizes() << " " << actual.scalar_type() << " vs expected "
           << expected.sizes() << " " << expected.scalar_type();
  }
  if (torch::equal(actual.cpu(), expected.cpu())) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "tensors differ; max |diff| = "
         << (actual.cpu().to(torch::kDouble) - expected.cpu().to(torch::kDouble))
                .abs()
                .max()
                .item<double>();
}

// ---- errors ---------------------------------------------------------------------------------

// Runs `f`, which must throw c10::Error; returns the message without the C++ backtrace.
template <typename F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  ADD_FAILURE() << "expected a c10::Error, but nothing was thrown";
  return "";
}

// The message holds every one of `parts`.
inline ::testing::AssertionResult contains_all(const std::string& message,
                                               std::initializer_list<std::string> parts) {
  for (const auto& part : parts) {
    if (message.find(part) == std::string::npos) {
      return ::testing::AssertionFailure()
             << "message lacks \"" << part << "\"; message was:\n" << message;
    }
  }
  return ::testing::AssertionSuccess();
}

inline std::string dtype_name(torch::Dtype dtype) {
  switch (dtype) {
    case torch::kDouble:
      return "float64";
    case torch::kFloat:
      return "float32";
    case torch::kHalf:
      return "float16";
    case torch::kBFloat16:
      return "bfloat16";
    default: {
      std::ostringstream os;
      os << dtype;
      return os.str();
    }
  }
}

}  // namespace rope_test
