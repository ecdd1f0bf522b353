// SPDX-License-Identifier: BSD-3-Clause
// inv_freq and attention scaling of every RoPE scaling variant, in float64.
//
// Each formula follows transformers' ROPE_INIT_FUNCTIONS (modeling_rope_utils.py), term for term,
// so that the tests can compare against the real library. The one difference is on purpose:
// transformers computes in float32 (theta^(2k/d) rounded to 24 bits), we compute in float64, so
// an angle p * inv_freq stays exact to ~1e-16 relative at any position instead of ~6e-8.
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch_rope/tables.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

namespace rope {
namespace {

constexpr double kPi = 3.14159265358979323846;

// 1 / theta^(2k / dim): the default frequencies over a rotary width `dim`, in transformers' order
// of operations (power first, then the reciprocal).
std::vector<double> default_inv_freq(double theta, int64_t dim, int64_t planes) {
  std::vector<double> inv(planes);
  for (int64_t k = 0; k < planes; ++k) {
    inv[k] = 1.0 / std::pow(theta, static_cast<double>(2 * k) / static_cast<double>(dim));
  }
  return inv;
}

void check_factor(const char* variant, const char* name, double value, double min = 0.0) {
  TORCH_CHECK_VALUE(std::isfinite(value) && value > min, "rope scaling '", variant, "': ", name,
                    " must be a finite number > ", min, ", got ", value);
}

void check_length(const char* variant, const char* name, int64_t value) {
  TORCH_CHECK_VALUE(value >= 1, "rope scaling '", variant, "': ", name, " must be >= 1, got ",
                    value);
}

// factor, or the ratio of the context lengths when it is absent (yarn and longrope).
double factor_or_ratio(const char* variant, const std::optional<double>& factor,
                       const std::optional<int64_t>& max_position_embeddings, int64_t original) {
  if (factor.has_value()) {
    check_factor(variant, "factor", *factor);
    return *factor;
  }
  TORCH_CHECK_VALUE(max_position_embeddings.has_value(), "rope scaling '", variant,
                    "': give factor, or max_position_embeddings to derive it as "
                    "max_position_embeddings / original_max_position_embeddings");
  check_length(variant, "max_position_embeddings", *max_position_embeddings);
  return static_cast<double>(*max_position_embeddings) / static_cast<double>(original);
}

struct Frequencies {
  std::vector<double> inv_freq;
  double attention_scaling = 1.0;
};

struct Builder {
  double theta;
  int64_t dim;  // rotary_dim
  int64_t planes;
  int64_t seq_len;

  Frequencies operator()(const NoScaling&) const {
    return {default_inv_freq(theta, dim, planes), 1.0};
  }

  Frequencies operator()(const LinearScaling& s) const {
    check_factor("linear", "factor", s.factor());
    auto inv = default_inv_freq(theta, dim, planes);
    for (auto& f : inv) f /= s.factor();
    return {inv, 1.0};
  }

  Frequencies operator()(const DynamicNTKScaling& s) const {
    check_factor("dynamic", "factor", s.factor());
    check_length("dynamic", "max_position_embeddings", s.max_position_embeddings());
    TORCH_CHECK_VALUE(dim > 2, "rope scaling 'dynamic': rotary_dim must be > 2 (the base grows ",
                      "as a power rotary_dim / (rotary_dim - 2)), got ", dim);
    const int64_t requested = s.seq_len().value_or(seq_len);
    check_length("dynamic", "seq_len", requested);
    const double length = static_cast<double>(std::max(requested, s.max_position_embeddings()));
    const double ratio =
        s.factor() * length / static_cast<double>(s.max_position_embeddings()) - (s.factor() - 1.0);
    const double base =
        theta * std::pow(ratio, static_cast<double>(dim) / static_cast<double>(dim - 2));
    return {default_inv_freq(base, dim, planes), 1.0};
  }

  Frequencies operator()(const YarnScaling& s) const {
    const int64_t original = s.original_max_position_embeddings();
    check_length("yarn", "original_max_position_embeddings", original);
    const double factor =
        factor_or_ratio("yarn", s.factor(), s.max_position_embeddings(), original);
    TORCH_CHECK_VALUE(std::isfinite(s.beta_fast()) && std::isfinite(s.beta_slow()) &&
                          s.beta_fast() > 0 && s.beta_slow() > 0,
                      "rope scaling 'yarn': beta_fast and beta_slow must be positive, got ",
                      s.beta_fast(), " and ", s.beta_slow());

    auto mscale_of = [](double scale, double m) {
      return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
    };
    double attention = 0.0;
    if (s.attention_factor().has_value()) {
      attention = *s.attention_factor();
      check_factor("yarn", "attention_factor", attention);
    } else if (s.mscale().value_or(0.0) != 0.0 && s.mscale_all_dim().value_or(0.0) != 0.0) {
      attention = mscale_of(factor, *s.mscale()) / mscale_of(factor, *s.mscale_all_dim());
    } else {
      attention = mscale_of(factor, 1.0);
    }

    // The plane whose wavelength makes `rotations` turns over the original context.
    auto correction_dim = [&](double rotations) {
      return static_cast<double>(dim) *
             std::log(static_cast<double>(original) / (rotations * 2.0 * kPi)) /
             (2.0 * std::log(theta));
    };
    double low = correction_dim(s.beta_fast());
    double high = correction_dim(s.beta_slow());
    if (s.truncate()) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(dim - 1));
    if (low == high) high += 0.001;  // transformers' guard against a zero-width ramp

    std::vector<double> inv(planes);
    for (int64_t k = 0; k < planes; ++k) {
      const double pos_freq =
          std::pow(theta, static_cast<double>(2 * k) / static_cast<double>(dim));
      const double extrapolation = 1.0 / pos_freq;
      const double interpolation = 1.0 / (factor * pos_freq);
      const double ramp = std::clamp((static_cast<double>(k) - low) / (high - low), 0.0, 1.0);
      const double extrapolation_weight = 1.0 - ramp;
      inv[k] = interpolation * (1.0 - extrapolation_weight) + extrapolation * extrapolation_weight;
    }
    return {inv, attention};
  }

  Frequencies operator()(const Llama3Scaling& s) const {
    check_factor("llama3", "factor", s.factor());
    check_factor("llama3", "low_freq_factor", s.low_freq_factor());
    check_factor("llama3", "high_freq_factor", s.high_freq_factor());
    check_length("llama3", "original_max_position_embeddings",
                 s.original_max_position_embeddings());
    TORCH_CHECK_VALUE(s.high_freq_factor() > s.low_freq_factor(),
                      "rope scaling 'llama3': high_freq_factor must be > low_freq_factor, got ",
                      s.high_freq_factor(), " and ", s.low_freq_factor());
    const double original = static_cast<double>(s.original_max_position_embeddings());
    const double low_freq_wavelen = original / s.low_freq_factor();
    const double high_freq_wavelen = original / s.high_freq_factor();
    auto inv = default_inv_freq(theta, dim, planes);
    for (auto& f : inv) {
      const double wavelen = 2.0 * kPi / f;
      if (wavelen > low_freq_wavelen) {
        f = f / s.factor();
      } else if (!(wavelen < high_freq_wavelen)) {
        const double smooth = (original / wavelen - s.low_freq_factor()) /
                              (s.high_freq_factor() - s.low_freq_factor());
        f = (1.0 - smooth) * f / s.factor() + smooth * f;
      }
    }
    return {inv, 1.0};
  }

  Frequencies operator()(const LongRopeScaling& s) const {
    const int64_t original = s.original_max_position_embeddings();
    check_length("longrope", "original_max_position_embeddings", original);
    for (const auto* which : {&s.short_factor(), &s.long_factor()}) {
      TORCH_CHECK_VALUE(static_cast<int64_t>(which->size()) == planes, "rope scaling 'longrope': ",
                        which == &s.short_factor() ? "short_factor" : "long_factor",
                        " must have rotary_dim / 2 = ", planes, " entries, got ", which->size());
      for (const double f : *which) check_factor("longrope", "each short/long factor", f);
    }
    const double factor =
        factor_or_ratio("longrope", s.factor(), s.max_position_embeddings(), original);
    double attention = 1.0;
    if (s.attention_factor().has_value()) {
      attention = *s.attention_factor();
      check_factor("longrope", "attention_factor", attention);
    } else if (factor > 1.0) {
      attention = std::sqrt(1.0 + std::log(factor) / std::log(static_cast<double>(original)));
    }
    const int64_t length = s.seq_len().value_or(seq_len);
    const auto& ext = length > original ? s.long_factor() : s.short_factor();
    std::vector<double> inv(planes);
    for (int64_t k = 0; k < planes; ++k) {
      inv[k] =
          1.0 / (ext[k] * std::pow(theta, static_cast<double>(2 * k) / static_cast<double>(dim)));
    }
    return {inv, attention};
  }

  Frequencies operator()(const ProportionalScaling& s) const {
    check_factor("proportional", "factor", s.factor());
    const double p = s.partial_rotary_factor();
    TORCH_CHECK_VALUE(std::isfinite(p) && p >= 0.0 && p <= 1.0,
                      "rope scaling 'proportional': partial_rotary_factor must be in [0, 1], got ",
                      p);
    // The planes that turn: transformers' int(partial_rotary_factor * head_dim // 2).
    const auto turning = std::min<int64_t>(
        planes, static_cast<int64_t>(std::floor(p * static_cast<double>(dim) / 2.0)));
    auto inv = default_inv_freq(theta, dim, planes);
    for (int64_t k = 0; k < planes; ++k) {
      inv[k] = k < turning ? inv[k] / s.factor() : 0.0;
    }
    return {inv, 1.0};
  }
};

}  // namespace

std::string rope_type_name(const RopeScaling& scaling) {
  const auto& names = supported_rope_types();  // in RopeScaling's order (scaling_parameters.cpp)
  TORCH_INTERNAL_ASSERT(names.size() == std::variant_size_v<RopeScaling>);
  return names[scaling.index()];
}

RopeFrequencies rope_frequencies(double theta, int64_t rotary_dim, const RopeScaling& scaling,
                                 int64_t seq_len) {
  TORCH_CHECK_VALUE(std::isfinite(theta) && theta > 0,
                    "rope_tables: theta must be a positive number, got ", theta);
  TORCH_CHECK_VALUE(
      rotary_dim >= 2 && rotary_dim % 2 == 0,
      "rope_tables: rotary_dim must be even and >= 2 (features rotate in pairs), got ", rotary_dim);
  const auto f = std::visit(Builder{theta, rotary_dim, rotary_dim / 2, seq_len}, scaling);
  auto inv_freq = at::empty({rotary_dim / 2}, at::TensorOptions().dtype(at::kDouble));
  std::copy(f.inv_freq.begin(), f.inv_freq.end(), inv_freq.data_ptr<double>());
  return {inv_freq, f.attention_scaling};
}

}  // namespace rope
