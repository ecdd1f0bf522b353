// Gradients through rope::apply / apply_ / apply_qk from C++: the backward is the inverse rotation,
// it matches finite differences and the reference transpose, and it is itself differentiable.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch_rope/module.h>
#include <torch_rope/ops.h>

#include <string>

#include "inputs.h"
#include "reference.h"

namespace {

using rope_test::all_close;
using rope_test::bitwise_equal;
using rope_test::Layout;
using rope_test::reference_rope;
using rope_test::reference_tables;
using rope_test::Tolerance;

constexpr int64_t kMaxSeqLen = 32;
constexpr Tolerance kF64{1e-12, 1e-12};

TEST(Autograd, GradientIsTheInverseRotation) {
  torch::manual_seed(0);
  for (const bool random : {false, true}) {
    // Arbitrary tables too: the transpose of [[c, -s], [s, c]] is [[c, s], [-s, c]] for any c, s,
    // so "backward = inverse" must hold even when the tables are not a rotation; sin halves that
    // differ from each other catch a backward that mixes up the planes.
    const auto tables = random ? rope_test::random_tables(kMaxSeqLen, 24, torch::kDouble)
                               : reference_tables(kMaxSeqLen, 24, 10000.0, torch::kDouble);
    for (const auto layout : {Layout::kBHSD, Layout::kBSHD, Layout::kPacked}) {
      for (const bool interleaved : {true, false}) {
        for (const bool inverse : {false, true}) {
          SCOPED_TRACE(std::string(random ? "random" : "trig") + " tables, " +
                       rope_test::layout_name(layout) + ", interleaved " +
                       std::to_string(interleaved) + ", inverse " + std::to_string(inverse));
          const auto sample = rope_test::make_sample(layout, 32, torch::kDouble, kMaxSeqLen);
          const auto x = sample.x.clone().requires_grad_(true);
          const auto y =
              rope::apply(x, tables.cos, tables.sin, sample.positions, interleaved, inverse);
          ASSERT_TRUE(y.requires_grad());
          const auto g = torch::randn_like(y);
          const auto grad = torch::autograd::grad({y}, {x}, {g})[0];
          EXPECT_TRUE(bitwise_equal(grad, rope::apply(g, tables.cos, tables.sin,
                                                      sample.positions, interleaved, !inverse)));
          EXPECT_TRUE(all_close(grad,
                                reference_rope(g, tables.cos, tables.sin, sample.positions,
                                               interleaved, !inverse),
                                kF64));
        }
      }
    }
  }
}

TEST(Autograd, JacobianMatchesFiniteDifferences) {
  // A C++ gradcheck: the full Jacobian by central differences (exact up to rounding, the op is
  // linear) against the one autograd builds row by row. Partial rotary, non-trivial positions.
  torch::manual_seed(1);
  const auto tables = rope_test::random_tables(kMaxSeqLen, 4, torch::kDouble);
  const auto positions = torch::tensor({3, 0, 17}, torch::kLong);
  for (const bool interleaved : {true, false}) {
    for (const bool inverse : {false, true}) {
      SCOPED_TRACE("interleaved " + std::to_string(interleaved) + ", inverse " +
                   std::to_string(inverse));
      const auto x0 = torch::randn({2, 3, 6}, torch::kDouble);
      const int64_t n = x0.numel();
      auto f = [&](const torch::Tensor& x) {
        return rope::apply(x, tables.cos, tables.sin, positions, interleaved, inverse).flatten();
      };
      const double eps = 1e-6;
      auto numeric = torch::empty({n, n}, torch::kDouble);  // numeric[i][j] = d y_i / d x_j
      for (int64_t j = 0; j < n; ++j) {
        auto dx = torch::zeros({n}, torch::kDouble);
        dx[j] = eps;
        const auto col =
            (f(x0 + dx.view(x0.sizes())) - f(x0 - dx.view(x0.sizes()))) / (2 * eps);
        numeric.select(1, j).copy_(col);
      }
      const auto x = x0.clone().requires_grad_(true);
      const auto y = f(x);
      auto analytic = torch::empty({n, n}, torch::kDouble);
      for (int64_t i = 0; i < n; ++i) {
        auto e = torch::zeros({n}, torch::kDouble);
        e[i] = 1.0;
        analytic.select(0, i).copy_(
            torch::autograd::grad({y}, {x}, {e}, /*retain_graph=*/true)[0].flatten());
      }
      EXPECT_TRUE(all_close(analytic, numeric, Tolerance{1e-7, 1e-8}));
      // The reference, applied to unit vectors, gives the same Jacobian (columns).
      auto expected = torch::empty({n, n}, torch::kDouble);
      for (int64_t j = 0; j < n; ++j) {
        auto e = torch::zeros({n}, torch::kDouble);
        e[j] = 1.0;
        expected.select(1, j).copy_(reference_rope(e.view(x0.sizes()), tables.cos, tables.sin,
                                                   positions, interleaved, inverse)
                                        .flatten());
      }
      EXPECT_TRUE(all_close(analytic, expected, kF64));
    }
  }
}

TEST(Autograd, LowPrecisionGradientsKeepDtype) {
  torch::manual_seed(2);
  const auto tables = reference_tables(kMaxSeqLen, 16);
  for (const auto dtype : {torch::kFloat, torch::kHalf, torch::kBFloat16}) {
    const auto sample = rope_test::make_sample(Layout::kBSHD, 16, dtype, kMaxSeqLen);
    const auto x = sample.x.clone().requires_grad_(true);
    const auto y = rope::apply(x, tables.cos, tables.sin, sample.positions);
    const auto g = torch::randn_like(y);
    y.backward(g);
    ASSERT_TRUE(x.grad().defined());
    EXPECT_EQ(x.grad().scalar_type(), dtype);
    EXPECT_TRUE(all_close(x.grad(),
                          reference_rope(g, tables.cos, tables.sin, sample.positions, true, true),
                          dtype));
  }
}

TEST(Autograd, BroadcastGradOutput) {
  // y.sum() hands backward an expanded grad (every stride 0, last dim included).
  torch::manual_seed(3);
  const auto tables = reference_tables(kMaxSeqLen, 16, 10000.0, torch::kDouble);
  const auto x = torch::randn({2, 3, 5, 16}, torch::kDouble).requires_grad_(true);
  const auto positions = torch::randint(0, kMaxSeqLen, {5}, torch::kLong);
  for (const bool interleaved : {true, false}) {
    const auto y = rope::apply(x, tables.cos, tables.sin, positions, interleaved);
    const auto grad = torch::autograd::grad({y.sum()}, {x})[0];
    EXPECT_TRUE(all_close(grad,
                          reference_rope(torch::ones_like(x), tables.cos, tables.sin, positions,
                                         interleaved, /*inverse=*/true),
                          kF64));
  }
}

TEST(Autograd, DoubleBackward) {
  torch::manual_seed(4);
  const auto tables = reference_tables(kMaxSeqLen, 24, 10000.0, torch::kDouble);
  const auto positions = torch::randint(0, kMaxSeqLen, {5}, torch::kLong);
  for (const bool interleaved : {true, false}) {
    for (const bool inverse : {false, true}) {
      SCOPED_TRACE("interleaved " + std::to_string(interleaved) + ", inverse " +
                   std::to_string(inverse));
      const auto x = torch::randn({2, 3, 5, 32}, torch::kDouble).requires_grad_(true);
      const auto g = torch::randn({2, 3, 5, 32}, torch::kDouble).requires_grad_(true);
      const auto y = rope::apply(x, tables.cos, tables.sin, positions, interleaved, inverse);
      const auto gx = torch::autograd::grad({y}, {x}, {g}, /*retain_graph=*/true,
                                            /*create_graph=*/true)[0];
      ASSERT_TRUE(gx.requires_grad()) << "backward was not recorded with create_graph=true";
      EXPECT_TRUE(all_close(
          gx, reference_rope(g, tables.cos, tables.sin, positions, interleaved, !inverse), kF64));

      // d/dg <R^T g, w> = R w: the forward rotation again.
      const auto w = torch::randn_like(gx);
      const auto grads = torch::autograd::grad({(gx * w).sum()}, {g, x}, {},
                                               /*retain_graph=*/true, /*create_graph=*/true,
                                               /*allow_unused=*/true);
      EXPECT_TRUE(all_close(
          grads[0], reference_rope(w, tables.cos, tables.sin, positions, interleaved, inverse),
          kF64));
      // The op is linear in x: no second derivative with respect to x.
      if (grads[1].defined()) {
        EXPECT_EQ(grads[1].abs().max().item<double>(), 0.0);
      }
    }
  }
}

TEST(Autograd, ApplyQkGradsFlowToBothQAndK) {
  torch::manual_seed(5);
  const auto tables = reference_tables(kMaxSeqLen, 32, 10000.0, torch::kDouble);
  const auto positions = torch::randint(0, kMaxSeqLen, {5}, torch::kLong);
  for (const bool interleaved : {true, false}) {
    const auto q = torch::randn({2, 8, 5, 32}, torch::kDouble).requires_grad_(true);
    const auto k = torch::randn({2, 2, 5, 32}, torch::kDouble).requires_grad_(true);
    const auto [qo, ko] = rope::apply_qk(q, k, tables.cos, tables.sin, positions, interleaved);
    ASSERT_TRUE(qo.requires_grad());
    ASSERT_TRUE(ko.requires_grad());
    const auto gq = torch::randn_like(qo);
    const auto gk = torch::randn_like(ko);
    ((qo * gq).sum() + (ko * gk).sum()).backward();
    ASSERT_TRUE(q.grad().defined());
    ASSERT_TRUE(k.grad().defined());
    EXPECT_TRUE(all_close(
        q.grad(), reference_rope(gq, tables.cos, tables.sin, positions, interleaved, true), kF64));
    EXPECT_TRUE(all_close(
        k.grad(), reference_rope(gk, tables.cos, tables.sin, positions, interleaved, true), kF64));
    EXPECT_TRUE(bitwise_equal(
        k.grad(), rope::apply(gk, tables.cos, tables.sin, positions, interleaved, true)));
  }
}

TEST(Autograd, ApplyQkWithOnlyQUsed) {
  // The unused output's grad is undefined; backward must not trip over it.
  torch::manual_seed(6);
  const auto tables = reference_tables(kMaxSeqLen, 16, 10000.0, torch::kDouble);
  const auto positions = torch::randint(0, kMaxSeqLen, {5}, torch::kLong);
  const auto q = torch::randn({2, 4, 5, 16}, torch::kDouble).requires_grad_(true);
  const auto k = torch::randn({2, 2, 5, 16}, torch::kDouble).requires_grad_(true);
  const auto [qo, ko] = rope::apply_qk(q, k, tables.cos, tables.sin, positions);
  const auto gq = torch::randn_like(qo);
  (qo * gq).sum().backward();
  EXPECT_TRUE(all_close(q.grad(),
                        reference_rope(gq, tables.cos, tables.sin, positions, true, true), kF64));
  if (k.grad().defined()) {
    EXPECT_EQ(k.grad().abs().max().item<double>(), 0.0);
  }
}

TEST(Autograd, ApplyQkWithOnlyQRequiringGrad) {
  torch::manual_seed(10);
  const auto tables = reference_tables(kMaxSeqLen, 16, 10000.0, torch::kDouble);
  const auto positions = torch::randint(0, kMaxSeqLen, {5}, torch::kLong);
  const auto q = torch::randn({2, 4, 5, 16}, torch::kDouble).requires_grad_(true);
  const auto k = torch::randn({2, 2, 5, 16}, torch::kDouble);
  const auto [qo, ko] = rope::apply_qk(q, k, tables.cos, tables.sin, positions);
  EXPECT_TRUE(qo.requires_grad());
  EXPECT_FALSE(ko.requires_grad());
  (qo.sum() + ko.sum()).backward();
  EXPECT_TRUE(all_close(q.grad(),
                        reference_rope(torch::ones_like(q), tables.cos, tables.sin, positions,
                                       true, true),
                        kF64));
  EXPECT_FALSE(k.grad().defined());
}

TEST(Autograd, InferenceMode) {
  torch::manual_seed(11);
  const auto tables = reference_tables(kMaxSeqLen, 16);
  const auto positions = torch::randint(0, kMaxSeqLen, {5}, torch::kLong);
  c10::InferenceMode guard;
  auto x = torch::randn({2, 3, 5, 16});
  const auto expected = reference_rope(x, tables.cos, tables.sin, positions);
  const auto out = rope::apply(x, tables.cos, tables.sin, positions);
  EXPECT_TRUE(all_close(out, expected, torch::kFloat));
  const auto [qo, ko] = rope::apply_qk(x, x, tables.cos, tables.sin, positions);
  EXPECT_TRUE(bitwise_equal(qo, out));
  rope::apply_(x, tables.cos, tables.sin, positions);
  EXPECT_TRUE(bitwise_equal(x, out));
}

TEST(Autograd, InPlaceOnNonLeaf) {
  torch::manual_seed(7);
  const auto tables = reference_tables(kMaxSeqLen, 16, 10000.0, torch::kDouble);
  const auto positions = torch::randint(0, kMaxSeqLen, {5}, torch::kLong);
  for (const bool inverse : {false, true}) {
    const auto leaf = torch::randn({2, 3, 5, 16}, torch::kDouble).requires_grad_(true);
    auto x = leaf * 2.0;
    rope::apply_(x, tables.cos, tables.sin, positions, true, inverse);
    EXPECT_TRUE(all_close(x.detach(),
                          reference_rope(leaf.detach() * 2.0, tables.cos, tables.sin, positions,
                                         true, inverse),
                          kF64));
    const auto g = torch::randn_like(x);
    x.backward(g);
    EXPECT_TRUE(all_close(leaf.grad(),
                          reference_rope(g * 2.0, tables.cos, tables.sin, positions, true,
                                         !inverse),
                          kF64));
  }
}

TEST(Autograd, InPlaceOnLeafThatRequiresGradThrows) {
  const auto tables = reference_tables(kMaxSeqLen, 16);
  auto leaf = torch::randn({2, 3, 5, 16}, torch::requires_grad());
  const auto before = leaf.detach().clone();
  EXPECT_THROW(rope::apply_(leaf, tables.cos, tables.sin, torch::arange(5, torch::kLong)),
               c10::Error);
  EXPECT_TRUE(torch::equal(leaf.detach(), before));
}

TEST(Autograd, InPlaceWithoutGradBumpsVersion) {
  const auto tables = reference_tables(kMaxSeqLen, 16);
  auto leaf = torch::randn({2, 3, 5, 16}, torch::requires_grad());
  const auto expected =
      reference_rope(leaf.detach(), tables.cos, tables.sin, torch::arange(5, torch::kLong));
  {
    torch::NoGradGuard no_grad;
    const auto version = leaf._version();
    rope::apply_(leaf, tables.cos, tables.sin, torch::arange(5, torch::kLong));
    EXPECT_GT(leaf._version(), version);
  }
  EXPECT_TRUE(all_close(leaf.detach(), expected, torch::kFloat));

  // A tensor saved for backward and then rotated in place is caught by autograd's version check.
  auto a = torch::randn({2, 3, 5, 16}, torch::requires_grad());
  auto b = a * 1.0;
  auto c = b * b;  // saves b
  {
    torch::NoGradGuard no_grad;
    rope::apply_(b, tables.cos, tables.sin, torch::arange(5, torch::kLong));
  }
  EXPECT_THROW(c.sum().backward(), c10::Error);
}

TEST(Autograd, TablesAndPositionsGetNoGradient) {
  torch::manual_seed(8);
  const auto tables = reference_tables(kMaxSeqLen, 16, 10000.0, torch::kDouble);
  const auto cos = tables.cos.clone().requires_grad_(true);
  const auto sin = tables.sin.clone().requires_grad_(true);
  const auto x = torch::randn({2, 3, 5, 16}, torch::kDouble).requires_grad_(true);
  const auto positions = torch::randint(0, kMaxSeqLen, {5}, torch::kLong);
  const auto y = rope::apply(x, cos, sin, positions);
  const auto grads = torch::autograd::grad({y.sum()}, {x, cos, sin}, {}, std::nullopt, false,
                                           /*allow_unused=*/true);
  EXPECT_TRUE(all_close(grads[0],
                        reference_rope(torch::ones_like(x), cos.detach(), sin.detach(), positions,
                                       true, true),
                        kF64));
  for (int i = 1; i < 3; ++i) {
    if (grads[i].defined()) {
      EXPECT_EQ(grads[i].abs().max().item<double>(), 0.0);
    }
  }
}

TEST(Autograd, ThroughTheModule) {
  torch::manual_seed(9);
  rope::RotaryPositionalEmbedding rope_module(10000.0, 16, kMaxSeqLen);
  const auto x = torch::randn({2, 3, 5, 16}).requires_grad_(true);
  const auto y = rope_module(x);
  const auto g = torch::randn_like(y);
  y.backward(g);
  EXPECT_TRUE(all_close(x.grad(),
                        reference_rope(g, rope_module->cos_table(), rope_module->sin_table(),
                                       torch::arange(5), true, true),
                        torch::kFloat));
  EXPECT_FALSE(rope_module->cos_table().requires_grad());
}

}  // namespace
