// SPDX-License-Identifier: BSD-3-Clause
#include "rules.h"

#include <ATen/ExpandUtils.h>
#include <ATen/ops/arange.h>
#include <c10/util/Exception.h>
#include <torch_rope/ops.h>

#include <cmath>
#include <sstream>
#include <string>

namespace rope::detail {
namespace {

constexpr int64_t kMaxTableElements = int64_t{1} << 53;
constexpr const char* kModule = "RotaryPositionalEmbedding";

std::string shape_of(const at::Tensor& t) {
  std::ostringstream out;
  out << t.sizes();
  return out.str();
}

}  // namespace

void check_table_dtype(const char* who, c10::ScalarType dtype) {
  TORCH_CHECK_VALUE(dtype == at::kFloat || dtype == at::kDouble, who,
                    ": dtype (of the tables) must be float32 or float64 (half-precision tables "
                    "lose accuracy at long context), got ",
                    dtype);
}

void check_table_length(const char* who, int64_t max_seq_len, int64_t rotary_dim) {
  TORCH_CHECK_VALUE(max_seq_len >= 1, who, ": max_seq_len must be >= 1, got ", max_seq_len);
  TORCH_CHECK_VALUE(max_seq_len <= kMaxTableElements / std::max<int64_t>(rotary_dim, 1), who,
                    ": max_seq_len * rotary_dim must be <= 2^53 (positions are exact in float64 "
                    "up to 2^53, and such tables could never be allocated), got max_seq_len = ",
                    max_seq_len, " with rotary_dim = ", rotary_dim);
}

void check_module_arguments(double theta, int64_t d_k, int64_t rotary_dim, int64_t max_seq_len,
                            c10::ScalarType dtype, int64_t seq_dim) {
  TORCH_CHECK_VALUE(std::isfinite(theta) && theta > 0, kModule,
                    ": theta must be a positive finite number, got ", theta);
  TORCH_CHECK_VALUE(d_k >= 1, kModule, ": d_k must be >= 1, got ", d_k);
  TORCH_CHECK_VALUE(rotary_dim % 2 == 0 && rotary_dim >= 2 && rotary_dim <= d_k, kModule,
                    ": rotary_dim must be even and in [2, d_k = ", d_k,
                    "] (features rotate in pairs), got ", rotary_dim);
  check_table_length(kModule, max_seq_len, rotary_dim);
  check_table_dtype(kModule, dtype);
  TORCH_CHECK_VALUE(seq_dim <= -2, kModule,
                    ": seq_dim must be a negative axis before the feature axis (-2 for "
                    "[..., seq_len, d_k] and [b, h, s, d], -3 for [b, s, h, d]), got ",
                    seq_dim);
}

void check_module_input(const at::Tensor& x, int64_t d_k, int64_t seq_dim, bool has_positions) {
  TORCH_CHECK_VALUE(x.dim() >= 1 && x.size(-1) == d_k, kModule,
                    ": x.size(-1) must equal d_k = ", d_k, ", got x of shape ", shape_of(x));
  TORCH_CHECK_VALUE(has_positions || x.dim() - 1 >= -seq_dim - 1, kModule,
                    ": without token_positions, x needs a sequence axis at seq_dim = ", seq_dim,
                    ", got x of shape ", shape_of(x));
}

at::Tensor module_positions(const at::Tensor& x, const std::optional<at::Tensor>& token_positions,
                            int64_t seq_dim) {
  // Dims of x.shape[:-1] after the sequence axis (the heads of [b, s, h, d]).
  const int64_t trailing = -seq_dim - 2;
  const int64_t rank = x.dim() - 1;
  at::Tensor positions;
  if (token_positions.has_value()) {
    positions = *token_positions;
    TORCH_CHECK_VALUE(positions.defined(), kModule, ": token_positions is an ",
                      "undefined tensor; pass positions or nullopt");
    if (positions.dim() == 2 && rank >= 2 + trailing) {
      // (B, S): B on x's first axis, S on its sequence axis.
      for (int64_t i = 0; i < rank - 2 - trailing; ++i) positions = positions.unsqueeze(1);
    }
  } else {
    TORCH_CHECK_VALUE(rank >= trailing + 1, kModule,
                      ": without token_positions, x needs a sequence axis at seq_dim = ", seq_dim,
                      ", got x of shape ", shape_of(x));
    positions = at::arange(x.size(seq_dim), at::TensorOptions(at::kLong).device(x.device()));
  }
  if (positions.dim() <= 2) {
    for (int64_t i = 0; i < trailing; ++i) positions = positions.unsqueeze(-1);
  }
  return positions;
}

void check_positions_fit(const at::Tensor& x, const at::Tensor& token_positions,
                         const at::Tensor& positions, int64_t seq_dim) {
  const int64_t rank = x.dim() - 1;
  if (rank < 0) return;  // check_module_input has refused x already
  TORCH_CHECK_VALUE(
      at::is_expandable_to(positions.sizes(), x.sizes().slice(0, rank)), kModule,
      ": token_positions of shape ", token_positions.sizes(), " do not fit x of shape ", x.sizes(),
      " with seq_dim = ", seq_dim,
      ". The module reads 1-D positions as (S,) along x's sequence axis (seq_dim), 2-D positions "
      "as (B, S) with B on x's first axis, and positions of 3 or more dims as broadcastable to "
      "x.shape[:-1]. For x laid out (B, S, H, D) construct the module with seq_dim=-3, "
      "for (B, H, S, D) with seq_dim=-2");
}

at::Tensor module_apply(const at::Tensor& x, const std::optional<at::Tensor>& token_positions,
                        const at::Tensor& cos, const at::Tensor& sin, int64_t seq_dim,
                        bool interleaved, int64_t long_offset, int64_t long_after) {
  const auto positions = module_positions(x, token_positions, seq_dim);
  try {
    return rope::apply(x, cos, sin, long_rope_positions(positions, long_offset, long_after),
                       interleaved, /*inverse=*/false);
  } catch (const c10::Error&) {
    // Only a failed call pays for the module's own positions check: positions that do not fit x
    // get the module's rule (the op's message would recommend the op's layouts); any other error
    // is the op's.
    if (token_positions.has_value()) check_positions_fit(x, *token_positions, positions, seq_dim);
    throw;
  }
}

at::Tensor long_rope_positions(const at::Tensor& positions, int64_t long_offset,
                               int64_t long_after) {
  if (long_offset == 0 || positions.numel() == 0) {
    return positions;
  }
  return positions.add(positions.max().ge(long_after).to(positions.scalar_type()).mul(long_offset));
}

}  // namespace rope::detail
