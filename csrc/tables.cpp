// The one cos/sin table builder, shared by the C++ module, the Python module and users.
#include <torch_rope/ops.h>

#include <ATen/ops/arange.h>
#include <ATen/ops/outer.h>
#include <ATen/ops/pow.h>
#include <c10/util/Exception.h>

#include <cmath>

namespace rope {

std::tuple<at::Tensor, at::Tensor> rope_tables(double theta, int64_t rotary_dim,
                                               int64_t max_seq_len,
                                               std::optional<c10::Device> device) {
  TORCH_CHECK(std::isfinite(theta) && theta > 0, "rope_tables: theta must be a positive number, got ",
              theta);
  TORCH_CHECK(rotary_dim >= 2 && rotary_dim % 2 == 0,
              "rope_tables: rotary_dim must be even and >= 2 (features rotate in pairs), got ",
              rotary_dim);
  TORCH_CHECK(max_seq_len >= 1, "rope_tables: max_seq_len must be >= 1, got ", max_seq_len);

  // float64 throughout: at position 1e5 a float32 angle is off by ~4e-3 rad, which is the
  // long-context error this library exists to avoid. Round to float32 once, at the end.
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  const auto plane = at::arange(rotary_dim / 2, f64);
  const auto inv_freq = at::pow(theta, plane.mul(-2.0 / static_cast<double>(rotary_dim)));
  const auto angles = at::outer(at::arange(max_seq_len, f64), inv_freq);
  const auto out = at::TensorOptions().dtype(at::kFloat).device(device.value_or(at::kCPU));
  return {angles.cos().to(out), angles.sin().to(out)};
}

}  // namespace rope
