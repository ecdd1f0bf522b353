// SPDX-License-Identifier: BSD-3-Clause
// rope::RotaryPositionalEmbedding, the C++ module (the Python module is a separate nn.Module,
// tested in tests/python): constructor forms and options, its tables and forward, dtype casts,
// Cloneable, serialization (tables are derived state: never saved, always rebuilt), the typed
// scaling options, and its errors as c10::ValueError.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch_rope/module.h>
#include <torch_rope/ops.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "assertions.h"
#include "oracle.h"

namespace {

using rope::RotaryPositionalEmbedding;
using rope::RotaryPositionalEmbeddingOptions;
using rope_test::all_close;
using rope_test::bitwise_equal;
using rope_test::contains_all;
using rope_test::error_message;
using rope_test::matches_oracle;
using rope_test::reference_rope;
using rope_test::reference_tables;
using Opts = RotaryPositionalEmbeddingOptions;

// ---- construction, tables, accessors
// --------------------------------------------------------------

TEST(Module, TablesAreFloat32BuffersOfTheSharedBuilder) {
  RotaryPositionalEmbedding m(10000.0, 64, 8192);
  const auto& cos = m->cos_table();
  ASSERT_EQ(cos.scalar_type(), torch::kFloat);
  ASSERT_EQ(cos.sizes(), (std::vector<int64_t>{8192, 32}));
  EXPECT_TRUE(cos.device().is_cpu());
  // Independent of the builder: cos/sin of a float64 angle, rounded to float32 once. At position
  // 8191 a float32 angle would be off by ~5e-4 rad, far outside this tolerance.
  const auto want = reference_tables(8192, 64, 10000.0, torch::kDouble);
  EXPECT_TRUE(all_close(cos, want.cos, {0.0, 1.2e-7}));
  EXPECT_TRUE(all_close(m->sin_table(), want.sin, {0.0, 1.2e-7}));
  const auto [built_cos, built_sin] = rope::rope_tables(10000.0, 64, 8192);
  EXPECT_TRUE(bitwise_equal(cos, built_cos));
  EXPECT_TRUE(bitwise_equal(m->sin_table(), built_sin));

  auto buffers = m->named_buffers();
  ASSERT_EQ(buffers.size(), 2u);
  EXPECT_TRUE(bitwise_equal(buffers["cos"], cos));
  EXPECT_TRUE(bitwise_equal(buffers["sin"], m->sin_table()));
  EXPECT_TRUE(m->parameters().empty());
  EXPECT_FALSE(cos.requires_grad());
}

TEST(Module, OptionsAndAccessors) {
  RotaryPositionalEmbedding m(500000.0, 32, 100, Opts().rotary_dim(16).interleaved(false));
  EXPECT_EQ(m->theta(), 500000.0);
  EXPECT_EQ(m->d_k(), 32);
  EXPECT_EQ(m->max_seq_len(), 100);
  EXPECT_EQ(m->rotary_dim(), 16);
  EXPECT_FALSE(m->interleaved());
  const auto want = reference_tables(100, 16, 500000.0, torch::kDouble);
  EXPECT_TRUE(all_close(m->cos_table(), want.cos, {0.0, 1.2e-7}));

  RotaryPositionalEmbedding defaults(10000.0, 24, 10);
  EXPECT_EQ(defaults->rotary_dim(), 24);
  EXPECT_TRUE(defaults->interleaved());
}

TEST(Module, DeviceIsTheFourthArgumentAsInCs336) {
  RotaryPositionalEmbedding cpu(10000.0, 16, 32, torch::kCPU);
  EXPECT_TRUE(cpu->cos_table().device().is_cpu());
  RotaryPositionalEmbedding meta(10000.0, 16, 32, torch::Device(torch::kMeta),
                                 Opts().rotary_dim(8));
  EXPECT_TRUE(meta->cos_table().is_meta());
  EXPECT_EQ(meta->cos_table().sizes(), (std::vector<int64_t>{32, 4}));
  RotaryPositionalEmbedding in_options(10000.0, 8, 10, Opts().device(torch::kMeta));
  EXPECT_TRUE(in_options->cos_table().is_meta());
  // The options-only form and the std::nullopt device mean the same as no device.
  RotaryPositionalEmbedding options_only(10000.0, 16, 32, Opts());
  RotaryPositionalEmbedding no_device(10000.0, 16, 32, std::nullopt, Opts());
  EXPECT_TRUE(bitwise_equal(options_only->cos_table(), cpu->cos_table()));
  EXPECT_TRUE(bitwise_equal(no_device->cos_table(), cpu->cos_table()));
  EXPECT_TRUE(contains_all(error_message<c10::ValueError>([] {
                             RotaryPositionalEmbedding(10000.0, 16, 32, torch::kCPU,
                                                       Opts().device(torch::kMeta));
                           }),
                           {"device given twice"}));
}

TEST(Module, PrettyPrintNamesTheConfiguration) {
  RotaryPositionalEmbedding m(10000.0, 16, 32, Opts().rotary_dim(8).interleaved(false));
  std::ostringstream os;
  os << *m;
  EXPECT_TRUE(contains_all(os.str(), {"RotaryPositionalEmbedding", "d_k=16", "max_seq_len=32",
                                      "rotary_dim=8", "interleaved=false"}));
}

// ---- forward
// ---------------------------------------------------------------------------------------

// (interleaved, rotary_dim, x dtype): the module hands its options and tables to rope::apply.
class ModuleForward : public ::testing::TestWithParam<std::tuple<bool, int64_t, torch::Dtype>> {};

TEST_P(ModuleForward, MatchesTheOracle) {
  const auto [interleaved, rotary_dim, dtype] = GetParam();
  torch::manual_seed(0);
  RotaryPositionalEmbedding m(10000.0, 16, 40,
                              Opts().rotary_dim(rotary_dim).interleaved(interleaved));
  const auto t = reference_tables(40, rotary_dim);
  const auto x = torch::randn({2, 3, 7, 16}).to(dtype);
  const auto positions = torch::randint(0, 40, {7}, torch::kLong);
  const auto out = m(x, positions);
  EXPECT_EQ(out.scalar_type(), dtype);
  EXPECT_TRUE(matches_oracle(out, reference_rope(x, t.cos, t.sin, positions, interleaved)));
  // Without positions: arange along the sequence dim (-2), int64 or int32 alike.
  EXPECT_TRUE(bitwise_equal(m(x), m(x, torch::arange(7, torch::kLong))));
  EXPECT_TRUE(bitwise_equal(m(x), m(x, torch::arange(7, torch::kInt))));
  EXPECT_TRUE(bitwise_equal(m(x), m->forward(x, std::nullopt)));
}

INSTANTIATE_TEST_SUITE_P(Options, ModuleForward,
                         ::testing::Values(std::make_tuple(true, int64_t{16}, torch::kFloat),
                                           std::make_tuple(false, int64_t{16}, torch::kFloat),
                                           std::make_tuple(true, int64_t{10}, torch::kDouble),
                                           std::make_tuple(false, int64_t{10}, torch::kBFloat16),
                                           std::make_tuple(true, int64_t{16}, torch::kHalf)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "interleaved"
                                                                      : "half_split") +
                                  "_rotary" + std::to_string(std::get<1>(info.param)) + "_" +
                                  rope_test::dtype_name(std::get<2>(info.param));
                         });

// ---- multi-axis positions (M-RoPE)
// ---------------------------------------------------------------

// The axis plane k reads, written here from the two rules (not the library's axis_of_plane).
int64_t test_axis_of_plane(const std::vector<int64_t>& section, bool mrope_interleaved, int64_t k) {
  if (mrope_interleaved) {
    if (k % 3 == 1 && k < 3 * section[1]) return 1;
    if (k % 3 == 2 && k < 3 * section[2]) return 2;
    return 0;
  }
  int64_t end = 0;
  for (size_t a = 0; a < section.size(); ++a) {
    end += section[a];
    if (k < end) return static_cast<int64_t>(a);
  }
  return static_cast<int64_t>(section.size()) - 1;
}

// Plane k of a multi-axis rotation is plane k of the one-axis rotation by its axis' positions:
// the oracle rotates x once per axis and takes each plane from its axis' result.
torch::Tensor multi_axis_oracle(const torch::Tensor& x, const rope_test::Tables& t,
                                const torch::Tensor& positions /* (..., A) */,
                                const std::vector<int64_t>& section, bool interleaved,
                                bool mrope_interleaved) {
  const int64_t half = t.cos.size(1);
  auto want = x.detach().to(torch::kDouble).clone();
  for (int64_t a = 0; a < static_cast<int64_t>(section.size()); ++a) {
    const auto by_axis = reference_rope(x, t.cos, t.sin, positions.select(-1, a), interleaved);
    for (int64_t k = 0; k < half; ++k) {
      if (test_axis_of_plane(section, mrope_interleaved, k) != a) continue;
      for (const int64_t f : interleaved ? std::vector<int64_t>{2 * k, 2 * k + 1}
                                         : std::vector<int64_t>{k, k + half}) {
        want.select(-1, f).copy_(by_axis.select(-1, f));
      }
    }
  }
  return want;
}

// (pair layout, section layout): all four combinations, with partial rotary (24 of 32 features).
class ModuleMultiAxis : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

TEST_P(ModuleMultiAxis, EachPlaneTurnsByItsAxis) {
  const auto [interleaved, mrope_interleaved] = GetParam();
  const std::vector<int64_t> section =
      mrope_interleaved ? std::vector<int64_t>{5, 4, 3} : std::vector<int64_t>{2, 6, 4};
  torch::manual_seed(4);
  RotaryPositionalEmbedding m(10000.0, 32, 64,
                              Opts()
                                  .rotary_dim(24)
                                  .interleaved(interleaved)
                                  .mrope_section(section)
                                  .mrope_interleaved(mrope_interleaved));
  const auto t = reference_tables(64, 24);
  for (const auto dtype : {torch::kFloat, torch::kBFloat16, torch::kDouble}) {
    const auto x = torch::randn({2, 3, 5, 32}).to(dtype);  // [b, h, s, d]
    // (B, S, A): each sequence's three axes, shared by its heads.
    const auto positions = torch::randint(0, 64, {2, 5, 3}, torch::kLong);
    const auto got = m(x, positions);
    EXPECT_EQ(got.scalar_type(), dtype);
    EXPECT_TRUE(matches_oracle(got, multi_axis_oracle(x, t, positions.unsqueeze(1), section,
                                                      interleaved, mrope_interleaved)));
    // (S, A) positions serve every sequence; absent positions give every axis the arange, the
    // one-axis rotation.
    const auto shared = positions[0];
    EXPECT_TRUE(bitwise_equal(m(x, shared), m(x, shared.unsqueeze(0).expand({2, 5, 3}))));
    RotaryPositionalEmbedding one_axis(10000.0, 32, 64,
                                       Opts().rotary_dim(24).interleaved(interleaved));
    EXPECT_TRUE(bitwise_equal(m(x), one_axis(x)));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, ModuleMultiAxis, ::testing::Combine(::testing::Bool(), ::testing::Bool()),
    [](const auto& info) {
      return std::string(std::get<0>(info.param) ? "gptj_pairs" : "half_split") +
             (std::get<1>(info.param) ? "_mrope_interleaved" : "_mrope_contiguous");
    });

TEST(ModuleMultiAxisErrors, NameTheArgumentAndWhatCame) {
  const auto make = [](std::vector<int64_t> section, bool mrope_interleaved) {
    return [=] {
      RotaryPositionalEmbedding(10000.0, 16, 32,
                                Opts().mrope_section(section).mrope_interleaved(mrope_interleaved));
    };
  };
  EXPECT_TRUE(contains_all(error_message<c10::ValueError>(make({2, 2, 2}, false)),
                           {"sum(mrope_section) must equal rotary_dim / 2 = 8", "= 6"}));
  EXPECT_TRUE(contains_all(error_message<c10::ValueError>(make({4, -1, 5}, false)),
                           {"mrope_section[1] must be >= 0", "-1"}));
  EXPECT_TRUE(contains_all(error_message<c10::ValueError>(make({4, 4}, true)),
                           {"mrope_interleaved=True", "needs 3 axes"}));
  EXPECT_TRUE(contains_all(error_message<c10::ValueError>([] {
                             RotaryPositionalEmbedding(10000.0, 16, 32,
                                                       Opts().mrope_interleaved(true));
                           }),
                           {"mrope_interleaved=True needs mrope_section"}));
  RotaryPositionalEmbedding m(10000.0, 16, 32, Opts().mrope_section(std::vector<int64_t>{4, 4}));
  const auto x = torch::randn({2, 5, 16});
  // Positions without the axis dim, or with 3 axes for a 2-axis module.
  EXPECT_TRUE(contains_all(error_message<c10::ValueError>([&] { m(x, torch::arange(5)); }),
                           {"trailing axis dim of size len(mrope_section) = 2", "[5]"}));
  EXPECT_TRUE(contains_all(
      error_message<c10::ValueError>([&] { m(x, torch::zeros({5, 3}, torch::kLong)); }),
      {"len(mrope_section) = 2", "[5, 3]"}));
  std::ostringstream os;
  os << *m;
  EXPECT_TRUE(contains_all(os.str(), {"mrope_section=[4, 4]"}));
}

TEST(Module, DefaultPositionsForEveryRank) {
  torch::manual_seed(1);
  RotaryPositionalEmbedding m(10000.0, 16, 32);
  const auto t = reference_tables(32, 16);
  for (const auto& shape : {std::vector<int64_t>{7, 16}, std::vector<int64_t>{4, 5, 16}}) {
    const auto x = torch::randn(shape);
    const auto seq = torch::arange(x.size(-2), torch::kLong);
    EXPECT_TRUE(matches_oracle(m(x), reference_rope(x, t.cos, t.sin, seq)));
  }
  // (B, S) positions of a (B, H, S, D) input: each sequence's positions serve all its heads.
  const auto x = torch::randn({2, 3, 5, 16});
  const auto bs = torch::randint(0, 32, {2, 5}, torch::kLong);
  EXPECT_TRUE(matches_oracle(m(x, bs), reference_rope(x, t.cos, t.sin, bs.unsqueeze(1))));
}

TEST(Module, WorksInsideSequentialWithDefaultArgument) {
  // FORWARD_HAS_DEFAULT_ARGS lets AnyModule-based containers call forward(x) alone.
  torch::manual_seed(3);
  RotaryPositionalEmbedding m(10000.0, 16, 32);
  torch::nn::Sequential seq(m);
  const auto x = torch::randn({2, 3, 6, 16});
  EXPECT_TRUE(bitwise_equal(seq->forward(x), m(x)));
}

TEST(Module, GradientReachesTheInputNotTheTables) {
  torch::manual_seed(9);
  RotaryPositionalEmbedding m(10000.0, 16, 32);
  const auto x = torch::randn({2, 3, 5, 16}).requires_grad_(true);
  const auto g = torch::randn({2, 3, 5, 16});
  m(x).backward(g);
  const auto t = reference_tables(32, 16);
  EXPECT_TRUE(matches_oracle(x.grad(), reference_rope(g, t.cos, t.sin, torch::arange(5), true,
                                                      /*inverse=*/true)));
  EXPECT_FALSE(m->cos_table().requires_grad());
}

TEST(Module, SeqDimMinus3FollowsTheSequenceAxis) {
  RotaryPositionalEmbedding bshd(10000.0, 16, 32, torch::kCPU, Opts().seq_dim(-3));
  RotaryPositionalEmbedding bhsd(10000.0, 16, 32);
  const auto x = torch::randn({2, 7, 3, 16});  // [b, s, h, d]
  EXPECT_TRUE(bitwise_equal(bshd(x).transpose(1, 2), bhsd(x.transpose(1, 2))));
  for (const auto& positions : {torch::arange(4, 11), torch::randint(0, 32, {2, 7})}) {
    EXPECT_TRUE(
        bitwise_equal(bshd(x, positions).transpose(1, 2), bhsd(x.transpose(1, 2), positions)));
  }
}

// (B, S) positions of an x with axes both between B and S and after S: row (b, n, s, h) must
// read positions[b, s]. The expected positions are written out row by row (not by unsqueeze).
TEST(Module, BatchAndSequencePositionsWithAxesOnBothSides) {
  torch::manual_seed(12);
  const auto t = reference_tables(64, 8);
  const std::vector<int64_t> section{1, 2, 1};
  RotaryPositionalEmbedding one_axis(10000.0, 8, 64, torch::kCPU, Opts().seq_dim(-3));
  RotaryPositionalEmbedding multi_axis(10000.0, 8, 64, torch::kCPU,
                                       Opts().seq_dim(-3).mrope_section(section));
  const auto x = torch::randn({2, 3, 5, 4, 8});  // [b, n, s, h, d]
  const auto bs = torch::randint(0, 64, {2, 5}, torch::kLong);
  const auto bsa = torch::randint(0, 64, {2, 5, 3}, torch::kLong);
  auto rows = torch::empty({2, 3, 5, 4}, torch::kLong);
  auto rows_axes = torch::empty({2, 3, 5, 4, 3}, torch::kLong);
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t n = 0; n < 3; ++n) {
      for (int64_t s = 0; s < 5; ++s) {
        for (int64_t h = 0; h < 4; ++h) {
          rows[b][n][s][h] = bs[b][s];
          for (int64_t a = 0; a < 3; ++a) rows_axes[b][n][s][h][a] = bsa[b][s][a];
        }
      }
    }
  }
  EXPECT_TRUE(matches_oracle(one_axis(x, bs), reference_rope(x, t.cos, t.sin, rows)));
  EXPECT_TRUE(
      matches_oracle(multi_axis(x, bsa), multi_axis_oracle(x, t, rows_axes, section, true, false)));
}

TEST(Module, RefusedExtendTablesLeavesTheModuleAsItWas) {
  RotaryPositionalEmbedding m(10000.0, 64, 32);
  const auto cos = m->cos_table().clone();
  EXPECT_THROW(m->extend_tables(int64_t{1} << 40), c10::ValueError);
  EXPECT_EQ(m->max_seq_len(), 32);
  EXPECT_TRUE(bitwise_equal(m->cos_table(), cos));
}

TEST(Module, ExtendTablesGrowsTheRegisteredBuffers) {
  RotaryPositionalEmbedding m(10000.0, 16, 32);
  const auto x = torch::randn({1, 40, 16});
  EXPECT_TRUE(contains_all(error_message<c10::IndexError>([&] { m(x); }), {"max_seq_len", "32"}));
  const auto before = m->cos_table().clone();
  const auto handle = m->named_buffers()["cos"];
  m->extend_tables(64);
  EXPECT_EQ(m->max_seq_len(), 64);
  EXPECT_EQ(m->cos_table().size(0), 64);
  EXPECT_TRUE(bitwise_equal(m->cos_table().narrow(0, 0, 32), before));
  EXPECT_TRUE(bitwise_equal(handle, m->cos_table()));  // the registered buffer itself grew
  const auto t = reference_tables(40, 16);
  EXPECT_TRUE(matches_oracle(m(x), reference_rope(x, t.cos, t.sin, torch::arange(40))));
}

// ---- dtype casts keep the tables' dtype
// -----------------------------------------------------------

class ModuleCast : public ::testing::TestWithParam<torch::Dtype> {};

TEST_P(ModuleCast, KeepsFloat32TablesExact) {
  const torch::Dtype dtype = GetParam();
  RotaryPositionalEmbedding m(10000.0, 16, 32);
  const auto cos_before = m->cos_table().clone();
  m->to(dtype);
  EXPECT_TRUE(bitwise_equal(m->cos_table(), cos_before));
  m->to(torch::kCPU, dtype);
  EXPECT_TRUE(bitwise_equal(m->cos_table(), cos_before));
  for (const auto& buffer : m->buffers()) {
    EXPECT_EQ(buffer.scalar_type(), torch::kFloat);
  }
  const auto x = torch::randn({2, 5, 16}).to(dtype);
  EXPECT_EQ(m(x).scalar_type(), dtype);
}

TEST_P(ModuleCast, KeepsFloat64Tables) {
  RotaryPositionalEmbedding m(10000.0, 16, 64, torch::kCPU, Opts().dtype(torch::kDouble));
  m->to(GetParam());
  EXPECT_EQ(m->cos_table().scalar_type(), torch::kDouble);
  EXPECT_EQ(m->sin_table().scalar_type(), torch::kDouble);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ModuleCast,
                         ::testing::Values(torch::kBFloat16, torch::kHalf, torch::kDouble,
                                           torch::kFloat),
                         [](const auto& info) { return rope_test::dtype_name(info.param); });

TEST(Module, Float64TablesReachTheAnglesRounding) {
  RotaryPositionalEmbedding m(10000.0, 16, 5000, torch::kCPU, Opts().dtype(torch::kDouble));
  const auto x = torch::randn({3, 16}, torch::kDouble);
  const auto positions = torch::tensor({1, 1000, 4096});
  const auto t = reference_tables(4097, 16, 10000.0, torch::kDouble);
  const auto want = reference_rope(x, t.cos, t.sin, positions);
  // Both sides carry float64 angle roundings: a few 1e-16 x position.
  EXPECT_LT((m(x, positions) - want).abs().max().item<double>(), 4096 * 1e-15);
}

// A model that owns the rope module, the way a LibTorch attention block would.
struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(int64_t max_seq_len = 32)
      : proj(register_module("proj", torch::nn::Linear(16, 16))),
        rotary(register_module("rope", RotaryPositionalEmbedding(10000.0, 16, max_seq_len))) {}
  torch::Tensor forward(const torch::Tensor& x) { return rotary(proj(x)); }
  torch::nn::Linear proj;
  RotaryPositionalEmbedding rotary;
};
TORCH_MODULE(Block);

TEST(Module, ParentCastKeepsTablesFloat32) {
  torch::manual_seed(4);
  Block block;
  block->to(torch::kBFloat16);
  EXPECT_EQ(block->proj->weight.scalar_type(), torch::kBFloat16);
  auto buffers = block->named_buffers();
  ASSERT_TRUE(buffers.contains("rope.cos"));
  EXPECT_EQ(buffers["rope.cos"].scalar_type(), torch::kFloat);
  EXPECT_EQ(buffers["rope.sin"].scalar_type(), torch::kFloat);
  EXPECT_EQ(block(torch::randn({2, 5, 16}, torch::kBFloat16)).scalar_type(), torch::kBFloat16);
  EXPECT_EQ(block->parameters().size(), 2u);  // the Linear's alone
}

// ---- Cloneable
// --------------------------------------------------------------------------------------

TEST(Module, CloneInsideSequentialCopiesTables) {
  torch::nn::Sequential seq(RotaryPositionalEmbedding(10000.0, 16, 32, Opts().rotary_dim(8)));
  auto copy = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(seq->clone());
  ASSERT_TRUE(copy);
  const auto* original = seq[0]->as<rope::RotaryPositionalEmbeddingImpl>();
  const auto* cloned = copy->ptr(0)->as<rope::RotaryPositionalEmbeddingImpl>();
  EXPECT_EQ(cloned->rotary_dim(), 8);
  EXPECT_TRUE(bitwise_equal(original->cos_table(), cloned->cos_table()));
  EXPECT_NE(original->cos_table().data_ptr(), cloned->cos_table().data_ptr());  // deep copy
  const auto x = torch::randn({2, 5, 16});
  EXPECT_TRUE(bitwise_equal(seq->forward(x), copy->forward(x)));
}

// ---- serialization: the archive holds no tables; loading keeps the fresh module's
// ----------------

std::vector<std::string> keys_of(torch::serialize::InputArchive& archive) {
  auto keys = archive.keys();
  std::sort(keys.begin(), keys.end());
  return keys;
}

bool has_key(const std::vector<std::string>& keys, const std::string& key) {
  return std::find(keys.begin(), keys.end(), key) != keys.end();
}

TEST(ModuleSerialization, ParentArchiveHasNoTables) {
  torch::manual_seed(5);
  Block saved;
  std::stringstream stream;
  torch::save(saved, stream);

  torch::serialize::InputArchive archive;
  archive.load_from(stream);
  const auto top = keys_of(archive);
  EXPECT_FALSE(has_key(top, "cos"));
  EXPECT_FALSE(has_key(top, "sin"));
  torch::Tensor t;
  EXPECT_FALSE(archive.try_read("rope.cos", t));
  EXPECT_FALSE(archive.try_read("rope.sin", t));
  torch::serialize::InputArchive proj;
  ASSERT_TRUE(archive.try_read("proj", proj));
  EXPECT_TRUE(proj.try_read("weight", t));  // positive control for try_read
  EXPECT_TRUE(has_key(keys_of(proj), "bias"));
  torch::serialize::InputArchive rope_archive;
  if (archive.try_read("rope", rope_archive)) {
    const auto rope_keys = keys_of(rope_archive);
    EXPECT_FALSE(has_key(rope_keys, "cos")) << ::testing::PrintToString(rope_keys);
    EXPECT_FALSE(rope_archive.try_read("cos", t, /*is_buffer=*/true));
    EXPECT_FALSE(rope_archive.try_read("sin", t, /*is_buffer=*/true));
  }
}

TEST(ModuleSerialization, RoundTripRebuildsTablesFromTheConstructor) {
  torch::manual_seed(6);
  Block saved(/*max_seq_len=*/16);
  std::stringstream stream;
  torch::save(saved, stream);
  // Loading into a model built for a longer context keeps that model's tables.
  Block loaded(/*max_seq_len=*/64);
  torch::load(loaded, stream);
  EXPECT_TRUE(bitwise_equal(loaded->proj->weight, saved->proj->weight));
  EXPECT_TRUE(bitwise_equal(loaded->proj->bias, saved->proj->bias));
  EXPECT_EQ(loaded->rotary->cos_table().size(0), 64);
  EXPECT_TRUE(
      bitwise_equal(loaded->rotary->cos_table().narrow(0, 0, 16), saved->rotary->cos_table()));
  const auto x = torch::randn({2, 5, 16});
  EXPECT_TRUE(bitwise_equal(loaded(x), saved(x)));
  EXPECT_NO_THROW(loaded(torch::randn({1, 40, 16})));  // 40 positions: only 64 rows cover them
}

TEST(ModuleSerialization, ModuleAloneThroughAFile) {
  torch::manual_seed(7);
  RotaryPositionalEmbedding saved(10000.0, 16, 32, Opts().rotary_dim(8));
  const auto path = std::filesystem::temp_directory_path() /
                    ("torch_rope_test_" + std::to_string(::getpid()) + ".pt");
  torch::save(saved, path.string());
  {
    torch::serialize::InputArchive archive;
    archive.load_from(path.string());
    const auto keys = keys_of(archive);
    EXPECT_FALSE(has_key(keys, "cos")) << ::testing::PrintToString(keys);
    EXPECT_FALSE(has_key(keys, "sin"));
  }
  RotaryPositionalEmbedding loaded(10000.0, 16, 32, Opts().rotary_dim(8));
  torch::load(loaded, path.string());
  std::filesystem::remove(path);
  EXPECT_TRUE(bitwise_equal(loaded->cos_table(), saved->cos_table()));
  EXPECT_TRUE(bitwise_equal(loaded->sin_table(), saved->sin_table()));
  const auto x = torch::randn({3, 9, 16});
  EXPECT_TRUE(bitwise_equal(loaded(x), saved(x)));
}

// ---- scaling variants as typed options
// --------------------------------------------------------------

class ModuleScaling : public ::testing::TestWithParam<rope::RopeScaling> {};

TEST_P(ModuleScaling, TablesAreTheSharedBuilders) {
  const rope::RopeScaling scaling = GetParam();
  RotaryPositionalEmbedding m(500000.0, 32, 128, torch::kCPU, Opts().scaling(scaling));
  const auto [cos, sin] =
      rope::rope_tables(500000.0, 32, 128, rope::TableOptions().scaling(scaling));
  EXPECT_TRUE(bitwise_equal(m->cos_table(), cos));
  EXPECT_TRUE(bitwise_equal(m->sin_table(), sin));
  // And the builder is attention_scaling * cos(p * inv_freq) in double, rounded once.
  const auto f = rope::rope_frequencies(500000.0, 32, scaling, 128);
  const auto angles = torch::arange(128, torch::kDouble).unsqueeze(1) * f.inv_freq;
  EXPECT_TRUE(bitwise_equal(cos, (angles.cos() * f.attention_scaling).to(torch::kFloat)));
  EXPECT_TRUE(bitwise_equal(sin, (angles.sin() * f.attention_scaling).to(torch::kFloat)));
  std::ostringstream os;
  os << *m;
  EXPECT_TRUE(contains_all(os.str(), {"scaling=" + rope::rope_type_name(scaling)}));
}

INSTANTIATE_TEST_SUITE_P(
    Variants, ModuleScaling,
    ::testing::Values(
        rope::RopeScaling(rope::LinearScaling().factor(4.0)),
        rope::RopeScaling(rope::Llama3Scaling().factor(8.0).original_max_position_embeddings(64)),
        rope::RopeScaling(rope::YarnScaling().factor(4.0).original_max_position_embeddings(32)),
        rope::RopeScaling(rope::DynamicNTKScaling().factor(2.0).max_position_embeddings(32)),
        rope::RopeScaling(rope::ProportionalScaling().partial_rotary_factor(0.5))),
    [](const auto& info) { return rope::rope_type_name(info.param); });

TEST(ModuleScalingFormulas, AgainstHandComputedValues) {
  // linear: every frequency over the factor.
  const auto plain = rope::rope_frequencies(10000.0, 8, rope::NoScaling{}, 1).inv_freq;
  const auto linear = rope::rope_frequencies(10000.0, 8, rope::LinearScaling().factor(4.0), 1);
  EXPECT_TRUE(torch::allclose(linear.inv_freq, plain / 4.0, 0, 0));
  EXPECT_DOUBLE_EQ(plain[1].item<double>(), 1.0 / std::pow(10000.0, 2.0 / 8.0));
  // yarn's default attention factor: 0.1 ln(factor) + 1.
  const auto yarn = rope::rope_frequencies(
      10000.0, 8, rope::YarnScaling().factor(8.0).original_max_position_embeddings(64), 1);
  EXPECT_DOUBLE_EQ(yarn.attention_scaling, 0.1 * std::log(8.0) + 1.0);
  // longrope: sqrt(1 + ln(factor) / ln(original)), factor from the context lengths.
  const auto longrope = rope::rope_frequencies(10000.0, 4,
                                               rope::LongRopeScaling()
                                                   .short_factor({1.0, 2.0})
                                                   .long_factor({3.0, 5.0})
                                                   .original_max_position_embeddings(16)
                                                   .max_position_embeddings(64),
                                               /*seq_len=*/17);
  EXPECT_DOUBLE_EQ(longrope.attention_scaling, std::sqrt(1.0 + std::log(4.0) / std::log(16.0)));
  EXPECT_DOUBLE_EQ(longrope.inv_freq[1].item<double>(), 1.0 / (5.0 * std::pow(10000.0, 0.5)));
  // dynamic at its pretraining length is plain RoPE; beyond it, a larger base.
  const auto dynamic = rope::DynamicNTKScaling().factor(2.0).max_position_embeddings(32);
  const auto at_length = rope::rope_frequencies(10000.0, 8, dynamic, 32);
  EXPECT_TRUE(torch::allclose(at_length.inv_freq, plain, 0, 0));
  const auto longer = rope::rope_frequencies(10000.0, 8, dynamic, 64);
  const double base = 10000.0 * std::pow(2.0 * 64 / 32 - 1.0, 8.0 / 6.0);
  EXPECT_DOUBLE_EQ(longer.inv_freq[1].item<double>(), 1.0 / std::pow(base, 2.0 / 8.0));
  EXPECT_EQ(rope::rope_type_name(rope::ProportionalScaling()), "proportional");
}

TEST(Module, LongRopeSwitchesPerCallOnTheDevice) {
  const auto longrope = rope::LongRopeScaling()
                            .short_factor({1.0, 1.5, 2.0, 2.5})
                            .long_factor({3.0, 4.0, 5.0, 6.0})
                            .original_max_position_embeddings(16)
                            .max_position_embeddings(64);
  RotaryPositionalEmbedding both(10000.0, 8, 64, torch::kCPU, Opts().scaling(longrope));
  RotaryPositionalEmbedding short_only(10000.0, 8, 64, torch::kCPU,
                                       Opts().scaling(rope::LongRopeScaling(longrope).seq_len(16)));
  RotaryPositionalEmbedding long_only(10000.0, 8, 64, torch::kCPU,
                                      Opts().scaling(rope::LongRopeScaling(longrope).seq_len(17)));
  EXPECT_EQ(both->cos_table().size(0), 128);
  EXPECT_EQ(both->long_offset(), 64);
  const auto x = torch::randn({1, 2, 20, 8});
  const auto head = x.narrow(2, 0, 16);
  EXPECT_TRUE(bitwise_equal(both(head), short_only(head)));
  EXPECT_TRUE(bitwise_equal(both(x), long_only(x)));
}

// ---- errors: c10::ValueError (Python's ValueError) naming the argument
// -----------------------------

struct BadModuleCall {
  std::string name;
  std::function<void()> call;
  std::vector<std::string> parts;
};

class ModuleErrors : public ::testing::TestWithParam<BadModuleCall> {};

TEST_P(ModuleErrors, AreValueErrorsNamingTheArgument) {
  const auto& bad = GetParam();
  const std::string message = error_message<c10::ValueError>(bad.call);
  for (const auto& part : bad.parts) {
    EXPECT_NE(message.find(part), std::string::npos)
        << "message lacks \"" << part << "\"; message was:\n"
        << message;
  }
}

RotaryPositionalEmbedding make(double theta, int64_t d_k, int64_t max_seq_len,
                               const Opts& options = Opts()) {
  return RotaryPositionalEmbedding(theta, d_k, max_seq_len, std::nullopt, options);
}

void forward_on(const std::vector<int64_t>& shape, int64_t d_k = 16, int64_t max_seq_len = 8) {
  RotaryPositionalEmbedding m(10000.0, d_k, max_seq_len);
  m(torch::randn(shape));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ModuleErrors,
    ::testing::Values(
        BadModuleCall{"theta_zero", [] { make(0.0, 16, 32); }, {"theta", "got 0"}},
        BadModuleCall{"theta_negative", [] { make(-10.0, 16, 32); }, {"theta", "-10"}},
        BadModuleCall{"theta_nan", [] { make(std::nan(""), 16, 32); }, {"theta", "nan"}},
        BadModuleCall{"d_k_zero", [] { make(10000.0, 0, 32); }, {"d_k", "got 0"}},
        BadModuleCall{"odd_d_k", [] { make(10000.0, 7, 32); }, {"rotary_dim", "got 7"}},
        BadModuleCall{"odd_rotary_dim",
                      [] { make(10000.0, 16, 32, Opts().rotary_dim(7)); },
                      {"rotary_dim must be even", "got 7"}},
        BadModuleCall{"rotary_dim_zero",
                      [] { make(10000.0, 16, 32, Opts().rotary_dim(0)); },
                      {"rotary_dim", "got 0"}},
        BadModuleCall{"rotary_dim_above_d_k",
                      [] { make(10000.0, 16, 32, Opts().rotary_dim(32)); },
                      {"rotary_dim", "d_k = 16", "got 32"}},
        BadModuleCall{
            "max_seq_len_zero", [] { make(10000.0, 16, 0); }, {"max_seq_len must be >= 1, got 0"}},
        BadModuleCall{"max_seq_len_huge",
                      [] { make(10000.0, 16, std::numeric_limits<int64_t>::max()); },
                      {"max_seq_len", "2^53", "9223372036854775807"}},
        // 2^40 rows of 32 float32 planes, cos and sin: 2^48 bytes (256 TiB), more than any
        // machine this runs on (the allocator's own error named no argument).
        BadModuleCall{"tables_larger_than_the_machine",
                      [] { make(10000.0, 64, int64_t{1} << 40); },
                      {"RotaryPositionalEmbedding: max_seq_len = 1099511627776 needs "
                       "281474976710656 bytes",
                       "(RAM and swap)", "pass a smaller max_seq_len"}},
        BadModuleCall{"extend_tables_larger_than_the_machine",
                      [] { make(10000.0, 64, 32)->extend_tables(int64_t{1} << 40); },
                      {"max_seq_len = 1099511627776 needs 281474976710656 bytes"}},
        BadModuleCall{"rope_tables_larger_than_the_machine",
                      [] { rope::rope_tables(10000.0, 64, int64_t{1} << 40); },
                      {"rope_tables: max_seq_len = 1099511627776 needs 281474976710656 bytes"}},
        BadModuleCall{"seq_dim_feature_axis",
                      [] { make(10000.0, 16, 32, Opts().seq_dim(-1)); },
                      {"seq_dim", "-1"}},
        BadModuleCall{"bfloat16_tables",
                      [] { make(10000.0, 16, 32, Opts().dtype(torch::kBFloat16)); },
                      {"dtype", "BFloat16"}},
        BadModuleCall{
            "llama3_negative_factor",
            [] { make(10000.0, 16, 32, Opts().scaling(rope::Llama3Scaling().factor(-1.0))); },
            {"llama3", "factor", "-1"}},
        BadModuleCall{"extend_tables_to_zero",
                      [] { RotaryPositionalEmbedding(10000.0, 16, 32)->extend_tables(0); },
                      {"extend_tables", "max_seq_len", "got 0"}},
        BadModuleCall{"x_narrower_than_d_k",
                      [] { forward_on({2, 4, 8}); },
                      {"x.size(-1) must equal d_k = 16", "[2, 4, 8]"}},
        BadModuleCall{"x_wider_than_d_k",
                      [] { forward_on({2, 4, 32}); },
                      {"x.size(-1) must equal d_k = 16", "[2, 4, 32]"}},
        BadModuleCall{"no_sequence_axis", [] { forward_on({16}); }, {"token_positions", "[16]"}},
        BadModuleCall{"undefined_positions",
                      [] {
                        RotaryPositionalEmbedding m(10000.0, 16, 8);
                        m(torch::randn({2, 16}), torch::Tensor());
                      },
                      {"token_positions", "undefined"}}),
    [](const auto& info) { return info.param.name; });

}  // namespace
