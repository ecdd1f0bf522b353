// SPDX-License-Identifier: BSD-3-Clause
// rope_parameters dicts -> RopeScaling: one key table per variant, with transformers' keys and
// defaults (modeling_rope_utils.py). Adding a variant means its struct (tables.h), its math
// (scaling.cpp) and its table here; the Python side only coerces Python types to C++ values.
#include <c10/util/Exception.h>
#include <torch_rope/tables.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>

namespace rope {
namespace {

const char* kind_of(const RopeParameter& v) {
  static const char* const kinds[] = {"bool", "int", "float", "list", "str"};
  return kinds[v.index()];
}

double as_number(const std::string& key, const RopeParameter& v) {
  if (const auto* d = std::get_if<double>(&v)) return *d;
  if (const auto* i = std::get_if<int64_t>(&v)) return static_cast<double>(*i);
  TORCH_CHECK_TYPE(false, "scaling['", key, "'] must be a number, got ", kind_of(v));
}

// A length: configs sometimes store 8192.0; an exact one is accepted.
int64_t as_length(const std::string& key, const RopeParameter& v) {
  if (const auto* i = std::get_if<int64_t>(&v)) return *i;
  if (const auto* d = std::get_if<double>(&v)) {
    TORCH_CHECK_TYPE(std::isfinite(*d) && std::floor(*d) == *d && std::abs(*d) < 9.0e18,
                     "scaling['", key, "'] must be an int, got ", *d);
    return static_cast<int64_t>(*d);
  }
  TORCH_CHECK_TYPE(false, "scaling['", key, "'] must be an int, got ", kind_of(v));
}

bool as_flag(const std::string& key, const RopeParameter& v) {
  if (const auto* b = std::get_if<bool>(&v)) return *b;
  TORCH_CHECK_TYPE(false, "scaling['", key, "'] must be a bool, got ", kind_of(v));
}

std::vector<double> as_factors(const std::string& key, const RopeParameter& v) {
  if (const auto* f = std::get_if<std::vector<double>>(&v)) return *f;
  TORCH_CHECK_TYPE(false, "scaling['", key, "'] must be a list of numbers, got ", kind_of(v));
}

// transformers reads beta_fast / beta_slow as `get(key) or default`: 0 means the default too.
double number_or(const std::string& key, const RopeParameter& v, double fallback) {
  const double value = as_number(key, v);
  return value == 0.0 ? fallback : value;
}

// One key of a variant: its name, whether the dict must have it, and how it sets the option.
template <typename S>
struct Key {
  const char* name;
  bool required;
  void (*set)(S&, const std::string&, const RopeParameter&);
};

template <typename S>
struct Variant {
  const char* rope_type;
  std::vector<Key<S>> keys;
};

// ---- the key tables, one per variant ----------------------------------------------------------

const Variant<NoScaling> kDefault{"default", {}};

const Variant<LinearScaling> kLinear{
    "linear", {{"factor", true, [](auto& s, auto& k, auto& v) { s.factor(as_number(k, v)); }}}};

const Variant<DynamicNTKScaling> kDynamic{
    "dynamic",
    {{"factor", true, [](auto& s, auto& k, auto& v) { s.factor(as_number(k, v)); }},
     {"max_position_embeddings", true,
      [](auto& s, auto& k, auto& v) { s.max_position_embeddings(as_length(k, v)); }},
     {"seq_len", false, [](auto& s, auto& k, auto& v) { s.seq_len(as_length(k, v)); }}}};

const Variant<YarnScaling> kYarn{
    "yarn",
    {{"original_max_position_embeddings", true,
      [](auto& s, auto& k, auto& v) { s.original_max_position_embeddings(as_length(k, v)); }},
     {"factor", false, [](auto& s, auto& k, auto& v) { s.factor(as_number(k, v)); }},
     {"max_position_embeddings", false,
      [](auto& s, auto& k, auto& v) { s.max_position_embeddings(as_length(k, v)); }},
     {"attention_factor", false,
      [](auto& s, auto& k, auto& v) { s.attention_factor(as_number(k, v)); }},
     {"beta_fast", false, [](auto& s, auto& k, auto& v) { s.beta_fast(number_or(k, v, 32.0)); }},
     {"beta_slow", false, [](auto& s, auto& k, auto& v) { s.beta_slow(number_or(k, v, 1.0)); }},
     {"mscale", false, [](auto& s, auto& k, auto& v) { s.mscale(as_number(k, v)); }},
     {"mscale_all_dim", false,
      [](auto& s, auto& k, auto& v) { s.mscale_all_dim(as_number(k, v)); }},
     {"truncate", false, [](auto& s, auto& k, auto& v) { s.truncate(as_flag(k, v)); }}}};

const Variant<Llama3Scaling> kLlama3{
    "llama3",
    {{"factor", true, [](auto& s, auto& k, auto& v) { s.factor(as_number(k, v)); }},
     {"low_freq_factor", true,
      [](auto& s, auto& k, auto& v) { s.low_freq_factor(as_number(k, v)); }},
     {"high_freq_factor", true,
      [](auto& s, auto& k, auto& v) { s.high_freq_factor(as_number(k, v)); }},
     {"original_max_position_embeddings", true,
      [](auto& s, auto& k, auto& v) { s.original_max_position_embeddings(as_length(k, v)); }}}};

const Variant<LongRopeScaling> kLongRope{
    "longrope",
    {{"short_factor", true, [](auto& s, auto& k, auto& v) { s.short_factor(as_factors(k, v)); }},
     {"long_factor", true, [](auto& s, auto& k, auto& v) { s.long_factor(as_factors(k, v)); }},
     {"original_max_position_embeddings", true,
      [](auto& s, auto& k, auto& v) { s.original_max_position_embeddings(as_length(k, v)); }},
     {"factor", false, [](auto& s, auto& k, auto& v) { s.factor(as_number(k, v)); }},
     {"max_position_embeddings", false,
      [](auto& s, auto& k, auto& v) { s.max_position_embeddings(as_length(k, v)); }},
     {"attention_factor", false,
      [](auto& s, auto& k, auto& v) { s.attention_factor(as_number(k, v)); }},
     {"seq_len", false, [](auto& s, auto& k, auto& v) { s.seq_len(as_length(k, v)); }}}};

const Variant<ProportionalScaling> kProportional{
    "proportional",
    {{"factor", false, [](auto& s, auto& k, auto& v) { s.factor(as_number(k, v)); }},
     {"partial_rotary_factor", false,
      [](auto& s, auto& k, auto& v) { s.partial_rotary_factor(as_number(k, v)); }}}};

// Keys any variant may carry: the type, theta (checked against the theta argument) and the rotary
// fraction, which the caller has already applied to rotary_dim (except 'proportional').
const std::set<std::string> kCommon = {"rope_type", "type", "rope_theta", "partial_rotary_factor"};

std::string join(const std::vector<std::string>& names, const char* sep) {
  std::ostringstream out;
  for (size_t i = 0; i < names.size(); ++i) out << (i ? sep : "") << names[i];
  return out.str();
}

template <typename S>
RopeScaling parse(const Variant<S>& variant, const RopeParameters& parameters) {
  std::vector<std::string> missing, unknown, accepted;
  for (const auto& key : variant.keys) {
    accepted.push_back(key.name);
    if (key.required && parameters.count(key.name) == 0) missing.push_back(key.name);
  }
  std::sort(missing.begin(), missing.end());
  TORCH_CHECK_VALUE(missing.empty(), "scaling: rope_type '", variant.rope_type, "' needs ",
                    join(missing, ", "));
  for (const auto& name : kCommon) accepted.push_back(name);
  std::sort(accepted.begin(), accepted.end());
  accepted.erase(std::unique(accepted.begin(), accepted.end()), accepted.end());
  for (const auto& [name, value] : parameters) {
    if (!std::binary_search(accepted.begin(), accepted.end(), name)) {
      unknown.push_back("'" + name + "'");
    }
  }
  TORCH_CHECK_VALUE(unknown.empty(), "scaling: unexpected key(s) ", join(unknown, ", "),
                    " for rope_type '", variant.rope_type, "' (accepted: ", join(accepted, ", "),
                    ")");
  S scaling;
  for (const auto& key : variant.keys) {
    const auto found = parameters.find(key.name);
    if (found != parameters.end()) key.set(scaling, found->first, found->second);
  }
  return scaling;
}

std::string rope_type_of(const RopeParameters& parameters) {
  for (const char* key : {"rope_type", "type"}) {
    const auto found = parameters.find(key);
    if (found == parameters.end()) continue;
    const auto* name = std::get_if<std::string>(&found->second);
    TORCH_CHECK_TYPE(name != nullptr, "scaling['", key, "'] must be a str, got ",
                     kind_of(found->second));
    if (!name->empty()) return *name;
  }
  return "default";
}

}  // namespace

const std::vector<std::string>& supported_rope_types() {
  static const std::vector<std::string> names = {
      kDefault.rope_type, kLinear.rope_type,   kDynamic.rope_type,     kYarn.rope_type,
      kLlama3.rope_type,  kLongRope.rope_type, kProportional.rope_type};
  return names;
}

RopeScaling rope_scaling_from_parameters(const RopeParameters& parameters, double theta) {
  const std::string rope_type = rope_type_of(parameters);
  const auto theta_entry = parameters.find("rope_theta");
  if (theta_entry != parameters.end()) {
    const double given = as_number("rope_theta", theta_entry->second);
    TORCH_CHECK_VALUE(std::abs(given - theta) <= 1e-12 * std::max(std::abs(given), std::abs(theta)),
                      "scaling: rope_theta = ", given, " disagrees with theta = ", theta,
                      "; pass the same value");
  }
  if (rope_type == kDefault.rope_type) return parse(kDefault, parameters);
  if (rope_type == kLinear.rope_type) return parse(kLinear, parameters);
  if (rope_type == kDynamic.rope_type) return parse(kDynamic, parameters);
  if (rope_type == kYarn.rope_type) return parse(kYarn, parameters);
  if (rope_type == kLlama3.rope_type) return parse(kLlama3, parameters);
  if (rope_type == kLongRope.rope_type) return parse(kLongRope, parameters);
  if (rope_type == kProportional.rope_type) return parse(kProportional, parameters);
  TORCH_CHECK_VALUE(
      false, "scaling: rope_type '", rope_type,
      "' is not supported; supported rope types: ", join(supported_rope_types(), ", "));
}

}  // namespace rope
