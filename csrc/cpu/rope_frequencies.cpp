// SPDX-License-Identifier: BSD-3-Clause
#include "rope_frequencies.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "../common_exact_angle.h"
#include "common_kernel_choice.h"
#include "rope_angle_rows.h"
#include "rope_parallel.h"

namespace rope::cpu {

AngleRowsFn angle_row_kernel() {
  static const AngleRowsFn fn = [] {
#ifdef TORCH_ROPE_CPU_X86_DISPATCH
    [[maybe_unused]] const char* v = row_kernel_variant();
#if ROPE_CPU_HAS_AVX512_BF16
    if (std::strcmp(v, "AVX512_BF16") == 0) return &AVX512_BF16::angle_rows;
#endif
#if ROPE_CPU_HAS_AVX512
    if (std::strcmp(v, "AVX512") == 0) return &AVX512::angle_rows;
#endif
#if ROPE_CPU_HAS_AVX2
    if (std::strcmp(v, "AVX2") == 0) return &AVX2::angle_rows;
#endif
#endif
    return &DEFAULT::angle_rows;
  }();
  return fn;
}

namespace {

// (position, plane) pairs per parallel task: about 30 us of angles at ~2 ns each.
constexpr int64_t kGrainPairs = 16384;

// The turn fractions (step 1 of common_exact_angle.h) of the last frequencies this thread saw.
// A decode step calls the op for every layer with the same few frequencies, and the fractions
// cost as much as the rest of a decode-sized call; comparing the values (not the tensor's
// address, which a new tensor may reuse) keeps the cache exact.
struct TurnFractions {
  std::vector<double> freqs;
  std::vector<uint64_t> hi;
  std::vector<uint64_t> lo;
};

const TurnFractions& turn_fractions(const FrequencyArgs& f, int64_t half) {
  thread_local TurnFractions cache;
  bool same = static_cast<int64_t>(cache.freqs.size()) == half;
  for (int64_t k = 0; same && k < half; ++k) {
    // Bit comparison: -0.0 and 0.0 have different fractions (all ones and zero).
    same = std::memcmp(&cache.freqs[k], f.freqs + k * f.freq_stride, sizeof(double)) == 0;
  }
  if (same) {
    return cache;
  }
  cache.freqs.resize(half);
  cache.hi.resize(half);
  cache.lo.resize(half);
  for (int64_t k = 0; k < half; ++k) {
    cache.freqs[k] = f.freqs[k * f.freq_stride];
    const exact_angle::TurnFraction g = exact_angle::turn_fraction(cache.freqs[k]);
    cache.hi[k] = g.hi;
    cache.lo[k] = g.lo;
  }
  return cache;
}

// The compact tables of one rotated tensor and the arguments that read them.
struct AngleTables {
  at::Tensor storage;  // cos, sin (float64), then the row index (int64) for kTensor positions
  RotationArgs args;
  TableArgs tables;
};

AngleTables build_angle_tables(const RotationArgs& a, const at::Tensor& positions,
                               const TableArgs& freqs) {
  const int64_t half = a.rotary_dim / 2;
  const bool packed = a.position_kind == PositionKind::kPacked;
  const int64_t num_axes = std::max<int64_t>(1, freqs.axes.num_axes);
  TORCH_INTERNAL_ASSERT(
      packed || (positions.is_contiguous() && positions.const_data_ptr() == a.positions),
      "rope: the frequency form's positions must be the compact tensor");
  const int64_t rows = packed ? a.packed.num_tokens : positions.numel() / num_axes;
  const TurnFractions& fractions = turn_fractions(freqs.frequencies, half);

  AngleTables t;
  t.storage = at::empty({2 * rows * half + (packed ? 0 : rows)}, at::TensorOptions(at::kDouble));
  auto* cos = t.storage.data_ptr<double>();
  double* sin = cos + rows * half;
  std::vector<int8_t> plane_axis(static_cast<size_t>(half));
  for (int64_t k = 0; k < half; ++k) {
    plane_axis[k] = static_cast<int8_t>(axis_of_plane(freqs.axes, k));
  }
  AngleRowsArgs rows_args;
  rows_args.fraction_hi = fractions.hi.data();
  rows_args.fraction_lo = fractions.lo.data();
  rows_args.half = half;
  rows_args.attention_factor = freqs.frequencies.attention_factor;
  rows_args.positions = packed ? nullptr : a.positions;
  rows_args.positions_are_int64 = a.positions_are_int64;
  rows_args.num_axes = static_cast<int32_t>(num_axes);
  rows_args.plane_axis = plane_axis.data();
  rows_args.packed = packed ? &a.packed : nullptr;
  rows_args.cos = cos;
  rows_args.sin = sin;
  if (half > 0) {
    const AngleRowsFn fill = angle_row_kernel();
    at::parallel_for(0, rows, std::max<int64_t>(1, kGrainPairs / half),
                     [&](int64_t begin, int64_t end) { fill(rows_args, begin, end); });
  }

  t.args = a;
  if (packed) {
    t.args.position_kind = PositionKind::kIndex;  // row t of the tables is token t
  } else {
    // The positions become the row index of the tables: element r * num_axes of the compact
    // positions is row r, so the position strides (multiples of num_axes) shrink by that much.
    auto* index = reinterpret_cast<int64_t*>(sin + rows * half);
    for (int64_t r = 0; r < rows; ++r) {
      index[r] = r;
    }
    t.args.positions = index;
    t.args.positions_are_int64 = true;
    t.args.axis_stride = 0;
    for (int32_t d = 0; d < t.args.geometry.ndim; ++d) {
      t.args.geometry.pos_strides[d] /= num_axes;
    }
  }
  t.tables.cos = cos;
  t.tables.sin = sin;
  t.tables.tables_are_double = true;
  t.tables.max_seq_len = rows;
  t.tables.table_stride = half;
  t.tables.exact_rotation = true;
  return t;
}

}  // namespace

void rotate_frequencies(c10::ScalarType dtype, const RotationArgs& first,
                        const at::Tensor& first_positions, const RotationArgs* second,
                        const at::Tensor* second_positions, const TableArgs& freqs,
                        RotationMode mode) {
  const AngleTables one = build_angle_tables(first, first_positions, freqs);
  if (second == nullptr) {
    return rotate(dtype, one.args, one.tables, mode);
  }
  // q and k read the same positions (apply_qk): one set of tables for both, unless one of them
  // was copied to a layout of its own (prepare_rotation's fallback for > kMaxRowDims dims).
  const bool shared =
      first.position_kind == second->position_kind &&
      (first.position_kind == PositionKind::kPacked || first.positions == second->positions);
  if (shared) {
    RotationArgs k = *second;
    k.position_kind = one.args.position_kind;
    k.positions = one.args.positions;
    k.positions_are_int64 = true;
    k.axis_stride = 0;
    if (k.position_kind == PositionKind::kTensor) {
      const int64_t num_axes = std::max<int32_t>(1, freqs.axes.num_axes);
      for (int32_t d = 0; d < k.geometry.ndim; ++d) {
        k.geometry.pos_strides[d] /= num_axes;
      }
    }
    return rotate_pair(dtype, one.args, k, one.tables, mode);
  }
  const AngleTables two = build_angle_tables(*second, *second_positions, freqs);
  rotate(dtype, one.args, one.tables, mode);
  rotate(dtype, two.args, two.tables, mode);
}

}  // namespace rope::cpu
