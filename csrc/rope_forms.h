// SPDX-License-Identifier: BSD-3-Clause
// The overloads of the new argument forms (docs/architecture.md, "Angle sources and position
// sources"): rope.apply, apply_, apply.out and apply_qk each with the suffixes freqs, varlen and
// freqs_varlen (apply.out's are apply.freqs_out, apply.varlen_out, apply.freqs_varlen_out).
// Every dispatch key registers the same twelve functions, built here from a policy that handles
// one call in any form, so the argument lists are written once:
//
//   static at::Tensor apply(const char* op, const at::Tensor& x, const AngleSource&,
//                           const PositionSource&, bool interleaved, bool inverse,
//                           const MultiAxisArgs&);
//   static void apply_inplace(same arguments);
//   static void apply_out(same, then const at::Tensor& out);
//   static std::tuple<at::Tensor, at::Tensor> apply_qk(const char* op, const at::Tensor& q,
//                                                     const at::Tensor& k, the rest as apply);
//
// `op` is the overload's name in messages ("rope.apply.freqs").
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "rope_validation.h"

namespace rope::detail {

inline PackedArgs packed_args(const at::Tensor& cu_seqlens,
                              const std::optional<at::Tensor>& seq_offsets, int64_t cp_size,
                              int64_t cp_rank) {
  return PackedArgs{cu_seqlens, seq_offsets.value_or(at::Tensor()), cp_size, cp_rank};
}

template <typename P>
struct FormOps {
  // ---- rope.apply -------------------------------------------------------------------------
  static at::Tensor apply_freqs(const at::Tensor& x, const at::Tensor& freqs,
                                const at::Tensor& positions, double attention_factor,
                                bool interleaved, bool inverse,
                                at::OptionalIntArrayRef mrope_section, bool mrope_interleaved) {
    return P::apply("rope.apply.freqs", x, AngleSource::of_frequencies(freqs, attention_factor),
                    PositionSource{&positions, nullptr}, interleaved, inverse,
                    {mrope_section, mrope_interleaved});
  }
  static at::Tensor apply_varlen(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                 const at::Tensor& cu_seqlens,
                                 const std::optional<at::Tensor>& seq_offsets, int64_t cp_size,
                                 int64_t cp_rank, bool interleaved, bool inverse) {
    const PackedArgs packed = packed_args(cu_seqlens, seq_offsets, cp_size, cp_rank);
    return P::apply("rope.apply.varlen", x, AngleSource::tables(cos, sin),
                    PositionSource{nullptr, &packed}, interleaved, inverse, {});
  }
  static at::Tensor apply_freqs_varlen(const at::Tensor& x, const at::Tensor& freqs,
                                       const at::Tensor& cu_seqlens,
                                       const std::optional<at::Tensor>& seq_offsets,
                                       int64_t cp_size, int64_t cp_rank, double attention_factor,
                                       bool interleaved, bool inverse) {
    const PackedArgs packed = packed_args(cu_seqlens, seq_offsets, cp_size, cp_rank);
    return P::apply("rope.apply.freqs_varlen", x,
                    AngleSource::of_frequencies(freqs, attention_factor),
                    PositionSource{nullptr, &packed}, interleaved, inverse, {});
  }

  // ---- rope.apply_ ------------------------------------------------------------------------
  static void apply_inplace_freqs(const at::Tensor& x, const at::Tensor& freqs,
                                  const at::Tensor& positions, double attention_factor,
                                  bool interleaved, bool inverse,
                                  at::OptionalIntArrayRef mrope_section, bool mrope_interleaved) {
    P::apply_inplace("rope.apply_.freqs", x, AngleSource::of_frequencies(freqs, attention_factor),
                     PositionSource{&positions, nullptr}, interleaved, inverse,
                     {mrope_section, mrope_interleaved});
  }
  static void apply_inplace_varlen(const at::Tensor& x, const at::Tensor& cos,
                                   const at::Tensor& sin, const at::Tensor& cu_seqlens,
                                   const std::optional<at::Tensor>& seq_offsets, int64_t cp_size,
                                   int64_t cp_rank, bool interleaved, bool inverse) {
    const PackedArgs packed = packed_args(cu_seqlens, seq_offsets, cp_size, cp_rank);
    P::apply_inplace("rope.apply_.varlen", x, AngleSource::tables(cos, sin),
                     PositionSource{nullptr, &packed}, interleaved, inverse, {});
  }
  static void apply_inplace_freqs_varlen(const at::Tensor& x, const at::Tensor& freqs,
                                         const at::Tensor& cu_seqlens,
                                         const std::optional<at::Tensor>& seq_offsets,
                                         int64_t cp_size, int64_t cp_rank, double attention_factor,
                                         bool interleaved, bool inverse) {
    const PackedArgs packed = packed_args(cu_seqlens, seq_offsets, cp_size, cp_rank);
    P::apply_inplace("rope.apply_.freqs_varlen", x,
                     AngleSource::of_frequencies(freqs, attention_factor),
                     PositionSource{nullptr, &packed}, interleaved, inverse, {});
  }

  // ---- rope.apply.*_out -------------------------------------------------------------------
  static void apply_out_freqs(const at::Tensor& x, const at::Tensor& freqs,
                              const at::Tensor& positions, double attention_factor,
                              bool interleaved, bool inverse, at::OptionalIntArrayRef mrope_section,
                              bool mrope_interleaved, const at::Tensor& out) {
    P::apply_out("rope.apply.freqs_out", x, AngleSource::of_frequencies(freqs, attention_factor),
                 PositionSource{&positions, nullptr}, interleaved, inverse,
                 {mrope_section, mrope_interleaved}, out);
  }
  static void apply_out_varlen(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                               const at::Tensor& cu_seqlens,
                               const std::optional<at::Tensor>& seq_offsets, int64_t cp_size,
                               int64_t cp_rank, bool interleaved, bool inverse,
                               const at::Tensor& out) {
    const PackedArgs packed = packed_args(cu_seqlens, seq_offsets, cp_size, cp_rank);
    P::apply_out("rope.apply.varlen_out", x, AngleSource::tables(cos, sin),
                 PositionSource{nullptr, &packed}, interleaved, inverse, {}, out);
  }
  static void apply_out_freqs_varlen(const at::Tensor& x, const at::Tensor& freqs,
                                     const at::Tensor& cu_seqlens,
                                     const std::optional<at::Tensor>& seq_offsets, int64_t cp_size,
                                     int64_t cp_rank, double attention_factor, bool interleaved,
                                     bool inverse, const at::Tensor& out) {
    const PackedArgs packed = packed_args(cu_seqlens, seq_offsets, cp_size, cp_rank);
    P::apply_out("rope.apply.freqs_varlen_out", x,
                 AngleSource::of_frequencies(freqs, attention_factor),
                 PositionSource{nullptr, &packed}, interleaved, inverse, {}, out);
  }

  // ---- rope.apply_qk ----------------------------------------------------------------------
  static std::tuple<at::Tensor, at::Tensor> apply_qk_freqs(
      const at::Tensor& q, const at::Tensor& k, const at::Tensor& freqs,
      const at::Tensor& positions, double attention_factor, bool interleaved, bool inverse,
      at::OptionalIntArrayRef mrope_section, bool mrope_interleaved) {
    return P::apply_qk("rope.apply_qk.freqs", q, k,
                       AngleSource::of_frequencies(freqs, attention_factor),
                       PositionSource{&positions, nullptr}, interleaved, inverse,
                       {mrope_section, mrope_interleaved});
  }
  static std::tuple<at::Tensor, at::Tensor> apply_qk_varlen(
      const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
      const at::Tensor& cu_seqlens, const std::optional<at::Tensor>& seq_offsets, int64_t cp_size,
      int64_t cp_rank, bool interleaved, bool inverse) {
    const PackedArgs packed = packed_args(cu_seqlens, seq_offsets, cp_size, cp_rank);
    return P::apply_qk("rope.apply_qk.varlen", q, k, AngleSource::tables(cos, sin),
                       PositionSource{nullptr, &packed}, interleaved, inverse, {});
  }
  static std::tuple<at::Tensor, at::Tensor> apply_qk_freqs_varlen(
      const at::Tensor& q, const at::Tensor& k, const at::Tensor& freqs,
      const at::Tensor& cu_seqlens, const std::optional<at::Tensor>& seq_offsets, int64_t cp_size,
      int64_t cp_rank, double attention_factor, bool interleaved, bool inverse) {
    const PackedArgs packed = packed_args(cu_seqlens, seq_offsets, cp_size, cp_rank);
    return P::apply_qk("rope.apply_qk.freqs_varlen", q, k,
                       AngleSource::of_frequencies(freqs, attention_factor),
                       PositionSource{nullptr, &packed}, interleaved, inverse, {});
  }
};

// Registers the twelve overloads with policy P on the library fragment `m` (one dispatch key).
template <typename P>
void register_forms(torch::Library& m) {
  using F = FormOps<P>;
  m.impl("apply.freqs", &F::apply_freqs);
  m.impl("apply.varlen", &F::apply_varlen);
  m.impl("apply.freqs_varlen", &F::apply_freqs_varlen);
  m.impl("apply_.freqs", &F::apply_inplace_freqs);
  m.impl("apply_.varlen", &F::apply_inplace_varlen);
  m.impl("apply_.freqs_varlen", &F::apply_inplace_freqs_varlen);
  m.impl("apply.freqs_out", &F::apply_out_freqs);
  m.impl("apply.varlen_out", &F::apply_out_varlen);
  m.impl("apply.freqs_varlen_out", &F::apply_out_freqs_varlen);
  m.impl("apply_qk.freqs", &F::apply_qk_freqs);
  m.impl("apply_qk.varlen", &F::apply_qk_varlen);
  m.impl("apply_qk.freqs_varlen", &F::apply_qk_freqs_varlen);
}

}  // namespace rope::detail
