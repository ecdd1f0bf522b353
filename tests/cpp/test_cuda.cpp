// The core checks again on CUDA, plus CPU-vs-CUDA agreement and device moves of the module. Every
// test skips (and says so) where no GPU is visible or librope was built without its CUDA kernels.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>
#include <torch_rope/module.h>
#include <torch_rope/ops.h>

#include <string>
#include <tuple>

#include "inputs.h"
#include "reference.h"

namespace {

using rope_test::all_close;
using rope_test::bitwise_equal;
using rope_test::contains_all;
using rope_test::error_message;
using rope_test::Layout;
using rope_test::reference_rope;
using rope_test::reference_tables;
using rope_test::Tables;
using rope_test::Tolerance;

constexpr int64_t kMaxSeqLen = 64;
const torch::Device kCuda(torch::kCUDA);

// Shared by the plain and the parameterized fixtures.
#define ROPE_SKIP_WITHOUT_CUDA()                                                   \
  do {                                                                             \
    if (!torch::cuda::is_available()) {                                            \
      GTEST_SKIP() << "CUDA not available";                                        \
    }                                                                              \
    if (!rope::compiled_with_cuda()) {                                             \
      GTEST_SKIP() << "librope was built without its CUDA kernels (TORCH_ROPE_CUDA=OFF)"; \
    }                                                                              \
  } while (0)

class Cuda : public ::testing::Test {
 protected:
  void SetUp() override { ROPE_SKIP_WITHOUT_CUDA(); }
};

Tables to_cuda(const Tables& t) { return {t.cos.to(kCuda), t.sin.to(kCuda)}; }

// Output rounding on two devices may differ by one step of the storage dtype (FMA contraction).
Tolerance cpu_vs_cuda_tolerance(torch::Dtype dtype) {
  switch (dtype) {
    case torch::kDouble:
      return {1e-12, 1e-12};
    case torch::kFloat:
      return {2e-6, 2e-6};
    case torch::kHalf:
      return {1e-3, 1e-3};
    default:
      return {8e-3, 8e-3};
  }
}

class CudaApplyVsReference : public ::testing::TestWithParam<torch::Dtype> {
 protected:
  void SetUp() override { ROPE_SKIP_WITHOUT_CUDA(); }
};

TEST_P(CudaApplyVsReference, MatchesReferenceAndCpu) {
  const torch::Dtype dtype = GetParam();
  torch::manual_seed(0);
  for (const auto layout : {Layout::kBHSD, Layout::kBSHD, Layout::kPacked}) {
    for (const auto& shape : rope_test::rotary_shapes()) {
      const auto cpu_tables = reference_tables(kMaxSeqLen, shape.rotary_dim);
      const auto tables = to_cuda(cpu_tables);
      const auto cpu = rope_test::make_sample(layout, shape.head_dim, dtype, kMaxSeqLen);
      const auto x = cpu.x.to(kCuda);
      const auto positions = cpu.positions.to(kCuda);
      for (const bool interleaved : {true, false}) {
        for (const bool inverse : {false, true}) {
          SCOPED_TRACE(rope_test::layout_name(layout) + ", head_dim " +
                       std::to_string(shape.head_dim) + ", rotary_dim " +
                       std::to_string(shape.rotary_dim) + ", interleaved " +
                       std::to_string(interleaved) + ", inverse " + std::to_string(inverse));
          const auto out =
              rope::apply(x, tables.cos, tables.sin, positions, interleaved, inverse);
          ASSERT_TRUE(out.is_cuda());
          EXPECT_EQ(out.scalar_type(), dtype);
          EXPECT_EQ(out.sizes(), x.sizes());
          EXPECT_TRUE(out.is_contiguous());
          EXPECT_TRUE(all_close(out,
                                reference_rope(cpu.x, cpu_tables.cos, cpu_tables.sin,
                                               cpu.positions, interleaved, inverse),
                                dtype));
          const auto on_cpu = rope::apply(cpu.x, cpu_tables.cos, cpu_tables.sin, cpu.positions,
                                          interleaved, inverse);
          EXPECT_TRUE(all_close(out, on_cpu, cpu_vs_cuda_tolerance(dtype)));
          const int64_t tail = shape.head_dim - shape.rotary_dim;
          EXPECT_TRUE(bitwise_equal(out.narrow(-1, shape.rotary_dim, tail).cpu(),
                                    cpu.x.narrow(-1, shape.rotary_dim, tail)));
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaApplyVsReference,
                         ::testing::Values(torch::kFloat, torch::kDouble, torch::kHalf,
                                           torch::kBFloat16),
                         [](const ::testing::TestParamInfo<torch::Dtype>& info) {
                           return rope_test::dtype_name(info.param);
                         });

TEST_F(Cuda, ArbitraryAndFloat64Tables) {
  torch::manual_seed(1);
  for (const auto table_dtype : {torch::kFloat, torch::kDouble}) {
    const auto cpu_tables = rope_test::random_tables(kMaxSeqLen, 48, table_dtype);
    const auto tables = to_cuda(cpu_tables);
    for (const auto dtype : {torch::kFloat, torch::kDouble, torch::kBFloat16}) {
      const auto cpu = rope_test::make_sample(Layout::kBSHD, 64, dtype, kMaxSeqLen);
      for (const bool interleaved : {true, false}) {
        SCOPED_TRACE(rope_test::dtype_name(dtype) + " x, " + rope_test::dtype_name(table_dtype) +
                     " tables, interleaved " + std::to_string(interleaved));
        const auto out = rope::apply(cpu.x.to(kCuda), tables.cos, tables.sin,
                                     cpu.positions.to(kCuda), interleaved);
        auto tol = rope_test::tolerance_for(dtype);
        tol.atol *= 4;
        EXPECT_TRUE(all_close(
            out,
            reference_rope(cpu.x, cpu_tables.cos, cpu_tables.sin, cpu.positions, interleaved),
            tol));
      }
    }
  }
}

TEST_F(Cuda, StridedTransposedAndNonUnitLastStride) {
  torch::manual_seed(2);
  const auto cpu_tables = reference_tables(kMaxSeqLen, 48);
  const auto tables = to_cuda(cpu_tables);
  const auto positions_s1 = torch::randint(0, kMaxSeqLen, {5, 1}, torch::kLong);
  const auto positions_s = torch::randint(0, kMaxSeqLen, {5}, torch::kInt);

  const auto qkv = torch::randn({2, 5, 3, 4, 64});
  const auto q = qkv.select(2, 0);
  const auto transposed = torch::randn({2, 5, 3, 64}).transpose(1, 2);
  const auto non_unit = torch::randn({2, 3, 64, 5}).transpose(-1, -2);
  const std::vector<std::tuple<std::string, torch::Tensor, torch::Tensor>> cases = {
      {"qkv slice", q, positions_s1},
      {"transposed", transposed, positions_s},
      {"non-unit last stride", non_unit, positions_s}};
  for (const auto& [name, x, positions] : cases) {
    for (const bool interleaved : {true, false}) {
      SCOPED_TRACE(name + ", interleaved " + std::to_string(interleaved));
      // .to(device) keeps the strides of a non-contiguous view only with preserve format; build
      // the same view on the device instead.
      torch::Tensor xc;
      if (name == "qkv slice") {
        xc = qkv.to(kCuda).select(2, 0);
      } else if (name == "transposed") {
        xc = x.transpose(1, 2).contiguous().to(kCuda).transpose(1, 2);
      } else {
        xc = x.transpose(-1, -2).contiguous().to(kCuda).transpose(-1, -2);
      }
      ASSERT_EQ(xc.strides(), x.strides());
      const auto expected =
          reference_rope(x, cpu_tables.cos, cpu_tables.sin, positions, interleaved);
      const auto out =
          rope::apply(xc, tables.cos, tables.sin, positions.to(kCuda), interleaved);
      EXPECT_TRUE(all_close(out, expected, torch::kFloat));
      // In place through the same view.
      auto xi = xc.clone(at::MemoryFormat::Preserve);
      if (name == "qkv slice") {
        auto fused = qkv.to(kCuda);
        auto view = fused.select(2, 0);
        rope::apply_(view, tables.cos, tables.sin, positions.to(kCuda), interleaved);
        EXPECT_TRUE(all_close(view, expected, torch::kFloat));
        EXPECT_TRUE(bitwise_equal(fused.select(2, 1).cpu(), qkv.select(2, 1)));
      } else {
        rope::apply_(xi, tables.cos, tables.sin, positions.to(kCuda), interleaved);
        EXPECT_TRUE(all_close(xi, expected, torch::kFloat));
      }
    }
  }
}

TEST_F(Cuda, InPlaceEqualsOutOfPlace) {
  torch::manual_seed(3);
  for (const auto dtype : {torch::kFloat, torch::kDouble, torch::kHalf, torch::kBFloat16}) {
    for (const auto& shape : rope_test::rotary_shapes()) {
      const auto tables = to_cuda(reference_tables(kMaxSeqLen, shape.rotary_dim));
      const auto sample =
          rope_test::make_sample(Layout::kBHSD, shape.head_dim, dtype, kMaxSeqLen, kCuda);
      for (const bool interleaved : {true, false}) {
        SCOPED_TRACE(rope_test::dtype_name(dtype) + ", head_dim " +
                     std::to_string(shape.head_dim) + ", rotary_dim " +
                     std::to_string(shape.rotary_dim) + ", interleaved " +
                     std::to_string(interleaved));
        const auto expected =
            rope::apply(sample.x, tables.cos, tables.sin, sample.positions, interleaved);
        auto x = sample.x.clone();
        rope::apply_(x, tables.cos, tables.sin, sample.positions, interleaved);
        EXPECT_TRUE(bitwise_equal(x, expected));
      }
    }
  }
}

TEST_F(Cuda, ApplyQkGqaEqualsTwoApplies) {
  torch::manual_seed(4);
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    const auto tables = to_cuda(reference_tables(kMaxSeqLen, 64));
    for (const bool interleaved : {true, false}) {
      const auto o = torch::TensorOptions().dtype(dtype).device(kCuda);
      const auto q = torch::randn({2, 8, 5, 64}, o);
      const auto k = torch::randn({2, 2, 5, 64}, o);
      const auto positions = torch::randint(0, kMaxSeqLen, {5}, torch::dtype(torch::kLong).device(kCuda));
      const auto [qo, ko] = rope::apply_qk(q, k, tables.cos, tables.sin, positions, interleaved);
      EXPECT_TRUE(all_close(qo, rope::apply(q, tables.cos, tables.sin, positions, interleaved),
                            Tolerance{0.0, 0.0}));
      EXPECT_TRUE(all_close(ko, rope::apply(k, tables.cos, tables.sin, positions, interleaved),
                            Tolerance{0.0, 0.0}));

      // BSHD with positions (S, 1), int32.
      const auto q2 = torch::randn({2, 5, 8, 64}, o);
      const auto k2 = torch::randn({2, 5, 2, 64}, o);
      const auto p2 = torch::randint(0, kMaxSeqLen, {5, 1}, torch::dtype(torch::kInt).device(kCuda));
      const auto [qo2, ko2] = rope::apply_qk(q2, k2, tables.cos, tables.sin, p2, interleaved);
      EXPECT_TRUE(all_close(qo2, rope::apply(q2, tables.cos, tables.sin, p2, interleaved),
                            Tolerance{0.0, 0.0}));
      EXPECT_TRUE(all_close(ko2, rope::apply(k2, tables.cos, tables.sin, p2, interleaved),
                            Tolerance{0.0, 0.0}));
    }
  }
}

TEST_F(Cuda, InverseUndoesForwardAndEmptyInputs) {
  torch::manual_seed(5);
  const auto tables = to_cuda(reference_tables(kMaxSeqLen, 32, 10000.0, torch::kDouble));
  const auto sample = rope_test::make_sample(Layout::kBSHD, 32, torch::kDouble, kMaxSeqLen, kCuda);
  for (const bool interleaved : {true, false}) {
    const auto fwd = rope::apply(sample.x, tables.cos, tables.sin, sample.positions, interleaved);
    const auto back =
        rope::apply(fwd, tables.cos, tables.sin, sample.positions, interleaved, true);
    EXPECT_TRUE(all_close(back, sample.x, Tolerance{1e-12, 1e-12}));
  }
  const auto empty = torch::randn({2, 0, 5, 32}, torch::dtype(torch::kFloat).device(kCuda));
  const auto ftables = to_cuda(reference_tables(kMaxSeqLen, 32));
  const auto positions = torch::zeros({5}, torch::dtype(torch::kLong).device(kCuda));
  const auto out = rope::apply(empty, ftables.cos, ftables.sin, positions);
  EXPECT_EQ(out.sizes(), empty.sizes());
  EXPECT_TRUE(out.is_cuda());
  auto e = empty.clone();
  rope::apply_(e, ftables.cos, ftables.sin, positions);
  const auto [qo, ko] = rope::apply_qk(empty, empty, ftables.cos, ftables.sin, positions);
  EXPECT_EQ(qo.sizes(), empty.sizes());
  torch::cuda::synchronize();
}

TEST_F(Cuda, LargeInputAgreesWithCpu) {
  // Enough rows for many blocks, and a head_dim that is not a multiple of any vector width.
  torch::manual_seed(6);
  const auto cpu_tables = reference_tables(4096, 80);
  const auto tables = to_cuda(cpu_tables);
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    const auto x = torch::randn({3, 1000, 4, 96}, dtype);
    const auto positions = torch::randint(0, 4096, {3, 1000, 1}, torch::kLong);
    for (const bool interleaved : {true, false}) {
      const auto cpu_out = rope::apply(x, cpu_tables.cos, cpu_tables.sin, positions, interleaved);
      const auto cuda_out = rope::apply(x.to(kCuda), tables.cos, tables.sin, positions.to(kCuda),
                                        interleaved);
      EXPECT_TRUE(all_close(cuda_out, cpu_out, cpu_vs_cuda_tolerance(dtype)))
          << rope_test::dtype_name(dtype) << ", interleaved " << interleaved;
    }
  }
}

TEST_F(Cuda, Autograd) {
  torch::manual_seed(7);
  const auto cpu_tables = rope_test::random_tables(kMaxSeqLen, 24, torch::kDouble);
  const auto tables = to_cuda(cpu_tables);
  const auto positions = torch::randint(0, kMaxSeqLen, {5}, torch::kLong);
  const auto pc = positions.to(kCuda);
  for (const bool interleaved : {true, false}) {
    const auto x = torch::randn({2, 3, 5, 32}, torch::dtype(torch::kDouble).device(kCuda))
                       .requires_grad_(true);
    const auto g = torch::randn({2, 3, 5, 32}, torch::dtype(torch::kDouble).device(kCuda))
                       .requires_grad_(true);
    const auto y = rope::apply(x, tables.cos, tables.sin, pc, interleaved);
    const auto gx = torch::autograd::grad({y}, {x}, {g}, true, /*create_graph=*/true)[0];
    EXPECT_TRUE(all_close(gx,
                          reference_rope(g.detach().cpu(), cpu_tables.cos, cpu_tables.sin,
                                         positions, interleaved, true),
                          Tolerance{1e-12, 1e-12}));
    const auto w = torch::randn_like(gx);
    const auto gg = torch::autograd::grad({(gx * w).sum()}, {g})[0];
    EXPECT_TRUE(all_close(
        gg, reference_rope(w.cpu(), cpu_tables.cos, cpu_tables.sin, positions, interleaved),
        Tolerance{1e-12, 1e-12}));

    const auto q = torch::randn({2, 8, 5, 32}, torch::dtype(torch::kDouble).device(kCuda))
                       .requires_grad_(true);
    const auto k = torch::randn({2, 2, 5, 32}, torch::dtype(torch::kDouble).device(kCuda))
                       .requires_grad_(true);
    const auto [qo, ko] = rope::apply_qk(q, k, tables.cos, tables.sin, pc, interleaved);
    (qo.sum() + 2.0 * ko.sum()).backward();
    EXPECT_TRUE(all_close(q.grad(),
                          reference_rope(torch::ones({2, 8, 5, 32}, torch::kDouble),
                                         cpu_tables.cos, cpu_tables.sin, positions, interleaved,
                                         true),
                          Tolerance{1e-12, 1e-12}));
    EXPECT_TRUE(all_close(k.grad(),
                          reference_rope(torch::full({2, 2, 5, 32}, 2.0, torch::kDouble),
                                         cpu_tables.cos, cpu_tables.sin, positions, interleaved,
                                         true),
                          Tolerance{1e-12, 1e-12}));
  }
}

TEST_F(Cuda, DeviceMismatchErrors) {
  const auto tables = reference_tables(kMaxSeqLen, 16);
  const auto x = torch::randn({2, 3, 5, 16}, torch::device(kCuda));
  const auto positions = torch::arange(5, torch::dtype(torch::kLong).device(kCuda));
  // Tables on the CPU, x on CUDA.
  EXPECT_TRUE(contains_all(
      error_message([&] { rope::apply(x, tables.cos, tables.sin, positions); }),
      {"x and cos must be on the same device", "cuda", "cpu"}));
  // Positions on the CPU.
  const auto ct = to_cuda(tables);
  EXPECT_TRUE(contains_all(
      error_message([&] { rope::apply(x, ct.cos, ct.sin, torch::arange(5, torch::kLong)); }),
      {"positions", "same device", "cpu", "cuda"}));
  // cos on CUDA, sin on the CPU.
  EXPECT_TRUE(contains_all(
      error_message([&] { rope::apply(x, ct.cos, tables.sin, positions); }),
      {"cos and sin must be on the same device"}));
  // Nothing written by a failed in-place call.
  auto y = x.clone();
  const auto before = y.clone();
  EXPECT_THROW(rope::apply_(y, tables.cos, tables.sin, positions), c10::Error);
  EXPECT_TRUE(bitwise_equal(y, before));
}

TEST_F(Cuda, TablesBuiltOnDevice) {
  const auto [cos, sin] = rope::rope_tables(10000.0, 64, 512, kCuda);
  EXPECT_TRUE(cos.is_cuda());
  EXPECT_EQ(cos.scalar_type(), torch::kFloat);
  const auto [cpu_cos, cpu_sin] = rope::rope_tables(10000.0, 64, 512);
  EXPECT_TRUE(all_close(cos, cpu_cos, Tolerance{0.0, 1.2e-7}));
  EXPECT_TRUE(all_close(sin, cpu_sin, Tolerance{0.0, 1.2e-7}));
}

TEST_F(Cuda, ModuleToCudaMovesTables) {
  torch::manual_seed(8);
  rope::RotaryPositionalEmbedding m(10000.0, 32, 64,
                                    rope::RotaryPositionalEmbeddingOptions().rotary_dim(16));
  const auto x = torch::randn({2, 3, 7, 32});
  const auto cpu_out = m(x);
  m->to(kCuda);
  EXPECT_TRUE(m->cos_table().is_cuda());
  EXPECT_TRUE(m->sin_table().is_cuda());
  for (const auto& buffer : m->buffers()) {
    EXPECT_TRUE(buffer.is_cuda());
  }
  const auto cuda_out = m(x.to(kCuda));
  EXPECT_TRUE(cuda_out.is_cuda());
  EXPECT_TRUE(all_close(cuda_out, cpu_out, cpu_vs_cuda_tolerance(torch::kFloat)));

  // Device and dtype together: moves, stays float32.
  m->to(torch::kCPU);
  EXPECT_TRUE(m->cos_table().device().is_cpu());
  m->to(kCuda, torch::kBFloat16);
  EXPECT_TRUE(m->cos_table().is_cuda());
  EXPECT_EQ(m->cos_table().scalar_type(), torch::kFloat);
  const auto bf16_out = m(x.to(kCuda, torch::kBFloat16));
  EXPECT_EQ(bf16_out.scalar_type(), torch::kBFloat16);

  // Built on the device directly.
  rope::RotaryPositionalEmbedding on_device(
      10000.0, 32, 64, rope::RotaryPositionalEmbeddingOptions().rotary_dim(16).device(kCuda));
  EXPECT_TRUE(on_device->cos_table().is_cuda());
  EXPECT_TRUE(all_close(on_device(x.to(kCuda)), cpu_out, cpu_vs_cuda_tolerance(torch::kFloat)));
}

struct BlockImpl : torch::nn::Module {
  BlockImpl()
      : proj(register_module("proj", torch::nn::Linear(16, 16))),
        rotary(register_module("rope", rope::RotaryPositionalEmbedding(10000.0, 16, 32))) {}
  torch::Tensor forward(const torch::Tensor& x) { return rotary(proj(x)); }
  torch::nn::Linear proj;
  rope::RotaryPositionalEmbedding rotary;
};
TORCH_MODULE(Block);

TEST_F(Cuda, ParentModuleToCudaAndSaveLoad) {
  torch::manual_seed(9);
  Block block;
  block->to(kCuda, torch::kBFloat16);
  EXPECT_TRUE(block->rotary->cos_table().is_cuda());
  EXPECT_EQ(block->rotary->cos_table().scalar_type(), torch::kFloat);
  EXPECT_TRUE(block->proj->weight.is_cuda());
  const auto x = torch::randn({2, 5, 16}, torch::dtype(torch::kBFloat16).device(kCuda));
  const auto out = block(x);
  EXPECT_EQ(out.scalar_type(), torch::kBFloat16);

  // Save from CUDA, load into a fresh CPU model.
  std::stringstream stream;
  torch::save(block, stream);
  Block loaded;
  loaded->to(torch::kBFloat16);
  torch::load(loaded, stream, torch::kCPU);  // tensors saved on CUDA, mapped to the CPU
  EXPECT_TRUE(loaded->proj->weight.device().is_cpu());
  EXPECT_TRUE(loaded->rotary->cos_table().device().is_cpu());
  EXPECT_TRUE(all_close(loaded(x.cpu()), out, Tolerance{2e-2, 2e-2}));
}

}  // namespace
