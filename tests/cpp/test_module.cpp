// rope::RotaryPositionalEmbedding: its tables, forward, dtype casts, and serialization (tables are
// derived state: never saved, always rebuilt).
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch_rope/module.h>
#include <torch_rope/ops.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "reference.h"

namespace {

using rope::RotaryPositionalEmbedding;
using rope::RotaryPositionalEmbeddingOptions;
using rope_test::all_close;
using rope_test::bitwise_equal;
using rope_test::contains_all;
using rope_test::error_message;
using rope_test::reference_rope;
using rope_test::Tolerance;

// Tables built independently: cos/sin of a float64 angle, rounded to float32 once. At position
// 8191 a float32 angle would be off by ~5e-4 rad, far outside this tolerance.
void expect_tables_match(const RotaryPositionalEmbedding& m, double theta, int64_t rotary_dim,
                         int64_t max_seq_len) {
  const auto& cos = m->cos_table();
  const auto& sin = m->sin_table();
  ASSERT_EQ(cos.scalar_type(), torch::kFloat);
  ASSERT_EQ(sin.scalar_type(), torch::kFloat);
  const std::vector<int64_t> shape = {max_seq_len, rotary_dim / 2};
  ASSERT_EQ(cos.sizes().vec(), shape);
  ASSERT_EQ(sin.sizes().vec(), shape);
  const auto expected = rope_test::reference_tables(max_seq_len, rotary_dim, theta, torch::kDouble);
  // One float32 rounding of a value in [-1, 1] is at most 6e-8.
  EXPECT_TRUE(all_close(cos, expected.cos, Tolerance{0.0, 1.2e-7}));
  EXPECT_TRUE(all_close(sin, expected.sin, Tolerance{0.0, 1.2e-7}));
}

TEST(Module, BuffersAreFloat32TablesEqualToDoubleComputation) {
  RotaryPositionalEmbedding m(10000.0, 64, 8192);
  expect_tables_match(m, 10000.0, 64, 8192);
  const auto buffers = m->named_buffers();
  ASSERT_EQ(buffers.size(), 2u);
  EXPECT_TRUE(buffers.contains("cos"));
  EXPECT_TRUE(buffers.contains("sin"));
  EXPECT_TRUE(bitwise_equal(buffers["cos"], m->cos_table()));
  EXPECT_TRUE(bitwise_equal(buffers["sin"], m->sin_table()));
  EXPECT_TRUE(m->cos_table().device().is_cpu());
}

TEST(Module, OptionsAndAccessors) {
  RotaryPositionalEmbedding m(500000.0, 32, 100,
                              RotaryPositionalEmbeddingOptions().rotary_dim(16).interleaved(false));
  expect_tables_match(m, 500000.0, 16, 100);
  EXPECT_EQ(m->theta(), 500000.0);
  EXPECT_EQ(m->d_k(), 32);
  EXPECT_EQ(m->max_seq_len(), 100);
  EXPECT_EQ(m->rotary_dim(), 16);
  EXPECT_FALSE(m->interleaved());

  RotaryPositionalEmbedding defaults(10000.0, 24, 10);
  EXPECT_EQ(defaults->rotary_dim(), 24);
  EXPECT_TRUE(defaults->interleaved());

  RotaryPositionalEmbedding on_cpu(10000.0, 8, 10,
                                   RotaryPositionalEmbeddingOptions().device(torch::kCPU));
  EXPECT_TRUE(on_cpu->cos_table().device().is_cpu());
}

TEST(Module, TablesAreTheSharedBuilder) {
  RotaryPositionalEmbedding m(10000.0, 48, 64, RotaryPositionalEmbeddingOptions().rotary_dim(32));
  const auto [cos, sin] = rope::rope_tables(10000.0, 32, 64);
  EXPECT_TRUE(bitwise_equal(m->cos_table(), cos));
  EXPECT_TRUE(bitwise_equal(m->sin_table(), sin));
}

TEST(Module, HasNoParameters) {
  RotaryPositionalEmbedding m(10000.0, 16, 32);
  EXPECT_TRUE(m->parameters().empty());
  EXPECT_TRUE(m->named_parameters().is_empty());
  EXPECT_FALSE(m->cos_table().requires_grad());
}

TEST(Module, ForwardMatchesReference) {
  torch::manual_seed(0);
  for (const bool interleaved : {true, false}) {
    for (const int64_t rotary_dim : {16, 10}) {
      RotaryPositionalEmbedding m(
          10000.0, 16, 40,
          RotaryPositionalEmbeddingOptions().rotary_dim(rotary_dim).interleaved(interleaved));
      const auto independent = rope_test::reference_tables(40, rotary_dim);
      const auto x = torch::randn({2, 3, 7, 16});
      const auto positions = torch::randint(0, 40, {7}, torch::kLong);
      EXPECT_TRUE(all_close(m(x, positions),
                            reference_rope(x, independent.cos, independent.sin, positions,
                                           interleaved),
                            torch::kFloat))
          << "interleaved " << interleaved << ", rotary_dim " << rotary_dim;
    }
  }
}

TEST(Module, ForwardWithoutPositionsUsesArange) {
  torch::manual_seed(1);
  RotaryPositionalEmbedding m(10000.0, 16, 32);
  for (const auto& shape : {std::vector<int64_t>{2, 3, 7, 16}, std::vector<int64_t>{7, 16},
                            std::vector<int64_t>{4, 5, 16}}) {
    const auto x = torch::randn(shape);
    const int64_t seq_len = x.size(-2);
    const auto out = m(x);
    EXPECT_TRUE(bitwise_equal(out, m(x, torch::arange(seq_len, torch::kLong))));
    EXPECT_TRUE(bitwise_equal(out, m(x, torch::arange(seq_len, torch::kInt))));
    EXPECT_TRUE(bitwise_equal(out, m->forward(x, std::nullopt)));
  }
}

TEST(Module, ForwardKeepsDtypeAndShape) {
  torch::manual_seed(2);
  RotaryPositionalEmbedding m(10000.0, 32, 16);
  for (const auto dtype : {torch::kFloat, torch::kDouble, torch::kHalf, torch::kBFloat16}) {
    const auto x = torch::randn({2, 5, 32}, dtype);
    const auto out = m(x);
    EXPECT_EQ(out.scalar_type(), dtype);
    EXPECT_EQ(out.sizes(), x.sizes());
    EXPECT_TRUE(all_close(out,
                          reference_rope(x, m->cos_table(), m->sin_table(), torch::arange(5)),
                          dtype));
  }
}

TEST(Module, WorksInsideSequentialWithDefaultArgument) {
  // FORWARD_HAS_DEFAULT_ARGS lets AnyModule-based containers call forward(x) alone.
  torch::manual_seed(3);
  RotaryPositionalEmbedding m(10000.0, 16, 32);
  torch::nn::Sequential seq(m);
  const auto x = torch::randn({2, 3, 6, 16});
  EXPECT_TRUE(bitwise_equal(seq->forward(x), m(x)));
}

TEST(Module, CastToLowPrecisionKeepsTablesFloat32) {
  for (const auto dtype : {torch::kBFloat16, torch::kHalf, torch::kDouble}) {
    RotaryPositionalEmbedding m(10000.0, 16, 32);
    const auto cos_before = m->cos_table().clone();
    m->to(dtype);
    EXPECT_EQ(m->cos_table().scalar_type(), torch::kFloat) << rope_test::dtype_name(dtype);
    EXPECT_EQ(m->sin_table().scalar_type(), torch::kFloat);
    EXPECT_TRUE(bitwise_equal(m->cos_table(), cos_before));
    m->to(torch::kCPU, dtype);
    EXPECT_EQ(m->cos_table().scalar_type(), torch::kFloat);
    for (const auto& buffer : m->buffers()) {
      EXPECT_EQ(buffer.scalar_type(), torch::kFloat);
    }
  }
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
  EXPECT_EQ(block->rotary->cos_table().scalar_type(), torch::kFloat);
  const auto buffers = block->named_buffers();
  ASSERT_TRUE(buffers.contains("rope.cos"));
  EXPECT_EQ(buffers["rope.cos"].scalar_type(), torch::kFloat);
  EXPECT_EQ(buffers["rope.sin"].scalar_type(), torch::kFloat);
  const auto x = torch::randn({2, 5, 16}, torch::kBFloat16);
  const auto out = block(x);
  EXPECT_EQ(out.scalar_type(), torch::kBFloat16);
  // The parent's parameters are the Linear's alone.
  EXPECT_EQ(block->parameters().size(), 2u);
}

std::vector<std::string> keys_of(torch::serialize::InputArchive& archive) {
  auto keys = archive.keys();
  std::sort(keys.begin(), keys.end());
  return keys;
}

bool has_key(const std::vector<std::string>& keys, const std::string& key) {
  return std::find(keys.begin(), keys.end(), key) != keys.end();
}

TEST(Module, ParentSaveLoadRoundTripWithoutTables) {
  torch::manual_seed(5);
  Block saved;
  std::stringstream stream;
  torch::save(saved, stream);

  // The archive holds the Linear's tensors and no cos/sin at any level.
  {
    std::stringstream copy(stream.str());
    torch::serialize::InputArchive archive;
    archive.load_from(copy);
    const auto top = keys_of(archive);
    EXPECT_FALSE(has_key(top, "cos"));
    EXPECT_FALSE(has_key(top, "sin"));
    torch::Tensor t;
    EXPECT_FALSE(archive.try_read("rope.cos", t));
    EXPECT_FALSE(archive.try_read("rope.sin", t));

    torch::serialize::InputArchive proj;
    ASSERT_TRUE(archive.try_read("proj", proj));
    const auto proj_keys = keys_of(proj);
    EXPECT_TRUE(has_key(proj_keys, "weight")) << ::testing::PrintToString(proj_keys);
    EXPECT_TRUE(has_key(proj_keys, "bias"));
    EXPECT_TRUE(proj.try_read("weight", t));  // positive control for try_read

    torch::serialize::InputArchive rope_archive;
    if (archive.try_read("rope", rope_archive)) {
      const auto rope_keys = keys_of(rope_archive);
      EXPECT_FALSE(has_key(rope_keys, "cos")) << ::testing::PrintToString(rope_keys);
      EXPECT_FALSE(has_key(rope_keys, "sin"));
      EXPECT_FALSE(rope_archive.try_read("cos", t, /*is_buffer=*/true));
      EXPECT_FALSE(rope_archive.try_read("sin", t, /*is_buffer=*/true));
    }
  }

  Block loaded;
  torch::load(loaded, stream);
  EXPECT_TRUE(bitwise_equal(loaded->proj->weight, saved->proj->weight));
  EXPECT_TRUE(bitwise_equal(loaded->proj->bias, saved->proj->bias));
  EXPECT_TRUE(bitwise_equal(loaded->rotary->cos_table(), saved->rotary->cos_table()));
  const auto x = torch::randn({2, 5, 16});
  EXPECT_TRUE(bitwise_equal(loaded(x), saved(x)));
}

TEST(Module, LoadKeepsTheFreshModulesTables) {
  // Tables are rebuilt from the constructor, so loading into a model built for a longer context
  // keeps that model's tables.
  Block saved(/*max_seq_len=*/16);
  std::stringstream stream;
  torch::save(saved, stream);
  Block loaded(/*max_seq_len=*/64);
  torch::load(loaded, stream);
  EXPECT_EQ(loaded->rotary->cos_table().size(0), 64);
  EXPECT_TRUE(bitwise_equal(loaded->proj->weight, saved->proj->weight));
  const auto x = torch::randn({1, 40, 16});  // 40 positions: only the 64-entry tables cover them
  EXPECT_NO_THROW(loaded(x));
}

TEST(Module, SaveLoadModuleAlone) {
  torch::manual_seed(6);
  RotaryPositionalEmbedding saved(10000.0, 16, 32,
                                  RotaryPositionalEmbeddingOptions().rotary_dim(8));
  std::stringstream stream;
  torch::save(saved, stream);
  {
    std::stringstream copy(stream.str());
    torch::serialize::InputArchive archive;
    archive.load_from(copy);
    const auto keys = keys_of(archive);
    EXPECT_FALSE(has_key(keys, "cos")) << ::testing::PrintToString(keys);
    EXPECT_FALSE(has_key(keys, "sin"));
    torch::Tensor t;
    EXPECT_FALSE(archive.try_read("cos", t, /*is_buffer=*/true));
  }
  RotaryPositionalEmbedding loaded(10000.0, 16, 32,
                                   RotaryPositionalEmbeddingOptions().rotary_dim(8));
  torch::load(loaded, stream);
  EXPECT_TRUE(bitwise_equal(loaded->cos_table(), saved->cos_table()));
  EXPECT_TRUE(bitwise_equal(loaded->sin_table(), saved->sin_table()));
  const auto x = torch::randn({3, 9, 16});
  EXPECT_TRUE(bitwise_equal(loaded(x), saved(x)));
}

TEST(Module, SaveLoadThroughAFile) {
  torch::manual_seed(7);
  const auto path = std::filesystem::temp_directory_path() /
                    ("torch_rope_test_" + std::to_string(::getpid()) + ".pt");
  Block saved;
  torch::save(saved, path.string());
  Block loaded;
  torch::load(loaded, path.string());
  std::filesystem::remove(path);
  const auto x = torch::randn({2, 5, 16});
  EXPECT_TRUE(bitwise_equal(loaded(x), saved(x)));
}

TEST(Module, PrettyPrintNamesTheConfiguration) {
  RotaryPositionalEmbedding m(10000.0, 16, 32,
                              RotaryPositionalEmbeddingOptions().rotary_dim(8).interleaved(false));
  std::ostringstream os;
  os << *m;
  EXPECT_TRUE(contains_all(os.str(), {"RotaryPositionalEmbedding", "d_k=16", "max_seq_len=32",
                                      "rotary_dim=8", "interleaved=false"}));
}

TEST(Module, BadConstructorArgumentsThrow) {
  using Opts = RotaryPositionalEmbeddingOptions;
  EXPECT_TRUE(contains_all(error_message([] { RotaryPositionalEmbedding(10000.0, 16, 32, Opts().rotary_dim(7)); }),
                           {"rotary_dim", "even", "7"}));
  EXPECT_TRUE(contains_all(
      error_message([] { RotaryPositionalEmbedding(10000.0, 7, 32); }), {"rotary_dim", "7"}));
  EXPECT_TRUE(contains_all(
      error_message([] { RotaryPositionalEmbedding(10000.0, 16, 32, Opts().rotary_dim(32)); }),
      {"rotary_dim", "d_k", "16", "32"}));
  EXPECT_TRUE(contains_all(error_message([] { RotaryPositionalEmbedding(10000.0, 16, 0); }),
                           {"max_seq_len", "0"}));
  EXPECT_TRUE(contains_all(error_message([] { RotaryPositionalEmbedding(0.0, 16, 32); }),
                           {"theta", "0"}));
  EXPECT_TRUE(contains_all(error_message([] { RotaryPositionalEmbedding(-10.0, 16, 32); }),
                           {"theta", "-10"}));
  EXPECT_TRUE(contains_all(
      error_message([] { RotaryPositionalEmbedding(std::nan(""), 16, 32); }), {"theta", "nan"}));
  EXPECT_TRUE(contains_all(error_message([] { RotaryPositionalEmbedding(10000.0, 0, 32); }),
                           {"d_k", "0"}));
  EXPECT_TRUE(contains_all(
      error_message([] { RotaryPositionalEmbedding(10000.0, 16, 32, Opts().rotary_dim(0)); }),
      {"rotary_dim", "0"}));
}

TEST(Module, ForwardErrors) {
  RotaryPositionalEmbedding m(10000.0, 16, 8);
  // Longer than the tables.
  EXPECT_TRUE(contains_all(error_message([&] { m(torch::randn({2, 9, 16})); }),
                           {"positions", "8", "max_seq_len"}));
  // No sequence dim to build positions from.
  EXPECT_TRUE(contains_all(error_message([&] { m(torch::randn({16})); }),
                           {"token_positions", "[16]"}));
  // x.size(-1) other than d_k, smaller or larger (a larger one used to pass its tail through).
  EXPECT_TRUE(contains_all(error_message([&] { m(torch::randn({2, 4, 8})); }),
                           {"x.size(-1) must equal d_k = 16", "[2, 4, 8]"}));
  EXPECT_TRUE(contains_all(error_message([&] { m(torch::randn({2, 4, 32})); }),
                           {"x.size(-1) must equal d_k = 16", "[2, 4, 32]"}));
}

}  // namespace

TEST(Module, CloneInsideSequentialCopiesTables) {
  torch::nn::Sequential seq(rope::RotaryPositionalEmbedding(10000.0, 16, 32));
  auto copy = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(seq->clone());
  ASSERT_TRUE(copy);
  const auto& original = seq[0]->as<rope::RotaryPositionalEmbeddingImpl>()->cos_table();
  const auto& cloned = copy->ptr(0)->as<rope::RotaryPositionalEmbeddingImpl>()->cos_table();
  EXPECT_TRUE(torch::equal(original, cloned));
  EXPECT_NE(original.data_ptr(), cloned.data_ptr());  // a deep copy, not shared storage
  const auto x = torch::randn({2, 5, 16});
  EXPECT_TRUE(torch::equal(seq->forward(x), copy->forward(x)));
}

// ---- options: device positional, scaling, float64 tables, seq_dim, growth ----------------------

namespace {

using rope::RotaryPositionalEmbedding;
using rope::RotaryPositionalEmbeddingOptions;
using rope_test::bitwise_equal;
using rope_test::contains_all;

// Runs `f`, which must throw c10::ValueError (Python's ValueError); returns its message.
template <typename F>
std::string value_error_message(F&& f) {
  try {
    f();
  } catch (const c10::ValueError& e) {
    return e.what_without_backtrace();
  } catch (const c10::Error& e) {
    ADD_FAILURE() << "expected c10::ValueError, got another c10::Error: "
                  << e.what_without_backtrace();
    return "";
  }
  ADD_FAILURE() << "expected a c10::ValueError, but nothing was thrown";
  return "";
}

TEST(ModuleOptions, DeviceIsTheFourthArgumentAsInCs336) {
  RotaryPositionalEmbedding cpu(10000.0, 16, 32, torch::kCPU);
  EXPECT_TRUE(cpu->cos_table().device().is_cpu());
  RotaryPositionalEmbedding meta(10000.0, 16, 32, torch::Device(torch::kMeta),
                                 RotaryPositionalEmbeddingOptions().rotary_dim(8));
  EXPECT_TRUE(meta->cos_table().is_meta());
  EXPECT_EQ(meta->cos_table().sizes(), (std::vector<int64_t>{32, 4}));
  // The options-only form keeps compiling and meaning the same.
  RotaryPositionalEmbedding old_form(10000.0, 16, 32, RotaryPositionalEmbeddingOptions());
  EXPECT_TRUE(bitwise_equal(old_form->cos_table(), cpu->cos_table()));
  EXPECT_TRUE(contains_all(value_error_message([] {
                             RotaryPositionalEmbedding(
                                 10000.0, 16, 32, torch::kCPU,
                                 RotaryPositionalEmbeddingOptions().device(torch::kMeta));
                           }),
                           {"device given twice"}));
}

TEST(ModuleOptions, BadArgumentsAreValueErrorsNamingTheArgument) {
  using Opts = RotaryPositionalEmbeddingOptions;
  EXPECT_TRUE(contains_all(value_error_message([] { RotaryPositionalEmbedding(std::nan(""), 16, 32); }),
                           {"theta", "nan"}));
  EXPECT_TRUE(contains_all(value_error_message([] { RotaryPositionalEmbedding(0.0, 16, 32); }),
                           {"theta", "0"}));
  EXPECT_TRUE(contains_all(value_error_message([] { RotaryPositionalEmbedding(10000.0, 16, 0); }),
                           {"max_seq_len must be >= 1, got 0"}));
  EXPECT_TRUE(contains_all(value_error_message([] {
                             RotaryPositionalEmbedding(10000.0, 16,
                                                       std::numeric_limits<int64_t>::max());
                           }),
                           {"max_seq_len", "2^53", "9223372036854775807"}));
  EXPECT_TRUE(contains_all(
      value_error_message([] { RotaryPositionalEmbedding(10000.0, 16, 32, std::nullopt, Opts().rotary_dim(5)); }),
      {"rotary_dim", "5"}));
  EXPECT_TRUE(contains_all(
      value_error_message([] { RotaryPositionalEmbedding(10000.0, 16, 32, std::nullopt, Opts().seq_dim(-1)); }),
      {"seq_dim", "-1"}));
  EXPECT_TRUE(contains_all(value_error_message([] {
                             RotaryPositionalEmbedding(10000.0, 16, 32, std::nullopt,
                                                       Opts().dtype(torch::kBFloat16));
                           }),
                           {"dtype", "BFloat16"}));
  EXPECT_TRUE(contains_all(value_error_message([] {
                             RotaryPositionalEmbedding(
                                 10000.0, 16, 32, std::nullopt,
                                 Opts().scaling(rope::Llama3Scaling().factor(-1.0)));
                           }),
                           {"llama3", "factor", "-1"}));
  RotaryPositionalEmbedding m(10000.0, 8, 32);
  EXPECT_TRUE(contains_all(value_error_message([&] { m(torch::randn({3, 16})); }),
                           {"x.size(-1) must equal d_k = 8", "[3, 16]"}));
}

TEST(ModuleOptions, ScalingVariantsAreTheSharedBuilders) {
  const rope::RopeScaling variants[] = {
      rope::LinearScaling().factor(4.0),
      rope::Llama3Scaling().factor(8.0).original_max_position_embeddings(64),
      rope::YarnScaling().factor(4.0).original_max_position_embeddings(32),
      rope::DynamicNTKScaling().factor(2.0).max_position_embeddings(32),
      rope::ProportionalScaling().partial_rotary_factor(0.5),
  };
  for (const auto& scaling : variants) {
    RotaryPositionalEmbedding m(500000.0, 32, 128, torch::kCPU,
                                RotaryPositionalEmbeddingOptions().scaling(scaling));
    const auto [cos, sin] =
        rope::rope_tables(500000.0, 32, 128, rope::TableOptions().scaling(scaling));
    EXPECT_TRUE(bitwise_equal(m->cos_table(), cos)) << rope::rope_type_name(scaling);
    EXPECT_TRUE(bitwise_equal(m->sin_table(), sin)) << rope::rope_type_name(scaling);
    // And the builder is attention_scaling * cos(p * inv_freq) in double, rounded once.
    const auto f = rope::rope_frequencies(500000.0, 32, scaling, 128);
    const auto angles = torch::arange(128, torch::kDouble).unsqueeze(1) * f.inv_freq;
    EXPECT_TRUE(bitwise_equal(cos, (angles.cos() * f.attention_scaling).to(torch::kFloat)));
    std::ostringstream os;
    os << *m;
    EXPECT_TRUE(contains_all(os.str(), {"scaling=" + rope::rope_type_name(scaling)}));
  }
}

TEST(ModuleOptions, ScalingFormulasAgainstHandComputedValues) {
  // linear: every frequency over the factor.
  const auto plain = rope::rope_frequencies(10000.0, 8, rope::NoScaling{}, 1).inv_freq;
  const auto linear = rope::rope_frequencies(10000.0, 8, rope::LinearScaling().factor(4.0), 1);
  EXPECT_TRUE(torch::allclose(linear.inv_freq, plain / 4.0, 0, 0));
  EXPECT_DOUBLE_EQ(plain[1].item<double>(), 1.0 / std::pow(10000.0, 2.0 / 8.0));
  // yarn's default attention factor: 0.1 ln(factor) + 1.
  const auto yarn =
      rope::rope_frequencies(10000.0, 8, rope::YarnScaling().factor(8.0).original_max_position_embeddings(64), 1);
  EXPECT_DOUBLE_EQ(yarn.attention_scaling, 0.1 * std::log(8.0) + 1.0);
  // longrope: sqrt(1 + ln(factor) / ln(original)), factor from the context lengths.
  const auto longrope = rope::rope_frequencies(
      10000.0, 4,
      rope::LongRopeScaling().short_factor({1.0, 2.0}).long_factor({3.0, 5.0})
          .original_max_position_embeddings(16).max_position_embeddings(64),
      /*seq_len=*/17);
  EXPECT_DOUBLE_EQ(longrope.attention_scaling, std::sqrt(1.0 + std::log(4.0) / std::log(16.0)));
  EXPECT_DOUBLE_EQ(longrope.inv_freq[1].item<double>(), 1.0 / (5.0 * std::pow(10000.0, 0.5)));
  // dynamic at its pretraining length is plain RoPE; beyond it, a larger base.
  const auto at_length = rope::rope_frequencies(
      10000.0, 8, rope::DynamicNTKScaling().factor(2.0).max_position_embeddings(32), 32);
  EXPECT_TRUE(torch::allclose(at_length.inv_freq, plain, 0, 0));
  const auto longer = rope::rope_frequencies(
      10000.0, 8, rope::DynamicNTKScaling().factor(2.0).max_position_embeddings(32), 64);
  const double base = 10000.0 * std::pow(2.0 * 64 / 32 - 1.0, 8.0 / 6.0);
  EXPECT_DOUBLE_EQ(longer.inv_freq[1].item<double>(), 1.0 / std::pow(base, 2.0 / 8.0));
  EXPECT_EQ(rope::rope_type_name(rope::ProportionalScaling()), "proportional");
}

TEST(ModuleOptions, Float64TablesStayFloat64AndReachTheAnglesRounding) {
  RotaryPositionalEmbedding m(10000.0, 16, 5000, torch::kCPU,
                              RotaryPositionalEmbeddingOptions().dtype(torch::kDouble));
  m->to(torch::kHalf);
  EXPECT_EQ(m->cos_table().scalar_type(), torch::kDouble);
  const auto x = torch::randn({3, 16}, torch::kDouble);
  const auto positions = torch::tensor({1, 1000, 4096});
  const auto independent = rope_test::reference_tables(4097, 16, 10000.0, torch::kDouble);
  const auto want = rope_test::reference_rope(x, independent.cos, independent.sin, positions);
  // Both sides carry float64 angle roundings: a few 1e-16 x position.
  EXPECT_LT((m(x, positions) - want).abs().max().item<double>(), 4096 * 1e-15);
}

TEST(ModuleOptions, SeqDimMinus3FollowsTheSequenceAxis) {
  RotaryPositionalEmbedding bshd(10000.0, 16, 32, torch::kCPU,
                                 RotaryPositionalEmbeddingOptions().seq_dim(-3));
  RotaryPositionalEmbedding bhsd(10000.0, 16, 32);
  const auto x = torch::randn({2, 7, 3, 16});  // [b, s, h, d]
  EXPECT_TRUE(bitwise_equal(bshd(x).transpose(1, 2), bhsd(x.transpose(1, 2))));
  for (const auto& positions : {torch::arange(4, 11), torch::randint(0, 32, {2, 7})}) {
    EXPECT_TRUE(bitwise_equal(bshd(x, positions).transpose(1, 2),
                              bhsd(x.transpose(1, 2), positions)));
  }
}

TEST(ModuleOptions, ExtendTablesGrowsThemExplicitly) {
  RotaryPositionalEmbedding m(10000.0, 16, 32);
  const auto x = torch::randn({1, 40, 16});
  EXPECT_TRUE(contains_all(rope_test::error_message([&] { m(x); }), {"max_seq_len", "32"}));
  const auto before = m->cos_table().clone();
  const auto handle = m->named_buffers()["cos"];
  m->extend_tables(64);
  EXPECT_EQ(m->max_seq_len(), 64);
  EXPECT_EQ(m->cos_table().size(0), 64);
  EXPECT_TRUE(bitwise_equal(m->cos_table().narrow(0, 0, 32), before));
  EXPECT_TRUE(bitwise_equal(handle, m->cos_table()));  // the registered buffer itself grew
  const auto independent = rope_test::reference_tables(40, 16);
  EXPECT_TRUE(rope_test::all_close(
      m(x), rope_test::reference_rope(x, independent.cos, independent.sin, torch::arange(40)),
      torch::kFloat));
}

TEST(ModuleOptions, LongRopeSwitchesPerCallOnTheDevice) {
  const auto longrope = rope::LongRopeScaling()
                            .short_factor({1.0, 1.5, 2.0, 2.5})
                            .long_factor({3.0, 4.0, 5.0, 6.0})
                            .original_max_position_embeddings(16)
                            .max_position_embeddings(64);
  RotaryPositionalEmbedding both(10000.0, 8, 64, torch::kCPU,
                                 RotaryPositionalEmbeddingOptions().scaling(longrope));
  RotaryPositionalEmbedding short_only(
      10000.0, 8, 64, torch::kCPU,
      RotaryPositionalEmbeddingOptions().scaling(rope::LongRopeScaling(longrope).seq_len(16)));
  RotaryPositionalEmbedding long_only(
      10000.0, 8, 64, torch::kCPU,
      RotaryPositionalEmbeddingOptions().scaling(rope::LongRopeScaling(longrope).seq_len(17)));
  EXPECT_EQ(both->cos_table().size(0), 128);
  EXPECT_EQ(both->long_offset(), 64);
  const auto x = torch::randn({1, 2, 20, 8});
  const auto head = x.narrow(2, 0, 16);
  EXPECT_TRUE(bitwise_equal(both(head), short_only(head)));
  EXPECT_TRUE(bitwise_equal(both(x), long_only(x)));
}

}  // namespace
