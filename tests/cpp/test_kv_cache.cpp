// SPDX-License-Identifier: BSD-3-Clause
// rope::apply_qk_cache from C++: the API's defaults and optional arguments, one call against the
// oracle (flat and paged), fp8 against torch's own quantization, and the c10 exception types of
// its errors, with nothing written. The full matrix is tests/python/ops/test_apply_qk_cache.py.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch_rope/ops.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "assertions.h"
#include "kv_cache_args.h"
#include "oracle.h"

namespace {

using rope_test::bitwise_equal;
using rope_test::contains_all;
using rope_test::cuda_required;
using rope_test::error_message;
using rope_test::matches_oracle;
using rope_test::reference_rope;
using rope_test::reference_tables;

constexpr int64_t kMaxSeqLen = 64;

// The rows of `slots` of a flat (S, H, D) or paged (N, B, H, D) cache.
// Where two fp8 tensors differ: the first few elements as (input, got, want), so that a failure
// says which values round differently (the bytes alone do not).
::testing::AssertionResult same_fp8_bytes(const torch::Tensor& got, const torch::Tensor& want,
                                          const torch::Tensor& input) {
  const auto g = got.reshape(-1).view(torch::kByte);
  const auto w = want.reshape(-1).view(torch::kByte);
  const auto differ = g.ne(w).nonzero().reshape(-1);
  if (differ.numel() == 0) return ::testing::AssertionSuccess();
  auto failure = ::testing::AssertionFailure();
  failure << differ.numel() << " of " << g.numel() << " bytes differ; first:";
  const auto in = input.reshape(-1).to(torch::kFloat);
  const auto g_f = got.reshape(-1).to(torch::kFloat);
  const auto w_f = want.reshape(-1).to(torch::kFloat);
  for (int64_t i = 0; i < std::min<int64_t>(differ.numel(), 6); ++i) {
    const int64_t at = differ[i].item<int64_t>();
    failure << " [" << at << "] input " << in[at].item<float>() << " got " << g_f[at].item<float>()
            << " (0x" << std::hex << int(g[at].item<uint8_t>()) << ") want "
            << w_f[at].item<float>() << " (0x" << int(w[at].item<uint8_t>()) << std::dec << ")";
  }
  return failure;
}

torch::Tensor rows_of(const torch::Tensor& cache, const torch::Tensor& slots) {
  // Slot s of a paged cache is (s / block_size, s % block_size): row s of the flattened blocks.
  return (cache.dim() == 3 ? cache : cache.flatten(0, 1)).index_select(0, slots);
}

struct Call {
  torch::Tensor q, k, v, positions, k_cache, v_cache, slots;
};

Call make_call(bool paged, torch::Dtype cache_dtype = torch::kFloat,
               torch::Device device = torch::kCPU) {
  Call c;
  const auto opts = torch::TensorOptions().device(device);
  c.q = torch::randn({5, 8, 32}, opts);
  c.k = torch::randn({5, 2, 32}, opts);
  c.v = torch::randn({5, 2, 24}, opts);
  c.positions = torch::randint(0, kMaxSeqLen, {5, 1}, opts.dtype(torch::kLong));
  c.slots = torch::tensor({7, 0, -1, 12, 3}, opts.dtype(torch::kLong));
  const std::vector<int64_t> lead = paged ? std::vector<int64_t>{4, 4} : std::vector<int64_t>{16};
  auto shape = [&](int64_t d) {
    auto s = lead;
    s.push_back(2);
    s.push_back(d);
    return s;
  };
  c.k_cache = torch::full(shape(32), 3.0, opts).to(cache_dtype);
  c.v_cache = torch::full(shape(24), 3.0, opts).to(cache_dtype);
  return c;
}

TEST(ApiKvCache, WritesTheRowsOfTheSlotsAndReturnsQ) {
  for (const bool paged : {false, true}) {
    SCOPED_TRACE(paged ? "paged" : "flat");
    torch::manual_seed(0);
    const auto t = reference_tables(kMaxSeqLen, 16);
    auto c = make_call(paged);
    const auto q_out = rope::apply_qk_cache(c.q, c.k, c.v, t.cos, t.sin, c.positions, c.k_cache,
                                            c.v_cache, c.slots);  // interleaved by default
    EXPECT_TRUE(matches_oracle(q_out, reference_rope(c.q, t.cos, t.sin, c.positions, true)));
    const auto [q_ref, k_ref] = rope::apply_qk(c.q, c.k, t.cos, t.sin, c.positions);
    EXPECT_TRUE(bitwise_equal(q_out, q_ref));
    const auto real = torch::tensor({0, 1, 3, 4}, torch::kLong);
    const auto slots = c.slots.index_select(0, real);
    EXPECT_TRUE(bitwise_equal(rows_of(c.k_cache, slots), k_ref.index_select(0, real)));
    EXPECT_TRUE(bitwise_equal(rows_of(c.v_cache, slots), c.v.index_select(0, real)));
    // 4 of 16 slots written; the other 12 rows keep their value.
    EXPECT_EQ(c.k_cache.eq(3.0).all(-1).all(-1).sum().item<int64_t>(), 12);
  }
}

TEST(ApiKvCache, WithoutVAndHalfSplit) {
  torch::manual_seed(1);
  const auto t = reference_tables(kMaxSeqLen, 32);
  auto c = make_call(false);
  rope::apply_qk_cache(c.q, c.k, std::nullopt, t.cos, t.sin, c.positions, c.k_cache, std::nullopt,
                       c.slots, /*interleaved=*/false);
  const auto [q_ref, k_ref] = rope::apply_qk(c.q, c.k, t.cos, t.sin, c.positions, false);
  EXPECT_TRUE(bitwise_equal(c.k_cache.index_select(0, torch::tensor({7L})), k_ref.narrow(0, 0, 1)));
}

TEST(ApiKvCache, Fp8MatchesTorchsQuantization) {
  // Position 0 rotates by nothing, exactly: the bytes are torch's (k / scale).clamp().to(fp8).
  torch::manual_seed(2);
  const auto t = reference_tables(kMaxSeqLen, 32);
  auto c = make_call(true, torch::kFloat8_e4m3fn);
  c.positions.zero_();
  c.k.mul_(200);  // some values saturate at 448 * 0.25
  const auto scale = torch::tensor(0.25f);
  rope::apply_qk_cache(c.q, c.k, c.v, t.cos, t.sin, c.positions, c.k_cache, c.v_cache, c.slots,
                       true, scale, scale);
  const auto real = torch::tensor({0, 1, 3, 4}, torch::kLong);
  const auto slots = c.slots.index_select(0, real);
  const auto want_k =
      (c.k.index_select(0, real) / scale).clamp(-448, 448).to(torch::kFloat8_e4m3fn);
  const auto want_v =
      (c.v.index_select(0, real) / scale).clamp(-448, 448).to(torch::kFloat8_e4m3fn);
  EXPECT_TRUE(same_fp8_bytes(rows_of(c.k_cache, slots), want_k, c.k.index_select(0, real) / scale));
  EXPECT_TRUE(same_fp8_bytes(rows_of(c.v_cache, slots), want_v, c.v.index_select(0, real) / scale));
}

TEST(ApiKvCache, ErrorsAreTypedNameTheArgumentAndWriteNothing) {
  torch::manual_seed(3);
  const auto t = reference_tables(kMaxSeqLen, 16);
  auto c = make_call(true);
  const auto k_before = c.k_cache.clone();
  const auto v_before = c.v_cache.clone();
  auto run = [&](const torch::Tensor& slots) {
    return [&, slots] {
      rope::apply_qk_cache(c.q, c.k, c.v, t.cos, t.sin, c.positions, c.k_cache, c.v_cache, slots);
    };
  };
  EXPECT_TRUE(
      contains_all(error_message<c10::IndexError>(run(torch::tensor({0L, 1L, 2L, 16L, 3L}))),
                   {"slot_mapping", "16", "index 3"}));
  EXPECT_TRUE(contains_all(error_message(run(torch::tensor({0L, 1L, 2L, 1L, 3L}))),
                           {"slot_mapping", "slot 1 twice"}));
  EXPECT_TRUE(contains_all(error_message(run(torch::tensor({0, 1, 2, 3, 4}, torch::kInt))),
                           {"slot_mapping must be int64"}));
  auto wrong_heads = torch::zeros({4, 4, 3, 32});
  EXPECT_TRUE(contains_all(error_message([&] {
                             rope::apply_qk_cache(c.q, c.k, c.v, t.cos, t.sin, c.positions,
                                                  wrong_heads, c.v_cache, c.slots);
                           }),
                           {"k_cache.size(-2) (heads)"}));
  auto fp8 = torch::zeros({4, 4, 2, 32}).to(torch::kFloat8_e5m2);
  EXPECT_TRUE(contains_all(error_message([&] {
                             rope::apply_qk_cache(c.q, c.k, c.v, t.cos, t.sin, c.positions, fp8,
                                                  c.v_cache, c.slots);
                           }),
                           {"k_scale is required"}));
  EXPECT_TRUE(torch::equal(c.k_cache, k_before));
  EXPECT_TRUE(torch::equal(c.v_cache, v_before));
  EXPECT_TRUE(torch::equal(fp8.view(torch::kByte), torch::zeros_like(fp8.view(torch::kByte))));
}

// The torch-free fp8 conversion of kv_cache_args.h (which the CUDA kernel and the host run use)
// against c10's, on every 251st float32 bit pattern inside each format's range, and NaN: c10's
// handling of overflow differs between torch versions, and the op saturates before converting.
TEST(ApiKvCache, Fp8ConversionMatchesC10) {
  int64_t compared = 0;
  for (uint64_t bits = 0; bits <= 0xffffffffull; bits += 251) {
    const float f = rope::fp32_from(static_cast<uint32_t>(bits));
    if (std::isnan(f) || std::fabs(f) < 464.0f) {
      ASSERT_EQ(rope::fp8_e4m3_from_float(f), c10::Float8_e4m3fn(f).x) << "e4m3fn of " << f;
    }
    if (std::isnan(f) || std::fabs(f) < 61440.0f) {
      ASSERT_EQ(rope::fp8_e5m2_from_float(f), c10::Float8_e5m2(f).x) << "e5m2 of " << f;
    }
    ++compared;
  }
  EXPECT_GT(compared, 17000000);
}

TEST(ApiKvCacheCuda, MatchesTheCpu) {
  const char* why = !torch::cuda::is_available()  ? "CUDA not available"
                    : !rope::compiled_with_cuda() ? "librope was built without its CUDA kernels"
                                                  : nullptr;
  if (why != nullptr && cuda_required()) {
    FAIL() << why << ", and TORCH_ROPE_REQUIRE_CUDA=1";
  }
  if (why != nullptr) {
    GTEST_SKIP() << why;
  }
  const torch::Device cuda(torch::kCUDA);
  for (const auto dtype : {torch::kFloat, torch::kFloat8_e4m3fn}) {
    torch::manual_seed(4);
    const auto t = reference_tables(kMaxSeqLen, 16);
    auto c = make_call(true, dtype);
    std::optional<at::Tensor> scale;
    if (dtype != torch::kFloat) {
      scale = torch::tensor(0.5f);
    }
    auto g = c;
    g.q = c.q.to(cuda), g.k = c.k.to(cuda), g.v = c.v.to(cuda), g.positions = c.positions.to(cuda);
    g.k_cache = c.k_cache.to(cuda), g.v_cache = c.v_cache.to(cuda), g.slots = c.slots.to(cuda);
    std::optional<at::Tensor> g_scale;
    if (scale) {
      g_scale = scale->to(cuda);
    }
    const auto q_cpu = rope::apply_qk_cache(c.q, c.k, c.v, t.cos, t.sin, c.positions, c.k_cache,
                                            c.v_cache, c.slots, true, scale, scale);
    const auto q_gpu =
        rope::apply_qk_cache(g.q, g.k, g.v, t.cos.to(cuda), t.sin.to(cuda), g.positions, g.k_cache,
                             g.v_cache, g.slots, true, g_scale, g_scale);
    EXPECT_TRUE(matches_oracle(q_gpu, reference_rope(c.q, t.cos, t.sin, c.positions, true)));
    EXPECT_TRUE(bitwise_equal(q_gpu.cpu(), q_cpu));
    EXPECT_TRUE(torch::equal(g.k_cache.cpu().view(torch::kByte), c.k_cache.view(torch::kByte)));
    EXPECT_TRUE(torch::equal(g.v_cache.cpu().view(torch::kByte), c.v_cache.view(torch::kByte)));
  }
}

}  // namespace
