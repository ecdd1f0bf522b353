// SPDX-License-Identifier: BSD-3-Clause
// torch_rope._C: the Python extension module. Loading it loads librope, whose static initialisers
// register the rope:: ops with the dispatcher; the bindings here are the few non-op entry points:
// the table builder (scaling variants parsed in C++), the module's rules, the typed fast path,
// and build information.
#include <torch/csrc/Exceptions.h>
#include <torch/extension.h>
#include <torch_rope/module.h>
#include <torch_rope/ops.h>
#include <torch_rope/tables.h>

#include "../engine_call.h"
#include "../rules.h"

namespace py = pybind11;

// Test hooks of csrc/common_exact_angle.h (csrc/python/exact_angle_hooks.cpp): not API.
void bind_exact_angle_test_hooks(py::module_& m);

namespace {

// A parsed scaling variant, opaque to Python: torch_rope/ops/tables.py coerces a transformers
// rope_parameters dict to C++ values, and rope::rope_scaling_from_parameters (the one key table
// per variant) builds the variant. No per-variant binding to keep in step.
struct Scaling {
  rope::RopeScaling value = rope::NoScaling{};
};

void bind_scaling(py::module_& m) {
  py::class_<Scaling>(m, "Scaling")
      .def(py::init<>())
      .def_property_readonly("rope_type",
                             [](const Scaling& s) { return rope::rope_type_name(s.value); })
      .def("__repr__", [](const Scaling& s) {
        return "<torch_rope._C.Scaling " + rope::rope_type_name(s.value) + ">";
      });
  m.def(
      "parse_scaling",
      [](const rope::RopeParameters& parameters, double theta) {
        return Scaling{rope::rope_scaling_from_parameters(parameters, theta)};
      },
      py::arg("parameters"), py::arg("theta"),
      "A rope_parameters dict (values already coerced) -> Scaling; see "
      "rope::rope_scaling_from_parameters");
  m.def("supported_rope_types", &rope::supported_rope_types);
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
  bind_exact_angle_test_hooks(m);
  m.def(
      "rope_tables",
      [](double theta, int64_t rotary_dim, int64_t max_seq_len, std::optional<c10::Device> device,
         const Scaling& scaling, c10::ScalarType dtype) {
        return rope::rope_tables(
            theta, rotary_dim, max_seq_len,
            rope::TableOptions().scaling(scaling.value).dtype(dtype).device(device));
      },
      py::arg("theta"), py::arg("rotary_dim"), py::arg("max_seq_len"),
      py::arg("device") = std::nullopt, py::kw_only(), py::arg("scaling") = Scaling{},
      py::arg("dtype") = at::kFloat,
      "(cos, sin) tables of shape (max_seq_len, rotary_dim // 2); see rope::rope_tables");
  m.def(
      "rope_frequencies",
      [](double theta, int64_t rotary_dim, const Scaling& scaling, int64_t seq_len) {
        const auto f = rope::rope_frequencies(theta, rotary_dim, scaling.value, seq_len);
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
      [](double theta, int64_t rotary_dim, int64_t max_seq_len, const Scaling& scaling,
         c10::ScalarType dtype, std::optional<c10::Device> device) {
        auto t = rope::detail::module_tables(theta, rotary_dim, max_seq_len, scaling.value, dtype,
                                             device);
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
        py::arg("seq_dim"), py::arg("tables") = true);
  // The table-free module (tables=False): its frequencies, and its forwards.
  m.def(
      "module_frequencies",
      [](double theta, int64_t rotary_dim, int64_t max_seq_len, const Scaling& scaling,
         std::optional<c10::Device> device) {
        auto f =
            rope::detail::module_frequencies(theta, rotary_dim, max_seq_len, scaling.value, device);
        return std::make_tuple(
            f.freqs,
            f.long_freqs.defined() ? std::optional<at::Tensor>(f.long_freqs) : std::nullopt,
            f.attention_factor, f.long_after);
      },
      py::arg("theta"), py::arg("rotary_dim"), py::arg("max_seq_len"), py::arg("scaling"),
      py::arg("device"),
      "(freqs, long_freqs or None, attention_factor, long_after) of a table-free "
      "RotaryPositionalEmbedding; see rope::detail::module_frequencies");
  m.def("check_position_count", [](const std::string& who, int64_t max_seq_len) {
    rope::detail::check_position_count(who.c_str(), max_seq_len);
  });
  m.def("long_rope_frequencies", &rope::detail::long_rope_frequencies, py::arg("freqs"),
        py::arg("long_freqs"), py::arg("positions"), py::arg("long_after"));
  m.def("packed_last_position", &rope::detail::packed_last_position, py::arg("cu_seqlens"),
        py::arg("seq_offsets"), py::arg("cp_size"), py::arg("cp_rank"));
  m.def("_module_forward_frequencies",
        [](const at::Tensor& x, const std::optional<at::Tensor>& positions, const at::Tensor& freqs,
           const std::optional<at::Tensor>& long_freqs, double attention_factor, int64_t long_after,
           int64_t d_k, int64_t seq_dim, bool interleaved) {
          rope::detail::check_module_input(x, d_k, seq_dim, positions.has_value());
          py::gil_scoped_release no_gil;
          return rope::detail::module_apply_frequencies(
              x, positions, freqs, long_freqs.value_or(at::Tensor()), attention_factor, long_after,
              seq_dim, interleaved);
        });
  m.def("_module_forward_packed",
        [](const at::Tensor& x, const std::optional<at::Tensor>& cos,
           const std::optional<at::Tensor>& sin, int64_t long_offset,
           const std::optional<at::Tensor>& freqs, const std::optional<at::Tensor>& long_freqs,
           double attention_factor, int64_t long_after, const at::Tensor& cu_seqlens,
           const std::optional<at::Tensor>& seq_offsets, int64_t cp_size, int64_t cp_rank,
           bool interleaved) {
          py::gil_scoped_release no_gil;
          return rope::detail::module_apply_packed(
              x, cos.value_or(at::Tensor()), sin.value_or(at::Tensor()), long_offset,
              freqs.value_or(at::Tensor()), long_freqs.value_or(at::Tensor()), attention_factor,
              long_after, cu_seqlens, seq_offsets, cp_size, cp_rank, interleaved);
        });
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
  m.def(
      "module_positions",
      [](const at::Tensor& x, const std::optional<at::Tensor>& token_positions, int64_t seq_dim,
         int64_t num_axes) {
        auto positions = rope::detail::module_positions(x, token_positions, seq_dim, num_axes);
        if (token_positions.has_value()) {
          rope::detail::check_positions_fit(x, *token_positions, positions, seq_dim, num_axes);
        }
        return positions;
      },
      py::arg("x"), py::arg("token_positions"), py::arg("seq_dim"), py::arg("num_axes") = 0);
  m.def("check_module_multi_axis", &rope::detail::check_module_multi_axis, py::arg("rotary_dim"),
        py::arg("mrope_section"), py::arg("mrope_interleaved"));
  m.def("long_rope_positions", &rope::detail::long_rope_positions, py::arg("positions"),
        py::arg("long_offset"), py::arg("long_after"));
  // Typed entry points for the eager fast path of python/torch_rope/ops/. They call the ops
  // through the dispatcher exactly as torch.ops.rope.* do (autograd, every backend, dispatch
  // modes), minus the boxed call's argument parsing. The wrappers use them only for plain tensors,
  // outside torch.compile, functorch transforms and __torch_function__ modes. The GIL is
  // released around the op, as in torch's own bindings.
  // Multi-axis sections come as a list of ints (None for one-axis positions).
  using Section = std::optional<std::vector<int64_t>>;
  const auto section_ref = [](const Section& s) {
    return s ? at::OptionalIntArrayRef(*s) : at::OptionalIntArrayRef(std::nullopt);
  };
  m.def(
      "_apply",
      [section_ref](const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                    const at::Tensor& positions, bool interleaved, bool inverse,
                    const Section& mrope_section, bool mrope_interleaved) {
        py::gil_scoped_release no_gil;
        return rope::apply(x, cos, sin, positions, interleaved, inverse, section_ref(mrope_section),
                           mrope_interleaved);
      },
      py::arg("x"), py::arg("cos"), py::arg("sin"), py::arg("positions"), py::arg("interleaved"),
      py::arg("inverse"), py::arg("mrope_section") = py::none(),
      py::arg("mrope_interleaved") = false);
  m.def(
      "_apply_",
      [section_ref](at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                    const at::Tensor& positions, bool interleaved, bool inverse,
                    const Section& mrope_section, bool mrope_interleaved) {
        py::gil_scoped_release no_gil;
        rope::apply_(x, cos, sin, positions, interleaved, inverse, section_ref(mrope_section),
                     mrope_interleaved);
      },
      py::arg("x"), py::arg("cos"), py::arg("sin"), py::arg("positions"), py::arg("interleaved"),
      py::arg("inverse"), py::arg("mrope_section") = py::none(),
      py::arg("mrope_interleaved") = false);
  m.def(
      "_apply_qk",
      [section_ref](const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                    const at::Tensor& sin, const at::Tensor& positions, bool interleaved,
                    bool inverse, const Section& mrope_section, bool mrope_interleaved) {
        py::gil_scoped_release no_gil;
        return rope::apply_qk(q, k, cos, sin, positions, interleaved, inverse,
                              section_ref(mrope_section), mrope_interleaved);
      },
      py::arg("q"), py::arg("k"), py::arg("cos"), py::arg("sin"), py::arg("positions"),
      py::arg("interleaved"), py::arg("inverse"), py::arg("mrope_section") = py::none(),
      py::arg("mrope_interleaved") = false);
  // The engines' in-place call of torch_rope.compat (rotary_embedding and FlashInfer's
  // apply_rope_with_cos_sin_cache_inplace), views and checks in C++ (csrc/engine_call.h).
  m.def(
      "_rotate_heads_in_place",
      [](const at::Tensor& positions, const at::Tensor& query, const std::optional<at::Tensor>& key,
         int64_t head_size, const at::Tensor& cos_sin_cache, bool interleaved) {
        py::gil_scoped_release no_gil;
        rope::detail::rotate_heads_in_place(positions, query, key, head_size, cos_sin_cache,
                                            interleaved);
      },
      py::arg("positions"), py::arg("query"), py::arg("key"), py::arg("head_size"),
      py::arg("cos_sin_cache"), py::arg("interleaved"));
  m.def(
      "_rotate_heads",
      [](const at::Tensor& positions, const at::Tensor& query, const at::Tensor& key,
         int64_t head_size, const at::Tensor& cos_sin_cache, bool interleaved) {
        py::gil_scoped_release no_gil;
        return rope::detail::rotate_heads(positions, query, key, head_size, cos_sin_cache,
                                          interleaved);
      },
      py::arg("positions"), py::arg("query"), py::arg("key"), py::arg("head_size"),
      py::arg("cos_sin_cache"), py::arg("interleaved"));
  // The frequency and packed-sequence forms (python/torch_rope/ops/rotation.py), same arguments and
  // keywords as their overloads.
  using OptTensor = std::optional<at::Tensor>;
  m.def(
      "_apply_freqs",
      [section_ref](const at::Tensor& x, const at::Tensor& freqs, const at::Tensor& positions,
                    double attention_factor, bool interleaved, bool inverse,
                    const Section& mrope_section, bool mrope_interleaved) {
        py::gil_scoped_release no_gil;
        return rope::apply(x, rope::Frequencies{freqs, attention_factor}, positions, interleaved,
                           inverse, section_ref(mrope_section), mrope_interleaved);
      },
      py::arg("x"), py::arg("freqs"), py::arg("positions"), py::kw_only(),
      py::arg("attention_factor") = 1.0, py::arg("interleaved") = true, py::arg("inverse") = false,
      py::arg("mrope_section") = py::none(), py::arg("mrope_interleaved") = false);
  m.def(
      "_apply_varlen",
      [](const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
         const at::Tensor& cu_seqlens, const OptTensor& seq_offsets, int64_t cp_size,
         int64_t cp_rank, bool interleaved, bool inverse) {
        py::gil_scoped_release no_gil;
        return rope::apply(x, cos, sin,
                           rope::PackedSequences{cu_seqlens, seq_offsets, cp_size, cp_rank},
                           interleaved, inverse);
      },
      py::arg("x"), py::arg("cos"), py::arg("sin"), py::arg("cu_seqlens"), py::kw_only(),
      py::arg("seq_offsets") = py::none(), py::arg("cp_size") = 1, py::arg("cp_rank") = 0,
      py::arg("interleaved") = true, py::arg("inverse") = false);
  m.def(
      "_apply_freqs_varlen",
      [](const at::Tensor& x, const at::Tensor& freqs, const at::Tensor& cu_seqlens,
         const OptTensor& seq_offsets, int64_t cp_size, int64_t cp_rank, double attention_factor,
         bool interleaved, bool inverse) {
        py::gil_scoped_release no_gil;
        return rope::apply(x, rope::Frequencies{freqs, attention_factor},
                           rope::PackedSequences{cu_seqlens, seq_offsets, cp_size, cp_rank},
                           interleaved, inverse);
      },
      py::arg("x"), py::arg("freqs"), py::arg("cu_seqlens"), py::kw_only(),
      py::arg("seq_offsets") = py::none(), py::arg("cp_size") = 1, py::arg("cp_rank") = 0,
      py::arg("attention_factor") = 1.0, py::arg("interleaved") = true, py::arg("inverse") = false);
  m.def(
      "_apply_inplace_freqs",
      [section_ref](at::Tensor& x, const at::Tensor& freqs, const at::Tensor& positions,
                    double attention_factor, bool interleaved, bool inverse,
                    const Section& mrope_section, bool mrope_interleaved) {
        py::gil_scoped_release no_gil;
        rope::apply_(x, rope::Frequencies{freqs, attention_factor}, positions, interleaved, inverse,
                     section_ref(mrope_section), mrope_interleaved);
      },
      py::arg("x"), py::arg("freqs"), py::arg("positions"), py::kw_only(),
      py::arg("attention_factor") = 1.0, py::arg("interleaved") = true, py::arg("inverse") = false,
      py::arg("mrope_section") = py::none(), py::arg("mrope_interleaved") = false);
  m.def(
      "_apply_inplace_varlen",
      [](at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& cu_seqlens,
         const OptTensor& seq_offsets, int64_t cp_size, int64_t cp_rank, bool interleaved,
         bool inverse) {
        py::gil_scoped_release no_gil;
        rope::apply_(x, cos, sin, rope::PackedSequences{cu_seqlens, seq_offsets, cp_size, cp_rank},
                     interleaved, inverse);
      },
      py::arg("x"), py::arg("cos"), py::arg("sin"), py::arg("cu_seqlens"), py::kw_only(),
      py::arg("seq_offsets") = py::none(), py::arg("cp_size") = 1, py::arg("cp_rank") = 0,
      py::arg("interleaved") = true, py::arg("inverse") = false);
  m.def(
      "_apply_inplace_freqs_varlen",
      [](at::Tensor& x, const at::Tensor& freqs, const at::Tensor& cu_seqlens,
         const OptTensor& seq_offsets, int64_t cp_size, int64_t cp_rank, double attention_factor,
         bool interleaved, bool inverse) {
        py::gil_scoped_release no_gil;
        rope::apply_(x, rope::Frequencies{freqs, attention_factor},
                     rope::PackedSequences{cu_seqlens, seq_offsets, cp_size, cp_rank}, interleaved,
                     inverse);
      },
      py::arg("x"), py::arg("freqs"), py::arg("cu_seqlens"), py::kw_only(),
      py::arg("seq_offsets") = py::none(), py::arg("cp_size") = 1, py::arg("cp_rank") = 0,
      py::arg("attention_factor") = 1.0, py::arg("interleaved") = true, py::arg("inverse") = false);
  m.def(
      "_apply_qk_freqs",
      [section_ref](const at::Tensor& q, const at::Tensor& k, const at::Tensor& freqs,
                    const at::Tensor& positions, double attention_factor, bool interleaved,
                    bool inverse, const Section& mrope_section, bool mrope_interleaved) {
        py::gil_scoped_release no_gil;
        return rope::apply_qk(q, k, rope::Frequencies{freqs, attention_factor}, positions,
                              interleaved, inverse, section_ref(mrope_section), mrope_interleaved);
      },
      py::arg("q"), py::arg("k"), py::arg("freqs"), py::arg("positions"), py::kw_only(),
      py::arg("attention_factor") = 1.0, py::arg("interleaved") = true, py::arg("inverse") = false,
      py::arg("mrope_section") = py::none(), py::arg("mrope_interleaved") = false);
  m.def(
      "_apply_qk_varlen",
      [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
         const at::Tensor& cu_seqlens, const OptTensor& seq_offsets, int64_t cp_size,
         int64_t cp_rank, bool interleaved, bool inverse) {
        py::gil_scoped_release no_gil;
        return rope::apply_qk(q, k, cos, sin,
                              rope::PackedSequences{cu_seqlens, seq_offsets, cp_size, cp_rank},
                              interleaved, inverse);
      },
      py::arg("q"), py::arg("k"), py::arg("cos"), py::arg("sin"), py::arg("cu_seqlens"),
      py::kw_only(), py::arg("seq_offsets") = py::none(), py::arg("cp_size") = 1,
      py::arg("cp_rank") = 0, py::arg("interleaved") = true, py::arg("inverse") = false);
  m.def(
      "_apply_qk_freqs_varlen",
      [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& freqs,
         const at::Tensor& cu_seqlens, const OptTensor& seq_offsets, int64_t cp_size,
         int64_t cp_rank, double attention_factor, bool interleaved, bool inverse) {
        py::gil_scoped_release no_gil;
        return rope::apply_qk(q, k, rope::Frequencies{freqs, attention_factor},
                              rope::PackedSequences{cu_seqlens, seq_offsets, cp_size, cp_rank},
                              interleaved, inverse);
      },
      py::arg("q"), py::arg("k"), py::arg("freqs"), py::arg("cu_seqlens"), py::kw_only(),
      py::arg("seq_offsets") = py::none(), py::arg("cp_size") = 1, py::arg("cp_rank") = 0,
      py::arg("attention_factor") = 1.0, py::arg("interleaved") = true, py::arg("inverse") = false);
  m.def("_apply_qk_cache",
        [](const at::Tensor& q, const at::Tensor& k, const std::optional<at::Tensor>& v,
           const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& positions,
           at::Tensor& k_cache, const std::optional<at::Tensor>& v_cache,
           const at::Tensor& slot_mapping, bool interleaved,
           const std::optional<at::Tensor>& k_scale, const std::optional<at::Tensor>& v_scale) {
          py::gil_scoped_release no_gil;
          return rope::apply_qk_cache(q, k, v, cos, sin, positions, k_cache, v_cache, slot_mapping,
                                      interleaved, k_scale, v_scale);
        });
  m.def("_rms_norm_apply_qk_cache",
        [](const at::Tensor& q, const at::Tensor& k, const std::optional<at::Tensor>& v,
           const at::Tensor& q_weight, const at::Tensor& k_weight, const at::Tensor& cos,
           const at::Tensor& sin, const at::Tensor& positions, at::Tensor& k_cache,
           const std::optional<at::Tensor>& v_cache, const at::Tensor& slot_mapping, double eps,
           double weight_offset, bool interleaved, const std::optional<at::Tensor>& k_scale,
           const std::optional<at::Tensor>& v_scale, std::optional<at::ScalarType> q_dtype,
           const std::optional<at::Tensor>& q_scale) {
          py::gil_scoped_release no_gil;
          return rope::rms_norm_apply_qk_cache(q, k, v, q_weight, k_weight, cos, sin, positions,
                                               k_cache, v_cache, slot_mapping, eps, weight_offset,
                                               interleaved, k_scale, v_scale, q_dtype, q_scale);
        });
  m.def("_apply_qk_fp8",
        [section_ref](
            const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
            const at::Tensor& positions, const std::optional<at::Tensor>& q_nope,
            const std::optional<at::Tensor>& k_nope, const std::optional<at::Tensor>& q_scale,
            const std::optional<at::Tensor>& k_scale, std::optional<at::ScalarType> dtype,
            bool interleaved, bool multiply_by_scale, const Section& mrope_section,
            bool mrope_interleaved, bool inverse) {
          py::gil_scoped_release no_gil;
          return rope::apply_qk_fp8(q, k, cos, sin, positions, q_nope, k_nope, q_scale, k_scale,
                                    dtype, interleaved, multiply_by_scale,
                                    section_ref(mrope_section), mrope_interleaved, inverse);
        });
  m.def("_mla_apply_cache",
        [](const at::Tensor& q_pe, const at::Tensor& k_pe, const at::Tensor& kv_c,
           const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& positions,
           at::Tensor& kv_cache, const std::optional<at::Tensor>& kpe_cache,
           const at::Tensor& slot_mapping, const std::optional<at::Tensor>& q_nope,
           const std::optional<at::Tensor>& v, const std::optional<at::Tensor>& v_cache,
           bool interleaved, const std::optional<at::Tensor>& kv_scale,
           const std::optional<at::Tensor>& v_scale, std::optional<at::ScalarType> q_dtype,
           const std::optional<at::Tensor>& q_scale, bool multiply_by_scale) {
          py::gil_scoped_release no_gil;
          return rope::mla_apply_cache(q_pe, k_pe, kv_c, cos, sin, positions, kv_cache, kpe_cache,
                                       slot_mapping, q_nope, v, v_cache, interleaved, kv_scale,
                                       v_scale, q_dtype, q_scale, multiply_by_scale);
        });
  m.def("_rms_norm_apply_qk",
        [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& q_weight,
           const at::Tensor& k_weight, const at::Tensor& cos, const at::Tensor& sin,
           const at::Tensor& positions, double eps, double weight_offset, bool interleaved,
           bool inverse) {
          py::gil_scoped_release no_gil;
          return rope::rms_norm_apply_qk(q, k, q_weight, k_weight, cos, sin, positions, eps,
                                         weight_offset, interleaved, inverse);
        });
  // The Python module's forward for plain tensors in eager mode (torch_rope.nn decides when): the
  // C++ module's forward (csrc/rules.h: its checks, positions convention, then rope.apply) in one
  // call.
  m.def("_module_forward",
        [](const at::Tensor& x, const std::optional<at::Tensor>& positions, const at::Tensor& cos,
           const at::Tensor& sin, int64_t d_k, int64_t seq_dim, bool interleaved) {
          rope::detail::check_module_input(x, d_k, seq_dim, positions.has_value());
          py::gil_scoped_release no_gil;
          return rope::detail::module_apply(x, positions, cos, sin, seq_dim, interleaved,
                                            /*long_offset=*/0, /*long_after=*/0);
        });
  m.def("compiled_with_cuda", &rope::compiled_with_cuda,
        "True when the library was built with its CUDA kernels");
  m.def("cpu_kernel_isa", &rope::cpu_kernel_isa,
        "Instruction set of the CPU kernel this process runs (AVX512, AVX2 or DEFAULT)");
  m.def("cpu_kernel_variant", &rope::cpu_kernel_variant,
        "The CPU kernel copy this process runs (AVX512_BF16, AVX512, AVX2 or DEFAULT)");
}
