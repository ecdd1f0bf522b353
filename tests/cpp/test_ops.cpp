// rope::apply, rope::apply_ and rope::apply_qk on the CPU, called through the dispatcher from C++,
// against the independent scalar reference of reference.h.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch_rope/ops.h>

#include <cmath>
#include <string>
#include <tuple>

#include "inputs.h"
#include "reference.h"

namespace {

using rope_test::all_close;
using rope_test::bitwise_equal;
using rope_test::Layout;
using rope_test::reference_rope;
using rope_test::reference_tables;
using rope_test::Tolerance;

constexpr int64_t kMaxSeqLen = 64;

// ---- every dtype x layout x (head_dim, rotary_dim) x interleaved x inverse ------------------

class ApplyVsReference : public ::testing::TestWithParam<torch::Dtype> {};

TEST_P(ApplyVsReference, MatchesScalarReference) {
  const torch::Dtype dtype = GetParam();
  torch::manual_seed(0);
  for (const auto layout : {Layout::kBHSD, Layout::kBSHD, Layout::kPacked}) {
    for (const auto& shape : rope_test::rotary_shapes()) {
      const auto tables = reference_tables(kMaxSeqLen, shape.rotary_dim);
      const auto sample = rope_test::make_sample(layout, shape.head_dim, dtype, kMaxSeqLen);
      for (const bool interleaved : {true, false}) {
        for (const bool inverse : {false, true}) {
          SCOPED_TRACE(rope_test::layout_name(layout) + ", head_dim " +
                       std::to_string(shape.head_dim) + ", rotary_dim " +
                       std::to_string(shape.rotary_dim) + ", interleaved " +
                       std::to_string(interleaved) + ", inverse " + std::to_string(inverse));
          const auto x_before = sample.x.clone();
          const auto out = rope::apply(sample.x, tables.cos, tables.sin, sample.positions,
                                       interleaved, inverse);
          EXPECT_EQ(out.sizes(), sample.x.sizes());
          EXPECT_EQ(out.scalar_type(), dtype);
          EXPECT_TRUE(out.is_contiguous());
          EXPECT_NE(out.data_ptr(), sample.x.data_ptr());
          EXPECT_TRUE(bitwise_equal(sample.x, x_before)) << "apply modified its input";
          EXPECT_TRUE(all_close(out, reference_rope(sample.x, tables.cos, tables.sin,
                                                    sample.positions, interleaved, inverse),
                                dtype));
          // Features past rotary_dim are copied, not recomputed.
          const int64_t tail = shape.head_dim - shape.rotary_dim;
          EXPECT_TRUE(bitwise_equal(out.narrow(-1, shape.rotary_dim, tail),
                                    sample.x.narrow(-1, shape.rotary_dim, tail)));
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ApplyVsReference,
                         ::testing::Values(torch::kFloat, torch::kDouble, torch::kHalf,
                                           torch::kBFloat16),
                         [](const ::testing::TestParamInfo<torch::Dtype>& info) {
                           return rope_test::dtype_name(info.param);
                         });

// ---- tables and positions -------------------------------------------------------------------

TEST(ApplyOps, ArbitraryTablesMatchReference) {
  // Non-trigonometric tables catch swapped cos/sin and wrong table columns.
  torch::manual_seed(1);
  for (const auto table_dtype : {torch::kFloat, torch::kDouble}) {
    const auto tables = rope_test::random_tables(kMaxSeqLen, 48, table_dtype);
    for (const auto dtype : {torch::kFloat, torch::kDouble, torch::kBFloat16}) {
      const auto sample = rope_test::make_sample(Layout::kBHSD, 64, dtype, kMaxSeqLen);
      for (const bool interleaved : {true, false}) {
        for (const bool inverse : {false, true}) {
          SCOPED_TRACE(rope_test::dtype_name(dtype) + " x, " + rope_test::dtype_name(table_dtype) +
                       " tables, interleaved " + std::to_string(interleaved) + ", inverse " +
                       std::to_string(inverse));
          const auto out = rope::apply(sample.x, tables.cos, tables.sin, sample.positions,
                                       interleaved, inverse);
          // Unit-free tables make outputs larger than |x|: loosen only the absolute part.
          auto tol = rope_test::tolerance_for(dtype);
          tol.atol *= 4;
          EXPECT_TRUE(all_close(out,
                                reference_rope(sample.x, tables.cos, tables.sin, sample.positions,
                                               interleaved, inverse),
                                tol));
        }
      }
    }
  }
}

TEST(ApplyOps, Float64TablesMatchReference) {
  torch::manual_seed(2);
  const auto tables = reference_tables(kMaxSeqLen, 32, 10000.0, torch::kDouble);
  for (const auto dtype : {torch::kFloat, torch::kDouble, torch::kHalf}) {
    const auto sample = rope_test::make_sample(Layout::kBSHD, 32, dtype, kMaxSeqLen);
    for (const bool interleaved : {true, false}) {
      const auto out =
          rope::apply(sample.x, tables.cos, tables.sin, sample.positions, interleaved);
      EXPECT_TRUE(all_close(
          out, reference_rope(sample.x, tables.cos, tables.sin, sample.positions, interleaved),
          dtype))
          << rope_test::dtype_name(dtype) << ", interleaved " << interleaved;
    }
  }
}

TEST(ApplyOps, KnownRotationOfUnitVector) {
  // Plane 0 has inv_freq = 1, so e_0 at position p becomes cos(p) e_a + sin(p) e_b.
  auto [cos, sin] = rope::rope_tables(10000.0, 8, 32);
  const int64_t p = 7;
  auto x = torch::zeros({8}, torch::kDouble);
  x[0] = 1.0;
  const auto positions = torch::tensor(p, torch::kLong);  // 0-dim: broadcasts to the single row

  const auto a = rope::apply(x, cos, sin, positions, /*interleaved=*/true);
  EXPECT_NEAR(a[0].item<double>(), std::cos(7.0), 1e-7);
  EXPECT_NEAR(a[1].item<double>(), std::sin(7.0), 1e-7);
  EXPECT_EQ(a.slice(0, 2).abs().sum().item<double>(), 0.0);

  const auto b = rope::apply(x, cos, sin, positions, /*interleaved=*/false);
  EXPECT_NEAR(b[0].item<double>(), std::cos(7.0), 1e-7);
  EXPECT_NEAR(b[4].item<double>(), std::sin(7.0), 1e-7);  // partner of feature 0 is rotary_dim/2
  EXPECT_EQ(b.slice(0, 1, 4).abs().sum().item<double>() + b.slice(0, 5).abs().sum().item<double>(),
            0.0);

  const auto c = rope::apply(x, cos, sin, positions, /*interleaved=*/true, /*inverse=*/true);
  EXPECT_NEAR(c[1].item<double>(), -std::sin(7.0), 1e-7);
}

TEST(ApplyOps, PerSequencePositions) {
  // (B, 1, S) positions for (B, H, S, D): each sequence has its own offsets.
  torch::manual_seed(3);
  const auto tables = reference_tables(kMaxSeqLen, 16);
  const auto x = torch::randn({3, 4, 5, 16});
  const auto positions = torch::randint(0, kMaxSeqLen, {3, 1, 5}, torch::kLong);
  for (const bool interleaved : {true, false}) {
    EXPECT_TRUE(all_close(rope::apply(x, tables.cos, tables.sin, positions, interleaved),
                          reference_rope(x, tables.cos, tables.sin, positions, interleaved),
                          torch::kFloat));
  }
  // (B, S, 1) positions for (B, S, H, D).
  const auto y = torch::randn({3, 5, 4, 16});
  const auto pos_bs1 = torch::randint(0, kMaxSeqLen, {3, 5, 1}, torch::kInt);
  EXPECT_TRUE(all_close(rope::apply(y, tables.cos, tables.sin, pos_bs1),
                        reference_rope(y, tables.cos, tables.sin, pos_bs1), torch::kFloat));
}

TEST(ApplyOps, FullyExpandedAndScalarPositions) {
  torch::manual_seed(4);
  const auto tables = reference_tables(kMaxSeqLen, 16);
  const auto x = torch::randn({2, 3, 5, 16});
  const auto full = torch::randint(0, kMaxSeqLen, {2, 3, 5}, torch::kLong);
  EXPECT_TRUE(all_close(rope::apply(x, tables.cos, tables.sin, full),
                        reference_rope(x, tables.cos, tables.sin, full), torch::kFloat));
  const auto scalar = torch::tensor(11, torch::kLong);
  EXPECT_TRUE(all_close(rope::apply(x, tables.cos, tables.sin, scalar),
                        reference_rope(x, tables.cos, tables.sin, scalar), torch::kFloat));
  // Positions given as a non-contiguous view.
  const auto strided = torch::randint(0, kMaxSeqLen, {10}, torch::kLong).slice(0, 0, 10, 2);
  EXPECT_TRUE(all_close(rope::apply(x, tables.cos, tables.sin, strided),
                        reference_rope(x, tables.cos, tables.sin, strided), torch::kFloat));
}

TEST(ApplyOps, Int32AndInt64PositionsAgree) {
  torch::manual_seed(5);
  const auto tables = reference_tables(kMaxSeqLen, 32);
  for (const auto layout : {Layout::kBHSD, Layout::kBSHD, Layout::kPacked}) {
    const auto sample = rope_test::make_sample(layout, 32, torch::kFloat, kMaxSeqLen);
    const auto p32 = sample.positions.to(torch::kInt);
    const auto out64 = rope::apply(sample.x, tables.cos, tables.sin, sample.positions);
    const auto out32 = rope::apply(sample.x, tables.cos, tables.sin, p32);
    EXPECT_TRUE(bitwise_equal(out32, out64)) << rope_test::layout_name(layout);
    EXPECT_TRUE(all_close(out32, reference_rope(sample.x, tables.cos, tables.sin, p32),
                          torch::kFloat));
  }
}

TEST(ApplyOps, LastPositionOfTableIsValid) {
  const auto tables = reference_tables(kMaxSeqLen, 16);
  const auto x = torch::randn({1, 2, 16});
  const auto positions = torch::tensor({int64_t{0}, kMaxSeqLen - 1}, torch::kLong);
  EXPECT_TRUE(all_close(rope::apply(x, tables.cos, tables.sin, positions),
                        reference_rope(x, tables.cos, tables.sin, positions), torch::kFloat));
}

TEST(ApplyOps, DecodeWithStartOffsetMatchesFullSequence) {
  // KV-cache decode: rotating the last tokens with start_pos + arange(n) gives exactly the rows
  // the full-sequence call gives.
  torch::manual_seed(6);
  const auto tables = reference_tables(kMaxSeqLen, 32);
  const int64_t S = 12;
  const auto x = torch::randn({2, 4, S, 32});
  const auto full = rope::apply(x, tables.cos, tables.sin, torch::arange(S, torch::kLong));
  const int64_t start = 9;
  const auto tail = rope::apply(x.slice(2, start), tables.cos, tables.sin,
                                torch::arange(start, S, torch::kLong));
  EXPECT_TRUE(bitwise_equal(tail, full.slice(2, start)));
}

TEST(ApplyOps, TablesGivenAsViews) {
  // vLLM-style fused cache [cos | sin] of shape (max_seq_len, rotary_dim): both tables are column
  // slices with row stride rotary_dim, read in place.
  torch::manual_seed(19);
  const auto tables = reference_tables(kMaxSeqLen, 32);
  const auto cache = torch::cat({tables.cos, tables.sin}, 1);
  const auto cos = cache.narrow(1, 0, 16);
  const auto sin = cache.narrow(1, 16, 16);
  ASSERT_EQ(cos.stride(0), 32);
  const auto x = torch::randn({2, 3, 5, 40});
  const auto positions = torch::randint(0, kMaxSeqLen, {5}, torch::kLong);
  for (const bool interleaved : {true, false}) {
    const auto expected = reference_rope(x, tables.cos, tables.sin, positions, interleaved);
    EXPECT_TRUE(all_close(rope::apply(x, cos, sin, positions, interleaved), expected,
                          torch::kFloat));
    // Transposed storage (last-dim stride != 1) and tables of different layouts.
    const auto cos_t = tables.cos.t().contiguous().t();
    ASSERT_NE(cos_t.stride(1), 1);
    EXPECT_TRUE(all_close(rope::apply(x, cos_t, sin, positions, interleaved), expected,
                          torch::kFloat));
    EXPECT_TRUE(all_close(rope::apply(x, tables.cos, sin, positions, interleaved), expected,
                          torch::kFloat));
  }
  // A prefix of the rows is a shorter table: max_seq_len comes from its size.
  const auto short_cos = cos.narrow(0, 0, 6);
  const auto short_sin = sin.narrow(0, 0, 6);
  const auto p6 = torch::tensor({5, 0, 3, 1, 2}, torch::kLong);
  EXPECT_TRUE(all_close(rope::apply(x, short_cos, short_sin, p6),
                        reference_rope(x, tables.cos, tables.sin, p6), torch::kFloat));
  EXPECT_THROW(rope::apply(x, short_cos, short_sin, positions.clamp_min(6)), c10::IndexError);
}

TEST(ApplyOps, SingleRowTable) {
  // max_seq_len 1: a table whose row stride is never stepped, here from a strided view.
  torch::manual_seed(20);
  const auto tables = reference_tables(8, 16);
  const auto cos = tables.cos.narrow(0, 3, 1);
  const auto sin = tables.sin.narrow(0, 3, 1);
  const auto x = torch::randn({2, 4, 3, 16});
  const auto zeros = torch::zeros({3}, torch::kLong);
  const auto threes = torch::full({3}, 3, torch::kLong);
  for (const bool interleaved : {true, false}) {
    EXPECT_TRUE(all_close(rope::apply(x, cos, sin, zeros, interleaved),
                          reference_rope(x, tables.cos, tables.sin, threes, interleaved),
                          torch::kFloat));
  }
}

TEST(ApplyOps, ExpandedPositionsInput) {
  // Positions already expanded by the caller (stride-0 dims) behave like their compact form.
  torch::manual_seed(21);
  const auto tables = reference_tables(kMaxSeqLen, 16);
  const auto x = torch::randn({2, 3, 5, 16});
  const auto compact = torch::randint(0, kMaxSeqLen, {5}, torch::kInt);
  const auto expanded = compact.expand({2, 3, 5});
  EXPECT_TRUE(bitwise_equal(rope::apply(x, tables.cos, tables.sin, expanded),
                            rope::apply(x, tables.cos, tables.sin, compact)));
}

// ---- layouts the caller already has ---------------------------------------------------------

TEST(ApplyOps, StridedSliceOfFusedQkv) {
  // q, k, v sliced out of one (B, S, 3, H, D) projection: last dim contiguous, other dims not.
  torch::manual_seed(7);
  const auto tables = reference_tables(kMaxSeqLen, 48);
  const auto qkv = torch::randn({2, 5, 3, 4, 64});
  const auto qkv_before = qkv.clone();
  const auto q = qkv.select(2, 0);
  const auto k = qkv.select(2, 1);
  ASSERT_FALSE(q.is_contiguous());
  const auto positions = torch::randint(0, kMaxSeqLen, {5, 1}, torch::kLong);
  for (const bool interleaved : {true, false}) {
    const auto q_out = rope::apply(q, tables.cos, tables.sin, positions, interleaved);
    EXPECT_TRUE(q_out.is_contiguous());
    EXPECT_TRUE(all_close(q_out, reference_rope(q, tables.cos, tables.sin, positions, interleaved),
                          torch::kFloat));
    const auto [q2, k2] = rope::apply_qk(q, k, tables.cos, tables.sin, positions, interleaved);
    EXPECT_TRUE(bitwise_equal(q2, q_out));
    EXPECT_TRUE(all_close(k2, reference_rope(k, tables.cos, tables.sin, positions, interleaved),
                          torch::kFloat));
  }
  EXPECT_TRUE(bitwise_equal(qkv, qkv_before));
}

TEST(ApplyOps, TransposedInput) {
  // (B, S, H, D) storage viewed as (B, H, S, D), positions (S,).
  torch::manual_seed(8);
  const auto tables = reference_tables(kMaxSeqLen, 32);
  const auto x = torch::randn({2, 6, 3, 32}).transpose(1, 2);
  ASSERT_FALSE(x.is_contiguous());
  const auto positions = torch::randint(0, kMaxSeqLen, {6}, torch::kLong);
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    const auto xd = x.to(dtype);  // keeps the transposed strides
    for (const bool interleaved : {true, false}) {
      const auto out = rope::apply(xd, tables.cos, tables.sin, positions, interleaved);
      EXPECT_TRUE(out.is_contiguous());
      EXPECT_TRUE(
          all_close(out, reference_rope(xd, tables.cos, tables.sin, positions, interleaved), dtype));
    }
  }
}

TEST(ApplyOps, NonUnitLastDimStride) {
  // The one layout that is copied: features not adjacent in memory.
  torch::manual_seed(9);
  const auto tables = reference_tables(kMaxSeqLen, 16);
  const auto base = torch::randn({2, 3, 24, 5});
  const auto x = base.transpose(-1, -2);  // (2, 3, 5, 24), stride(-1) == 5
  ASSERT_NE(x.stride(-1), 1);
  const auto positions = torch::randint(0, kMaxSeqLen, {5}, torch::kLong);
  for (const bool interleaved : {true, false}) {
    const auto expected = reference_rope(x, tables.cos, tables.sin, positions, interleaved);
    EXPECT_TRUE(
        all_close(rope::apply(x, tables.cos, tables.sin, positions, interleaved), expected,
                  torch::kFloat));
    // In place writes back through the view into base's storage.
    auto base_copy = base.clone();
    auto view = base_copy.transpose(-1, -2);
    rope::apply_(view, tables.cos, tables.sin, positions, interleaved);
    EXPECT_TRUE(all_close(view, expected, torch::kFloat));
    EXPECT_TRUE(all_close(base_copy.transpose(-1, -2), expected, torch::kFloat));
  }
}

TEST(ApplyOps, LargeStridedInputSpansThreads) {
  // Enough rows for at::parallel_for to split them, in a layout whose chunks start mid-dim.
  torch::manual_seed(10);
  const auto tables = reference_tables(1024, 16);
  const auto qkv = torch::randn({3, 700, 3, 2, 16});
  const auto q = qkv.select(2, 2);
  const auto positions = torch::randint(0, 1024, {700, 1}, torch::kInt);
  for (const bool interleaved : {true, false}) {
    EXPECT_TRUE(all_close(rope::apply(q, tables.cos, tables.sin, positions, interleaved),
                          reference_rope(q, tables.cos, tables.sin, positions, interleaved),
                          torch::kFloat));
  }
}

TEST(ApplyOps, SingleRowAndMinimalHeadDim) {
  const auto tables = reference_tables(8, 2);
  const auto x = torch::randn({2}, torch::kDouble);
  const auto positions = torch::tensor(5, torch::kLong);
  EXPECT_TRUE(all_close(rope::apply(x, tables.cos, tables.sin, positions),
                        reference_rope(x, tables.cos, tables.sin, positions), torch::kDouble));
  const auto y = torch::randn({4, 2, 2});
  const auto p = torch::tensor({1, 3}, torch::kLong);
  EXPECT_TRUE(all_close(rope::apply(y, tables.cos, tables.sin, p, false),
                        reference_rope(y, tables.cos, tables.sin, p, false), torch::kFloat));
}

// ---- in place, qk, inverse, empty -------------------------------------------------------------

TEST(ApplyOps, InPlaceEqualsOutOfPlace) {
  torch::manual_seed(11);
  for (const auto& shape : rope_test::rotary_shapes()) {
    const auto tables = reference_tables(kMaxSeqLen, shape.rotary_dim);
    for (const auto dtype : {torch::kFloat, torch::kDouble, torch::kHalf, torch::kBFloat16}) {
      for (const bool interleaved : {true, false}) {
        for (const bool inverse : {false, true}) {
          SCOPED_TRACE(rope_test::dtype_name(dtype) + ", head_dim " +
                       std::to_string(shape.head_dim) + ", rotary_dim " +
                       std::to_string(shape.rotary_dim) + ", interleaved " +
                       std::to_string(interleaved) + ", inverse " + std::to_string(inverse));
          const auto sample =
              rope_test::make_sample(Layout::kBSHD, shape.head_dim, dtype, kMaxSeqLen);
          const auto expected = rope::apply(sample.x, tables.cos, tables.sin, sample.positions,
                                            interleaved, inverse);
          auto x = sample.x.clone();
          const void* storage = x.data_ptr();
          rope::apply_(x, tables.cos, tables.sin, sample.positions, interleaved, inverse);
          EXPECT_EQ(x.data_ptr(), storage);
          EXPECT_TRUE(bitwise_equal(x, expected));
        }
      }
    }
  }
}

TEST(ApplyOps, InPlaceOnSliceTouchesOnlyTheSlice) {
  torch::manual_seed(12);
  const auto tables = reference_tables(kMaxSeqLen, 24);
  auto qkv = torch::randn({2, 5, 3, 4, 32});
  const auto before = qkv.clone();
  const auto positions = torch::randint(0, kMaxSeqLen, {5, 1}, torch::kLong);
  auto k = qkv.select(2, 1);
  const auto expected = rope::apply(k, tables.cos, tables.sin, positions);
  rope::apply_(k, tables.cos, tables.sin, positions);
  EXPECT_TRUE(bitwise_equal(qkv.select(2, 1), expected));
  EXPECT_TRUE(bitwise_equal(qkv.select(2, 0), before.select(2, 0)));
  EXPECT_TRUE(bitwise_equal(qkv.select(2, 2), before.select(2, 2)));
  // The pass-through features of the rotated slice are untouched too.
  EXPECT_TRUE(bitwise_equal(qkv.select(2, 1).narrow(-1, 24, 8), before.select(2, 1).narrow(-1, 24, 8)));
}

TEST(ApplyOps, ApplyOutWritesAStridedSlotAndReturnsIt) {
  // The C++ out= API: a KV-cache slot (non-contiguous view) receives apply()'s result.
  const auto tables = reference_tables(kMaxSeqLen, 16);
  auto cache = torch::full({2, 16, 3, 24}, 7.0);
  const auto k = torch::randn({2, 4, 3, 24});
  const auto positions = (5 + torch::arange(4)).view({4, 1});
  auto slot = cache.slice(1, 5, 9);
  at::Tensor& returned = rope::apply_out(slot, k, tables.cos, tables.sin, positions, false);
  EXPECT_TRUE(returned.is_same(slot));
  EXPECT_TRUE(torch::equal(slot, rope::apply(k, tables.cos, tables.sin, positions, false)));
  EXPECT_TRUE((cache.slice(1, 0, 5) == 7.0).all().item<bool>());
  EXPECT_TRUE((cache.slice(1, 9, 16) == 7.0).all().item<bool>());
  // Not differentiable, as aten's out= ops.
  const auto x = torch::randn({2, 4, 3, 24}, torch::requires_grad());
  EXPECT_THROW(rope::apply_out(slot, x, tables.cos, tables.sin, positions), c10::Error);
}

TEST(ApplyOps, ApplyQkGqaEqualsTwoApplies) {
  torch::manual_seed(13);
  for (const auto dtype : {torch::kFloat, torch::kBFloat16, torch::kDouble}) {
    for (const auto& shape : {rope_test::RotaryShape{64, 64}, rope_test::RotaryShape{64, 32}}) {
      const auto tables = reference_tables(kMaxSeqLen, shape.rotary_dim);
      for (const bool interleaved : {true, false}) {
        for (const bool inverse : {false, true}) {
          SCOPED_TRACE(rope_test::dtype_name(dtype) + ", rotary_dim " +
                       std::to_string(shape.rotary_dim) + ", interleaved " +
                       std::to_string(interleaved) + ", inverse " + std::to_string(inverse));
          // (B, H, S, D) with positions (S,)
          auto q = torch::randn({2, 8, 5, shape.head_dim}, dtype);
          auto k = torch::randn({2, 2, 5, shape.head_dim}, dtype);
          auto positions = torch::randint(0, kMaxSeqLen, {5}, torch::kLong);
          auto [qo, ko] =
              rope::apply_qk(q, k, tables.cos, tables.sin, positions, interleaved, inverse);
          EXPECT_TRUE(bitwise_equal(
              qo, rope::apply(q, tables.cos, tables.sin, positions, interleaved, inverse)));
          EXPECT_TRUE(bitwise_equal(
              ko, rope::apply(k, tables.cos, tables.sin, positions, interleaved, inverse)));
          EXPECT_TRUE(all_close(
              ko, reference_rope(k, tables.cos, tables.sin, positions, interleaved, inverse),
              dtype));

          // (B, S, H, D) with positions (S, 1), and packed (T, H, D) with (T, 1)
          q = torch::randn({2, 5, 8, shape.head_dim}, dtype);
          k = torch::randn({2, 5, 2, shape.head_dim}, dtype);
          positions = torch::randint(0, kMaxSeqLen, {5, 1}, torch::kInt);
          std::tie(qo, ko) =
              rope::apply_qk(q, k, tables.cos, tables.sin, positions, interleaved, inverse);
          EXPECT_TRUE(bitwise_equal(
              qo, rope::apply(q, tables.cos, tables.sin, positions, interleaved, inverse)));
          EXPECT_TRUE(bitwise_equal(
              ko, rope::apply(k, tables.cos, tables.sin, positions, interleaved, inverse)));
          EXPECT_EQ(qo.sizes(), q.sizes());
          EXPECT_EQ(ko.sizes(), k.sizes());
        }
      }
    }
  }
}

TEST(ApplyOps, ApplyQkPackedDifferentHeadCounts) {
  torch::manual_seed(14);
  const auto tables = reference_tables(kMaxSeqLen, 32);
  const auto q = torch::randn({9, 8, 32});
  const auto k = torch::randn({9, 2, 32});
  const auto positions = torch::randint(0, kMaxSeqLen, {9, 1}, torch::kLong);
  const auto [qo, ko] = rope::apply_qk(q, k, tables.cos, tables.sin, positions);
  EXPECT_TRUE(all_close(qo, reference_rope(q, tables.cos, tables.sin, positions), torch::kFloat));
  EXPECT_TRUE(all_close(ko, reference_rope(k, tables.cos, tables.sin, positions), torch::kFloat));
}

TEST(ApplyOps, InverseUndoesForward) {
  torch::manual_seed(15);
  for (const auto dtype : {torch::kDouble, torch::kFloat}) {
    const auto tables = reference_tables(kMaxSeqLen, 48, 10000.0, dtype);
    for (const auto layout : {Layout::kBHSD, Layout::kBSHD, Layout::kPacked}) {
      const auto sample = rope_test::make_sample(layout, 64, dtype, kMaxSeqLen);
      for (const bool interleaved : {true, false}) {
        const auto fwd = rope::apply(sample.x, tables.cos, tables.sin, sample.positions, interleaved);
        const auto back = rope::apply(fwd, tables.cos, tables.sin, sample.positions, interleaved,
                                      /*inverse=*/true);
        const Tolerance tol = dtype == torch::kDouble ? Tolerance{1e-12, 1e-12}
                                                      : Tolerance{1e-5, 1e-5};
        EXPECT_TRUE(all_close(back, sample.x, tol))
            << rope_test::dtype_name(dtype) << " " << rope_test::layout_name(layout)
            << ", interleaved " << interleaved;
        // And the other way round.
        const auto inv = rope::apply(sample.x, tables.cos, tables.sin, sample.positions,
                                     interleaved, /*inverse=*/true);
        EXPECT_TRUE(all_close(rope::apply(inv, tables.cos, tables.sin, sample.positions,
                                          interleaved),
                              sample.x, tol));
      }
    }
  }
}

TEST(ApplyOps, EmptyInputReturnsEmpty) {
  const auto tables = reference_tables(kMaxSeqLen, 16);
  struct EmptyCase {
    std::vector<int64_t> x_shape;
    std::vector<int64_t> pos_shape;
  };
  const std::vector<EmptyCase> cases = {
      {{2, 0, 5, 16}, {5}}, {{2, 3, 0, 16}, {0}}, {{0, 4, 16}, {0, 1}}, {{0, 16}, {0}}};
  for (const auto& c : cases) {
    SCOPED_TRACE(::testing::PrintToString(c.x_shape));
    const auto x = torch::randn(c.x_shape);
    const auto positions = torch::zeros(c.pos_shape, torch::kLong);
    const auto out = rope::apply(x, tables.cos, tables.sin, positions);
    EXPECT_EQ(out.sizes(), x.sizes());
    EXPECT_EQ(out.numel(), 0);
    EXPECT_EQ(out.scalar_type(), x.scalar_type());
    auto y = x.clone();
    rope::apply_(y, tables.cos, tables.sin, positions);
    EXPECT_EQ(y.sizes(), x.sizes());
    const auto [qo, ko] = rope::apply_qk(x, x, tables.cos, tables.sin, positions);
    EXPECT_EQ(qo.sizes(), x.sizes());
    EXPECT_EQ(ko.sizes(), x.sizes());
  }
  // Empty positions never index the table, so even a value check has nothing to reject.
  const auto x = torch::randn({2, 3, 0, 16});
  EXPECT_EQ(rope::apply(x, tables.cos, tables.sin, torch::empty({0}, torch::kInt)).numel(), 0);
}

TEST(ApplyOps, ApplyQkWithOneEmptyTensor) {
  torch::manual_seed(16);
  const auto tables = reference_tables(kMaxSeqLen, 16);
  const auto q = torch::randn({2, 4, 5, 16});
  const auto k = torch::randn({2, 0, 5, 16});
  const auto positions = torch::randint(0, kMaxSeqLen, {5}, torch::kLong);
  const auto [qo, ko] = rope::apply_qk(q, k, tables.cos, tables.sin, positions);
  EXPECT_TRUE(all_close(qo, reference_rope(q, tables.cos, tables.sin, positions), torch::kFloat));
  EXPECT_EQ(ko.sizes(), k.sizes());
}

// ---- properties of the rotation (DESIGN.md section 1) ---------------------------------------

TEST(RotationProperties, PreservesNorms) {
  torch::manual_seed(17);
  const auto tables = reference_tables(kMaxSeqLen, 64, 10000.0, torch::kDouble);
  const auto sample = rope_test::make_sample(Layout::kBHSD, 64, torch::kDouble, kMaxSeqLen);
  for (const bool interleaved : {true, false}) {
    const auto out = rope::apply(sample.x, tables.cos, tables.sin, sample.positions, interleaved);
    EXPECT_TRUE(all_close((out * out).sum(-1), (sample.x * sample.x).sum(-1),
                          Tolerance{1e-12, 1e-12}));
    EXPECT_FALSE(torch::allclose(out, sample.x));  // and it did rotate something
  }
}

TEST(RotationProperties, DotProductDependsOnlyOnRelativePosition) {
  // (R_i q) . (R_j k) is a function of i - j: shift both positions, the score stays.
  torch::manual_seed(18);
  const auto tables = reference_tables(kMaxSeqLen, 32, 10000.0, torch::kDouble);
  const auto q = torch::randn({32}, torch::kDouble);
  const auto k = torch::randn({32}, torch::kDouble);
  for (const bool interleaved : {true, false}) {
    auto score = [&](int64_t i, int64_t j) {
      const auto qi = rope::apply(q, tables.cos, tables.sin, torch::tensor(i), interleaved);
      const auto kj = rope::apply(k, tables.cos, tables.sin, torch::tensor(j), interleaved);
      return qi.dot(kj).item<double>();
    };
    for (const int64_t offset : {0, 3, -5}) {
      const double reference = score(20 + offset, 20);
      for (const int64_t shift : {-15, -7, 1, 12, 30}) {
        EXPECT_NEAR(score(20 + offset + shift, 20 + shift), reference, 1e-10)
            << "offset " << offset << ", shift " << shift << ", interleaved " << interleaved;
      }
    }
    // And it does depend on the offset (the test above is not vacuous).
    EXPECT_GT(std::abs(score(25, 20) - score(20, 20)), 1e-6);
  }
}

}  // namespace
