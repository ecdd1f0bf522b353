// SPDX-License-Identifier: BSD-3-Clause
// Assertion helpers of the C++ suite: comparisons with readable failures, and error capture that
// checks the c10 exception type (which only C++ sees; Python gets the mapped builtin).
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <initializer_list>
#include <sstream>
#include <string>
#include <typeinfo>

namespace rope_test {

struct Tolerance {
  double rtol;
  double atol;
};

// The same numbers, and the same procedure, as TOLERANCES in tests/python/support/helpers.py: the
// library computes in float32 (float64 for float64) and rounds once to the storage dtype, so it
// agrees with the float64 oracle *rounded to that dtype* (see matches_oracle) within about one unit
// in the last place.
inline Tolerance tolerance_for(torch::Dtype dtype) {
  switch (dtype) {
    case torch::kDouble:
      return {1e-12, 1e-12};
    case torch::kFloat:
      return {1e-5, 1e-5};
    case torch::kHalf:
      return {1e-3, 1e-3};
    case torch::kBFloat16:
      return {1e-2, 1e-2};
    default:
      return {0.0, 0.0};
  }
}

// |actual - expected| <= atol + rtol * |expected| elementwise (torch.testing.assert_close's rule),
// compared in float64 on the CPU, with the worst element named on failure.
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
  const auto excess = err - (tol.atol + tol.rtol * e.abs());
  const int64_t worst = excess.flatten().argmax().item<int64_t>();
  const bool has_nan = err.isnan().any().item<bool>();
  if (excess.flatten()[worst].item<double>() <= 0 && !has_nan) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "max |actual - expected| = " << err.max().item<double>() << " (rtol " << tol.rtol
         << ", atol " << tol.atol << "); worst at flat index " << worst << ": actual "
         << a.flatten()[worst].item<double>() << ", expected " << e.flatten()[worst].item<double>()
         << (has_nan ? "; NaN present" : "");
}

// `actual` (any floating dtype) against a float64 oracle value: the oracle is rounded once to
// actual's dtype, then compared with tolerance_for(that dtype). Also checks the dtype is kept.
inline ::testing::AssertionResult matches_oracle(const torch::Tensor& actual,
                                                 const torch::Tensor& oracle) {
  const auto dtype = actual.scalar_type();
  if (oracle.scalar_type() != torch::kDouble) {
    return ::testing::AssertionFailure() << "the oracle must be float64, got " << oracle.dtype();
  }
  return all_close(actual, oracle.to(dtype), tolerance_for(dtype));
}

// Exact equality (values, shape and dtype) with a readable failure.
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

// Runs `f`, which must throw exactly an `E` (c10::Error, or a subclass such as c10::IndexError
// or c10::ValueError, which Python sees as IndexError / ValueError). Returns the message without
// the C++ backtrace; a different type or no exception is a test failure.
template <typename E = c10::Error, typename F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    if (typeid(e) != typeid(E)) {
      ADD_FAILURE() << "expected " << typeid(E).name() << ", got " << typeid(e).name() << ": "
                    << e.what_without_backtrace();
    }
    return e.what_without_backtrace();
  }
  ADD_FAILURE() << "expected " << typeid(E).name() << ", but nothing was thrown";
  return "";
}

// The message holds every one of `parts`.
inline ::testing::AssertionResult contains_all(const std::string& message,
                                               std::initializer_list<std::string> parts) {
  for (const auto& part : parts) {
    if (message.find(part) == std::string::npos) {
      return ::testing::AssertionFailure() << "message lacks \"" << part << "\"; message was:\n"
                                           << message;
    }
  }
  return ::testing::AssertionSuccess();
}

// "float32", "bfloat16", ...: names for test parameters (gtest names allow [A-Za-z0-9_]).
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

// TORCH_ROPE_REQUIRE_CUDA=1 (for a machine that has a GPU) makes a missing GPU or CUDA build a
// failure instead of a skip.
inline bool cuda_required() {
  const char* value = std::getenv("TORCH_ROPE_REQUIRE_CUDA");
  return value != nullptr && std::string(value) == "1";
}

}  // namespace rope_test
