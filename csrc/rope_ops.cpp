// SPDX-License-Identifier: BSD-3-Clause
// The rope op library: every schema in one place, and the C++ API that calls through the
// dispatcher (so C++ callers get autograd and every backend exactly as Python does).
// Kernels live in cpu/, cuda/, rope_meta.cpp and rope_autograd.cpp, each registering only its own
// key.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>
#include <torch_rope/ops.h>

#include <string>
#include <utility>

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
  // The other argument forms of the four ops above, one overload per (angle source, position
  // source) pair (docs/architecture.md, "Angle sources and position sources"): `freqs`, the
  // float64 frequency of each plane and an attention factor, instead of cos/sin tables; packed
  // sequences (`varlen`: cu_seqlens, seq_offsets, cp_size, cp_rank) instead of positions. They are
  // defined after the default overloads, so a call by the op's bare name keeps resolving to the
  // tables-and-positions form.
  constexpr const char* kFreqs =
      "Tensor freqs, Tensor positions, *, float attention_factor=1., bool interleaved=True, "
      "bool inverse=False, int[]? mrope_section=None, bool mrope_interleaved=False";
  constexpr const char* kVarlen =
      "Tensor cos, Tensor sin, Tensor cu_seqlens, *, Tensor? seq_offsets=None, int cp_size=1, "
      "int cp_rank=0, bool interleaved=True, bool inverse=False";
  constexpr const char* kFreqsVarlen =
      "Tensor freqs, Tensor cu_seqlens, *, Tensor? seq_offsets=None, int cp_size=1, "
      "int cp_rank=0, float attention_factor=1., bool interleaved=True, bool inverse=False";
  for (const auto& [suffix, args] :
       {std::pair{"freqs", kFreqs}, {"varlen", kVarlen}, {"freqs_varlen", kFreqsVarlen}}) {
    for (const std::string& schema :
         {c10::str("apply.", suffix, "(Tensor x, ", args, ") -> Tensor"),
          c10::str("apply_.", suffix, "(Tensor(a!) x, ", args, ") -> ()"),
          c10::str("apply.", suffix, "_out(Tensor x, ", args, ", Tensor(a!) out) -> ()"),
          c10::str("apply_qk.", suffix, "(Tensor q, Tensor k, ", args, ") -> (Tensor, Tensor)")}) {
      m.def(schema.c_str());
    }
  }
  // Rotates q and k, writes the rotated k and v into cache rows (csrc/kv_cache_body.h); returns q.
  m.def(
      "apply_qk_cache(Tensor q, Tensor k, Tensor? v, Tensor cos, Tensor sin, Tensor positions, "
      "Tensor(a!) k_cache, Tensor(b!)? v_cache, Tensor slot_mapping, *, bool interleaved=True, "
      "Tensor? k_scale=None, Tensor? v_scale=None, int[]? mrope_section=None, "
      "bool mrope_interleaved=False) -> Tensor");
  // Fused QK-RMSNorm + RoPE (Qwen3, Gemma 3, OLMo 2): kernels and C++ API in rms_norm_ops.cpp.
  m.def(
      "rms_norm_apply_qk(Tensor q, Tensor k, Tensor q_weight, Tensor k_weight, Tensor cos, "
      "Tensor sin, Tensor positions, *, float eps=1e-06, float weight_offset=0., "
      "bool interleaved=True, bool inverse=False, int[]? mrope_section=None, "
      "bool mrope_interleaved=False) -> (Tensor, Tensor)");

  // ---- the serving fusions: the row streams of common_row_streams.h ----------------------------
  // RoPE with float8 q and k outputs (and their no-RoPE parts quantized alongside); scale rule:
  // stored = saturate(value / scale), or value * scale with multiply_by_scale (FlashInfer's).
  // Body and checks in qk_fp8_body.h; C++ API, Meta and Autograd in qk_fp8_ops.cpp.
  m.def(
      "apply_qk_fp8(Tensor q, Tensor k, Tensor cos, Tensor sin, Tensor positions, *, "
      "Tensor? q_nope=None, Tensor? k_nope=None, Tensor? q_scale=None, Tensor? k_scale=None, "
      "ScalarType? dtype=None, bool interleaved=True, bool multiply_by_scale=False, "
      "int[]? mrope_section=None, bool mrope_interleaved=False, bool inverse=False) -> (Tensor, "
      "Tensor, Tensor, Tensor)");
  m.def(
      "apply_qk_fp8.out(Tensor q, Tensor k, Tensor cos, Tensor sin, Tensor positions, *, "
      "Tensor? q_nope=None, Tensor? k_nope=None, Tensor? q_scale=None, Tensor? k_scale=None, "
      "bool interleaved=True, bool multiply_by_scale=False, int[]? mrope_section=None, "
      "bool mrope_interleaved=False, bool inverse=False, Tensor(a!) q_out, Tensor(b!) k_out, "
      "Tensor(c!)? q_nope_out=None, Tensor(d!)? k_nope_out=None) -> ()");
  // apply_qk_fp8 with dynamic scales computed from the rotated rows: one float32 per (token, head)
  // row, or per token; returns (q_out, k_out, q_scale, k_scale). Body in qk_fp8_body.h.
  // inverse=True on the fp8 ops rotates by -angle before quantizing (DeepSeek-V4's output side).
  m.def(
      "apply_qk_fp8_dynamic(Tensor q, Tensor k, Tensor cos, Tensor sin, Tensor positions, *, "
      "ScalarType? dtype=None, bool interleaved=True, bool per_token=False, "
      "bool pow2_scale=False, int[]? mrope_section=None, bool mrope_interleaved=False, "
      "bool inverse=False) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "apply_qk_fp8_dynamic.out(Tensor q, Tensor k, Tensor cos, Tensor sin, Tensor positions, *, "
      "bool interleaved=True, bool per_token=False, bool pow2_scale=False, "
      "int[]? mrope_section=None, bool mrope_interleaved=False, bool inverse=False, "
      "Tensor(a!) q_out, Tensor(b!) k_out, Tensor(c!) q_scale_out, Tensor(d!) k_scale_out) -> ()");
  // QK-RMSNorm + RoPE + the KV-cache write in one pass (rms_norm_apply_qk and apply_qk_cache
  // fused); returns q (its dtype, or float8 with q_scale). Body and checks in kv_cache_norm_body.h;
  // C++ API, Meta and Autograd in kv_cache_norm_ops.cpp.
  m.def(
      "rms_norm_apply_qk_cache(Tensor q, Tensor k, Tensor? v, Tensor q_weight, Tensor k_weight, "
      "Tensor cos, Tensor sin, Tensor positions, Tensor(a!) k_cache, Tensor(b!)? v_cache, "
      "Tensor slot_mapping, *, float eps=1e-06, float weight_offset=0., bool interleaved=True, "
      "Tensor? k_scale=None, Tensor? v_scale=None, ScalarType? q_dtype=None, "
      "Tensor? q_scale=None, int[]? mrope_section=None, bool mrope_interleaved=False) -> Tensor");
  // MLA cache rows (DeepSeek-V2/V3): q_pe and k_pe rotated, [kv_c | k_pe] into one cache or two
  // (kv_cache, kpe_cache) by slot; returns q_pe (and q_nope) in q_dtype. Body and checks in
  // mla_body.h; C++ API, Meta and Autograd in mla_ops.cpp.
  m.def(
      "mla_apply_cache(Tensor q_pe, Tensor k_pe, Tensor kv_c, Tensor cos, Tensor sin, "
      "Tensor positions, Tensor(a!) kv_cache, Tensor(b!)? kpe_cache, Tensor slot_mapping, *, "
      "Tensor? q_nope=None, Tensor? v=None, Tensor(c!)? v_cache=None, bool interleaved=True, "
      "Tensor? kv_scale=None, Tensor? v_scale=None, ScalarType? q_dtype=None, "
      "Tensor? q_scale=None, bool multiply_by_scale=False) -> (Tensor, Tensor)");
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

// ---- the frequency and packed-sequence forms ----------------------------------------------------
namespace {

std::optional<at::Tensor> offsets_of(const PackedSequences& packed) { return packed.seq_offsets; }

}  // namespace

at::Tensor apply(const at::Tensor& x, const Frequencies& angles, const at::Tensor& positions,
                 bool interleaved, bool inverse, at::OptionalIntArrayRef mrope_section,
                 bool mrope_interleaved) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("rope::apply", "freqs")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         double, bool, bool, at::OptionalIntArrayRef, bool)>();
  return op.call(x, angles.freqs, positions, angles.attention_factor, interleaved, inverse,
                 mrope_section, mrope_interleaved);
}

at::Tensor apply(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                 const PackedSequences& packed, bool interleaved, bool inverse) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("rope::apply", "varlen")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         const at::Tensor&, const std::optional<at::Tensor>&,
                                         int64_t, int64_t, bool, bool)>();
  return op.call(x, cos, sin, packed.cu_seqlens, offsets_of(packed), packed.cp_size, packed.cp_rank,
                 interleaved, inverse);
}

at::Tensor apply(const at::Tensor& x, const Frequencies& angles, const PackedSequences& packed,
                 bool interleaved, bool inverse) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("rope::apply", "freqs_varlen")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         const std::optional<at::Tensor>&, int64_t, int64_t, double,
                                         bool, bool)>();
  return op.call(x, angles.freqs, packed.cu_seqlens, offsets_of(packed), packed.cp_size,
                 packed.cp_rank, angles.attention_factor, interleaved, inverse);
}

void apply_(at::Tensor& x, const Frequencies& angles, const at::Tensor& positions, bool interleaved,
            bool inverse, at::OptionalIntArrayRef mrope_section, bool mrope_interleaved) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("rope::apply_", "freqs")
                       .typed<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
                                   bool, bool, at::OptionalIntArrayRef, bool)>();
  op.call(x, angles.freqs, positions, angles.attention_factor, interleaved, inverse, mrope_section,
          mrope_interleaved);
}

void apply_(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
            const PackedSequences& packed, bool interleaved, bool inverse) {
  static auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("rope::apply_", "varlen")
          .typed<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                      const std::optional<at::Tensor>&, int64_t, int64_t, bool, bool)>();
  op.call(x, cos, sin, packed.cu_seqlens, offsets_of(packed), packed.cp_size, packed.cp_rank,
          interleaved, inverse);
}

void apply_(at::Tensor& x, const Frequencies& angles, const PackedSequences& packed,
            bool interleaved, bool inverse) {
  static auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("rope::apply_", "freqs_varlen")
          .typed<void(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                      const std::optional<at::Tensor>&, int64_t, int64_t, double, bool, bool)>();
  op.call(x, angles.freqs, packed.cu_seqlens, offsets_of(packed), packed.cp_size, packed.cp_rank,
          angles.attention_factor, interleaved, inverse);
}

at::Tensor& apply_out(at::Tensor& out, const at::Tensor& x, const Frequencies& angles,
                      const at::Tensor& positions, bool interleaved, bool inverse,
                      at::OptionalIntArrayRef mrope_section, bool mrope_interleaved) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("rope::apply", "freqs_out")
                       .typed<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
                                   bool, bool, at::OptionalIntArrayRef, bool, const at::Tensor&)>();
  op.call(x, angles.freqs, positions, angles.attention_factor, interleaved, inverse, mrope_section,
          mrope_interleaved, out);
  return out;
}

at::Tensor& apply_out(at::Tensor& out, const at::Tensor& x, const at::Tensor& cos,
                      const at::Tensor& sin, const PackedSequences& packed, bool interleaved,
                      bool inverse) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("rope::apply", "varlen_out")
                       .typed<void(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                   const at::Tensor&, const std::optional<at::Tensor>&, int64_t,
                                   int64_t, bool, bool, const at::Tensor&)>();
  op.call(x, cos, sin, packed.cu_seqlens, offsets_of(packed), packed.cp_size, packed.cp_rank,
          interleaved, inverse, out);
  return out;
}

at::Tensor& apply_out(at::Tensor& out, const at::Tensor& x, const Frequencies& angles,
                      const PackedSequences& packed, bool interleaved, bool inverse) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("rope::apply", "freqs_varlen_out")
                       .typed<void(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                   const std::optional<at::Tensor>&, int64_t, int64_t, double, bool,
                                   bool, const at::Tensor&)>();
  op.call(x, angles.freqs, packed.cu_seqlens, offsets_of(packed), packed.cp_size, packed.cp_rank,
          angles.attention_factor, interleaved, inverse, out);
  return out;
}

std::tuple<at::Tensor, at::Tensor> apply_qk(const at::Tensor& q, const at::Tensor& k,
                                            const Frequencies& angles, const at::Tensor& positions,
                                            bool interleaved, bool inverse,
                                            at::OptionalIntArrayRef mrope_section,
                                            bool mrope_interleaved) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("rope::apply_qk", "freqs")
                       .typed<std::tuple<at::Tensor, at::Tensor>(
                           const at::Tensor&, const at::Tensor&, const at::Tensor&,
                           const at::Tensor&, double, bool, bool, at::OptionalIntArrayRef, bool)>();
  return op.call(q, k, angles.freqs, positions, angles.attention_factor, interleaved, inverse,
                 mrope_section, mrope_interleaved);
}

std::tuple<at::Tensor, at::Tensor> apply_qk(const at::Tensor& q, const at::Tensor& k,
                                            const at::Tensor& cos, const at::Tensor& sin,
                                            const PackedSequences& packed, bool interleaved,
                                            bool inverse) {
  static auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("rope::apply_qk", "varlen")
          .typed<std::tuple<at::Tensor, at::Tensor>(
              const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
              const at::Tensor&, const std::optional<at::Tensor>&, int64_t, int64_t, bool, bool)>();
  return op.call(q, k, cos, sin, packed.cu_seqlens, offsets_of(packed), packed.cp_size,
                 packed.cp_rank, interleaved, inverse);
}

std::tuple<at::Tensor, at::Tensor> apply_qk(const at::Tensor& q, const at::Tensor& k,
                                            const Frequencies& angles,
                                            const PackedSequences& packed, bool interleaved,
                                            bool inverse) {
  static auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("rope::apply_qk", "freqs_varlen")
          .typed<std::tuple<at::Tensor, at::Tensor>(
              const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
              const std::optional<at::Tensor>&, int64_t, int64_t, double, bool, bool)>();
  return op.call(q, k, angles.freqs, packed.cu_seqlens, offsets_of(packed), packed.cp_size,
                 packed.cp_rank, angles.attention_factor, interleaved, inverse);
}

}  // namespace rope
