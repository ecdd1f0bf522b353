// SPDX-License-Identifier: BSD-3-Clause
// Input checks shared by every backend (CPU, CUDA and Meta), so that a bad call fails the same way
// on each, under torch.compile as in eager, and before anything is written. Messages name the op,
// the argument, what was expected and what came, so the caller can fix the call from the message
// alone.
//
// Everything here reads only metadata (shapes, strides, dtypes, devices), through the SymInt
// accessors, so the Meta kernels can run the same checks on symbolic shapes. The one check that
// reads data, check_positions_in_range, is the CPU backend's alone.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>

#include "common_kernel_args.h"

namespace rope::detail {

// The multi-axis arguments every op takes (mrope_section, mrope_interleaved), as the dispatcher
// passes them. No section: one-axis positions.
struct MultiAxisArgs {
  at::OptionalIntArrayRef section;
  bool interleaved = false;
  bool active() const { return section.has_value(); }
};

// ---- the argument forms of docs/architecture.md ("Angle sources and position sources") ----------

// Where the angles come from: the cos/sin tables, or the float64 frequencies and the attention
// factor (the frequency form, table-free). Borrowed: the tensors are the caller's.
struct AngleSource {
  const at::Tensor* cos = nullptr;
  const at::Tensor* sin = nullptr;
  const at::Tensor* freqs = nullptr;
  double attention_factor = 1.0;
  bool frequencies() const { return freqs != nullptr; }
  static AngleSource tables(const at::Tensor& cos, const at::Tensor& sin) {
    return {&cos, &sin, nullptr, 1.0};
  }
  static AngleSource of_frequencies(const at::Tensor& freqs, double attention_factor) {
    return {nullptr, nullptr, &freqs, attention_factor};
  }
};

// Packed sequences (the `varlen` forms): cu_seqlens (N + 1,), seq_offsets (N,) or undefined,
// cp_size and cp_rank. x is (T, ..., head_dim) with its tokens on dim 0.
struct PackedArgs {
  at::Tensor cu_seqlens;
  at::Tensor seq_offsets;  // undefined: every sequence starts at position 0
  int64_t cp_size = 1;
  int64_t cp_rank = 0;
};

// Where the positions come from: a positions tensor, or packed sequences.
struct PositionSource {
  const at::Tensor* positions = nullptr;
  const PackedArgs* packed = nullptr;
  bool is_packed() const { return packed != nullptr; }
};

// The checks of a call in any form, on metadata only (every backend and Meta), as check_apply,
// check_apply_inplace, check_apply_out and check_apply_qk below are for the tables-and-positions
// form. Multi-axis positions (axes) go with the positions form only.
void check_apply_form(const char* op, const at::Tensor& x, const AngleSource& angles,
                      const PositionSource& where, const MultiAxisArgs& axes = {});
void check_apply_inplace_form(const char* op, const at::Tensor& x, const AngleSource& angles,
                              const PositionSource& where, const MultiAxisArgs& axes = {});
void check_apply_out_form(const char* op, const at::Tensor& x, const AngleSource& angles,
                          const PositionSource& where, const at::Tensor& out,
                          const MultiAxisArgs& axes = {});
void check_apply_qk_form(const char* op, const at::Tensor& q, const at::Tensor& k,
                         const AngleSource& angles, const PositionSource& where,
                         const MultiAxisArgs& axes = {});

// rotary_dim of an angle source (2 * cos.size(1), or 2 * freqs.size(0)), after its checks.
int64_t rotary_dim_of(const AngleSource& angles);

// The value checks of the new forms, which read data: each needs CPU tensors.
// freqs must be finite.
void check_frequencies_finite(const char* op, const at::Tensor& freqs);
// Positions of the frequency form must be >= 0 (there is no upper bound).
void check_positions_not_negative(const char* op, const at::Tensor& positions,
                                  const MultiAxisArgs& axes = {});
// cu_seqlens[0] == 0, non-decreasing, cu_seqlens[N] == num_tokens * cp_size, every length
// divisible by 2 * cp_size when cp_size > 1; seq_offsets >= 0; and every position the packed
// sequences give is < max_seq_len (tables; max_seq_len < 0 for the frequency form, whose
// positions need only fit in int64).
void check_packed_values(const char* op, const PackedArgs& packed, int64_t num_tokens,
                         int64_t max_seq_len);

// Every value check of the new forms whose data is on the CPU: finite freqs, positions >= 0 (the
// frequency form), the packed sequences (when cu_seqlens is a CPU tensor; num_tokens is x's
// (q's) size(0)). The CPU backend reads everything this way; the CUDA backend only the packed
// sequences a caller passed as CPU tensors (device data is asserted in the kernel instead).
void check_form_values_on_host(const char* op, const AngleSource& angles,
                               const PositionSource& where, int64_t num_tokens,
                               const MultiAxisArgs& axes = {});
// The same, with `on_host(t)` saying whose data can be read now (the CUDA glue asks its runtime:
// a tensor on no CUDA device; the host run of the CUDA code simulates devices with CPU tensors).
void check_form_values_on_host(const char* op, const AngleSource& angles,
                               const PositionSource& where, int64_t num_tokens,
                               const MultiAxisArgs& axes,
                               const std::function<bool(const at::Tensor&)>& on_host);

// rope.apply: x (..., head_dim) against the tables and positions.
void check_apply(const char* op, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                 const at::Tensor& positions, const MultiAxisArgs& axes = {});

// rope.apply_: check_apply, and x must be writable in place (no overlapping memory).
void check_apply_inplace(const char* op, const at::Tensor& x, const at::Tensor& cos,
                         const at::Tensor& sin, const at::Tensor& positions,
                         const MultiAxisArgs& axes = {});

// rope.apply.out: check_apply, and `out` must have x's shape, dtype and device, be writable, and
// share no memory with any input (checked where tensors have memory, i.e. not on Meta).
void check_apply_out(const char* op, const at::Tensor& x, const at::Tensor& cos,
                     const at::Tensor& sin, const at::Tensor& positions, const at::Tensor& out,
                     const MultiAxisArgs& axes = {});

// rope.apply_qk: check_apply for q and for k, and q and k agree in dtype and head_dim.
void check_apply_qk(const char* op, const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                    const at::Tensor& sin, const at::Tensor& positions,
                    const MultiAxisArgs& axes = {});

// Host-side range check of positions against [0, max_seq_len): reads positions, so only the CPU
// backend calls it (CUDA asserts inside the kernel instead, to avoid a device-to-host sync).
// With multi-axis positions the message names the axis of the offending value.
void check_positions_in_range(const char* op, const at::Tensor& positions, int64_t max_seq_len,
                              const MultiAxisArgs& axes = {});

// One rotated input `name` (..., head_dim) against the tables and positions, as check_apply does
// for x: for ops whose rotated inputs have other names (rope.mla_apply_cache's q_pe and k_pe).
void check_rotated(const char* op, const char* name, const at::Tensor& x, const at::Tensor& cos,
                   const at::Tensor& sin, const at::Tensor& positions,
                   const MultiAxisArgs& axes = {});

// For ops checked outside this file (kv_cache_validation.cpp): the writability check of apply_ /
// out= for a tensor that has no out-of-place form (a KV cache: the message says to allocate a
// buffer of its own), and the overlap check of one written tensor against one read (or written)
// tensor.
void check_writable_arg(const char* op, const char* name, const at::Tensor& t);
void check_disjoint(const char* op, const char* written_name, const at::Tensor& written,
                    const char* other_name, const at::Tensor& other);

// The AxisMap of common_kernel_args.h for checked multi-axis arguments (num_axes 0 when inactive).
AxisMap axis_map(const MultiAxisArgs& axes);

}  // namespace rope::detail
