// SPDX-License-Identifier: BSD-3-Clause
// The argument rules and shape conventions of the tables and the module, each defined once
// (rules.cpp) and called from C++ and, through bindings.cpp, from Python (c10 errors arrive there
// as ValueError / TypeError / IndexError). Internal: not installed with the public headers.
//
// The Python module keeps one mirror of check_module_input, module_positions and
// long_rope_positions for the path torch.compile and torch.func trace (they cannot trace into a
// pybind11 call); tests/python pins that mirror to these functions with a parity test.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>
#include <torch_rope/tables.h>

#include <optional>
#include <vector>

namespace rope::detail {

// Tables are float32 or float64: half-precision tables lose accuracy at long context.
void check_table_dtype(const char* who, c10::ScalarType dtype);

// max_seq_len >= 1, and max_seq_len * rotary_dim <= 2^53: positions are exact in float64 up to
// 2^53, and a module's LongRoPE tables (2 * max_seq_len rows of rotary_dim / 2) stay addressable.
// The one bound for rope_tables, rope_tables_from_inv_freq, the module and extend_tables.
void check_table_length(const char* who, int64_t max_seq_len, int64_t rotary_dim);

// Tables of `rows` rows of rotary_dim / 2 `dtype` values each, cos and sin, on `device` (rows is
// max_seq_len, or 2 * max_seq_len for a module's LongRoPE switch): on the CPU, refused up front
// (ValueError naming max_seq_len and the bytes needed) when larger than the machine's memory (RAM
// and swap), since they could never be filled. Call after check_table_length.
void check_table_memory(const char* who, int64_t max_seq_len, int64_t rows, int64_t rotary_dim,
                        c10::ScalarType dtype, c10::Device device);

// An allocation error (c10::OutOfMemoryError, e.g. CUDA's) raised while building such tables,
// rethrown as a ValueError naming max_seq_len, the bytes needed and the device's own message.
[[noreturn]] void throw_tables_do_not_fit(const char* who, int64_t max_seq_len, int64_t rows,
                                          int64_t rotary_dim, c10::ScalarType dtype,
                                          c10::Device device, const c10::Error& error);

// The module constructor's arguments (the C++ and the Python module's): theta positive and finite,
// d_k >= 1, rotary_dim even in [2, d_k], the table length, the table dtype, seq_dim <= -2.
// A table-free module (tables = false) takes any max_seq_len up to 2^62 (check_position_count)
// and no table dtype.
void check_module_arguments(double theta, int64_t d_k, int64_t rotary_dim, int64_t max_seq_len,
                            c10::ScalarType dtype, int64_t seq_dim, bool tables = true);

// A module's multi-axis options (M-RoPE): mrope_section lists 1 to kMaxAxes non-negative plane
// counts adding up to rotary_dim / 2; mrope_interleaved needs a section of 3 axes.
void check_module_multi_axis(int64_t rotary_dim,
                             const std::optional<std::vector<int64_t>>& mrope_section,
                             bool mrope_interleaved);

// A forward's x: (..., d_k), with a sequence axis at seq_dim when positions are not given.
void check_module_input(const at::Tensor& x, int64_t d_k, int64_t seq_dim, bool has_positions);

// The positions a module passes to rope::apply for x: token_positions aligned with x's sequence
// axis `seq_dim` (a negative axis before the features). (S,) and (B, S) positions get the unit
// dims the op's trailing broadcast needs (B on x's first axis, S on the sequence axis); 3-D and
// larger positions are returned unchanged; nullopt means arange along the sequence axis.
// Multi-axis modules (num_axes > 0) take token_positions with a trailing axis dim of that size:
// the same rules apply to the dims before it, and nullopt gives every axis the arange (text
// tokens, whose time, height and width positions are equal).
at::Tensor module_positions(const at::Tensor& x, const std::optional<at::Tensor>& token_positions,
                            int64_t seq_dim, int64_t num_axes = 0);

// Aligned positions that do not fit x get a ValueError stating the module's rule (not the op's).
void check_positions_fit(const at::Tensor& x, const at::Tensor& token_positions,
                         const at::Tensor& positions, int64_t seq_dim, int64_t num_axes = 0);

// A module's forward after check_module_input: module_positions, the LongRoPE switch, then
// rope::apply through the dispatcher; check_positions_fit runs only when the op has failed, so
// the decode path pays nothing for it. Shared by the C++ module and the Python eager fast path.
at::Tensor module_apply(const at::Tensor& x, const std::optional<at::Tensor>& token_positions,
                        const at::Tensor& cos, const at::Tensor& sin, int64_t seq_dim,
                        bool interleaved, int64_t long_offset, int64_t long_after,
                        at::OptionalIntArrayRef mrope_section = std::nullopt,
                        bool mrope_interleaved = false);

// LongRoPE's switch, on the device (no host sync): the table rows for `positions` are the
// positions themselves, or shifted by long_offset to the long-factor tables when the call's
// largest position is >= long_after (transformers' rule). long_offset == 0: unchanged.
at::Tensor long_rope_positions(const at::Tensor& positions, int64_t long_offset,
                               int64_t long_after);

// ---- the table-free module (tables = false) and packed sequences --------------------------------

// A table-free module's max_seq_len: 1 <= max_seq_len <= 2^62 (nothing is allocated per position;
// the bound keeps positions, offsets and default arange lengths far from int64's end).
void check_position_count(const char* who, int64_t max_seq_len);

// The frequencies a table-free module holds (module.cpp): float64 (rotary_dim / 2,) on `device`,
// evaluated as module_tables evaluates its variant (dynamic and longrope at max_seq_len), and for
// LongRoPE without a seq_len both sets: `freqs` the short one, `long_freqs` the long one (else
// undefined), with the switch at long_after (as the tables' long_offset / long_after).
struct ModuleFrequencies {
  at::Tensor freqs;
  at::Tensor long_freqs;
  double attention_factor = 1.0;
  int64_t long_after = 0;
};
ModuleFrequencies module_frequencies(double theta, int64_t rotary_dim, int64_t max_seq_len,
                                     const RopeScaling& scaling, std::optional<c10::Device> device);

// LongRoPE's switch for the frequency form, on the device (no host sync): long_freqs when the
// call's largest position is >= long_after, else freqs. Undefined long_freqs: freqs.
at::Tensor long_rope_frequencies(const at::Tensor& freqs, const at::Tensor& long_freqs,
                                 const at::Tensor& positions, int64_t long_after);

// A table-free module's forward after check_module_input: module_positions, the LongRoPE switch,
// then rope::apply with rope::Frequencies (the C++ module and the Python eager fast path).
at::Tensor module_apply_frequencies(const at::Tensor& x,
                                    const std::optional<at::Tensor>& token_positions,
                                    const at::Tensor& freqs, const at::Tensor& long_freqs,
                                    double attention_factor, int64_t long_after, int64_t seq_dim,
                                    bool interleaved,
                                    at::OptionalIntArrayRef mrope_section = std::nullopt,
                                    bool mrope_interleaved = false);

// The largest position packed sequences give this rank, as a 0-dim int64 tensor on cu_seqlens'
// device (no host sync); -1 when no sequence has a token. For LongRoPE's switch.
at::Tensor packed_last_position(const at::Tensor& cu_seqlens,
                                const std::optional<at::Tensor>& seq_offsets, int64_t cp_size,
                                int64_t cp_rank);

// A module's forward with packed sequences (both modes: tables when cos is defined, else the
// frequencies), x (T, ..., d_k): LongRoPE's switch from the largest position (tables: the
// sequences' offsets shifted by long_offset; frequencies: the long set), then rope::apply.
at::Tensor module_apply_packed(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                               int64_t long_offset, const at::Tensor& freqs,
                               const at::Tensor& long_freqs, double attention_factor,
                               int64_t long_after, const at::Tensor& cu_seqlens,
                               const std::optional<at::Tensor>& seq_offsets, int64_t cp_size,
                               int64_t cp_rank, bool interleaved);

// The tables a module holds for a scaling variant (defined in module.cpp). For LongRopeScaling
// without a seq_len, rows [0, max_seq_len) hold the short-factor tables and rows
// [max_seq_len, 2 max_seq_len) the long-factor ones (see long_rope_positions); otherwise
// long_offset is 0.
struct ModuleTables {
  at::Tensor cos;
  at::Tensor sin;
  int64_t long_offset = 0;
  int64_t long_after = 0;
};
ModuleTables module_tables(double theta, int64_t rotary_dim, int64_t max_seq_len,
                           const RopeScaling& scaling, c10::ScalarType dtype,
                           std::optional<c10::Device> device);

}  // namespace rope::detail
