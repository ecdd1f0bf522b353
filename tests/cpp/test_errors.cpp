// Bad input raises c10::Error whose message names the argument and the offending value, and a
// failed call writes nothing.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch_rope/ops.h>

#include <functional>
#include <string>
#include <vector>

#include "reference.h"

namespace {

using rope_test::contains_all;
using rope_test::error_message;

struct Fixture {
  torch::Tensor cos = torch::rand({32, 8});  // rotary_dim 16, max_seq_len 32
  torch::Tensor sin = torch::rand({32, 8});
  torch::Tensor x = torch::randn({2, 3, 5, 16});
  torch::Tensor positions = torch::arange(5, torch::kLong);
};

TEST(Errors, HeadDimSmallerThanRotaryDim) {
  Fixture f;
  const auto x = torch::randn({2, 3, 5, 12});
  const auto msg = error_message([&] { rope::apply(x, f.cos, f.sin, f.positions); });
  EXPECT_TRUE(contains_all(msg, {"rope.apply", "x.size(-1) (head_dim)", "rotary_dim", "16",
                                 "got 12"}));
}

TEST(Errors, FloatPositions) {
  Fixture f;
  const auto positions = torch::arange(5, torch::kFloat);
  const auto msg = error_message([&] { rope::apply(f.x, f.cos, f.sin, positions); });
  EXPECT_TRUE(contains_all(msg, {"positions", "int32 or int64", "Float"}));
}

TEST(Errors, BoolPositions) {
  Fixture f;
  const auto positions = torch::ones({5}, torch::kBool);
  const auto msg = error_message([&] { rope::apply(f.x, f.cos, f.sin, positions); });
  EXPECT_TRUE(contains_all(msg, {"positions", "Bool"}));
}

TEST(Errors, PositionsNotBroadcastable) {
  Fixture f;
  const auto positions = torch::arange(4, torch::kLong);
  const auto msg = error_message([&] { rope::apply(f.x, f.cos, f.sin, positions); });
  EXPECT_TRUE(contains_all(msg, {"positions", "[4]", "x.shape[:-1]", "[2, 3, 5]"}));

  // (S,) is the BHSD shape; for BSHD it must be (S, 1).
  const auto bshd = torch::randn({2, 5, 3, 16});
  const auto msg2 = error_message([&] { rope::apply(bshd, f.cos, f.sin, f.positions); });
  EXPECT_TRUE(contains_all(msg2, {"positions", "[5]", "[2, 5, 3]"}));

  // More dims than x.shape[:-1].
  const auto too_many = torch::zeros({1, 2, 3, 5}, torch::kLong);
  const auto msg3 = error_message([&] { rope::apply(f.x, f.cos, f.sin, too_many); });
  EXPECT_TRUE(contains_all(msg3, {"positions", "[1, 2, 3, 5]"}));
}

TEST(Errors, PositionsOutOfRange) {
  Fixture f;
  const auto too_big = torch::tensor({0, 1, 2, 40, 3}, torch::kLong);
  const auto msg = error_message([&] { rope::apply(f.x, f.cos, f.sin, too_big); });
  EXPECT_TRUE(contains_all(msg, {"positions", "40", "32", "max_seq_len"}));
  EXPECT_THROW(rope::apply(f.x, f.cos, f.sin, too_big), c10::IndexError);

  const auto negative = torch::tensor({0, 1, -1, 3, 4}, torch::kInt);
  const auto msg2 = error_message([&] { rope::apply(f.x, f.cos, f.sin, negative); });
  EXPECT_TRUE(contains_all(msg2, {"positions", "-1", "32"}));

  // The bound itself is out of range: [0, max_seq_len).
  const auto at_bound = torch::tensor({32}, torch::kLong);
  const auto msg3 = error_message([&] { rope::apply(f.x, f.cos, f.sin, at_bound); });
  EXPECT_TRUE(contains_all(msg3, {"got 32"}));

  // apply_qk checks them too.
  const auto msg4 =
      error_message([&] { rope::apply_qk(f.x, f.x, f.cos, f.sin, too_big); });
  EXPECT_TRUE(contains_all(msg4, {"rope.apply_qk", "40"}));
}

TEST(Errors, IntegerX) {
  Fixture f;
  for (const auto dtype : {torch::kInt, torch::kLong}) {
    const auto x = torch::ones({2, 3, 5, 16}, dtype);
    const auto msg = error_message([&] { rope::apply(x, f.cos, f.sin, f.positions); });
    EXPECT_TRUE(contains_all(msg, {"x", "floating", dtype == torch::kInt ? "Int" : "Long"}));
  }
}

TEST(Errors, ZeroDimX) {
  Fixture f;
  const auto x = torch::tensor(1.0);
  const auto msg = error_message([&] { rope::apply(x, f.cos, f.sin, f.positions); });
  EXPECT_TRUE(contains_all(msg, {"x", "at least 1 dim"}));
}

TEST(Errors, CosSinShapeMismatch) {
  Fixture f;
  const auto sin = torch::rand({32, 4});
  const auto msg = error_message([&] { rope::apply(f.x, f.cos, sin, f.positions); });
  EXPECT_TRUE(contains_all(msg, {"cos", "sin", "same shape", "[32, 8]", "[32, 4]"}));
}

TEST(Errors, CosNotATable) {
  Fixture f;
  const auto cos = torch::rand({32 * 8});
  const auto msg = error_message([&] { rope::apply(f.x, cos, cos, f.positions); });
  EXPECT_TRUE(contains_all(msg, {"cos", "2-D", "[256]"}));
}

TEST(Errors, HalfPrecisionTables) {
  Fixture f;
  for (const auto dtype : {torch::kHalf, torch::kBFloat16}) {
    const auto cos = f.cos.to(dtype);
    const auto sin = f.sin.to(dtype);
    const auto msg = error_message([&] { rope::apply(f.x, cos, sin, f.positions); });
    EXPECT_TRUE(contains_all(msg, {"cos", "float32 or float64",
                                   dtype == torch::kHalf ? "Half" : "BFloat16"}));
  }
}

TEST(Errors, CosSinDtypeMismatch) {
  Fixture f;
  const auto sin = f.sin.to(torch::kDouble);
  const auto msg = error_message([&] { rope::apply(f.x, f.cos, sin, f.positions); });
  EXPECT_TRUE(contains_all(msg, {"cos", "sin", "same dtype", "Float", "Double"}));
}

TEST(Errors, ApplyQkNamesTheOffendingArgument) {
  Fixture f;
  const auto q = torch::randn({2, 8, 5, 16});
  // k's heads do not match positions of shape (8, 5), q's do.
  const auto k = torch::randn({2, 2, 5, 16});
  const auto positions = torch::zeros({8, 5}, torch::kLong);
  const auto msg = error_message([&] { rope::apply_qk(q, k, f.cos, f.sin, positions); });
  EXPECT_TRUE(contains_all(msg, {"rope.apply_qk", "k.shape[:-1]", "[8, 5]"}));

  const auto short_k = torch::randn({2, 2, 5, 8});
  const auto msg2 = error_message([&] { rope::apply_qk(q, short_k, f.cos, f.sin, f.positions); });
  EXPECT_TRUE(contains_all(msg2, {"k.size(-1)", "got 8"}));

  const auto double_k = torch::randn({2, 2, 5, 16}, torch::kDouble);
  const auto msg3 = error_message([&] { rope::apply_qk(q, double_k, f.cos, f.sin, f.positions); });
  EXPECT_TRUE(contains_all(msg3, {"same dtype", "Float", "Double"}));

  const auto wide_k = torch::randn({2, 2, 5, 24});
  const auto msg4 = error_message([&] { rope::apply_qk(q, wide_k, f.cos, f.sin, f.positions); });
  EXPECT_TRUE(contains_all(msg4, {"head_dim", "16", "24"}));

  const auto int_q = torch::ones({2, 8, 5, 16}, torch::kInt);
  const auto msg5 = error_message([&] { rope::apply_qk(int_q, k, f.cos, f.sin, f.positions); });
  EXPECT_TRUE(contains_all(msg5, {"q must be a floating tensor", "Int"}));
}

TEST(Errors, InPlaceOnOverlappingMemory) {
  Fixture f;
  auto x = torch::randn({1, 1, 5, 16}).expand({2, 3, 5, 16});
  const auto msg = error_message([&] { rope::apply_(x, f.cos, f.sin, f.positions); });
  EXPECT_TRUE(contains_all(msg, {"rope.apply_", "overlapping memory"}));
}

TEST(Errors, FailedInPlaceCallWritesNothing) {
  Fixture f;
  const std::vector<std::pair<std::string, std::function<void(torch::Tensor&)>>> bad_calls = {
      {"positions out of range",
       [&](torch::Tensor& x) {
         // Every position but the last is valid: a kernel that ran before the check would have
         // written most of x.
         rope::apply_(x, f.cos, f.sin, torch::tensor({0, 1, 2, 3, 99}, torch::kLong));
       }},
      {"negative position",
       [&](torch::Tensor& x) {
         rope::apply_(x, f.cos, f.sin, torch::tensor({0, 1, 2, 3, -2}, torch::kInt));
       }},
      {"float positions",
       [&](torch::Tensor& x) { rope::apply_(x, f.cos, f.sin, torch::arange(5, torch::kFloat)); }},
      {"positions not broadcastable",
       [&](torch::Tensor& x) { rope::apply_(x, f.cos, f.sin, torch::arange(3, torch::kLong)); }},
      {"cos/sin shape mismatch",
       [&](torch::Tensor& x) { rope::apply_(x, f.cos, f.sin.narrow(1, 0, 4), f.positions); }},
      {"half tables",
       [&](torch::Tensor& x) {
         rope::apply_(x, f.cos.to(torch::kHalf), f.sin.to(torch::kHalf), f.positions);
       }},
      {"head_dim < rotary_dim",
       [&](torch::Tensor& x) {
         auto narrow = x.narrow(-1, 0, 12);
         rope::apply_(narrow, f.cos, f.sin, f.positions);
       }},
  };
  for (const auto& [name, call] : bad_calls) {
    for (const bool sliced : {false, true}) {
      SCOPED_TRACE(name + (sliced ? " (non-unit last-dim stride)" : ""));
      auto base = torch::randn({2, 3, 16, 5});
      auto x = sliced ? base.transpose(-1, -2) : base.reshape({2, 3, 5, 16});
      const auto before = base.clone();
      EXPECT_THROW(call(x), c10::Error);
      EXPECT_TRUE(torch::equal(base, before)) << "x was modified by a failed call";
    }
  }
}

TEST(Errors, FailedInPlaceCallWithGradWritesNothing) {
  Fixture f;
  const auto leaf = torch::randn({2, 3, 5, 16}, torch::requires_grad());
  auto x = leaf * 1.0;  // non-leaf: the autograd path of apply_
  const auto before = x.detach().clone();
  EXPECT_THROW(rope::apply_(x, f.cos, f.sin, torch::tensor({0, 1, 2, 3, 77}, torch::kLong)),
               c10::Error);
  EXPECT_TRUE(torch::equal(x.detach(), before));
}

TEST(Errors, TablesValidateTheirArguments) {
  const auto msg = error_message([] { rope::rope_tables(10000.0, 7, 16); });
  EXPECT_TRUE(contains_all(msg, {"rotary_dim", "even", "7"}));
  const auto msg2 = error_message([] { rope::rope_tables(10000.0, 0, 16); });
  EXPECT_TRUE(contains_all(msg2, {"rotary_dim", "got 0"}));
  const auto msg3 = error_message([] { rope::rope_tables(10000.0, 8, 0); });
  EXPECT_TRUE(contains_all(msg3, {"max_seq_len", "got 0"}));
  const auto msg4 = error_message([] { rope::rope_tables(-1.0, 8, 16); });
  EXPECT_TRUE(contains_all(msg4, {"theta", "-1"}));
  const auto msg5 = error_message([] { rope::rope_tables(0.0, 8, 16); });
  EXPECT_TRUE(contains_all(msg5, {"theta", "got 0"}));
}

}  // namespace
