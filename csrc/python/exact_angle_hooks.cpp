// SPDX-License-Identifier: BSD-3-Clause
// TEST HOOKS, not API: torch_rope._C._exact_angle_test exposes the steps
// of csrc/exact_angle.h one by one, so that tests/python/kernels/test_exact_angle.py can check
// each against mpmath. No op uses them; their names and results may change with the tests.
#include <torch/extension.h>

#include <tuple>

#include "../exact_angle.h"

namespace py = pybind11;
namespace ea = rope::exact_angle;

namespace {

// positions: (P,) int64 >= 0; freqs: (K,) float64. Returns (fractions (K, 2) int64 [hi, lo words
// of turn_fraction], turns (P, K) int64 [turns_at]).
std::tuple<at::Tensor, at::Tensor> exact_angle_test(const at::Tensor& positions,
                                                    const at::Tensor& freqs) {
  TORCH_CHECK(positions.dim() == 1 && positions.scalar_type() == at::kLong && positions.is_cpu(),
              "_exact_angle_test: positions must be a 1-D int64 CPU tensor, got ",
              positions.sizes(), " ", positions.scalar_type(), " on ", positions.device());
  TORCH_CHECK(freqs.dim() == 1 && freqs.scalar_type() == at::kDouble && freqs.is_cpu(),
              "_exact_angle_test: freqs must be a 1-D float64 CPU tensor, got ", freqs.sizes(), " ",
              freqs.scalar_type(), " on ", freqs.device());
  const auto pos = positions.contiguous();
  const auto f = freqs.contiguous();
  const int64_t P = pos.size(0);
  const int64_t K = f.size(0);
  const int64_t* p_ptr = pos.data_ptr<int64_t>();
  const double* f_ptr = f.data_ptr<double>();
  for (int64_t i = 0; i < P; ++i) {
    TORCH_CHECK(p_ptr[i] >= 0, "_exact_angle_test: positions must be >= 0, got ", p_ptr[i]);
  }
  auto fractions = at::empty({K, 2}, at::kLong);
  auto turns = at::empty({P, K}, at::kLong);
  auto* g_ptr = reinterpret_cast<uint64_t*>(fractions.data_ptr<int64_t>());
  auto* t_ptr = reinterpret_cast<uint64_t*>(turns.data_ptr<int64_t>());
  for (int64_t k = 0; k < K; ++k) {
    const ea::TurnFraction g = ea::turn_fraction(f_ptr[k]);
    g_ptr[2 * k] = g.hi;
    g_ptr[2 * k + 1] = g.lo;
  }
  for (int64_t i = 0; i < P; ++i) {
    for (int64_t k = 0; k < K; ++k) {
      t_ptr[i * K + k] = ea::turns_at(p_ptr[i], ea::TurnFraction{g_ptr[2 * k], g_ptr[2 * k + 1]});
    }
  }
  return {fractions, turns};
}

}  // namespace

void bind_exact_angle_test_hooks(py::module_& m) {
  m.def("_exact_angle_test", &exact_angle_test, py::arg("positions"), py::arg("freqs"),
        "TEST HOOK (csrc/exact_angle.h): (fractions, turns); see exact_angle_hooks.cpp");
}
