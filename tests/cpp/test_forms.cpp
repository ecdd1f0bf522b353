// SPDX-License-Identifier: BSD-3-Clause
// The argument forms from C++: rope::Frequencies (table-free angles) and
// rope::PackedSequences (cu_seqlens instead of positions), on every op overload and the module.
// The accuracy sweep to 2^40 and the packing fuzz are in tests/python (mpmath, hypothesis); here:
// that each C++ overload reaches its form and means what ops.h says, against references written
// in the test (long double angles; positions the test derives from the packing rules itself).
#include <gtest/gtest.h>
#include <quadmath.h>
#include <torch/torch.h>
#include <torch_rope/module.h>
#include <torch_rope/ops.h>
#include <torch_rope/tables.h>

#include <cmath>
#include <vector>

#include "assertions.h"
#include "oracle.h"

namespace {

using rope_test::bitwise_equal;
using rope_test::contains_all;
using rope_test::error_message;
using rope_test::reference_rope;

// theta^(-2k/d) in float64, as the frequency builder makes them.
torch::Tensor inverse_frequencies(double theta, int64_t rotary_dim) {
  std::vector<double> f(rotary_dim / 2);
  for (size_t k = 0; k < f.size(); ++k) {
    f[k] = std::pow(theta, -2.0 * static_cast<double>(k) / static_cast<double>(rotary_dim));
  }
  return torch::tensor(f, torch::kDouble);
}

// cos/sin rows 0..rows-1 of the exact angle p * f (the float64 f as stored): for p < 2^11 the
// product of an 11-bit integer and a 53-bit double is exact in long double's 64-bit mantissa,
// and cosl/sinl are accurate to long double precision. Scaled by attention_factor.
std::pair<torch::Tensor, torch::Tensor> exact_rows(const torch::Tensor& freqs, int64_t rows,
                                                   double attention_factor = 1.0) {
  const int64_t half = freqs.size(0);
  auto cos = torch::empty({rows, half}, torch::kDouble);
  auto sin = torch::empty({rows, half}, torch::kDouble);
  auto f = freqs.accessor<double, 1>();
  auto c = cos.accessor<double, 2>();
  auto s = sin.accessor<double, 2>();
  for (int64_t p = 0; p < rows; ++p) {
    for (int64_t k = 0; k < half; ++k) {
      const long double angle = static_cast<long double>(p) * static_cast<long double>(f[k]);
      c[p][k] = static_cast<double>(attention_factor * cosl(angle));
      s[p][k] = static_cast<double>(attention_factor * sinl(angle));
    }
  }
  return {cos, sin};
}

// The positions a packing gives (ops.h's PackedSequences rules), built here from the rules.
torch::Tensor packed_positions(const std::vector<int64_t>& cu, const std::vector<int64_t>& offsets,
                               int64_t cp_size, int64_t cp_rank) {
  std::vector<int64_t> out;
  for (size_t i = 0; i + 1 < cu.size(); ++i) {
    const int64_t length = cu[i + 1] - cu[i];
    const int64_t offset = offsets.empty() ? 0 : offsets[i];
    if (cp_size == 1) {
      for (int64_t j = 0; j < length; ++j) out.push_back(offset + j);
      continue;
    }
    const int64_t c = length / (2 * cp_size);
    for (int64_t j = 0; j < c; ++j) out.push_back(offset + cp_rank * c + j);
    for (int64_t j = 0; j < c; ++j) out.push_back(offset + (2 * cp_size - 1 - cp_rank) * c + j);
  }
  return torch::tensor(out, torch::kLong);
}

TEST(Frequencies, EveryOverloadRotatesByTheExactAngle) {
  torch::manual_seed(0);
  const auto freqs = inverse_frequencies(10000.0, 16);
  const double af = 1.25;
  const auto [cos, sin] = exact_rows(freqs, 2048, af);
  const auto x = torch::randn({3, 7, 2, 16}, torch::kDouble);
  const auto positions = torch::randint(0, 2048, {3, 7, 1}, torch::kLong);
  for (bool interleaved : {true, false}) {
    const auto want = reference_rope(x, cos, sin, positions, interleaved);
    const rope::Frequencies angles{freqs, af};
    const auto out = rope::apply(x, angles, positions, interleaved);
    EXPECT_TRUE(torch::allclose(out, want, /*rtol=*/0, /*atol=*/1e-14)) << interleaved;

    auto y = x.clone();
    rope::apply_(y, angles, positions, interleaved);
    EXPECT_TRUE(bitwise_equal(y, out));
    auto buffer = torch::empty_like(x);
    rope::apply_out(buffer, x, angles, positions, interleaved);
    EXPECT_TRUE(bitwise_equal(buffer, out));
    const auto [q, k] = rope::apply_qk(x, x.narrow(2, 0, 1), angles, positions, interleaved);
    EXPECT_TRUE(bitwise_equal(q, out));
    EXPECT_TRUE(bitwise_equal(k, out.narrow(2, 0, 1)));
    // inverse turns back (each pass scales by the attention factor).
    const auto back = rope::apply(out, angles, positions, interleaved, /*inverse=*/true);
    EXPECT_TRUE(torch::allclose(back, x * (af * af), 0, 1e-13));
  }
}

TEST(Frequencies, Float32WithinAnUlpOfThePairAtLargePositions) {
  // At p = 2^40 and beyond the float64 product p * f is not the exact angle; the op must be. For
  // f = 2^-k the product is exact, and binary128's reduction modulo 2 pi is off by about
  // p * 2^-113 (2^-51 at 2^62).
  const auto freqs = torch::tensor({1.0, 0.5, 0.25, 0.125}, torch::kDouble);
  const auto x = torch::randn({5, 1, 8});
  const std::vector<int64_t> values = {0, 3, (int64_t{1} << 40) + 5, (int64_t{1} << 52) + 7,
                                       int64_t{1} << 62};
  const auto positions = torch::tensor(values, torch::kLong).view({5, 1});
  const auto out = rope::apply(x, rope::Frequencies{freqs}, positions);
  auto cos = torch::empty({5, 4}, torch::kDouble);
  auto sin = torch::empty({5, 4}, torch::kDouble);
  for (int64_t r = 0; r < 5; ++r) {
    for (int64_t k = 0; k < 4; ++k) {
      const __float128 angle = fmodq(
          static_cast<__float128>(values[r]) / static_cast<__float128>(int64_t{1} << k), 2 * M_PIq);
      cos[r][k] = static_cast<double>(cosq(angle));
      sin[r][k] = static_cast<double>(sinq(angle));
    }
  }
  const auto want = reference_rope(x, cos, sin, torch::arange(5).view({5, 1})).view({5, 8});
  // 2^-23 * (|a| + |b|) per pair (the reference's own error is below 2^-50).
  const auto xd = x.to(torch::kDouble).view({5, 4, 2});  // GPT-J pairs (2k, 2k + 1)
  const auto bound = (xd.abs().sum(-1, true) * std::ldexp(1.0, -23)).expand({5, 4, 2});
  const auto err = (out.to(torch::kDouble).view({5, 4, 2}) - want.view({5, 4, 2})).abs();
  EXPECT_TRUE((err <= bound).all().item<bool>()) << (err - bound).max();
}

TEST(Frequencies, TheBuilderGivesEveryScalingVariantsFrequencies) {
  const auto f = rope::rope_frequencies(
      10000.0, 32, rope::YarnScaling().factor(4.0).original_max_position_embeddings(64),
      /*seq_len=*/256);
  ASSERT_EQ(f.inv_freq.scalar_type(), torch::kDouble);
  ASSERT_EQ(f.inv_freq.size(0), 16);
  EXPECT_GT(f.attention_scaling, 1.0);  // YaRN's mscale travels as the attention factor
  const auto x = torch::randn({4, 2, 32}, torch::kDouble);
  const auto p = torch::arange(4).view({4, 1});
  const auto [cos, sin] = exact_rows(f.inv_freq, 4, f.attention_scaling);
  EXPECT_TRUE(torch::allclose(rope::apply(x, rope::Frequencies{f.inv_freq, f.attention_scaling}, p),
                              reference_rope(x, cos, sin, p), 0, 1e-14));
}

TEST(PackedSequences, EveryOverloadEqualsTheOpGivenThePositionsOfThePacking) {
  torch::manual_seed(1);
  const auto [cos, sin] = rope::rope_tables(10000.0, 16, 256);
  const auto freqs = inverse_frequencies(10000.0, 16);
  // Sequences of 8, 0 (empty), 16 and 8 tokens, offsets per sequence.
  const std::vector<int64_t> cu = {0, 8, 8, 24, 32};
  const std::vector<int64_t> offsets = {3, 0, 100, 7};
  const auto cu_t = torch::tensor(cu, torch::kInt);
  const auto off_t = torch::tensor(offsets, torch::kLong);
  for (int64_t cp_size : {1, 2, 4}) {
    for (int64_t rank = 0; rank < cp_size; ++rank) {
      const int64_t tokens = 32 / cp_size;
      const auto x = torch::randn({tokens, 3, 16});
      const auto positions = packed_positions(cu, offsets, cp_size, rank).view({tokens, 1});
      const rope::PackedSequences packed{cu_t, off_t, cp_size, rank};
      const auto want_tables = rope::apply(x, cos, sin, positions);
      const auto want_freqs = rope::apply(x, rope::Frequencies{freqs}, positions);
      EXPECT_TRUE(bitwise_equal(rope::apply(x, cos, sin, packed), want_tables));
      EXPECT_TRUE(bitwise_equal(rope::apply(x, rope::Frequencies{freqs}, packed), want_freqs));
      auto y = x.clone();
      rope::apply_(y, cos, sin, packed);
      EXPECT_TRUE(bitwise_equal(y, want_tables));
      auto buffer = torch::empty_like(x);
      rope::apply_out(buffer, x, rope::Frequencies{freqs}, packed);
      EXPECT_TRUE(bitwise_equal(buffer, want_freqs));
      const auto [q, k] = rope::apply_qk(x, x.narrow(1, 0, 1), cos, sin, packed);
      EXPECT_TRUE(bitwise_equal(q, want_tables));
      EXPECT_TRUE(bitwise_equal(k, want_tables.narrow(1, 0, 1)));
    }
  }
}

TEST(PackedSequences, BadPackingsAreRefusedBeforeAnyWrite) {
  const auto [cos, sin] = rope::rope_tables(10000.0, 8, 64);
  const auto x = torch::randn({6, 2, 8});
  struct Bad {
    torch::Tensor cu_seqlens;
    std::optional<torch::Tensor> offsets;
    int64_t cp_size, cp_rank;
    std::vector<std::string> words;
  };
  const std::vector<Bad> cases = {
      {torch::tensor({0, 4, 2, 6}, torch::kInt), std::nullopt, 1, 0, {"cu_seqlens", "decreas"}},
      {torch::tensor({0, 4, 5}, torch::kInt), std::nullopt, 1, 0, {"cu_seqlens", "6"}},
      {torch::tensor({0.0, 6.0}), std::nullopt, 1, 0, {"cu_seqlens", "int"}},
      {torch::tensor({0, 6}, torch::kInt),
       torch::tensor({1, 2}, torch::kLong),
       1,
       0,
       {"seq_offsets"}},
      {torch::tensor({0, 12}, torch::kInt), std::nullopt, 2, 2, {"cp_rank"}},
      {torch::tensor({0, 2, 12}, torch::kInt), std::nullopt, 2, 0, {"2 * cp_size"}},
  };
  for (const auto& c : cases) {
    auto y = x.clone();
    std::string message;
    try {  // c10::Error or a subclass (ValueError for bad values, TypeError for a bad dtype)
      rope::apply_(y, cos, sin,
                   rope::PackedSequences{c.cu_seqlens, c.offsets, c.cp_size, c.cp_rank});
      ADD_FAILURE() << "accepted a bad packing: " << c.words.front();
    } catch (const c10::Error& e) {
      message = e.what_without_backtrace();
    }
    for (const auto& w : c.words) {
      EXPECT_TRUE(contains_all(message, {w})) << message;
    }
    EXPECT_TRUE(bitwise_equal(y, x)) << "a refused call wrote into x: " << message;
  }
}

TEST(TableFreeModule, HoldsOnlyFloat64FrequenciesAndMatchesTheTablesModule) {
  torch::manual_seed(2);
  rope::RotaryPositionalEmbedding tables(
      10000.0, 32, 512, rope::RotaryPositionalEmbeddingOptions().dtype(torch::kDouble));
  rope::RotaryPositionalEmbedding free(10000.0, 32, int64_t{1} << 62,
                                       rope::RotaryPositionalEmbeddingOptions().tables(false));
  const auto buffers = free->named_buffers();
  ASSERT_EQ(buffers.size(), 1u);
  EXPECT_EQ(buffers.begin()->key(), "freqs");
  EXPECT_EQ(buffers.begin()->value().scalar_type(), torch::kDouble);
  EXPECT_EQ(buffers.begin()->value().numel(), 16);
  EXPECT_FALSE(free->tables());

  const auto x = torch::randn({2, 4, 9, 32}, torch::kDouble);
  EXPECT_TRUE(torch::allclose(free(x), tables(x), 0, 1e-12));
  const auto positions = torch::randint(0, 512, {2, 9}, torch::kLong);
  EXPECT_TRUE(torch::allclose(free(x, positions), tables(x, positions), 0, 1e-12));

  // Packed sequences through the module, either mode.
  const auto cu = torch::tensor({0, 3, 9}, torch::kLong);
  const auto xt = torch::randn({9, 2, 3, 32}, torch::kDouble);  // (T, H, 3, D)
  const auto p = packed_positions({0, 3, 9}, {}, 1, 0).view({9, 1, 1});
  const rope::PackedSequences packed{cu};
  EXPECT_TRUE(bitwise_equal(free(xt, std::nullopt, packed), free(xt, p)));
  EXPECT_TRUE(bitwise_equal(tables(xt, std::nullopt, packed), tables(xt, p)));
  const auto both = error_message<c10::ValueError>([&] { free(xt, p, packed); });
  EXPECT_TRUE(contains_all(both, {"token_positions", "not both"})) << both;
}

}  // namespace
