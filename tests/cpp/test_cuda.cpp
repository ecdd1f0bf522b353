// SPDX-License-Identifier: BSD-3-Clause
// The C++-only CUDA surfaces: the module's .to(cuda) moving its tables, tables built on the
// device, a save from CUDA loaded on the CPU, and one smoke call of each op. The CUDA op matrix
// (dtypes, layouts, strides, autograd, errors, streams, CPU agreement) is the device-parametrised
// pytest suite; without a GPU every test here is SKIPPED, and says why, in the gtest output.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>
#include <torch_rope/module.h>
#include <torch_rope/ops.h>

#include <cstdlib>
#include <sstream>
#include <string>

#include "assertions.h"
#include "oracle.h"

namespace {

using rope_test::all_close;
using rope_test::bitwise_equal;
using rope_test::cuda_required;
using rope_test::matches_oracle;
using rope_test::reference_rope;
using rope_test::reference_tables;

const torch::Device kCuda(torch::kCUDA);

class Cuda : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* why = !torch::cuda::is_available() ? "CUDA not available"
                      : !rope::compiled_with_cuda()
                          ? "librope was built without its CUDA kernels (TORCH_ROPE_CUDA=OFF)"
                          : nullptr;
    if (why != nullptr && cuda_required()) {
      FAIL() << why << ", and TORCH_ROPE_REQUIRE_CUDA=1";
    }
    if (why != nullptr) {
      GTEST_SKIP() << why;
    }
  }
};

TEST_F(Cuda, OpsSmoke) {
  torch::manual_seed(0);
  const auto t = reference_tables(64, 48);
  const auto cos = t.cos.to(kCuda);
  const auto sin = t.sin.to(kCuda);
  const auto q = torch::randn({2, 5, 8, 64});
  const auto k = torch::randn({2, 5, 2, 64});
  const auto positions = torch::randint(0, 64, {5, 1}, torch::kInt);
  const auto pc = positions.to(kCuda);
  for (const bool interleaved : {true, false}) {
    SCOPED_TRACE(interleaved ? "interleaved" : "half split");
    const auto want_q = reference_rope(q, t.cos, t.sin, positions, interleaved);
    const auto want_k = reference_rope(k, t.cos, t.sin, positions, interleaved);
    const auto out = rope::apply(q.to(kCuda), cos, sin, pc, interleaved);
    ASSERT_TRUE(out.is_cuda());
    EXPECT_TRUE(matches_oracle(out, want_q));
    auto x = q.to(kCuda);
    rope::apply_(x, cos, sin, pc, interleaved);
    EXPECT_TRUE(bitwise_equal(x, out));
    const auto [qo, ko] = rope::apply_qk(q.to(kCuda), k.to(kCuda), cos, sin, pc, interleaved);
    EXPECT_TRUE(bitwise_equal(qo, out));
    EXPECT_TRUE(matches_oracle(ko, want_k));
    auto slot = torch::zeros({2, 9, 2, 64}, torch::device(kCuda)).narrow(1, 2, 5);
    EXPECT_TRUE(rope::apply_out(slot, k.to(kCuda), cos, sin, pc, interleaved).is_same(slot));
    EXPECT_TRUE(bitwise_equal(slot, ko));
  }
  torch::cuda::synchronize();
}

TEST_F(Cuda, TablesBuiltOnDevice) {
  const auto [cos, sin] = rope::rope_tables(10000.0, 64, 512, kCuda);
  EXPECT_TRUE(cos.is_cuda());
  EXPECT_TRUE(sin.is_cuda());
  EXPECT_EQ(cos.scalar_type(), torch::kFloat);
  const auto want = reference_tables(512, 64, 10000.0, torch::kDouble);
  EXPECT_TRUE(all_close(cos, want.cos, {0.0, 1.2e-7}));
  EXPECT_TRUE(all_close(sin, want.sin, {0.0, 1.2e-7}));

  rope::RotaryPositionalEmbedding on_device(
      10000.0, 32, 64, kCuda, rope::RotaryPositionalEmbeddingOptions().rotary_dim(16));
  EXPECT_TRUE(on_device->cos_table().is_cuda());
  const auto x = torch::randn({2, 3, 7, 32});
  const auto t = reference_tables(64, 16);
  EXPECT_TRUE(
      matches_oracle(on_device(x.to(kCuda)), reference_rope(x, t.cos, t.sin, torch::arange(7))));
}

TEST_F(Cuda, ModuleToCudaMovesTablesAndKeepsTheirDtype) {
  torch::manual_seed(1);
  rope::RotaryPositionalEmbedding m(10000.0, 32, 64,
                                    rope::RotaryPositionalEmbeddingOptions().rotary_dim(16));
  const auto cos_before = m->cos_table().clone();
  m->to(kCuda);
  for (const auto& buffer : m->buffers()) {
    EXPECT_TRUE(buffer.is_cuda());
  }
  EXPECT_TRUE(bitwise_equal(m->cos_table().cpu(), cos_before));
  const auto x = torch::randn({2, 3, 7, 32});
  const auto t = reference_tables(64, 16);
  const auto out = m(x.to(kCuda));
  EXPECT_TRUE(out.is_cuda());
  EXPECT_TRUE(matches_oracle(out, reference_rope(x, t.cos, t.sin, torch::arange(7))));

  // Device and dtype together: moves, stays float32.
  m->to(torch::kCPU);
  EXPECT_TRUE(m->cos_table().device().is_cpu());
  m->to(kCuda, torch::kBFloat16);
  EXPECT_TRUE(m->cos_table().is_cuda());
  EXPECT_EQ(m->cos_table().scalar_type(), torch::kFloat);
  EXPECT_EQ(m(x.to(kCuda, torch::kBFloat16)).scalar_type(), torch::kBFloat16);
}

struct CudaBlockImpl : torch::nn::Module {
  CudaBlockImpl()
      : proj(register_module("proj", torch::nn::Linear(16, 16))),
        rotary(register_module("rope", rope::RotaryPositionalEmbedding(10000.0, 16, 32))) {}
  torch::Tensor forward(const torch::Tensor& x) { return rotary(proj(x)); }
  torch::nn::Linear proj;
  rope::RotaryPositionalEmbedding rotary;
};
TORCH_MODULE(CudaBlock);

TEST_F(Cuda, ParentModuleSavedOnCudaLoadsOnTheCpu) {
  torch::manual_seed(2);
  CudaBlock block;
  block->to(kCuda, torch::kBFloat16);
  EXPECT_TRUE(block->rotary->cos_table().is_cuda());
  EXPECT_EQ(block->rotary->cos_table().scalar_type(), torch::kFloat);
  const auto x = torch::randn({2, 5, 16}, torch::dtype(torch::kBFloat16).device(kCuda));
  const auto out = block(x);
  EXPECT_EQ(out.scalar_type(), torch::kBFloat16);

  std::stringstream stream;
  torch::save(block, stream);
  CudaBlock loaded;
  loaded->to(torch::kBFloat16);
  torch::load(loaded, stream, torch::kCPU);  // tensors saved on CUDA, mapped to the CPU
  EXPECT_TRUE(loaded->proj->weight.device().is_cpu());
  EXPECT_TRUE(loaded->rotary->cos_table().device().is_cpu());
  // bfloat16 matmuls on two devices: a few bfloat16 steps apart at most.
  EXPECT_TRUE(all_close(loaded(x.cpu()), out, {2e-2, 2e-2}));
}

}  // namespace
