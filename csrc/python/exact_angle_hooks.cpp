// SPDX-License-Identifier: BSD-3-Clause
// TEST HOOKS, not API: torch_rope._C._exact_angle_test and _exact_rotation_test expose the steps
// of csrc/common_exact_angle.h one by one, so that tests/python/kernels/test_exact_angle.py can
// check each against mpmath. No op uses them; their names and results may change with the tests.
#include <torch/extension.h>

#include <string>
#include <tuple>
#include <vector>

#include "../common_exact_angle.h"

namespace py = pybind11;
namespace ea = rope::exact_angle;

namespace {

void check_path(const std::string& path) {
  TORCH_CHECK(path == "f64" || path == "f32",
              "exact angle test hook: path must be 'f64' or 'f32', got '", path, "'");
}

// positions: (P,) int64 >= 0; freqs: (K,) float64. Returns (fractions (K, 2) int64 [hi, lo words
// of turn_fraction], turns (P, K) int64 [turns_at], cos, sin): path "f64": (P, K) float64 from
// sincos_turns; "f32": (P, K, 2) float32 [hi, lo] from sincos_turns_f32. attention_factor scales
// cos and sin (split into a float-float for "f32").
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> exact_angle_test(
    const at::Tensor& positions, const at::Tensor& freqs, const std::string& path,
    double attention_factor) {
  check_path(path);
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
  if (path == "f64") {
    auto cos = at::empty({P, K}, at::kDouble);
    auto sin = at::empty({P, K}, at::kDouble);
    double* c = cos.data_ptr<double>();
    double* s = sin.data_ptr<double>();
    for (int64_t j = 0; j < P * K; ++j) {
      const ea::SinCos64 cs = ea::sincos_turns(t_ptr[j], attention_factor);
      c[j] = cs.cos;
      s[j] = cs.sin;
    }
    return {fractions, turns, cos, sin};
  }
  const ea::FloatFloat af = ea::split_double(attention_factor);
  auto cos = at::empty({P, K, 2}, at::kFloat);
  auto sin = at::empty({P, K, 2}, at::kFloat);
  float* c = cos.data_ptr<float>();
  float* s = sin.data_ptr<float>();
  for (int64_t j = 0; j < P * K; ++j) {
    const ea::SinCos32 cs = ea::sincos_turns_f32(t_ptr[j], af.hi, af.lo);
    c[2 * j] = cs.cos.hi;
    c[2 * j + 1] = cs.cos.lo;
    s[2 * j] = cs.sin.hi;
    s[2 * j + 1] = cs.sin.lo;
  }
  return {fractions, turns, cos, sin};
}

// Elementwise rotation of pairs (xa[n], xb[n]) by (cos[n], sin[n]): path "f32": xa, xb float32
// (N,), cos / sin (N, 2) float32 float-float pairs, rotate_f32; "f64": cos / sin (N,) float64,
// xa, xb float32 (rotate_via_f64) or float64 (rotate_f64). Returns (ya, yb) of xa's dtype.
std::tuple<at::Tensor, at::Tensor> exact_rotation_test(const at::Tensor& xa, const at::Tensor& xb,
                                                       const at::Tensor& cos, const at::Tensor& sin,
                                                       const std::string& path) {
  check_path(path);
  TORCH_CHECK(
      xa.dim() == 1 && xa.sizes() == xb.sizes() && xa.scalar_type() == xb.scalar_type() &&
          xa.is_cpu() && xb.is_cpu(),
      "_exact_rotation_test: xa and xb must be 1-D CPU tensors of one shape and dtype, got ",
      xa.sizes(), " ", xa.scalar_type(), " and ", xb.sizes(), " ", xb.scalar_type());
  const int64_t N = xa.size(0);
  const bool f32 = path == "f32";
  const std::vector<int64_t> cs_shape = f32 ? std::vector<int64_t>{N, 2} : std::vector<int64_t>{N};
  const auto cs_type = f32 ? at::kFloat : at::kDouble;
  TORCH_CHECK(cos.sizes() == at::IntArrayRef(cs_shape) && sin.sizes() == cos.sizes() &&
                  cos.scalar_type() == cs_type && sin.scalar_type() == cs_type && cos.is_cpu() &&
                  sin.is_cpu(),
              "_exact_rotation_test: cos and sin must be ", cs_type, " CPU tensors of shape ",
              at::IntArrayRef(cs_shape), " for path '", path, "', got ", cos.sizes(), " ",
              cos.scalar_type(), " and ", sin.sizes(), " ", sin.scalar_type());
  TORCH_CHECK(xa.scalar_type() == at::kFloat || (!f32 && xa.scalar_type() == at::kDouble),
              "_exact_rotation_test: xa must be float32 (or float64 for path 'f64'), got ",
              xa.scalar_type());
  const auto c = cos.contiguous();
  const auto s = sin.contiguous();
  auto ya = at::empty_like(xa, at::MemoryFormat::Contiguous);
  auto yb = at::empty_like(xb, at::MemoryFormat::Contiguous);
  if (xa.scalar_type() == at::kDouble) {
    const auto a = xa.contiguous();
    const auto b = xb.contiguous();
    for (int64_t n = 0; n < N; ++n) {
      const ea::SinCos64 cs{c.data_ptr<double>()[n], s.data_ptr<double>()[n]};
      ea::rotate_f64(a.data_ptr<double>()[n], b.data_ptr<double>()[n], cs, ya.data_ptr<double>()[n],
                     yb.data_ptr<double>()[n]);
    }
    return {ya, yb};
  }
  const auto a = xa.contiguous();
  const auto b = xb.contiguous();
  const float* ap = a.data_ptr<float>();
  const float* bp = b.data_ptr<float>();
  float* yap = ya.data_ptr<float>();
  float* ybp = yb.data_ptr<float>();
  for (int64_t n = 0; n < N; ++n) {
    if (f32) {
      const float* cp = c.data_ptr<float>() + 2 * n;
      const float* sp = s.data_ptr<float>() + 2 * n;
      const ea::SinCos32 cs{{cp[0], cp[1]}, {sp[0], sp[1]}};
      ea::rotate_f32(ap[n], bp[n], cs, yap[n], ybp[n]);
    } else {
      const ea::SinCos64 cs{c.data_ptr<double>()[n], s.data_ptr<double>()[n]};
      ea::rotate_via_f64(ap[n], bp[n], cs, yap[n], ybp[n]);
    }
  }
  return {ya, yb};
}

}  // namespace

void bind_exact_angle_test_hooks(py::module_& m) {
  m.def("_exact_angle_test", &exact_angle_test, py::arg("positions"), py::arg("freqs"),
        py::arg("path"), py::arg("attention_factor") = 1.0,
        "TEST HOOK (csrc/common_exact_angle.h): (fractions, turns, cos, sin); see "
        "exact_angle_hooks.cpp");
  m.def("_exact_rotation_test", &exact_rotation_test, py::arg("xa"), py::arg("xb"), py::arg("cos"),
        py::arg("sin"), py::arg("path"),
        "TEST HOOK (csrc/common_exact_angle.h): (ya, yb); see exact_angle_hooks.cpp");
}
