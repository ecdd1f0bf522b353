// SPDX-License-Identifier: BSD-3-Clause
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch/serialize/archive.h>
#include <torch_rope/module.h>
#include <torch_rope/ops.h>

#include <utility>
#include <vector>

#include "rules.h"

namespace rope {
namespace detail {

ModuleTables module_tables(double theta, int64_t rotary_dim, int64_t max_seq_len,
                           const RopeScaling& scaling, c10::ScalarType dtype,
                           std::optional<c10::Device> device) {
  constexpr const char* who = "RotaryPositionalEmbedding";
  check_table_length(who, max_seq_len, rotary_dim);
  check_table_dtype(who, dtype);
  // transformers picks long_factor when max(position) + 1 > original_max_position_embeddings.
  // Both variants live in one allocation, so forward switches by adding a row offset on the
  // device instead of reading the positions back.
  const auto* longrope = std::get_if<LongRopeScaling>(&scaling);
  const bool switches = longrope != nullptr && !longrope->seq_len().has_value();
  const int64_t original = switches ? longrope->original_max_position_embeddings() : 0;
  // The frequencies first: a bad scaling fails before anything is allocated.
  std::vector<RopeFrequencies> parts;
  if (switches) {
    parts.push_back(rope_frequencies(theta, rotary_dim,
                                     LongRopeScaling(*longrope).seq_len(original), max_seq_len));
    parts.push_back(rope_frequencies(
        theta, rotary_dim, LongRopeScaling(*longrope).seq_len(original + 1), max_seq_len));
  } else {
    parts.push_back(rope_frequencies(theta, rotary_dim, scaling, max_seq_len));
  }
  const int64_t rows = max_seq_len * static_cast<int64_t>(parts.size());
  const c10::Device where = device.value_or(at::kCPU);
  check_table_memory(who, max_seq_len, rows, rotary_dim, dtype, where);
  const auto options = at::TensorOptions().dtype(dtype).device(where);
  at::Tensor cos;
  at::Tensor sin;
  try {
    cos = at::empty({rows, rotary_dim / 2}, options);
    sin = at::empty({rows, rotary_dim / 2}, options);
  } catch (const c10::OutOfMemoryError& error) {
    throw_tables_do_not_fit(who, max_seq_len, rows, rotary_dim, dtype, where, error);
  }
  for (size_t i = 0; i < parts.size(); ++i) {
    const int64_t first = static_cast<int64_t>(i) * max_seq_len;
    fill_rope_tables(cos.narrow(0, first, max_seq_len), sin.narrow(0, first, max_seq_len),
                     parts[i].inv_freq, parts[i].attention_scaling);
  }
  return {cos, sin, switches ? max_seq_len : 0, original};
}

ModuleFrequencies module_frequencies(double theta, int64_t rotary_dim, int64_t max_seq_len,
                                     const RopeScaling& scaling,
                                     std::optional<c10::Device> device) {
  check_position_count("RotaryPositionalEmbedding", max_seq_len);
  // The variants evaluated as module_tables evaluates them; LongRoPE keeps both sets.
  const auto* longrope = std::get_if<LongRopeScaling>(&scaling);
  const bool switches = longrope != nullptr && !longrope->seq_len().has_value();
  const auto options = at::TensorOptions().dtype(at::kDouble).device(device.value_or(at::kCPU));
  ModuleFrequencies f;
  if (switches) {
    const int64_t original = longrope->original_max_position_embeddings();
    const auto short_set = rope_frequencies(
        theta, rotary_dim, LongRopeScaling(*longrope).seq_len(original), max_seq_len);
    const auto long_set = rope_frequencies(
        theta, rotary_dim, LongRopeScaling(*longrope).seq_len(original + 1), max_seq_len);
    f.freqs = short_set.inv_freq.to(options);
    f.long_freqs = long_set.inv_freq.to(options);
    f.attention_factor = short_set.attention_scaling;  // the same for both sets
    f.long_after = original;
    return f;
  }
  const auto set = rope_frequencies(theta, rotary_dim, scaling, max_seq_len);
  f.freqs = set.inv_freq.to(options);
  f.attention_factor = set.attention_scaling;
  return f;
}

}  // namespace detail

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
  detail::check_module_arguments(theta, d_k, rotary_dim_, max_seq_len, options.dtype(),
                                 options.seq_dim(), options.tables());
  detail::check_module_multi_axis(rotary_dim_, options.mrope_section(),
                                  options.mrope_interleaved());
  if (device.has_value()) {
    TORCH_CHECK_VALUE(!options.device().has_value() || *options.device() == *device,
                      "RotaryPositionalEmbedding", ": device given twice, as ", *device,
                      " and as options.device() = ", *options.device());
    options_.device(device);
  }
  reset();
}

void RotaryPositionalEmbeddingImpl::build_tables(std::optional<torch::Device> device) {
  auto tables = detail::module_tables(theta_, rotary_dim_, max_seq_len_, options_.scaling(),
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

void RotaryPositionalEmbeddingImpl::build_frequencies(std::optional<torch::Device> device) {
  auto f =
      detail::module_frequencies(theta_, rotary_dim_, max_seq_len_, options_.scaling(), device);
  attention_factor_ = f.attention_factor;
  long_after_ = f.long_after;
  long_offset_ = 0;
  const auto keep = [&](const char* name, torch::Tensor& handle, const torch::Tensor& value) {
    if (!value.defined()) {
      return;
    }
    if (handle.defined() && named_buffers(/*recurse=*/false).contains(name)) {
      handle.set_data(value);  // the registered buffer keeps its identity
    } else {
      handle = register_buffer(name, value);
    }
  };
  keep("freqs", freqs_, f.freqs);
  keep("long_freqs", long_freqs_, f.long_freqs);
}

void RotaryPositionalEmbeddingImpl::reread_buffers() {
  const auto buffers = named_buffers(/*recurse=*/false);
  for (const auto& [name, handle] : {std::pair<const char*, torch::Tensor*>{"cos", &cos_},
                                     {"sin", &sin_},
                                     {"freqs", &freqs_},
                                     {"long_freqs", &long_freqs_}}) {
    if (buffers.contains(name)) {
      *handle = buffers[name];
    }
  }
}

void RotaryPositionalEmbeddingImpl::reset() {
  // A clone is rebuilt where the original's buffers are now (they may have moved since).
  const torch::Tensor& where = options_.tables() ? cos_ : freqs_;
  const auto device =
      where.defined() ? std::optional<torch::Device>(where.device()) : options_.device();
  if (options_.tables()) {
    build_tables(device);
  } else {
    build_frequencies(device);
  }
}

void RotaryPositionalEmbeddingImpl::extend_tables(int64_t max_seq_len) {
  const int64_t previous = max_seq_len_;
  if (!options_.tables()) {
    // No tables to grow: the length only re-evaluates a dynamic variant's frequencies.
    detail::check_position_count("RotaryPositionalEmbedding.extend_tables", max_seq_len);
    max_seq_len_ = max_seq_len;
    try {
      build_frequencies(freqs_.device());
    } catch (...) {
      max_seq_len_ = previous;
      throw;
    }
    return;
  }
  detail::check_table_length("RotaryPositionalEmbedding.extend_tables", max_seq_len, rotary_dim_);
  max_seq_len_ = max_seq_len;
  try {
    build_tables(cos_.device());
  } catch (...) {
    max_seq_len_ = previous;  // refused (tables too large): the module stays as it was
    throw;
  }
}

torch::Tensor RotaryPositionalEmbeddingImpl::forward(
    const torch::Tensor& x, const std::optional<torch::Tensor>& token_positions,
    const std::optional<PackedSequences>& packed) {
  if (packed.has_value()) {
    TORCH_CHECK_VALUE(!token_positions.has_value(), "RotaryPositionalEmbedding",
                      ": give token_positions or packed sequences, not both");
    TORCH_CHECK_VALUE(!options_.mrope_section().has_value(), "RotaryPositionalEmbedding",
                      ": packed sequences cannot be combined with mrope_section (multi-axis "
                      "positions are per token); pass the positions");
    detail::check_module_input(x, d_k_, options_.seq_dim(), /*has_positions=*/true);
    return detail::module_apply_packed(x, cos_, sin_, long_offset_, freqs_, long_freqs_,
                                       attention_factor_, long_after_, packed->cu_seqlens,
                                       packed->seq_offsets, packed->cp_size, packed->cp_rank,
                                       options_.interleaved());
  }
  detail::check_module_input(x, d_k_, options_.seq_dim(), token_positions.has_value());
  const auto& section = options_.mrope_section();
  const auto section_ref = section ? at::OptionalIntArrayRef(*section) : std::nullopt;
  if (!options_.tables()) {
    return detail::module_apply_frequencies(
        x, token_positions, freqs_, long_freqs_, attention_factor_, long_after_, options_.seq_dim(),
        options_.interleaved(), section_ref, options_.mrope_interleaved());
  }
  return detail::module_apply(x, token_positions, cos_, sin_, options_.seq_dim(),
                              options_.interleaved(), long_offset_, long_after_, section_ref,
                              options_.mrope_interleaved());
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
  reread_buffers();
}

void RotaryPositionalEmbeddingImpl::pretty_print(std::ostream& stream) const {
  stream << "rope::RotaryPositionalEmbedding(theta=" << theta_ << ", d_k=" << d_k_
         << ", max_seq_len=" << max_seq_len_ << ", rotary_dim=" << rotary_dim_
         << ", interleaved=" << (options_.interleaved() ? "true" : "false");
  if (options_.scaling().index() != 0) stream << ", scaling=" << rope_type_name(options_.scaling());
  if (!options_.tables()) stream << ", tables=false";
  if (options_.tables() && options_.dtype() != torch::kFloat) {
    stream << ", dtype=" << options_.dtype();
  }
  if (options_.seq_dim() != -2) stream << ", seq_dim=" << options_.seq_dim();
  if (options_.mrope_section()) {
    stream << ", mrope_section=" << c10::IntArrayRef(*options_.mrope_section());
    if (options_.mrope_interleaved()) stream << ", mrope_interleaved=true";
  }
  stream << ")";
}

}  // namespace rope
