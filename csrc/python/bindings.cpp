// SPDX-License-Identifier: BSD-3-Clause
// torch_rope._C: the Python extension module. Loading it loads librope, whose static initialisers
// register the rope:: ops with the dispatcher; the bindings here are the few non-op entry points:
// the table builder (with its typed scaling variants) and build information.
#include <torch/csrc/Exceptions.h>
#include <torch/extension.h>
#include <torch_rope/module.h>
#include <torch_rope/ops.h>
#include <torch_rope/tables.h>

#include "../rules.h"

namespace py = pybind11;

namespace {

// Each scaling variant is a small Python class with a keyword constructor; torch_rope/_scaling.py
// turns transformers' rope_parameters dicts into them.
void bind_scaling(py::module_& m) {
  py::class_<rope::NoScaling>(m, "NoScaling").def(py::init<>());
  py::class_<rope::LinearScaling>(m, "LinearScaling")
      .def(py::init([](double factor) { return rope::LinearScaling().factor(factor); }),
           py::kw_only(), py::arg("factor"));
  py::class_<rope::DynamicNTKScaling>(m, "DynamicNTKScaling")
      .def(py::init(
               [](double factor, int64_t max_position_embeddings, std::optional<int64_t> seq_len) {
                 return rope::DynamicNTKScaling()
                     .factor(factor)
                     .max_position_embeddings(max_position_embeddings)
                     .seq_len(seq_len);
               }),
           py::kw_only(), py::arg("factor"), py::arg("max_position_embeddings"),
           py::arg("seq_len") = std::nullopt);
  py::class_<rope::YarnScaling>(m, "YarnScaling")
      .def(py::init([](std::optional<double> factor, int64_t original_max_position_embeddings,
                       std::optional<int64_t> max_position_embeddings, double beta_fast,
                       double beta_slow, std::optional<double> mscale,
                       std::optional<double> mscale_all_dim, std::optional<double> attention_factor,
                       bool truncate) {
             return rope::YarnScaling()
                 .factor(factor)
                 .original_max_position_embeddings(original_max_position_embeddings)
                 .max_position_embeddings(max_position_embeddings)
                 .beta_fast(beta_fast)
                 .beta_slow(beta_slow)
                 .mscale(mscale)
                 .mscale_all_dim(mscale_all_dim)
                 .attention_factor(attention_factor)
                 .truncate(truncate);
           }),
           py::kw_only(), py::arg("factor"), py::arg("original_max_position_embeddings"),
           py::arg("max_position_embeddings") = std::nullopt, py::arg("beta_fast") = 32.0,
           py::arg("beta_slow") = 1.0, py::arg("mscale") = std::nullopt,
           py::arg("mscale_all_dim") = std::nullopt, py::arg("attention_factor") = std::nullopt,
           py::arg("truncate") = true);
  py::class_<rope::Llama3Scaling>(m, "Llama3Scaling")
      .def(py::init([](double factor, double low_freq_factor, double high_freq_factor,
                       int64_t original_max_position_embeddings) {
             return rope::Llama3Scaling()
                 .factor(factor)
                 .low_freq_factor(low_freq_factor)
                 .high_freq_factor(high_freq_factor)
                 .original_max_position_embeddings(original_max_position_embeddings);
           }),
           py::kw_only(), py::arg("factor"), py::arg("low_freq_factor"),
           py::arg("high_freq_factor"), py::arg("original_max_position_embeddings"));
  py::class_<rope::LongRopeScaling>(m, "LongRopeScaling")
      .def(py::init([](std::vector<double> short_factor, std::vector<double> long_factor,
                       int64_t original_max_position_embeddings, std::optional<double> factor,
                       std::optional<int64_t> max_position_embeddings,
                       std::optional<double> attention_factor, std::optional<int64_t> seq_len) {
             return rope::LongRopeScaling()
                 .short_factor(std::move(short_factor))
                 .long_factor(std::move(long_factor))
                 .original_max_position_embeddings(original_max_position_embeddings)
                 .factor(factor)
                 .max_position_embeddings(max_position_embeddings)
                 .attention_factor(attention_factor)
                 .seq_len(seq_len);
           }),
           py::kw_only(), py::arg("short_factor"), py::arg("long_factor"),
           py::arg("original_max_position_embeddings"), py::arg("factor") = std::nullopt,
           py::arg("max_position_embeddings") = std::nullopt,
           py::arg("attention_factor") = std::nullopt, py::arg("seq_len") = std::nullopt);
  py::class_<rope::ProportionalScaling>(m, "ProportionalScaling")
      .def(py::init([](double factor, double partial_rotary_factor) {
             return rope::ProportionalScaling().factor(factor).partial_rotary_factor(
                 partial_rotary_factor);
           }),
           py::kw_only(), py::arg("factor") = 1.0, py::arg("partial_rotary_factor") = 1.0);
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "torch-rope native module: loading it registers torch.ops.rope.*";
  // c10 errors from this module's functions become the Python exceptions torch raises for them
  // (IndexError, ValueError, ...; no C++ backtrace unless TORCH_SHOW_CPP_STACKTRACES). torch's own
  // translator only reaches modules built with its pybind11 ABI; this one does not depend on it.
  py::register_local_exception_translator([](std::exception_ptr error) {
    try {
      if (error) std::rethrow_exception(error);
    } catch (const c10::Error&) {
      torch::translate_exception_to_python(std::current_exception());
    }
  });
  bind_scaling(m);
  m.def(
      "rope_tables",
      [](double theta, int64_t rotary_dim, int64_t max_seq_len, std::optional<c10::Device> device,
         const rope::RopeScaling& scaling, c10::ScalarType dtype) {
        return rope::rope_tables(theta, rotary_dim, max_seq_len,
                                 rope::TableOptions().scaling(scaling).dtype(dtype).device(device));
      },
      py::arg("theta"), py::arg("rotary_dim"), py::arg("max_seq_len"),
      py::arg("device") = std::nullopt, py::kw_only(),
      py::arg("scaling") = rope::RopeScaling(rope::NoScaling{}), py::arg("dtype") = at::kFloat,
      "(cos, sin) tables of shape (max_seq_len, rotary_dim // 2); see rope::rope_tables");
  m.def(
      "rope_frequencies",
      [](double theta, int64_t rotary_dim, const rope::RopeScaling& scaling, int64_t seq_len) {
        const auto f = rope::rope_frequencies(theta, rotary_dim, scaling, seq_len);
        return std::make_tuple(f.inv_freq, f.attention_scaling);
      },
      py::arg("theta"), py::arg("rotary_dim"), py::arg("scaling"), py::arg("seq_len"),
      "(float64 inv_freq, attention_scaling) of a scaling variant; see rope::rope_frequencies");
  m.def("rope_tables_from_inv_freq", &rope::rope_tables_from_inv_freq, py::arg("inv_freq"),
        py::arg("max_seq_len"), py::arg("attention_scaling") = 1.0, py::arg("dtype") = at::kFloat,
        py::arg("device") = std::nullopt,
        "(cos, sin) tables from a ready inv_freq; see rope::rope_tables_from_inv_freq");
  m.def(
      "module_tables",
      [](double theta, int64_t rotary_dim, int64_t max_seq_len, const rope::RopeScaling& scaling,
         c10::ScalarType dtype, std::optional<c10::Device> device) {
        auto t =
            rope::detail::module_tables(theta, rotary_dim, max_seq_len, scaling, dtype, device);
        return std::make_tuple(t.cos, t.sin, t.long_offset, t.long_after);
      },
      py::arg("theta"), py::arg("rotary_dim"), py::arg("max_seq_len"), py::arg("scaling"),
      py::arg("dtype"), py::arg("device"),
      "(cos, sin, long_offset, long_after) of a RotaryPositionalEmbedding; see "
      "rope::detail::module_tables");
  // The module's argument rules (csrc/rules.h), for the Python module's constructor and
  // extend_tables: one definition for both modules.
  m.def("check_module_arguments", &rope::detail::check_module_arguments, py::arg("theta"),
        py::arg("d_k"), py::arg("rotary_dim"), py::arg("max_seq_len"), py::arg("dtype"),
        py::arg("seq_dim"));
  m.def(
      "check_table_length",
      [](const std::string& who, int64_t max_seq_len, int64_t rotary_dim) {
        rope::detail::check_table_length(who.c_str(), max_seq_len, rotary_dim);
      },
      py::arg("who"), py::arg("max_seq_len"), py::arg("rotary_dim"));
  // The C++ module's positions convention and LongRoPE switch, for the parity test of the Python
  // module's traced path (tests/python).
  m.def("check_module_input", &rope::detail::check_module_input, py::arg("x"), py::arg("d_k"),
        py::arg("seq_dim"), py::arg("has_positions"));
  m.def("module_positions", &rope::detail::module_positions, py::arg("x"),
        py::arg("token_positions"), py::arg("seq_dim"));
  m.def("long_rope_positions", &rope::detail::long_rope_positions, py::arg("positions"),
        py::arg("long_offset"), py::arg("long_after"));
  // Typed entry points for the eager fast path of python/torch_rope/ops.py. They call the ops
  // through the dispatcher exactly as torch.ops.rope.* do (autograd, every backend, dispatch
  // modes), minus the boxed call's argument parsing. ops.py uses them only for plain tensors,
  // outside torch.compile, functorch transforms and __torch_function__ modes. The GIL is
  // released around the op, as in torch's own bindings.
  m.def("_apply", [](const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     const at::Tensor& positions, bool interleaved, bool inverse) {
    py::gil_scoped_release no_gil;
    return rope::apply(x, cos, sin, positions, interleaved, inverse);
  });
  m.def("_apply_", [](at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                      const at::Tensor& positions, bool interleaved, bool inverse) {
    py::gil_scoped_release no_gil;
    rope::apply_(x, cos, sin, positions, interleaved, inverse);
  });
  m.def("_apply_qk",
        [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
           const at::Tensor& positions, bool interleaved, bool inverse) {
          py::gil_scoped_release no_gil;
          return rope::apply_qk(q, k, cos, sin, positions, interleaved, inverse);
        });
  // The Python module's forward for plain tensors in eager mode (nn.py decides when): the C++
  // module's checks and positions convention (csrc/rules.h), then rope.apply, in one call.
  m.def("_module_forward",
        [](const at::Tensor& x, const std::optional<at::Tensor>& positions, const at::Tensor& cos,
           const at::Tensor& sin, int64_t d_k, int64_t seq_dim, bool interleaved) {
          rope::detail::check_module_input(x, d_k, seq_dim, positions.has_value());
          py::gil_scoped_release no_gil;
          return rope::apply(x, cos, sin, rope::detail::module_positions(x, positions, seq_dim),
                             interleaved, /*inverse=*/false);
        });
  m.def("compiled_with_cuda", &rope::compiled_with_cuda,
        "True when the library was built with its CUDA kernels");
  m.def("cpu_kernel_isa", &rope::cpu_kernel_isa,
        "Instruction set of the CPU kernel this process runs (AVX512, AVX2 or DEFAULT)");
  m.def("cpu_kernel_variant", &rope::cpu_kernel_variant,
        "The CPU kernel copy this process runs (AVX512_BF16, AVX512, AVX2 or DEFAULT)");
}
