// SPDX-License-Identifier: BSD-3-Clause
// rope::detail::make_row_geometry: the dim merging that lets one kernel walk any strided x with
// 1 to 3 loop dims. Checked on hand-worked cases, then against brute-force addressing.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common_prepare.h"

namespace {

using rope::RowGeometry;
using rope::detail::make_row_geometry;

std::vector<int64_t> sizes_of(const RowGeometry& g) { return {g.row_sizes, g.row_sizes + g.ndim}; }
std::vector<int64_t> in_strides_of(const RowGeometry& g) {
  return {g.in_strides, g.in_strides + g.ndim};
}
std::vector<int64_t> out_strides_of(const RowGeometry& g) {
  return {g.out_strides, g.out_strides + g.ndim};
}
std::vector<int64_t> pos_strides_of(const RowGeometry& g) {
  return {g.pos_strides, g.pos_strides + g.ndim};
}

using V = std::vector<int64_t>;

TEST(RowGeometry, FullyContiguousMergesIntoOneDim) {
  // x (2, 3, 4, D=8) contiguous, positions (2, 3, 4) contiguous.
  const auto g = make_row_geometry({2, 3, 4}, {96, 32, 8}, {96, 32, 8}, {12, 4, 1});
  EXPECT_EQ(g.num_rows, 24);
  EXPECT_EQ(g.ndim, 1);
  EXPECT_EQ(sizes_of(g), V({24}));
  EXPECT_EQ(in_strides_of(g), V({8}));
  EXPECT_EQ(out_strides_of(g), V({8}));
  EXPECT_EQ(pos_strides_of(g), V({1}));
}

TEST(RowGeometry, BroadcastPositionsStaySeparate) {
  // (B, H, S, D=8) contiguous with positions (S,): B and H merge (positions stride 0 in both),
  // S cannot merge with them because positions step along S only.
  const auto g = make_row_geometry({2, 3, 4}, {96, 32, 8}, {96, 32, 8}, {0, 0, 1});
  EXPECT_EQ(g.num_rows, 24);
  EXPECT_EQ(g.ndim, 2);
  EXPECT_EQ(sizes_of(g), V({6, 4}));
  EXPECT_EQ(in_strides_of(g), V({32, 8}));
  EXPECT_EQ(out_strides_of(g), V({32, 8}));
  EXPECT_EQ(pos_strides_of(g), V({0, 1}));
}

TEST(RowGeometry, BshdWithPositionsS1) {
  // (B, S, H, D=8) contiguous with positions (S, 1): three dims, none mergeable.
  const auto g = make_row_geometry({2, 5, 4}, {160, 32, 8}, {160, 32, 8}, {0, 1, 0});
  EXPECT_EQ(g.ndim, 3);
  EXPECT_EQ(sizes_of(g), V({2, 5, 4}));
  EXPECT_EQ(pos_strides_of(g), V({0, 1, 0}));
}

TEST(RowGeometry, SizeOneDimsAreDropped) {
  // A size-1 dim may carry any stride; it must not block a merge or appear in the geometry.
  const auto g = make_row_geometry({2, 1, 4}, {32, 12345, 8}, {32, 999, 8}, {4, 7, 1});
  EXPECT_EQ(g.num_rows, 8);
  EXPECT_EQ(g.ndim, 1);
  EXPECT_EQ(sizes_of(g), V({8}));
  EXPECT_EQ(in_strides_of(g), V({8}));
  EXPECT_EQ(pos_strides_of(g), V({1}));

  const auto ones = make_row_geometry({1, 1, 1}, {5, 6, 7}, {5, 6, 7}, {0, 0, 0});
  EXPECT_EQ(ones.num_rows, 1);
  EXPECT_EQ(ones.ndim, 0);
}

TEST(RowGeometry, SingleRowHasNoDims) {
  // 1-D x: x.shape[:-1] is ().
  const auto g = make_row_geometry({}, {}, {}, {});
  EXPECT_EQ(g.num_rows, 1);
  EXPECT_EQ(g.ndim, 0);
}

TEST(RowGeometry, EmptyHasNoRows) {
  EXPECT_EQ(make_row_geometry({2, 0, 3}, {0, 24, 8}, {0, 24, 8}, {0, 0, 1}).num_rows, 0);
  EXPECT_EQ(make_row_geometry({0}, {8}, {8}, {1}).num_rows, 0);
}

TEST(RowGeometry, SlicedQkvInputAgainstContiguousOutput) {
  // q = qkv.select(2, 0) of a (B=2, S=3, 3, H=4, D=8) tensor: x strides (288, 96, 8); the output
  // is contiguous (96, 32, 8). B and S would merge for x and out but positions (S, 1) step only
  // along S, so nothing merges.
  const auto g = make_row_geometry({2, 3, 4}, {288, 96, 8}, {96, 32, 8}, {0, 1, 0});
  EXPECT_EQ(g.ndim, 3);
  EXPECT_EQ(sizes_of(g), V({2, 3, 4}));
  EXPECT_EQ(in_strides_of(g), V({288, 96, 8}));
  EXPECT_EQ(out_strides_of(g), V({96, 32, 8}));

  // With positions (B, S, H) contiguous, B and S merge (all three agree), H does not (x jumps).
  const auto h = make_row_geometry({2, 3, 4}, {288, 96, 8}, {96, 32, 8}, {12, 4, 1});
  EXPECT_EQ(h.ndim, 2);
  EXPECT_EQ(sizes_of(h), V({6, 4}));
  EXPECT_EQ(in_strides_of(h), V({96, 8}));
  EXPECT_EQ(out_strides_of(h), V({32, 8}));
  EXPECT_EQ(pos_strides_of(h), V({4, 1}));
}

TEST(RowGeometry, MergesOnlyWhenEveryTensorAgrees) {
  // x and positions contiguous, out transposed: no merge.
  const auto g = make_row_geometry({3, 4}, {32, 8}, {8, 24}, {4, 1});
  EXPECT_EQ(g.ndim, 2);
}

TEST(RowGeometry, TooManyUnmergeableDimsThrows) {
  // Nine dims of size 2 whose x strides never line up (stride[d] * 2 != stride[d - 1]).
  std::vector<int64_t> sizes(9, 2), strides(9), pos(9);
  for (int i = 0; i < 9; ++i) {
    strides[i] = int64_t{1} << (2 * (9 - i));  // 4^(9 - i)
    pos[i] = int64_t{1} << (8 - i);            // contiguous positions
  }
  EXPECT_THROW(make_row_geometry(sizes, strides, strides, pos), c10::Error);
  // Eight such dims still fit.
  const std::vector<int64_t> s8(sizes.begin() + 1, sizes.end()),
      st8(strides.begin() + 1, strides.end()), p8(pos.begin() + 1, pos.end());
  EXPECT_EQ(make_row_geometry(s8, st8, st8, p8).ndim, 8);
}

// Brute force: for every row in row-major order, the offsets computed from the original sizes and
// strides equal the offsets computed from the merged geometry.
void expect_same_addressing(const std::vector<int64_t>& sizes, const std::vector<int64_t>& in,
                            const std::vector<int64_t>& out, const std::vector<int64_t>& pos) {
  const auto g = make_row_geometry(sizes, in, out, pos);
  int64_t num_rows = 1;
  for (const auto s : sizes) {
    num_rows *= s;
  }
  ASSERT_EQ(g.num_rows, num_rows);
  for (int64_t r = 0; r < num_rows; ++r) {
    int64_t expected[3] = {0, 0, 0};
    int64_t rem = r;
    for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
      const int64_t i = rem % sizes[d];
      rem /= sizes[d];
      expected[0] += i * in[d];
      expected[1] += i * out[d];
      expected[2] += i * pos[d];
    }
    int64_t actual[3] = {0, 0, 0};
    rem = r;
    for (int32_t d = g.ndim - 1; d >= 0; --d) {
      const int64_t i = rem % g.row_sizes[d];
      rem /= g.row_sizes[d];
      actual[0] += i * g.in_strides[d];
      actual[1] += i * g.out_strides[d];
      actual[2] += i * g.pos_strides[d];
    }
    ASSERT_EQ(actual[0], expected[0]) << "x offset of row " << r;
    ASSERT_EQ(actual[1], expected[1]) << "out offset of row " << r;
    ASSERT_EQ(actual[2], expected[2]) << "positions offset of row " << r;
  }
}

// Real tensors in the layouts callers pass, with their strides taken as prepare_rotation takes
// them. Factories, so no tensor is made before main().
struct RealLayout {
  std::string name;
  std::function<torch::Tensor()> x;  // (..., D)
  std::function<torch::Tensor()> positions;
};

class RowGeometryOfRealLayouts : public ::testing::TestWithParam<RealLayout> {};

TEST_P(RowGeometryOfRealLayouts, MergedAddressingEqualsOriginal) {
  const auto x = GetParam().x();
  const auto positions = GetParam().positions();
  SCOPED_TRACE(::testing::PrintToString(x.sizes().vec()) + " strides " +
               ::testing::PrintToString(x.strides().vec()));
  const auto row_shape = x.sizes().slice(0, x.dim() - 1);
  const auto out = torch::empty(x.sizes());
  const auto pos = positions.expand(row_shape);
  expect_same_addressing(row_shape.vec(), x.strides().slice(0, x.dim() - 1).vec(),
                         out.strides().slice(0, x.dim() - 1).vec(), pos.strides().vec());
}

constexpr int64_t D = 8;

INSTANTIATE_TEST_SUITE_P(
    Layouts, RowGeometryOfRealLayouts,
    ::testing::Values(
        RealLayout{"bhsd_S", [] { return torch::empty({2, 3, 5, D}); },
                   [] { return torch::empty({5}, torch::kLong); }},
        RealLayout{"bshd_S1", [] { return torch::empty({2, 5, 3, D}); },
                   [] { return torch::empty({5, 1}, torch::kLong); }},
        RealLayout{"packed_T1", [] { return torch::empty({7, 3, D}); },
                   [] { return torch::empty({7, 1}, torch::kLong); }},
        RealLayout{"qkv_slice", [] { return torch::empty({2, 5, 3, 3, D}).select(2, 1); },
                   [] { return torch::empty({5, 1}, torch::kLong); }},
        RealLayout{"transposed", [] { return torch::empty({2, 5, 3, D}).transpose(1, 2); },
                   [] { return torch::empty({5}, torch::kLong); }},
        RealLayout{"size_one_heads", [] { return torch::empty({2, 1, 5, D}); },
                   [] { return torch::empty({2, 1, 5}, torch::kLong); }},
        RealLayout{"per_sequence_B1S", [] { return torch::empty({4, 3, 5, D}); },
                   [] { return torch::empty({4, 1, 5}, torch::kLong); }},
        RealLayout{"permuted",
                   [] { return torch::empty({3, 4, 2, 2, D}).permute({2, 0, 3, 1, 4}); },
                   [] { return torch::empty({2, 1, 1, 1}, torch::kLong); }},
        RealLayout{"strided_rows_transposed_positions",
                   [] { return torch::empty({6, 10, D}).slice(1, 0, 10, 3); },
                   [] { return torch::empty({6, 4}, torch::kLong).t().t(); }}),
    [](const auto& info) { return info.param.name; });

}  // namespace
