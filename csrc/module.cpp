// SPDX-License-Identifier: BSD-3-Clause
#include <ATen/ExpandUtils.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch/serialize/archive.h>
#include <torch_rope/module.h>
#include <torch_rope/ops.h>

#include <cmath>
#include <type_traits>

namespace rope {
namespace {

// Positions are exact in float64 up to 2^53 and the doubled LongRoPE tables must stay addressable.
constexpr int64_t kMaxTableElements = int64_t{1} << 53;

void check_max_seq_len(int64_t max_seq_len, int64_t rotary_dim, const char* who) {
  TORCH_CHECK_VALUE(max_seq_len >= 1, who, ": max_seq_len must be >= 1, got ", max_seq_len);
  TORCH_CHECK_VALUE(max_seq_len <= kMaxTableElements / rotary_dim, who,
                    ": max_seq_len * rotary_dim must be <= 2^53 (the tables could never be "
                    "allocated), got max_seq_len = ",
                    max_seq_len, " with rotary_dim = ", rotary_dim);
}

}  // namespace

ModuleTables module_tables(double theta, int64_t rotary_dim, int64_t max_seq_len,
                           const RopeScaling& scaling, c10::ScalarType dtype,
                           std::optional<c10::Device> device) {
  const auto* longrope = std::get_if<LongRopeScaling>(&scaling);
  if (longrope == nullptr || longrope->seq_len().has_value()) {
    auto [cos, sin] = rope_tables(theta, rotary_dim, max_seq_len,
                                  TableOptions().scaling(scaling).dtype(dtype).device(device));
    return {cos, sin, 0, 0};
  }
  // transformers picks long_factor when max(position) + 1 > original_max_position_embeddings.
  // Both variants live in one allocation, so forward switches by adding a row offset on the
  // device instead of reading the positions back.
  check_max_seq_len(max_seq_len, rotary_dim, "rope_tables");
  const int64_t original = longrope->original_max_position_embeddings();
  const auto short_freq = rope_frequencies(
      theta, rotary_dim, LongRopeScaling(*longrope).seq_len(original), max_seq_len);
  const auto long_freq = rope_frequencies(
      theta, rotary_dim, LongRopeScaling(*longrope).seq_len(original + 1), max_seq_len);
  TORCH_CHECK_VALUE(dtype == at::kFloat || dtype == at::kDouble,
                    "rope_tables: dtype must be float32 or float64, got ", dtype);
  const auto options = at::TensorOptions().dtype(dtype).device(device.value_or(at::kCPU));
  auto cos = at::empty({2 * max_seq_len, rotary_dim / 2}, options);
  auto sin = at::empty({2 * max_seq_len, rotary_dim / 2}, options);
  fill_rope_tables(cos.narrow(0, 0, max_seq_len), sin.narrow(0, 0, max_seq_len),
                   short_freq.inv_freq, short_freq.attention_scaling);
  fill_rope_tables(cos.narrow(0, max_seq_len, max_seq_len), sin.narrow(0, max_seq_len, max_seq_len),
                   long_freq.inv_freq, long_freq.attention_scaling);
  return {cos, sin, max_seq_len, original};
}

RotaryPositionalEmbeddingImpl::RotaryPositionalEmbeddingImpl(
    double theta, int64_t d_k, int64_t max_seq_len, const RotaryPositionalEmbeddingOptions& options)
    : RotaryPositionalEmbeddingImpl(theta, d_k, max_seq_len, std::nullopt, options) {}

RotaryPositionalEmbeddingImpl::RotaryPositionalEmbeddingImpl(
    double theta, int64_t d_k, int64_t max_seq_len, std::optional<torch::Device> device,
    const RotaryPositionalEmbeddingOptions& options)
    : theta_(theta),
      d_k_(d_k),
      max_seq_len_(max_seq_len),
      rotary_dim_(options.rotary_dim().value_or(d_k)),
      options_(options) {
  constexpr const char* who = "RotaryPositionalEmbedding";
  TORCH_CHECK_VALUE(std::isfinite(theta) && theta > 0, who,
                    ": theta must be a positive finite number, got ", theta);
  TORCH_CHECK_VALUE(d_k >= 1, who, ": d_k must be >= 1, got ", d_k);
  TORCH_CHECK_VALUE(rotary_dim_ % 2 == 0 && rotary_dim_ >= 2 && rotary_dim_ <= d_k, who,
                    ": rotary_dim must be even and in [2, d_k = ", d_k,
                    "] (features rotate in pairs), got ", rotary_dim_);
  check_max_seq_len(max_seq_len, rotary_dim_, who);
  TORCH_CHECK_VALUE(options.dtype() == torch::kFloat || options.dtype() == torch::kDouble, who,
                    ": dtype (of the tables) must be float32 or float64, got ", options.dtype());
  TORCH_CHECK_VALUE(options.seq_dim() <= -2, who,
                    ": seq_dim must be a negative axis before the feature axis (-2 for "
                    "[..., seq_len, d_k], -3 for [b, s, h, d]), got ",
                    options.seq_dim());
  if (device.has_value()) {
    TORCH_CHECK_VALUE(!options.device().has_value() || *options.device() == *device, who,
                      ": device given twice, as ", *device,
                      " and as options.device() = ", *options.device());
    options_.device(device);
  }
  reset();
}

void RotaryPositionalEmbeddingImpl::build_tables(std::optional<torch::Device> device) {
  auto tables = module_tables(theta_, rotary_dim_, max_seq_len_, options_.scaling(),
                              options_.dtype(), device);
  long_offset_ = tables.long_offset;
  long_after_ = tables.long_after;
  if (cos_.defined() && named_buffers(/*recurse=*/false).contains("cos")) {
    // Keep the registered buffers (and every handle to them); swap their storage. (A clone has
    // no buffers yet: its cos_ still shares the original's storage and must not be touched.)
    cos_.set_data(tables.cos);
    sin_.set_data(tables.sin);
  } else {
    cos_ = register_buffer("cos", tables.cos);
    sin_ = register_buffer("sin", tables.sin);
  }
}

void RotaryPositionalEmbeddingImpl::reset() {
  // A clone is rebuilt where the original's tables are now (they may have moved since).
  const auto device =
      cos_.defined() ? std::optional<torch::Device>(cos_.device()) : options_.device();
  build_tables(device);
}

void RotaryPositionalEmbeddingImpl::extend_tables(int64_t max_seq_len) {
  check_max_seq_len(max_seq_len, rotary_dim_, "RotaryPositionalEmbedding.extend_tables");
  max_seq_len_ = max_seq_len;
  build_tables(cos_.device());
}

torch::Tensor RotaryPositionalEmbeddingImpl::forward(
    const torch::Tensor& x, const std::optional<torch::Tensor>& token_positions) {
  TORCH_CHECK_VALUE(x.dim() >= 1 && x.size(-1) == d_k_,
                    "RotaryPositionalEmbedding: x.size(-1) must equal d_k = ", d_k_,
                    ", got x of shape ", x.sizes());
  torch::Tensor positions = module_positions(x, token_positions, options_.seq_dim());
  if (long_offset_ != 0 && positions.numel() > 0) {
    // LongRoPE's switch, on the device: long rows for a call reaching past the original context.
    positions =
        positions + positions.max().ge(long_after_).to(positions.scalar_type()) * long_offset_;
  }
  return rope::apply(x, cos_, sin_, positions, options_.interleaved());
}

at::Tensor module_positions(const at::Tensor& x, const std::optional<at::Tensor>& token_positions,
                            int64_t seq_dim) {
  // Dims of x.shape[:-1] after the sequence axis (the heads of [b, s, h, d]).
  const int64_t trailing = -seq_dim - 2;
  const int64_t rank = x.dim() - 1;
  at::Tensor positions;
  if (token_positions.has_value()) {
    positions = *token_positions;
    TORCH_CHECK_VALUE(positions.defined(), "RotaryPositionalEmbedding: token_positions is an ",
                      "undefined tensor; pass positions or nullopt");
    if (positions.dim() == 2 && rank >= 2 + trailing) {
      // (B, S): B on x's first axis, S on its sequence axis.
      for (int64_t i = 0; i < rank - 2 - trailing; ++i) positions = positions.unsqueeze(1);
    }
  } else {
    TORCH_CHECK_VALUE(rank >= trailing + 1, "RotaryPositionalEmbedding: without token_positions, ",
                      "x needs a sequence axis at seq_dim = ", seq_dim, ", got x of shape ",
                      x.sizes());
    positions = at::arange(x.size(seq_dim), at::TensorOptions(at::kLong).device(x.device()));
  }
  if (positions.dim() <= 2) {
    for (int64_t i = 0; i < trailing; ++i) positions = positions.unsqueeze(-1);
  }
  if (token_positions.has_value() && rank >= 0) {
    // The op would name its own rule ((S, 1) for (B, S, H, D)), which is not how the module reads
    // positions: state the module's.
    const auto rows = x.sizes().slice(0, rank);
    TORCH_CHECK_VALUE(
        at::is_expandable_to(positions.sizes(), rows), "RotaryPositionalEmbedding: token_positions",
        " of shape ", token_positions->sizes(), " do not fit x of shape ", x.sizes(),
        " with seq_dim = ", seq_dim,
        ". The module reads 1-D positions as (S,) along x's sequence axis (seq_dim), 2-D positions "
        "as (B, S) with B on x's first axis, and positions of 3 or more dims as broadcastable to "
        "x.shape[:-1]. For x laid out (B, S, H, D) construct the module with seq_dim=-3, "
        "for (B, H, S, D) with seq_dim=-2");
  }
  return positions;
}

void RotaryPositionalEmbeddingImpl::save(torch::serialize::OutputArchive& /*archive*/) const {}

void RotaryPositionalEmbeddingImpl::load(torch::serialize::InputArchive& /*archive*/) {}

void RotaryPositionalEmbeddingImpl::to(torch::Device device, torch::Dtype /*dtype*/,
                                       bool non_blocking) {
  to(device, non_blocking);
}

void RotaryPositionalEmbeddingImpl::to(torch::Dtype /*dtype*/, bool /*non_blocking*/) {}

void RotaryPositionalEmbeddingImpl::to(torch::Device device, bool non_blocking) {
  // Module::to moves every registered buffer; re-read the handles it replaced.
  torch::nn::Module::to(device, non_blocking);
  cos_ = named_buffers(/*recurse=*/false)["cos"];
  sin_ = named_buffers(/*recurse=*/false)["sin"];
}

void RotaryPositionalEmbeddingImpl::pretty_print(std::ostream& stream) const {
  stream << "rope::RotaryPositionalEmbedding(theta=" << theta_ << ", d_k=" << d_k_
         << ", max_seq_len=" << max_seq_len_ << ", rotary_dim=" << rotary_dim_
         << ", interleaved=" << (options_.interleaved() ? "true" : "false");
  if (options_.scaling().index() != 0) stream << ", scaling=" << rope_type_name(options_.scaling());
  if (options_.dtype() != torch::kFloat) stream << ", dtype=" << options_.dtype();
  if (options_.seq_dim() != -2) stream << ", seq_dim=" << options_.seq_dim();
  stream << ")";
}

}  // namespace rope
