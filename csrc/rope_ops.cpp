// SPDX-License-Identifier: BSD-3-Clause
// The rope op library: every schema in one place, and the C++ API that calls through the
// dispatcher (so C++ callers get autograd and every backend exactly as Python does).
// Kernels live in cpu/, cuda/, rope_meta.cpp and rope_autograd.cpp, each registering only its own
// key.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>
#include <torch_rope/ops.h>

TORCH_LIBRARY(rope, m) {
  m.def(
      "apply(Tensor x, Tensor cos, Tensor sin, Tensor positions, *, bool interleaved=True, "
      "bool inverse=False, int[]? mrope_section=None, bool mrope_interleaved=False) -> Tensor");
  m.def(
      "apply_(Tensor(a!) x, Tensor cos, Tensor sin, Tensor positions, *, bool interleaved=True, "
      "bool inverse=False, int[]? mrope_section=None, bool mrope_interleaved=False) -> ()");
  // out= returns nothing: a custom op may not return an alias of an input under torch.compile.
  m.def(
      "apply.out(Tensor x, Tensor cos, Tensor sin, Tensor positions, *, bool interleaved=True, "
      "bool inverse=False, int[]? mrope_section=None, bool mrope_interleaved=False, Tensor(a!) "
      "out) "
      "-> ()");
  m.def(
      "apply_qk(Tensor q, Tensor k, Tensor cos, Tensor sin, Tensor positions, *, "
      "bool interleaved=True, bool inverse=False, int[]? mrope_section=None, "
      "bool mrope_interleaved=False) -> (Tensor, Tensor)");
  // Rotates q and k, writes the rotated k and v into cache rows (csrc/kv_cache_body.h); returns q.
  m.def(
      "apply_qk_cache(Tensor q, Tensor k, Tensor? v, Tensor cos, Tensor sin, Tensor positions, "
      "Tensor(a!) k_cache, Tensor(b!)? v_cache, Tensor slot_mapping, *, bool interleaved=True, "
      "Tensor? k_scale=None, Tensor? v_scale=None) -> Tensor");
  // Fused QK-RMSNorm + RoPE (Qwen3, Gemma 3, OLMo 2): kernels and C++ API in rms_norm_ops.cpp.
  m.def(
      "rms_norm_apply_qk(Tensor q, Tensor k, Tensor q_weight, Tensor k_weight, Tensor cos, "
      "Tensor sin, Tensor positions, *, float eps=1e-06, float weight_offset=0., "
      "bool interleaved=True, bool inverse=False, int[]? mrope_section=None, "
      "bool mrope_interleaved=False) -> (Tensor, Tensor)");
}

namespace rope {

at::Tensor apply(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                 const at::Tensor& positions, bool interleaved, bool inverse,
                 at::OptionalIntArrayRef mrope_section, bool mrope_interleaved) {
  static auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("rope::apply", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                            const at::Tensor&, bool, bool, at::OptionalIntArrayRef, bool)>();
  return op.call(x, cos, sin, positions, interleaved, inverse, mrope_section, mrope_interleaved);
}

void apply_(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
            const at::Tensor& positions, bool interleaved, bool inverse,
            at::OptionalIntArrayRef mrope_section, bool mrope_interleaved) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("rope::apply_", "")
                       .typed<void(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                   const at::Tensor&, bool, bool, at::OptionalIntArrayRef, bool)>();
  op.call(x, cos, sin, positions, interleaved, inverse, mrope_section, mrope_interleaved);
}

at::Tensor& apply_out(at::Tensor& out, const at::Tensor& x, const at::Tensor& cos,
                      const at::Tensor& sin, const at::Tensor& positions, bool interleaved,
                      bool inverse, at::OptionalIntArrayRef mrope_section, bool mrope_interleaved) {
  static auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("rope::apply", "out")
          .typed<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                      bool, bool, at::OptionalIntArrayRef, bool, const at::Tensor&)>();
  op.call(x, cos, sin, positions, interleaved, inverse, mrope_section, mrope_interleaved, out);
  return out;
}

std::tuple<at::Tensor, at::Tensor> apply_qk(const at::Tensor& q, const at::Tensor& k,
                                            const at::Tensor& cos, const at::Tensor& sin,
                                            const at::Tensor& positions, bool interleaved,
                                            bool inverse, at::OptionalIntArrayRef mrope_section,
                                            bool mrope_interleaved) {
  static auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("rope::apply_qk", "")
          .typed<std::tuple<at::Tensor, at::Tensor>(
              const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
              const at::Tensor&, bool, bool, at::OptionalIntArrayRef, bool)>();
  return op.call(q, k, cos, sin, positions, interleaved, inverse, mrope_section, mrope_interleaved);
}

}  // namespace rope
