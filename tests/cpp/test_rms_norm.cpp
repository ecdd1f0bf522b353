// SPDX-License-Identifier: BSD-3-Clause
// rope::rms_norm_apply_qk from C++: its defaults, one call against the oracle (RMSNorm written
// here in float64, then oracle.h's rotation), Gemma's weight_offset, gradients through the
// dispatcher, and the c10 exception types of its errors. The op matrix is
// tests/python/ops/test_rms_norm_apply_qk.py.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch_rope/ops.h>

#include "assertions.h"
#include "oracle.h"

namespace {

using rope_test::all_close;
using rope_test::bitwise_equal;
using rope_test::contains_all;
using rope_test::error_message;
using rope_test::matches_oracle;
using rope_test::reference_rope;
using rope_test::reference_tables;

torch::Tensor reference_norm(const torch::Tensor& x, const torch::Tensor& w, double eps,
                             double offset) {
  const auto xd = x.detach().cpu().to(torch::kDouble);
  const auto wd = w.detach().cpu().to(torch::kDouble);
  return xd / torch::sqrt(xd.square().mean(-1, true) + eps) * (wd + offset);
}

TEST(RmsNormApplyQK, DefaultsMatchTheOracle) {
  torch::manual_seed(0);
  const auto t = reference_tables(32, 16);  // partial rotary: head_dim 24
  const auto q = torch::randn({2, 5, 4, 24});
  const auto k = torch::randn({2, 5, 2, 24});
  const auto qw = torch::randn({24});
  const auto kw = torch::randn({24}).to(torch::kBFloat16);  // any floating weight dtype
  const auto positions = torch::randint(0, 32, {5, 1}, torch::kLong);
  const auto [q_out, k_out] = rope::rms_norm_apply_qk(q, k, qw, kw, t.cos, t.sin, positions);
  EXPECT_TRUE(matches_oracle(
      q_out, reference_rope(reference_norm(q, qw, 1e-6, 0.0), t.cos, t.sin, positions, true)));
  EXPECT_TRUE(matches_oracle(
      k_out, reference_rope(reference_norm(k, kw, 1e-6, 0.0), t.cos, t.sin, positions, true)));
  const auto [q2, k2] = rope::rms_norm_apply_qk(q, k, qw, kw, t.cos, t.sin, positions, 1e-6, 0.0,
                                                true, false, std::nullopt, false);
  EXPECT_TRUE(bitwise_equal(q_out, q2));
  EXPECT_TRUE(bitwise_equal(k_out, k2));
}

TEST(RmsNormApplyQK, GemmaOffsetAndHalfSplitInverse) {
  torch::manual_seed(1);
  const auto t = reference_tables(16, 32);
  const auto q = torch::randn({3, 2, 32}).to(torch::kBFloat16);
  const auto w = torch::randn({32});
  const auto positions = torch::arange(3).view({3, 1});
  const auto [q_out, k_out] =
      rope::rms_norm_apply_qk(q, q, w, w, t.cos, t.sin, positions, 0.5, 1.0, false, true);
  EXPECT_TRUE(matches_oracle(
      q_out, reference_rope(reference_norm(q, w, 0.5, 1.0), t.cos, t.sin, positions, false, true)));
  EXPECT_TRUE(bitwise_equal(q_out, k_out));
}

TEST(RmsNormApplyQK, GradientsThroughTheDispatcher) {
  torch::manual_seed(2);
  const auto t = reference_tables(16, 8, 10000.0, torch::kDouble);
  const auto opts = torch::TensorOptions().dtype(torch::kDouble).requires_grad(true);
  const auto q = torch::randn({2, 3, 8}, opts);
  const auto k = torch::randn({2, 1, 8}, opts);
  const auto qw = torch::randn({8}, opts);
  const auto kw = torch::randn({8}, opts);
  const auto positions = torch::tensor({3, 7}).view({2, 1});
  const auto [q_out, k_out] =
      rope::rms_norm_apply_qk(q, k, qw, kw, t.cos, t.sin, positions, 0.1, 1.0);
  const auto g =
      torch::autograd::grad({(q_out * q_out.detach().cos()).sum() + k_out.sum()}, {q, k, qw, kw});
  // The same function from ATen ops and rope::apply (differentiable by its own rule).
  const auto norm = [](const torch::Tensor& x, const torch::Tensor& w) {
    return x * torch::rsqrt(x.square().mean(-1, true) + 0.1) * (w + 1.0);
  };
  const auto rq = rope::apply(norm(q, qw), t.cos, t.sin, positions);
  const auto rk = rope::apply(norm(k, kw), t.cos, t.sin, positions);
  const auto want =
      torch::autograd::grad({(rq * q_out.detach().cos()).sum() + rk.sum()}, {q, k, qw, kw});
  for (size_t i = 0; i < g.size(); ++i) {
    EXPECT_TRUE(all_close(g[i], want[i], {1e-10, 1e-10})) << "input " << i;
  }
}

TEST(RmsNormApplyQK, ErrorsNameTheArgument) {
  const auto t = reference_tables(8, 16);
  const auto q = torch::randn({2, 16});
  const auto w = torch::ones({16});
  const auto positions = torch::arange(2);
  EXPECT_TRUE(contains_all(
      error_message([&] { rope::rms_norm_apply_qk(q, q, w, w, t.cos, t.sin, positions, 0.0); }),
      {"rope.rms_norm_apply_qk", "eps must be a finite number > 0"}));
  EXPECT_TRUE(contains_all(error_message([&] {
                             rope::rms_norm_apply_qk(q, q, w, torch::ones({8}), t.cos, t.sin,
                                                     positions);
                           }),
                           {"k_weight must have shape (head_dim,) = (16,)", "[8]"}));
  EXPECT_TRUE(contains_all(error_message<c10::IndexError>([&] {
                             rope::rms_norm_apply_qk(q, q, w, w, t.cos, t.sin,
                                                     torch::tensor({0, 8}));
                           }),
                           {"positions must be in [0, max_seq_len)", "got 8"}));
}

}  // namespace
