// SPDX-License-Identifier: BSD-3-Clause
// The cos/sin table builder: every RoPE scaling variant of Hugging Face transformers'
// ROPE_INIT_FUNCTIONS, computed in float64 and rounded once to the table dtype.
//
//   auto [cos, sin] = rope::rope_tables(500000.0, /*rotary_dim=*/128, /*max_seq_len=*/131072,
//       rope::TableOptions().scaling(rope::Llama3Scaling().factor(8.0)));
//
// A table row p holds attention_scaling * cos(p * inv_freq[k]) (and sin) for k < rotary_dim / 2.
// Each variant only changes inv_freq and attention_scaling; the tables are built from them in
// chunks of rows, so building needs no scratch memory beyond the output tables (a few hundred
// KiB per thread).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <torch/arg.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <variant>
#include <vector>

namespace rope {

// Plain RoPE: inv_freq[k] = theta^(-2k / rotary_dim) ("default" in transformers).
struct NoScaling {};

// Position interpolation: every frequency divided by `factor` ("linear").
struct LinearScaling {
  TORCH_ARG(double, factor) = 1.0;
};

// Dynamic NTK ("dynamic"): the base grows with the sequence length once it passes the
// pretraining length, theta' = theta * (factor * L / max_position_embeddings - (factor - 1))
// ^ (rotary_dim / (rotary_dim - 2)) with L = max(seq_len, max_position_embeddings).
struct DynamicNTKScaling {
  TORCH_ARG(double, factor) = 1.0;
  // The pretraining context (transformers: config.max_position_embeddings).
  TORCH_ARG(int64_t, max_position_embeddings) = 0;
  // The sequence length the frequencies are computed for; default: the table's max_seq_len.
  TORCH_ARG(std::optional<int64_t>, seq_len) = std::nullopt;
};

// YaRN ("yarn"): interpolation for low frequencies, extrapolation for high ones, a linear ramp
// between beta_slow and beta_fast rotations, and an attention factor folded into the tables.
struct YarnScaling {
  // Default when absent: max_position_embeddings / original_max_position_embeddings.
  TORCH_ARG(std::optional<double>, factor) = std::nullopt;
  TORCH_ARG(int64_t, original_max_position_embeddings) = 0;
  // Only read when factor is absent.
  TORCH_ARG(std::optional<int64_t>, max_position_embeddings) = std::nullopt;
  TORCH_ARG(double, beta_fast) = 32.0;
  TORCH_ARG(double, beta_slow) = 1.0;
  TORCH_ARG(std::optional<double>, mscale) = std::nullopt;
  TORCH_ARG(std::optional<double>, mscale_all_dim) = std::nullopt;
  // Default when absent: 0.1 * ln(factor) + 1 (or the mscale / mscale_all_dim ratio).
  TORCH_ARG(std::optional<double>, attention_factor) = std::nullopt;
  // Round the ramp's ends to whole dimensions (floor / ceil).
  TORCH_ARG(bool, truncate) = true;
};

// Llama 3.1 ("llama3"): long wavelengths divided by factor, short ones kept, a smooth blend
// between original / low_freq_factor and original / high_freq_factor.
struct Llama3Scaling {
  TORCH_ARG(double, factor) = 8.0;
  TORCH_ARG(double, low_freq_factor) = 1.0;
  TORCH_ARG(double, high_freq_factor) = 4.0;
  TORCH_ARG(int64_t, original_max_position_embeddings) = 8192;
};

// LongRoPE ("longrope", Phi-3): per-frequency factors, short_factor up to the pretraining length
// and long_factor past it, and an attention factor sqrt(1 + ln(factor) / ln(original)).
struct LongRopeScaling {
  TORCH_ARG(std::vector<double>, short_factor);
  TORCH_ARG(std::vector<double>, long_factor);
  TORCH_ARG(int64_t, original_max_position_embeddings) = 0;
  // Default when absent: max_position_embeddings / original_max_position_embeddings.
  TORCH_ARG(std::optional<double>, factor) = std::nullopt;
  TORCH_ARG(std::optional<int64_t>, max_position_embeddings) = std::nullopt;
  TORCH_ARG(std::optional<double>, attention_factor) = std::nullopt;
  // The short/long switch: long_factor when seq_len > original_max_position_embeddings.
  // Default: the table's max_seq_len.
  TORCH_ARG(std::optional<int64_t>, seq_len) = std::nullopt;
};

// Proportional ("proportional", Gemma 4): the first floor(partial_rotary_factor * rotary_dim / 2)
// planes turn with exponents over the whole rotary_dim, the rest do not turn; all over factor.
struct ProportionalScaling {
  TORCH_ARG(double, factor) = 1.0;
  TORCH_ARG(double, partial_rotary_factor) = 1.0;
};

using RopeScaling = std::variant<NoScaling, LinearScaling, DynamicNTKScaling, YarnScaling,
                                 Llama3Scaling, LongRopeScaling, ProportionalScaling>;

// transformers' rope_type name of a variant ("default", "linear", "dynamic", ...).
std::string rope_type_name(const RopeScaling& scaling);

// A transformers rope_parameters dict ({"rope_type": "llama3", "factor": 8.0, ...}), as C++
// values: numbers as int64 or double, flags as bool, per-plane factors as a vector, names as a
// string. Two keys a transformers config keeps outside the dict are accepted too:
// max_position_embeddings (read by dynamic, and by yarn and longrope when factor is absent) and
// seq_len (the length dynamic and longrope are evaluated at; default: the table's max_seq_len).
using RopeParameter = std::variant<bool, int64_t, double, std::vector<double>, std::string>;
using RopeParameters = std::map<std::string, RopeParameter>;

// The variant a rope_parameters dict describes, with transformers' keys and defaults: one key
// table per variant (scaling_parameters.cpp), the only place a variant's keys are listed. Missing
// required keys, unknown keys, values of the wrong type and a rope_theta that disagrees with
// `theta` are c10::ValueError / c10::TypeError naming the key.
RopeScaling rope_scaling_from_parameters(const RopeParameters& parameters, double theta);

// The rope_type names rope_scaling_from_parameters accepts, in the order of RopeScaling.
const std::vector<std::string>& supported_rope_types();

// What a variant does to plain RoPE: float64 inv_freq of shape (rotary_dim / 2), and the factor
// that multiplies cos and sin. Throws c10::ValueError naming a bad parameter.
struct RopeFrequencies {
  at::Tensor inv_freq;
  double attention_scaling = 1.0;
};

// `seq_len` is the sequence length the dynamic and longrope variants are evaluated at.
RopeFrequencies rope_frequencies(double theta, int64_t rotary_dim, const RopeScaling& scaling,
                                 int64_t seq_len);

// Plain tables, each float32 of shape (max_seq_len, rotary_dim / 2), with
// cos[p][k] = cos(p * theta^(-2k / rotary_dim)). Angles are computed in float64 and rounded once,
// so long contexts keep full float32 accuracy. The one table builder the C++ and Python modules
// share. Throws c10::ValueError if theta <= 0, rotary_dim is odd or < 2, or max_seq_len < 1.
std::tuple<at::Tensor, at::Tensor> rope_tables(double theta, int64_t rotary_dim,
                                               int64_t max_seq_len,
                                               std::optional<c10::Device> device = std::nullopt);

// Keyword options of rope_tables.
struct TableOptions {
  TORCH_ARG(RopeScaling, scaling) = NoScaling {};
  // float32 (default) or float64; half precision tables are refused.
  TORCH_ARG(c10::ScalarType, dtype) = c10::kFloat;
  // Where the tables are built (and computed); default CPU. Meta gives uninitialised tables.
  TORCH_ARG(std::optional<c10::Device>, device) = std::nullopt;
};

// (cos, sin), each (max_seq_len, rotary_dim / 2) of options.dtype():
// cos[p][k] = attention_scaling * cos(p * inv_freq[k]).
std::tuple<at::Tensor, at::Tensor> rope_tables(double theta, int64_t rotary_dim,
                                               int64_t max_seq_len, const TableOptions& options);

// Tables from a ready inv_freq (any floating dtype, (rotary_dim / 2,)) and attention scaling.
std::tuple<at::Tensor, at::Tensor> rope_tables_from_inv_freq(
    const at::Tensor& inv_freq, int64_t max_seq_len, double attention_scaling = 1.0,
    c10::ScalarType dtype = c10::kFloat, std::optional<c10::Device> device = std::nullopt);

// Fills existing tables in place: row r gets position first_position + r. cos and sin are
// (rows, inv_freq.numel()) float32/float64 tensors on one device (any strides). This is
// how the builder works (chunks of rows, float64 angles, one rounding), exposed so that a caller
// can build two variants into one allocation or fill only the rows it adds.
void fill_rope_tables(const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& inv_freq,
                      double attention_scaling = 1.0, int64_t first_position = 0);

}  // namespace rope
