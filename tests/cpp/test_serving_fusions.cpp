// SPDX-License-Identifier: BSD-3-Clause
// The serving fusions from C++ (rope::apply_qk_fp8, apply_qk_fp8_out and apply_qk_fp8_dynamic,
// rope::rms_norm_apply_qk_cache, rope::mla_apply_cache, apply_qk_cache with multi-axis positions):
// the API's defaults and optional arguments, one call each against the float64 oracle
// (oracle.h) and torch's own float8 cast, and errors thrown with nothing written. The full
// matrices are tests/python/ops/test_apply_qk_fp8.py, test_rms_norm_apply_qk_cache.py and
// test_mla_apply_cache.py.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch_rope/ops.h>

#include <vector>

#include "assertions.h"
#include "oracle.h"

namespace {

using rope_test::bitwise_equal;
using rope_test::error_message;
using rope_test::reference_rope;
using rope_test::reference_tables;

constexpr int64_t kServingMaxSeqLen = 32;

// torch's own float8 storage rule: (value / scale).clamp(-max, max) cast to e4m3fn.
torch::Tensor quantize_e4m3(const torch::Tensor& value, double scale) {
  return (value.to(torch::kFloat) / static_cast<float>(scale))
      .clamp(-448.0, 448.0)
      .to(torch::kFloat8_e4m3fn);
}

// float64 RMSNorm over the last dim, then the oracle's rotation.
torch::Tensor reference_norm_rope(const torch::Tensor& x, const torch::Tensor& weight, double eps,
                                  const rope_test::Tables& t, const torch::Tensor& positions) {
  const auto x64 = x.to(torch::kDouble);
  const auto normed =
      x64 * torch::rsqrt(x64.square().mean(-1, true) + eps) * weight.to(torch::kDouble);
  return reference_rope(normed, t.cos.to(torch::kDouble), t.sin.to(torch::kDouble), positions);
}

TEST(ServingFusions, ApplyQkFp8IsTorchsCastOfTheRotation) {
  torch::manual_seed(0);
  const auto t = reference_tables(kServingMaxSeqLen, 32);
  const auto q = torch::randn({4, 4, 48});
  const auto k = torch::randn({4, 2, 48});
  const auto q_nope = torch::randn({4, 4, 16});
  const auto positions = torch::randint(0, kServingMaxSeqLen, {4, 1});
  const auto q_scale = torch::full({}, 0.05f);
  const auto k_scale = torch::full({1}, 0.1f);
  const auto [q8, k8, qn8, kn8] =
      rope::apply_qk_fp8(q, k, t.cos, t.sin, positions, q_nope, std::nullopt, q_scale, k_scale);
  EXPECT_EQ(q8.scalar_type(), torch::kFloat8_e4m3fn);  // the default dtype
  const auto [q32, k32] = rope::apply_qk(q, k, t.cos, t.sin, positions);
  EXPECT_TRUE(bitwise_equal(q8, quantize_e4m3(q32, 0.05)));
  EXPECT_TRUE(bitwise_equal(k8, quantize_e4m3(k32, 0.1)));
  EXPECT_TRUE(bitwise_equal(qn8, quantize_e4m3(q_nope, 0.05)));
  EXPECT_EQ(kn8.sizes(), (std::vector<int64_t>{4, 2, 0}));
  // The rotation itself against the float64 oracle, within one fp8 step (2^-3 relative).
  const auto want = reference_rope(q.to(torch::kDouble), t.cos.to(torch::kDouble),
                                   t.sin.to(torch::kDouble), positions) /
                    0.05;
  EXPECT_TRUE(torch::allclose(q8.to(torch::kDouble), want.clamp(-448, 448), 0.0625, 1e-3));

  // out=: the caller's buffers are written.
  auto q_out = torch::empty_like(q, torch::kFloat8_e4m3fn);
  auto k_out = torch::empty_like(k, torch::kFloat8_e4m3fn);
  rope::apply_qk_fp8_out(q_out, k_out, std::nullopt, std::nullopt, q, k, t.cos, t.sin, positions,
                         std::nullopt, std::nullopt, q_scale, k_scale);
  EXPECT_TRUE(bitwise_equal(q_out, q8));
  EXPECT_TRUE(bitwise_equal(k_out, k8));
}

TEST(ServingFusions, ApplyQkFp8DynamicScalesEachRowByItsAmax) {
  torch::manual_seed(1);
  const auto t = reference_tables(kServingMaxSeqLen, 32);
  const auto q = torch::randn({4, 4, 48}) * torch::exp2(torch::randint(-4, 5, {4, 4, 1}));
  const auto k = torch::randn({4, 2, 48});
  const auto positions = torch::randint(0, kServingMaxSeqLen, {4, 1});
  const auto [q8, k8, q_scale, k_scale] =
      rope::apply_qk_fp8_dynamic(q, k, t.cos, t.sin, positions);  // per row, float32 scales
  const auto [q32, k32] = rope::apply_qk(q, k, t.cos, t.sin, positions);
  // The scale of a row is amax / 448 of its float32 rotation, rounded once; the row is torch's
  // cast of value / scale.
  const auto want_scale = q32.abs().amax({-1}, true) / 448.0f;
  EXPECT_TRUE(bitwise_equal(q_scale, want_scale));
  EXPECT_TRUE(bitwise_equal(q8, (q32 / q_scale).clamp(-448.0, 448.0).to(torch::kFloat8_e4m3fn)));
  EXPECT_EQ(k_scale.sizes(), (std::vector<int64_t>{4, 2, 1}));
  // Per token, powers of two (UE8M0): one scale over every head, the least power of two >= it.
  const auto [p8, pk8, p_scale, pk_scale] = rope::apply_qk_fp8_dynamic(
      q, k, t.cos, t.sin, positions, std::nullopt, true, /*per_token=*/true, /*pow2_scale=*/true);
  EXPECT_EQ(p_scale.sizes(), (std::vector<int64_t>{4, 1, 1}));
  const auto token_scale = q32.abs().amax({-2, -1}, true) / 448.0f;
  EXPECT_TRUE(torch::equal(p_scale, torch::exp2(torch::ceil(torch::log2(token_scale)))));
  EXPECT_TRUE(bitwise_equal(p8, (q32 / p_scale).clamp(-448.0, 448.0).to(torch::kFloat8_e4m3fn)));
  // Not differentiable: refused, nothing returned.
  const auto qg = q.clone().requires_grad_();
  EXPECT_THROW(rope::apply_qk_fp8_dynamic(qg, k, t.cos, t.sin, positions), c10::Error);

  // out=: the caller's rows and scales (a strided scale view) get the same bits.
  auto q_out = torch::empty_like(q, torch::kFloat8_e4m3fn);
  auto k_out = torch::empty_like(k, torch::kFloat8_e4m3fn);
  auto q_scale_base = torch::full({4, 4, 2}, -1.0f);
  auto q_scale_out = q_scale_base.narrow(2, 1, 1);
  auto k_scale_out = torch::full({4, 2, 1}, -1.0f);
  rope::apply_qk_fp8_dynamic_out(q_out, k_out, q_scale_out, k_scale_out, q, k, t.cos, t.sin,
                                 positions);
  EXPECT_TRUE(bitwise_equal(q_out, q8));
  EXPECT_TRUE(bitwise_equal(k_out, k8));
  EXPECT_TRUE(bitwise_equal(q_scale_out, q_scale));
  EXPECT_TRUE(bitwise_equal(k_scale_out, k_scale));
  EXPECT_TRUE(torch::equal(q_scale_base.narrow(2, 0, 1), torch::full({4, 4, 1}, -1.0f)));
  // A scale buffer of the wrong shape is refused by name before anything is written.
  auto k_out2 = torch::zeros_like(k_out);
  auto wrong = torch::zeros({4, 2});
  EXPECT_NE(error_message([&] {
              rope::apply_qk_fp8_dynamic_out(q_out, k_out2, q_scale_out, wrong, q, k, t.cos, t.sin,
                                             positions);
            }).find("k_scale_out must have shape"),
            std::string::npos);
  EXPECT_TRUE(
      torch::equal(k_out2.view(torch::kUInt8), torch::zeros_like(k_out2).view(torch::kUInt8)));
}

TEST(ServingFusions, ApplyQkFp8InverseQuantizesTheInverseRotation) {
  torch::manual_seed(2);
  const auto t = reference_tables(kServingMaxSeqLen, 32);
  const auto q = torch::randn({5, 4, 48});  // float32: apply_qk's output is the unrounded value
  const auto k = torch::randn({5, 2, 48});
  const auto positions = torch::randint(0, kServingMaxSeqLen, {5, 1});
  const auto q_scale = torch::full({}, 0.05f);
  // The inverse rotation of apply_qk, then torch's cast, bit for bit (static scales) ...
  const auto [q8, k8, qn8, kn8] =
      rope::apply_qk_fp8(q, k, t.cos, t.sin, positions, std::nullopt, std::nullopt, q_scale,
                         std::nullopt, std::nullopt, /*interleaved=*/false,
                         /*multiply_by_scale=*/false, std::nullopt, false, /*inverse=*/true);
  const auto [qi, ki] =
      rope::apply_qk(q, k, t.cos, t.sin, positions, /*interleaved=*/false, /*inverse=*/true);
  EXPECT_TRUE(bitwise_equal(q8, quantize_e4m3(qi, 0.05)));
  EXPECT_TRUE(bitwise_equal(k8, quantize_e4m3(ki, 1.0)));
  // ... and it is the forward rotation by the negated angle (float64 oracle, within a step).
  const auto want = reference_rope(q.to(torch::kDouble), t.cos.to(torch::kDouble),
                                   -t.sin.to(torch::kDouble), positions, /*interleaved=*/false) /
                    0.05;
  EXPECT_TRUE(torch::allclose(q8.to(torch::kDouble), want.clamp(-448, 448), 0.0625, 1e-3));
  // Dynamic scales: the scales of the inverse rotation's rows.
  const auto [d8, dk8, d_scale, dk_scale] =
      rope::apply_qk_fp8_dynamic(q, k, t.cos, t.sin, positions, std::nullopt, false, false, false,
                                 std::nullopt, false, /*inverse=*/true);
  EXPECT_TRUE(bitwise_equal(d_scale, qi.abs().amax({-1}, true) / 448.0f));
  EXPECT_TRUE(bitwise_equal(d8, (qi / d_scale).clamp(-448.0, 448.0).to(torch::kFloat8_e4m3fn)));
}

struct CacheCall {
  torch::Tensor q, k, v, q_weight, k_weight, positions, k_cache, v_cache, slots;
};

CacheCall make_cache_call(int64_t axes = 0) {
  CacheCall c;
  c.q = torch::randn({5, 4, 32});
  c.k = torch::randn({5, 2, 32});
  c.v = torch::randn({5, 2, 24});
  c.q_weight = torch::rand({32}) + 0.5;
  c.k_weight = torch::rand({32}) + 0.5;
  c.positions = axes == 0 ? torch::randint(0, kServingMaxSeqLen, {5, 1})
                          : torch::randint(0, kServingMaxSeqLen, {5, 1, axes});
  c.slots = torch::tensor({7, 0, -1, 12, 3}, torch::kLong);
  c.k_cache = torch::full({4, 4, 2, 32}, 3.0);  // paged: 4 blocks of 4 slots
  c.v_cache = torch::full({4, 4, 2, 24}, 3.0);
  return c;
}

// Rows of a paged (num_blocks, block_size, heads, dim) cache at `slots`.
torch::Tensor paged_rows(const torch::Tensor& cache, const torch::Tensor& slots) {
  return cache.flatten(0, 1).index_select(0, slots);
}

TEST(ServingFusions, RmsNormApplyQkCacheMatchesTheOracle) {
  torch::manual_seed(1);
  const auto t = reference_tables(kServingMaxSeqLen, 32);
  auto c = make_cache_call();
  const auto q_out = rope::rms_norm_apply_qk_cache(c.q, c.k, c.v, c.q_weight, c.k_weight, t.cos,
                                                   t.sin, c.positions, c.k_cache, c.v_cache,
                                                   c.slots);  // eps 1e-6, q's dtype
  EXPECT_EQ(q_out.scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::allclose(q_out.to(torch::kDouble),
                              reference_norm_rope(c.q, c.q_weight, 1e-6, t, c.positions), 2e-5,
                              2e-5));
  const auto stored = torch::tensor({0, 1, 3, 4}, torch::kLong);
  const auto k_want = reference_norm_rope(c.k, c.k_weight, 1e-6, t, c.positions);
  EXPECT_TRUE(
      torch::allclose(paged_rows(c.k_cache, c.slots.index_select(0, stored)).to(torch::kDouble),
                      k_want.index_select(0, stored), 2e-5, 2e-5));
  EXPECT_TRUE(bitwise_equal(paged_rows(c.v_cache, c.slots.index_select(0, stored)),
                            c.v.index_select(0, stored)));
  // Every other slot is untouched (3.0 everywhere before the call).
  EXPECT_EQ(c.k_cache.eq(3.0).all(-1).all(-1).sum().item<int64_t>(), 16 - 4);

  // float8 q: torch's cast of the float32 q the same call returns.
  auto again = make_cache_call();
  again.q = c.q;
  const auto q8 = rope::rms_norm_apply_qk_cache(c.q, c.k, c.v, c.q_weight, c.k_weight, t.cos, t.sin,
                                                c.positions, again.k_cache, again.v_cache, c.slots,
                                                1e-6, 0.0, true, std::nullopt, std::nullopt,
                                                torch::kFloat8_e4m3fn, torch::full({}, 0.25f));
  EXPECT_TRUE(bitwise_equal(q8, quantize_e4m3(q_out, 0.25)));
}

TEST(ServingFusions, RmsNormApplyQkCacheRefusesARepeatedSlotBeforeWriting) {
  const auto t = reference_tables(kServingMaxSeqLen, 32);
  auto c = make_cache_call();
  c.slots = torch::tensor({7, 0, -1, 7, 3}, torch::kLong);
  const auto before = c.k_cache.clone();
  const std::string message = error_message([&] {
    rope::rms_norm_apply_qk_cache(c.q, c.k, c.v, c.q_weight, c.k_weight, t.cos, t.sin, c.positions,
                                  c.k_cache, c.v_cache, c.slots);
  });
  EXPECT_NE(message.find("slot_mapping holds slot 7"), std::string::npos) << message;
  EXPECT_TRUE(bitwise_equal(c.k_cache, before));
}

TEST(ServingFusions, ApplyQkCacheTakesMultiAxisPositions) {
  torch::manual_seed(2);
  const auto t = reference_tables(kServingMaxSeqLen, 32);
  auto c = make_cache_call(/*axes=*/3);
  const std::vector<int64_t> section = {4, 6, 6};
  const auto q_out =
      rope::apply_qk_cache(c.q, c.k, c.v, t.cos, t.sin, c.positions, c.k_cache, c.v_cache, c.slots,
                           true, std::nullopt, std::nullopt, section, false);
  const auto [q_ref, k_ref] =
      rope::apply_qk(c.q, c.k, t.cos, t.sin, c.positions, true, false, section, false);
  EXPECT_TRUE(bitwise_equal(q_out, q_ref));
  const auto stored = torch::tensor({0, 1, 3, 4}, torch::kLong);
  EXPECT_TRUE(bitwise_equal(paged_rows(c.k_cache, c.slots.index_select(0, stored)),
                            k_ref.index_select(0, stored)));
}

TEST(ServingFusions, MlaApplyCacheWritesConcatenatedRows) {
  torch::manual_seed(3);
  const auto t = reference_tables(kServingMaxSeqLen, 16);
  const auto q_pe = torch::randn({3, 4, 16});
  const auto k_pe = torch::randn({3, 16});
  const auto kv_c = torch::randn({3, 64});
  const auto positions = torch::randint(0, kServingMaxSeqLen, {3, 1});
  const auto slots = torch::tensor({5, -1, 2}, torch::kLong);
  auto kv_cache = torch::zeros({8, 80});  // vLLM's layout: [kv_c | k_pe]
  const auto [q_pe_out, q_nope_out] = rope::mla_apply_cache(
      q_pe, k_pe, kv_c, t.cos, t.sin, positions, kv_cache, std::nullopt, slots);
  const auto [q_ref, k_ref] = rope::apply_qk(q_pe, k_pe.unsqueeze(1), t.cos, t.sin, positions);
  EXPECT_TRUE(bitwise_equal(q_pe_out, q_ref));
  EXPECT_EQ(q_nope_out.sizes(), (std::vector<int64_t>{3, 4, 0}));
  for (int64_t token : {0, 2}) {
    const int64_t slot = slots[token].item<int64_t>();
    EXPECT_TRUE(bitwise_equal(kv_cache[slot].slice(0, 0, 64), kv_c[token]));
    EXPECT_TRUE(bitwise_equal(kv_cache[slot].slice(0, 64), k_ref[token][0]));
  }
  EXPECT_EQ(kv_cache.ne(0).any(-1).sum().item<int64_t>(), 2);  // the padding token wrote nothing
}

}  // namespace
