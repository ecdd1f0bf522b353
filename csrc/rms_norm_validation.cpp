// SPDX-License-Identifier: BSD-3-Clause
#include "rms_norm_validation.h"

#include <ATen/Dispatch.h>
#include <ATen/EmptyTensor.h>
#include <ATen/ops/add.h>
#include <c10/core/SymBool.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <limits>

namespace rope::detail {
namespace {

// `weight` normalises the rows of `x` (named `x_name`): a 1-D (head_dim,) floating tensor on x's
// device. Any floating dtype of the ops; it need not match x's.
void check_weight(const char* op, const char* name, const at::Tensor& weight, const char* x_name,
                  const at::Tensor& x) {
  TORCH_CHECK(weight.defined(), op, ": ", name, " must be a tensor, got None");
  TORCH_CHECK(weight.device() == x.device(), op, ": ", name, " and ", x_name,
              " must be on the same device, got ", name, " on ", weight.device(), " and ", x_name,
              " on ", x.device());
  const auto t = weight.scalar_type();
  TORCH_CHECK(t == at::kDouble || t == at::kFloat || t == at::kHalf || t == at::kBFloat16, op, ": ",
              name, " must be a floating tensor of dtype float64, float32, float16 or ",
              "bfloat16, got ", t);
  TORCH_CHECK(weight.dim() == 1, op, ": ", name, " must be 1-D of shape (head_dim,) = (",
              x.sym_size(-1), ",), got shape ", weight.sym_sizes());
  TORCH_SYM_CHECK(weight.sym_size(0).sym_eq(x.sym_size(-1)), op, ": ", name,
                  " must have shape (head_dim,) = (", x.sym_size(-1), ",) of ", x_name,
                  ", got shape ", weight.sym_sizes());
}

// The kernels add eps to mean(x^2) in the math type: float for float32, float16 and bfloat16
// rows, double for float64. There eps must stay a normal number: one that rounds to 0 (1e-300 in
// float) gives 0 / sqrt(0) = NaN for an all-zero row, and so does a subnormal one under
// flush-to-zero (torch.set_flush_denormal(True)); one that rounds to inf zeroes every row.
void check_eps_in_math_type(const char* op, double eps, at::ScalarType dtype) {
  if (dtype == at::kDouble) {
    TORCH_CHECK(eps >= std::numeric_limits<double>::min(), op,
                ": eps must be a normal float64 number, >= ", std::numeric_limits<double>::min(),
                " (float64 inputs are normalised in float64, where a smaller eps is subnormal, "
                "which flush-to-zero makes 0: an all-zero row would give NaN), got ",
                eps);
    return;
  }
  constexpr double lowest = std::numeric_limits<float>::min();
  constexpr double highest = std::numeric_limits<float>::max();
  TORCH_CHECK(eps >= lowest && eps <= highest, op, ": eps must be a normal float32 number, in [",
              lowest, ", ", highest, "], for ", dtype,
              " inputs (they are normalised in float32, where a smaller eps rounds to 0 or to a "
              "subnormal, which flush-to-zero makes 0, so an all-zero row would give NaN, and a "
              "larger one rounds to inf), got ",
              eps);
}

}  // namespace

void check_rms_norm_apply_qk(const char* op, const at::Tensor& q, const at::Tensor& k,
                             const at::Tensor& q_weight, const at::Tensor& k_weight,
                             const at::Tensor& cos, const at::Tensor& sin,
                             const at::Tensor& positions, double eps, double weight_offset,
                             const MultiAxisArgs& axes) {
  check_apply_qk(op, q, k, cos, sin, positions, axes);
  check_norm_weights(op, q, k, q_weight, k_weight, eps, weight_offset);
}

void check_norm_weights(const char* op, const at::Tensor& q, const at::Tensor& k,
                        const at::Tensor& q_weight, const at::Tensor& k_weight, double eps,
                        double weight_offset) {
  check_weight(op, "q_weight", q_weight, "q", q);
  check_weight(op, "k_weight", k_weight, "k", k);
  TORCH_CHECK(std::isfinite(eps) && eps > 0, op, ": eps must be a finite number > 0, got ", eps);
  check_eps_in_math_type(op, eps, q.scalar_type());
  TORCH_CHECK(std::isfinite(weight_offset), op, ": weight_offset must be finite, got ",
              weight_offset);
}

at::Tensor norm_weight_in_math_type(const at::Tensor& weight, double offset,
                                    at::ScalarType row_dtype) {
  const at::ScalarType acc = row_dtype == at::kDouble ? at::kDouble : at::kFloat;
  if (!weight.device().is_cpu()) {
    // Two ATen ops on the GPU, which round as the loop below does: acc(w) + acc(offset).
    return at::add(weight.to(acc), offset).contiguous();
  }
  // On the CPU without a trip through the dispatcher (a decode call is a few microseconds).
  const int64_t n = weight.size(0);
  const int64_t stride = weight.stride(0);
  at::Tensor out = at::detail::empty_cpu({n}, acc, /*pin_memory=*/false, std::nullopt);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, weight.scalar_type(), "rope_norm_w",
                                  [&] {
                                    const auto* w = weight.const_data_ptr<scalar_t>();
                                    if (acc == at::kDouble) {
                                      auto* o = out.data_ptr<double>();
                                      for (int64_t i = 0; i < n; ++i) {
                                        o[i] = static_cast<double>(w[i * stride]) + offset;
                                      }
                                    } else {
                                      auto* o = out.data_ptr<float>();
                                      const auto off = static_cast<float>(offset);
                                      for (int64_t i = 0; i < n; ++i) {
                                        o[i] = static_cast<float>(w[i * stride]) + off;
                                      }
                                    }
                                  });
  return out;
}

}  // namespace rope::detail
