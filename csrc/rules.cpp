// SPDX-License-Identifier: BSD-3-Clause
#include "rules.h"

#include <ATen/ExpandUtils.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/full.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <torch_rope/ops.h>

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>

#if defined(__linux__)
#include <sys/sysinfo.h>
#elif defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif

#include "common_kernel_args.h"

namespace rope::detail {
namespace {

constexpr int64_t kMaxTableElements = int64_t{1} << 53;
constexpr const char* kModule = "RotaryPositionalEmbedding";

std::string shape_of(const at::Tensor& t) {
  std::ostringstream out;
  out << t.sizes();
  return out.str();
}

}  // namespace

void check_table_dtype(const char* who, c10::ScalarType dtype) {
  TORCH_CHECK_VALUE(dtype == at::kFloat || dtype == at::kDouble, who,
                    ": dtype (of the tables) must be float32 or float64 (half-precision tables "
                    "lose accuracy at long context), got ",
                    dtype);
}

void check_table_length(const char* who, int64_t max_seq_len, int64_t rotary_dim) {
  TORCH_CHECK_VALUE(max_seq_len >= 1, who, ": max_seq_len must be >= 1, got ", max_seq_len);
  TORCH_CHECK_VALUE(max_seq_len <= kMaxTableElements / std::max<int64_t>(rotary_dim, 1), who,
                    ": max_seq_len * rotary_dim must be <= 2^53 (positions are exact in float64 "
                    "up to 2^53, and such tables could never be allocated), got max_seq_len = ",
                    max_seq_len, " with rotary_dim = ", rotary_dim);
}

namespace {

// Bytes of memory this machine has for a table, RAM and swap; 0 where unknown (no check then).
uint64_t host_memory_bytes() {
#if defined(__linux__)
  struct sysinfo info{};
  if (sysinfo(&info) == 0) {
    return (static_cast<uint64_t>(info.totalram) + info.totalswap) * info.mem_unit;
  }
#elif defined(__unix__) || defined(__APPLE__)
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page_size > 0) {
    return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size);
  }
#endif
  return 0;
}

// The bytes of cos and sin together. check_table_length bounds max_seq_len * rotary_dim by 2^53,
// so rows * rotary_dim / 2 (rows at most 2 * max_seq_len) is at most 2^53: this fits in 64 bits.
uint64_t table_bytes(int64_t rows, int64_t rotary_dim, c10::ScalarType dtype) {
  return 2 * static_cast<uint64_t>(rows) * static_cast<uint64_t>(rotary_dim / 2) *
         c10::elementSize(dtype);
}

std::string what_tables_need(const char* who, int64_t max_seq_len, int64_t rows, int64_t rotary_dim,
                             c10::ScalarType dtype) {
  const uint64_t bytes = table_bytes(rows, rotary_dim, dtype);
  return c10::str(who, ": max_seq_len = ", max_seq_len, " needs ", bytes, " bytes (",
                  static_cast<double>(bytes) / static_cast<double>(uint64_t{1} << 30),
                  " GiB) of tables: cos and sin, each (", rows,
                  ", rotary_dim / 2 = ", rotary_dim / 2, ") of ", dtype);
}

}  // namespace

void check_table_memory(const char* who, int64_t max_seq_len, int64_t rows, int64_t rotary_dim,
                        c10::ScalarType dtype, c10::Device device) {
  if (!device.is_cpu()) {
    return;  // meta tables take no memory; other devices report through their allocator
  }
  const uint64_t memory = host_memory_bytes();
  TORCH_CHECK_VALUE(memory == 0 || table_bytes(rows, rotary_dim, dtype) <= memory,
                    what_tables_need(who, max_seq_len, rows, rotary_dim, dtype), ", more than the ",
                    memory,
                    " bytes of memory (RAM and swap) of this machine; pass a smaller max_seq_len");
}

void throw_tables_do_not_fit(const char* who, int64_t max_seq_len, int64_t rows, int64_t rotary_dim,
                             c10::ScalarType dtype, c10::Device device, const c10::Error& error) {
  TORCH_CHECK_VALUE(
      false, what_tables_need(who, max_seq_len, rows, rotary_dim, dtype), ", which ", device,
      " could not allocate (pass a smaller max_seq_len): ", error.what_without_backtrace());
}

void check_module_arguments(double theta, int64_t d_k, int64_t rotary_dim, int64_t max_seq_len,
                            c10::ScalarType dtype, int64_t seq_dim, bool tables) {
  TORCH_CHECK_VALUE(std::isfinite(theta) && theta > 0, kModule,
                    ": theta must be a positive finite number, got ", theta);
  TORCH_CHECK_VALUE(d_k >= 1, kModule, ": d_k must be >= 1, got ", d_k);
  TORCH_CHECK_VALUE(rotary_dim % 2 == 0 && rotary_dim >= 2 && rotary_dim <= d_k, kModule,
                    ": rotary_dim must be even and in [2, d_k = ", d_k,
                    "] (features rotate in pairs), got ", rotary_dim);
  if (tables) {
    check_table_length(kModule, max_seq_len, rotary_dim);
    check_table_dtype(kModule, dtype);
  } else {
    check_position_count(kModule, max_seq_len);
  }
  TORCH_CHECK_VALUE(seq_dim <= -2, kModule,
                    ": seq_dim must be a negative axis before the feature axis (-2 for "
                    "[..., seq_len, d_k] and [b, h, s, d], -3 for [b, s, h, d]), got ",
                    seq_dim);
}

void check_module_multi_axis(int64_t rotary_dim,
                             const std::optional<std::vector<int64_t>>& mrope_section,
                             bool mrope_interleaved) {
  if (!mrope_section.has_value()) {
    TORCH_CHECK_VALUE(!mrope_interleaved, kModule,
                      ": mrope_interleaved=True needs mrope_section (the planes per axis), got "
                      "mrope_section=None");
    return;
  }
  const auto& section = *mrope_section;
  const auto num_axes = static_cast<int64_t>(section.size());
  TORCH_CHECK_VALUE(num_axes >= 1 && num_axes <= kMaxAxes, kModule,
                    ": mrope_section must list the planes of 1 to ", kMaxAxes, " axes, got ",
                    num_axes, " entries: ", c10::IntArrayRef(section));
  int64_t planes = 0;
  for (int64_t a = 0; a < num_axes; ++a) {
    TORCH_CHECK_VALUE(section[a] >= 0, kModule, ": mrope_section[", a, "] must be >= 0, got ",
                      section[a], " in mrope_section=", c10::IntArrayRef(section));
    planes += section[a];
  }
  TORCH_CHECK_VALUE(planes == rotary_dim / 2, kModule,
                    ": sum(mrope_section) must equal rotary_dim / 2 = ", rotary_dim / 2,
                    ", got sum(", c10::IntArrayRef(section), ") = ", planes);
  TORCH_CHECK_VALUE(!mrope_interleaved || num_axes == 3, kModule,
                    ": mrope_interleaved=True (Qwen3-VL) needs 3 axes (time, height, width), got "
                    "mrope_section=",
                    c10::IntArrayRef(section), " with ", num_axes);
}

void check_module_input(const at::Tensor& x, int64_t d_k, int64_t seq_dim, bool has_positions) {
  TORCH_CHECK_VALUE(x.dim() >= 1 && x.size(-1) == d_k, kModule,
                    ": x.size(-1) must equal d_k = ", d_k, ", got x of shape ", shape_of(x));
  TORCH_CHECK_VALUE(has_positions || x.dim() - 1 >= -seq_dim - 1, kModule,
                    ": without token_positions, x needs a sequence axis at seq_dim = ", seq_dim,
                    ", got x of shape ", shape_of(x));
}

at::Tensor module_positions(const at::Tensor& x, const std::optional<at::Tensor>& token_positions,
                            int64_t seq_dim, int64_t num_axes) {
  // Dims of x.shape[:-1] after the sequence axis (the heads of [b, s, h, d]).
  const int64_t trailing = -seq_dim - 2;
  const int64_t rank = x.dim() - 1;
  // Multi-axis positions keep their axis dim last; the rules below see the dims before it.
  const int64_t axis_dims = num_axes > 0 ? 1 : 0;
  at::Tensor positions;
  // (S,) and (B, S) positions get the trailing unit dims (below) whatever unit dims the (B, S)
  // rule inserts between B and S first: decided on the dims the caller gave.
  bool one_or_two_dims = true;
  if (token_positions.has_value()) {
    positions = *token_positions;
    TORCH_CHECK_VALUE(positions.defined(), kModule, ": token_positions is an ",
                      "undefined tensor; pass positions or nullopt");
    TORCH_CHECK_VALUE(
        num_axes == 0 || (positions.dim() >= 1 && positions.size(-1) == num_axes), kModule,
        ": token_positions must have a trailing axis dim of size len(mrope_section) = ", num_axes,
        " (token_positions[..., a] is axis a), got token_positions of shape ", shape_of(positions));
    one_or_two_dims = positions.dim() - axis_dims <= 2;
    if (positions.dim() - axis_dims == 2 && rank >= 2 + trailing) {
      // (B, S): B on x's first axis, S on its sequence axis.
      for (int64_t i = 0; i < rank - 2 - trailing; ++i) positions = positions.unsqueeze(1);
    }
  } else {
    TORCH_CHECK_VALUE(rank >= trailing + 1, kModule,
                      ": without token_positions, x needs a sequence axis at seq_dim = ", seq_dim,
                      ", got x of shape ", shape_of(x));
    positions = at::arange(x.size(seq_dim), at::TensorOptions(at::kLong).device(x.device()));
    if (num_axes > 0) {
      positions = positions.unsqueeze(-1).expand({positions.size(0), num_axes});
    }
  }
  if (one_or_two_dims) {
    for (int64_t i = 0; i < trailing; ++i) positions = positions.unsqueeze(-1 - axis_dims);
  }
  return positions;
}

void check_positions_fit(const at::Tensor& x, const at::Tensor& token_positions,
                         const at::Tensor& positions, int64_t seq_dim, int64_t num_axes) {
  const int64_t rank = x.dim() - 1;
  if (rank < 0) return;  // check_module_input has refused x already
  const auto row_sizes = positions.sizes().slice(0, positions.dim() - (num_axes > 0 ? 1 : 0));
  TORCH_CHECK_VALUE(
      at::is_expandable_to(row_sizes, x.sizes().slice(0, rank)), kModule,
      ": token_positions of shape ", token_positions.sizes(), " do not fit x of shape ", x.sizes(),
      " with seq_dim = ", seq_dim,
      ". The module reads 1-D positions as (S,) along x's sequence axis (seq_dim), 2-D positions "
      "as (B, S) with B on x's first axis, and positions of 3 or more dims as broadcastable to "
      "x.shape[:-1]. For x laid out (B, S, H, D) construct the module with seq_dim=-3, "
      "for (B, H, S, D) with seq_dim=-2");
}

at::Tensor module_apply(const at::Tensor& x, const std::optional<at::Tensor>& token_positions,
                        const at::Tensor& cos, const at::Tensor& sin, int64_t seq_dim,
                        bool interleaved, int64_t long_offset, int64_t long_after,
                        at::OptionalIntArrayRef mrope_section, bool mrope_interleaved) {
  const int64_t num_axes =
      mrope_section.has_value() ? static_cast<int64_t>(mrope_section->size()) : 0;
  const auto positions = module_positions(x, token_positions, seq_dim, num_axes);
  try {
    return rope::apply(x, cos, sin, long_rope_positions(positions, long_offset, long_after),
                       interleaved, /*inverse=*/false, mrope_section, mrope_interleaved);
  } catch (const c10::Error&) {
    // Only a failed call pays for the module's own positions check: positions that do not fit x
    // get the module's rule (the op's message would recommend the op's layouts); any other error
    // is the op's.
    if (token_positions.has_value()) {
      check_positions_fit(x, *token_positions, positions, seq_dim, num_axes);
    }
    throw;
  }
}

void check_position_count(const char* who, int64_t max_seq_len) {
  TORCH_CHECK_VALUE(max_seq_len >= 1 && max_seq_len <= (int64_t{1} << 62), who,
                    ": max_seq_len must be in [1, 2^62] (the table-free module allocates nothing "
                    "per position), got ",
                    max_seq_len);
}

at::Tensor long_rope_frequencies(const at::Tensor& freqs, const at::Tensor& long_freqs,
                                 const at::Tensor& positions, int64_t long_after) {
  if (!long_freqs.defined() || positions.numel() == 0) {
    return freqs;
  }
  return at::where(positions.max().ge(long_after), long_freqs, freqs);
}

at::Tensor module_apply_frequencies(const at::Tensor& x,
                                    const std::optional<at::Tensor>& token_positions,
                                    const at::Tensor& freqs, const at::Tensor& long_freqs,
                                    double attention_factor, int64_t long_after, int64_t seq_dim,
                                    bool interleaved, at::OptionalIntArrayRef mrope_section,
                                    bool mrope_interleaved) {
  const int64_t num_axes =
      mrope_section.has_value() ? static_cast<int64_t>(mrope_section->size()) : 0;
  const auto positions = module_positions(x, token_positions, seq_dim, num_axes);
  try {
    return rope::apply(x,
                       Frequencies{long_rope_frequencies(freqs, long_freqs, positions, long_after),
                                   attention_factor},
                       positions, interleaved, /*inverse=*/false, mrope_section, mrope_interleaved);
  } catch (const c10::Error&) {
    if (token_positions.has_value()) {
      check_positions_fit(x, *token_positions, positions, seq_dim, num_axes);
    }
    throw;
  }
}

at::Tensor packed_last_position(const at::Tensor& cu_seqlens,
                                const std::optional<at::Tensor>& seq_offsets, int64_t cp_size,
                                int64_t cp_rank) {
  const at::Tensor cu = cu_seqlens.to(at::kLong);
  const int64_t n = cu.size(0) - 1;
  if (n <= 0) {
    return at::full({}, -1, cu.options());
  }
  const at::Tensor lengths = cu.narrow(0, 1, n).sub(cu.narrow(0, 0, n));
  // The last position of a sequence on this rank: its last token (cp_size 1), or the last of
  // chunk 2 cp_size - 1 - cp_rank (packed_position_in).
  at::Tensor last = lengths.sub(1);
  if (cp_size > 1) {
    last = last.sub(lengths.div(2 * cp_size, "floor").mul(cp_rank));
  }
  if (seq_offsets.has_value() && seq_offsets->defined()) {
    last = last.add(seq_offsets->to(at::kLong).to(last.device()));
  }
  return at::where(lengths.gt(0), last, at::full({}, -1, last.options())).max();
}

at::Tensor module_apply_packed(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                               int64_t long_offset, const at::Tensor& freqs,
                               const at::Tensor& long_freqs, double attention_factor,
                               int64_t long_after, const at::Tensor& cu_seqlens,
                               const std::optional<at::Tensor>& seq_offsets, int64_t cp_size,
                               int64_t cp_rank, bool interleaved) {
  const bool switches = cos.defined() ? long_offset != 0 : long_freqs.defined();
  std::optional<at::Tensor> offsets = seq_offsets;
  at::Tensor use_freqs = freqs;
  if (switches && cu_seqlens.defined() && cu_seqlens.dim() == 1 && cu_seqlens.size(0) > 1) {
    const at::Tensor is_long =
        packed_last_position(cu_seqlens, seq_offsets, cp_size, cp_rank).ge(long_after);
    if (cos.defined()) {
      // Tables: every position moves long_offset rows down, so the offsets do.
      const at::Tensor base =
          seq_offsets.has_value() && seq_offsets->defined()
              ? seq_offsets->to(at::kLong)
              : at::zeros({cu_seqlens.size(0) - 1}, cu_seqlens.options().dtype(at::kLong));
      offsets = base.add(is_long.to(at::kLong).mul(long_offset).to(base.device()));
    } else {
      use_freqs = at::where(is_long.to(freqs.device()), long_freqs, freqs);
    }
  }
  const PackedSequences packed{cu_seqlens, offsets, cp_size, cp_rank};
  if (cos.defined()) {
    return rope::apply(x, cos, sin, packed, interleaved, /*inverse=*/false);
  }
  return rope::apply(x, Frequencies{use_freqs, attention_factor}, packed, interleaved,
                     /*inverse=*/false);
}

at::Tensor long_rope_positions(const at::Tensor& positions, int64_t long_offset,
                               int64_t long_after) {
  if (long_offset == 0 || positions.numel() == 0) {
    return positions;
  }
  return positions.add(positions.max().ge(long_after).to(positions.scalar_type()).mul(long_offset));
}

}  // namespace rope::detail
