// SPDX-License-Identifier: BSD-3-Clause
// rope:: from C++: what only a C++ caller can see. The op matrix (dtypes, head_dims, layouts,
// strides, positions shapes, every error message, autograd rules, CUDA) is the device-parametrised
// pytest suite in tests/python, which reaches the same dispatcher and kernels. Here: the C++ API's
// defaults and overloads, one call of each op through the dispatcher against the oracle, one
// gradient check through the dispatcher, and the c10 exception types of the errors.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch_rope/ops.h>
#include <torch_rope/tables.h>

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

constexpr int64_t kMaxSeqLen = 64;

// ---- defaults and overloads ------------------------------------------------------------------

TEST(ApiDefaults, OpsDefaultToInterleavedForward) {
  // A default of interleaved=false or inverse=true would still produce a rotation: compare with
  // the oracle of each combination, not only with the explicit call.
  torch::manual_seed(0);
  const auto t = reference_tables(kMaxSeqLen, 16);
  const auto x = torch::randn({2, 3, 5, 24});
  const auto positions = torch::randint(0, kMaxSeqLen, {5}, torch::kLong);
  const auto want = reference_rope(x, t.cos, t.sin, positions, /*interleaved=*/true);
  ASSERT_FALSE(matches_oracle(rope::apply(x, t.cos, t.sin, positions, false), want));
  ASSERT_FALSE(matches_oracle(rope::apply(x, t.cos, t.sin, positions, true, true), want));

  const auto out = rope::apply(x, t.cos, t.sin, positions);
  EXPECT_TRUE(matches_oracle(out, want));
  EXPECT_TRUE(bitwise_equal(out, rope::apply(x, t.cos, t.sin, positions, true, false)));

  auto y = x.clone();
  rope::apply_(y, t.cos, t.sin, positions);
  EXPECT_TRUE(bitwise_equal(y, out));

  const auto [q, k] = rope::apply_qk(x, x.narrow(1, 0, 1), t.cos, t.sin, positions);
  EXPECT_TRUE(bitwise_equal(q, out));
  EXPECT_TRUE(bitwise_equal(k, out.narrow(1, 0, 1)));

  auto buffer = torch::empty_like(x);
  rope::apply_out(buffer, x, t.cos, t.sin, positions);
  EXPECT_TRUE(bitwise_equal(buffer, out));
}

TEST(ApiDefaults, RopeTablesOverloadsAgree) {
  // rope_tables(theta, r, L[, device]) of ops.h and rope_tables(theta, r, L, TableOptions) of
  // tables.h: float32 on the CPU by default, one rounding of the float64 value.
  const auto [cos, sin] = rope::rope_tables(10000.0, 48, 300);
  EXPECT_EQ(cos.scalar_type(), torch::kFloat);
  EXPECT_TRUE(cos.device().is_cpu());
  EXPECT_EQ(cos.sizes(), (std::vector<int64_t>{300, 24}));
  const auto want = reference_tables(300, 48, 10000.0, torch::kDouble);
  // One float32 rounding of a value in [-1, 1] is at most 6e-8.
  EXPECT_TRUE(all_close(cos, want.cos, {0.0, 1.2e-7}));
  EXPECT_TRUE(all_close(sin, want.sin, {0.0, 1.2e-7}));

  const auto [cos_dev, sin_dev] = rope::rope_tables(10000.0, 48, 300, torch::Device(torch::kCPU));
  EXPECT_TRUE(bitwise_equal(cos_dev, cos));
  EXPECT_TRUE(bitwise_equal(sin_dev, sin));
  const auto [cos_opt, sin_opt] = rope::rope_tables(10000.0, 48, 300, rope::TableOptions());
  EXPECT_TRUE(bitwise_equal(cos_opt, cos));
  EXPECT_TRUE(bitwise_equal(sin_opt, sin));
  const auto [cos64, sin64] =
      rope::rope_tables(10000.0, 48, 300, rope::TableOptions().dtype(torch::kDouble));
  EXPECT_EQ(cos64.scalar_type(), torch::kDouble);
  EXPECT_TRUE(all_close(cos64, want.cos, {0.0, 1e-13}));
  EXPECT_TRUE(all_close(sin64, want.sin, {0.0, 1e-13}));
}

// ---- one call of each op through the dispatcher -----------------------------------------------

TEST(OpsSmoke, ApplyOnASliceOfAFusedProjection) {
  // q out of a (B, S, 3, H, D) projection: last dim contiguous, the others not; int32 (S, 1)
  // positions; half split; partial rotary.
  torch::manual_seed(1);
  const auto t = reference_tables(kMaxSeqLen, 48);
  const auto qkv = torch::randn({2, 5, 3, 4, 64});
  const auto before = qkv.clone();
  const auto q = qkv.select(2, 0);
  ASSERT_FALSE(q.is_contiguous());
  const auto positions = torch::randint(0, kMaxSeqLen, {5, 1}, torch::kInt);
  const auto out = rope::apply(q, t.cos, t.sin, positions, /*interleaved=*/false);
  EXPECT_TRUE(out.is_contiguous());
  EXPECT_EQ(out.scalar_type(), torch::kFloat);
  EXPECT_TRUE(matches_oracle(out, reference_rope(q, t.cos, t.sin, positions, false)));
  EXPECT_TRUE(bitwise_equal(qkv, before)) << "apply modified its input";
}

TEST(OpsSmoke, ApplyInPlaceWritesThroughTheView) {
  torch::manual_seed(2);
  const auto t = reference_tables(kMaxSeqLen, 24, 10000.0, torch::kDouble);
  auto qkv = torch::randn({2, 5, 3, 4, 32}, torch::kDouble);
  const auto before = qkv.clone();
  const auto positions = torch::randint(0, kMaxSeqLen, {5, 1}, torch::kLong);
  auto k = qkv.select(2, 1);
  const void* storage = k.data_ptr();
  rope::apply_(k, t.cos, t.sin, positions, /*interleaved=*/true, /*inverse=*/true);
  EXPECT_EQ(k.data_ptr(), storage);
  EXPECT_TRUE(matches_oracle(
      qkv.select(2, 1), reference_rope(before.select(2, 1), t.cos, t.sin, positions, true, true)));
  EXPECT_TRUE(bitwise_equal(qkv.select(2, 0), before.select(2, 0)));
  EXPECT_TRUE(bitwise_equal(qkv.select(2, 2), before.select(2, 2)));
}

TEST(OpsSmoke, ApplyQkWithFewerKeyHeads) {
  torch::manual_seed(3);
  const auto t = reference_tables(kMaxSeqLen, 32);
  const auto q = torch::randn({2, 8, 5, 32}, torch::kBFloat16);
  const auto k = torch::randn({2, 2, 5, 32}, torch::kBFloat16);
  const auto positions = torch::randint(0, kMaxSeqLen, {5}, torch::kLong);
  const auto [qo, ko] = rope::apply_qk(q, k, t.cos, t.sin, positions, /*interleaved=*/false);
  EXPECT_EQ(qo.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(matches_oracle(qo, reference_rope(q, t.cos, t.sin, positions, false)));
  EXPECT_TRUE(matches_oracle(ko, reference_rope(k, t.cos, t.sin, positions, false)));
  EXPECT_TRUE(bitwise_equal(ko, rope::apply(k, t.cos, t.sin, positions, false)));
}

TEST(OpsSmoke, ApplyOutWritesAStridedSlotAndReturnsIt) {
  // The C++ out= API: a KV-cache slot (non-contiguous view) receives apply()'s result, and the
  // returned reference is that slot.
  torch::manual_seed(4);
  const auto t = reference_tables(kMaxSeqLen, 16);
  auto cache = torch::full({2, 16, 3, 24}, 7.0);
  const auto k = torch::randn({2, 4, 3, 24});
  const auto positions = (5 + torch::arange(4)).view({4, 1});
  auto slot = cache.slice(1, 5, 9);
  at::Tensor& returned = rope::apply_out(slot, k, t.cos, t.sin, positions, false);
  EXPECT_TRUE(returned.is_same(slot));
  EXPECT_TRUE(matches_oracle(slot, reference_rope(k, t.cos, t.sin, positions, false)));
  EXPECT_TRUE((cache.slice(1, 0, 5) == 7.0).all().item<bool>());
  EXPECT_TRUE((cache.slice(1, 9, 16) == 7.0).all().item<bool>());
  // Not differentiable, as aten's out= ops.
  const auto x = torch::randn({2, 4, 3, 24}, torch::requires_grad());
  EXPECT_TRUE(
      contains_all(error_message([&] { rope::apply_out(slot, x, t.cos, t.sin, positions); }),
                   {"rope.apply.out", "automatic differentiation"}));
}

// ---- one gradient check through the dispatcher --------------------------------------------------

TEST(AutogradSmoke, GradientIsTheTransposeAndItselfDifferentiable) {
  // Arbitrary tables with every entry different: the transpose of [[c, -s], [s, c]] is
  // [[c, s], [-s, c]] for any c and s, so only a backward that is the true transpose (the same op
  // with inverse flipped) matches the oracle, and a mix-up of planes or halves shows.
  torch::manual_seed(5);
  const auto cos = torch::randn({kMaxSeqLen, 12}, torch::kDouble);
  const auto sin = torch::randn({kMaxSeqLen, 12}, torch::kDouble);
  const auto positions = torch::randint(0, kMaxSeqLen, {5, 1}, torch::kLong);
  for (const bool interleaved : {true, false}) {
    SCOPED_TRACE(interleaved ? "interleaved" : "half split");
    const auto x = torch::randn({2, 5, 3, 32}, torch::kDouble).requires_grad_(true);
    const auto g = torch::randn({2, 5, 3, 32}, torch::kDouble).requires_grad_(true);
    const auto y = rope::apply(x, cos, sin, positions, interleaved);
    ASSERT_TRUE(y.requires_grad());
    const auto gx = torch::autograd::grad({y}, {x}, {g}, /*retain_graph=*/true,
                                          /*create_graph=*/true)[0];
    EXPECT_TRUE(matches_oracle(gx, reference_rope(g, cos, sin, positions, interleaved, true)));
    // d/dg <R^T g, w> = R w: the forward rotation again (double backward).
    const auto w = torch::randn_like(gx);
    const auto gg = torch::autograd::grad({(gx * w).sum()}, {g})[0];
    EXPECT_TRUE(matches_oracle(gg, reference_rope(w, cos, sin, positions, interleaved)));
  }
}

// ---- errors: the c10 exception type is part of the C++ API
// ---------------------------------------

TEST(ErrorTypes, PositionOutOfRangeIsAnIndexError) {
  const auto t = reference_tables(32, 16);
  const auto x = torch::randn({2, 3, 5, 16});
  const auto bad = torch::tensor({0, 1, 2, 40, 3}, torch::kLong);
  EXPECT_TRUE(
      contains_all(error_message<c10::IndexError>([&] { rope::apply(x, t.cos, t.sin, bad); }),
                   {"rope.apply", "positions", "max_seq_len", "32", "got 40"}));
  auto y = x.clone();
  error_message<c10::IndexError>([&] { rope::apply_(y, t.cos, t.sin, -bad); });
  EXPECT_TRUE(bitwise_equal(y, x)) << "a failed apply_ wrote into x";
  error_message<c10::IndexError>([&] { rope::apply_qk(x, x, t.cos, t.sin, bad); });
}

TEST(ErrorTypes, BadArgumentsAreC10Errors) {
  // RuntimeError in Python: plain c10::Error, not a subclass.
  const auto t = reference_tables(32, 16);
  const auto x = torch::randn({2, 3, 5, 16});
  const auto positions = torch::arange(5, torch::kLong);
  EXPECT_TRUE(contains_all(
      error_message([&] { rope::apply(x.narrow(-1, 0, 12), t.cos, t.sin, positions); }),
      {"rope.apply", "x.size(-1) (head_dim)", "rotary_dim", "16", "got 12"}));
  error_message([&] { rope::apply(x, t.cos, t.sin, positions.to(torch::kFloat)); });
  error_message([&] { rope::apply(x, t.cos.to(torch::kHalf), t.sin.to(torch::kHalf), positions); });
  error_message([&] { rope::apply(x.to(torch::kInt), t.cos, t.sin, positions); });
}

TEST(ErrorTypes, BadTableArgumentsAreValueErrors) {
  EXPECT_TRUE(
      contains_all(error_message<c10::ValueError>([] { rope::rope_tables(10000.0, 7, 16); }),
                   {"rotary_dim", "even", "7"}));
  EXPECT_TRUE(contains_all(error_message<c10::ValueError>([] { rope::rope_tables(10000.0, 8, 0); }),
                           {"max_seq_len", "got 0"}));
  EXPECT_TRUE(contains_all(error_message<c10::ValueError>([] { rope::rope_tables(0.0, 8, 16); }),
                           {"theta", "got 0"}));
  EXPECT_TRUE(contains_all(error_message<c10::ValueError>([] {
                             rope::rope_tables(10000.0, 8, 16,
                                               rope::TableOptions().dtype(torch::kHalf));
                           }),
                           {"dtype", "Half"}));
}

// rope_parameters as C++ users hold them (e.g. read from a config.json): the same key tables
// the Python module uses.
TEST(ScalingParameters, Llama3DictBuildsTheTypedOptions) {
  const rope::RopeParameters llama3 = {{"rope_type", std::string("llama3")},
                                       {"factor", 8.0},
                                       {"low_freq_factor", int64_t{1}},
                                       {"high_freq_factor", 4.0},
                                       {"original_max_position_embeddings", 8192.0},
                                       {"rope_theta", 500000.0}};
  const auto scaling = rope::rope_scaling_from_parameters(llama3, 500000.0);
  ASSERT_EQ(rope::rope_type_name(scaling), "llama3");
  const auto& options = std::get<rope::Llama3Scaling>(scaling);
  EXPECT_EQ(options.factor(), 8.0);
  EXPECT_EQ(options.low_freq_factor(), 1.0);
  EXPECT_EQ(options.original_max_position_embeddings(), 8192);
  // The same tables as the typed options give.
  const auto [cos_a, sin_a] =
      rope::rope_tables(500000.0, 64, 32, rope::TableOptions().scaling(scaling));
  const auto [cos_b, sin_b] = rope::rope_tables(
      500000.0, 64, 32,
      rope::TableOptions().scaling(
          rope::Llama3Scaling().factor(8.0).low_freq_factor(1.0).high_freq_factor(4.0)));
  EXPECT_TRUE(bitwise_equal(cos_a, cos_b) && bitwise_equal(sin_a, sin_b));
}

TEST(ScalingParameters, BadDictsNameTheKey) {
  const auto parse = [](rope::RopeParameters p) {
    return [p] { rope::rope_scaling_from_parameters(p, 10000.0); };
  };
  EXPECT_TRUE(
      contains_all(error_message<c10::ValueError>(parse({{"rope_type", std::string("yarn")}})),
                   {"rope_type 'yarn' needs original_max_position_embeddings"}));
  EXPECT_TRUE(contains_all(
      error_message<c10::ValueError>(
          parse({{"rope_type", std::string("linear")}, {"factor", 2.0}, {"fctor", 3.0}})),
      {"unexpected key(s) 'fctor'", "accepted:"}));
  EXPECT_TRUE(contains_all(error_message<c10::TypeError>(
                               parse({{"rope_type", std::string("linear")}, {"factor", true}})),
                           {"scaling['factor'] must be a number, got bool"}));
  EXPECT_TRUE(contains_all(
      error_message<c10::ValueError>(parse({{"rope_type", std::string("ntk-by-parts")}})),
      {"'ntk-by-parts' is not supported", "llama3", "longrope"}));
  EXPECT_TRUE(contains_all(error_message<c10::ValueError>(parse({{"rope_theta", 5.0}})),
                           {"rope_theta = 5 disagrees with theta = 10000"}));
}

}  // namespace
