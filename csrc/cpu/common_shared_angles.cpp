// SPDX-License-Identifier: BSD-3-Clause
#include "common_shared_angles.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace rope::cpu {
namespace {

// Rows per distinct position below which the compact table is not worth building: with one row
// per position (positions as large as x) it would be a second pass for nothing.
constexpr int64_t kMinRowsPerPosition = 2;

// Runs of consecutive planes that read one axis: one per axis for contiguous sections, mostly one
// per plane for the interleaved (Qwen3-VL) rule.
struct AxisRun {
  int64_t begin;
  int64_t length;
  int32_t axis;
};

std::vector<AxisRun> axis_runs(const AxisMap& axes, int64_t half) {
  std::vector<AxisRun> runs;
  for (int64_t k = 0; k < half; ++k) {
    const int32_t a = axis_of_plane(axes, k);
    if (runs.empty() || runs.back().axis != a) {
      runs.push_back({k, 0, a});
    }
    ++runs.back().length;
  }
  return runs;
}

// Rows [r_begin, r_end) of the compact tables: row r holds the angles of the r-th distinct
// position (row-major over the varying dims), whose axis a sits at offset + a * axis_stride.
// `plane_axis` (one entry per plane) is used when the runs are short (the interleaved rule):
// a plain loop then beats a memcpy per plane.
template <typename table_t, typename pos_t>
void gather_rows(const RotationArgs& args, const TableArgs& tables,
                 const std::vector<AxisRun>& runs, const std::vector<int8_t>& plane_axis,
                 const int64_t* dims, const int64_t* sizes, int32_t num_dims, int64_t half,
                 table_t* cos_out, table_t* sin_out, int64_t r_begin, int64_t r_end) {
  const auto* positions = static_cast<const pos_t*>(args.positions);
  const auto* cos = static_cast<const table_t*>(tables.cos);
  const auto* sin = static_cast<const table_t*>(tables.sin);
  const RowGeometry& g = args.geometry;
  const bool per_plane = static_cast<int64_t>(runs.size()) > tables.axes.num_axes;
  for (int64_t r = r_begin; r < r_end; ++r) {
    int64_t offset = 0;
    int64_t rest = r;
    for (int32_t i = num_dims - 1; i >= 0; --i) {
      offset += (rest % sizes[i]) * g.pos_strides[dims[i]];
      rest /= sizes[i];
    }
    const table_t* cos_rows[kMaxAxes];
    const table_t* sin_rows[kMaxAxes];
    for (int32_t a = 0; a < tables.axes.num_axes; ++a) {
      const int64_t row = static_cast<int64_t>(positions[offset + a * args.axis_stride]);
      cos_rows[a] = cos + row * tables.table_stride;
      sin_rows[a] = sin + row * tables.table_stride;
    }
    table_t* c = cos_out + r * half;
    table_t* s = sin_out + r * half;
    if (per_plane) {
      for (int64_t k = 0; k < half; ++k) {
        c[k] = cos_rows[plane_axis[k]][k];
        s[k] = sin_rows[plane_axis[k]][k];
      }
      continue;
    }
    for (const AxisRun& run : runs) {
      std::memcpy(c + run.begin, cos_rows[run.axis] + run.begin, run.length * sizeof(table_t));
      std::memcpy(s + run.begin, sin_rows[run.axis] + run.begin, run.length * sizeof(table_t));
    }
  }
}

}  // namespace

std::optional<SharedAngles> share_angles(const RotationArgs& args, const TableArgs& tables) {
  const RowGeometry& g = args.geometry;
  const int64_t half = args.rotary_dim / 2;
  if (tables.axes.num_axes == 0 || half == 0 || g.num_rows == 0) {
    return std::nullopt;
  }
  // The dims along which positions vary; the others broadcast them.
  int64_t dims[kMaxRowDims];
  int64_t sizes[kMaxRowDims];
  int32_t num_dims = 0;
  int64_t distinct = 1;
  for (int32_t d = 0; d < g.ndim; ++d) {
    if (g.pos_strides[d] != 0 && g.row_sizes[d] > 1) {
      dims[num_dims] = d;
      sizes[num_dims] = g.row_sizes[d];
      ++num_dims;
      distinct *= g.row_sizes[d];
    }
  }
  if (distinct * kMinRowsPerPosition > g.num_rows) {
    return std::nullopt;
  }
  // Consecutive rows sharing a position (x (B, S, H, D) with positions (B, S, 1, A), decode's
  // (B, H, 1, D) with (B, 1, 1, A)): the row kernel's gather already runs once per run of them
  // (MixedRows::row caches the last one), so a compact table would only add an allocation.
  for (int32_t d = g.ndim - 1; d >= 0; --d) {
    if (g.row_sizes[d] > 1) {
      if (g.pos_strides[d] == 0) {
        return std::nullopt;
      }
      break;
    }
  }

  SharedAngles shared{args, tables, {}};
  const int64_t table_bytes = tables.tables_are_double ? 8 : 4;
  const int64_t table_elems = distinct * half;
  // cos, sin, then the index; every part starts 8-byte aligned.
  shared.storage =
      at::empty({2 * table_elems * table_bytes + 8 * distinct + 8}, at::TensorOptions(at::kByte));
  auto* base = static_cast<char*>(shared.storage.data_ptr());
  void* compact_cos = base;
  void* compact_sin = base + table_elems * table_bytes;
  auto* index = reinterpret_cast<int64_t*>(base + ((2 * table_elems * table_bytes + 7) / 8) * 8);
  const std::vector<AxisRun> runs = axis_runs(tables.axes, half);
  std::vector<int8_t> plane_axis(static_cast<size_t>(half));
  for (int64_t k = 0; k < half; ++k) {
    plane_axis[k] = static_cast<int8_t>(axis_of_plane(tables.axes, k));
  }
  // About 32 KiB of gathered angles per task, as the row kernel's grain.
  const int64_t grain = std::max<int64_t>(1, 4096 / half);
  at::parallel_for(0, distinct, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      index[r] = r;
    }
    const auto gather = [&](auto table_tag, auto pos_tag) {
      using table_t = decltype(table_tag);
      using pos_t = decltype(pos_tag);
      gather_rows<table_t, pos_t>(args, tables, runs, plane_axis, dims, sizes, num_dims, half,
                                  static_cast<table_t*>(compact_cos),
                                  static_cast<table_t*>(compact_sin), begin, end);
    };
    if (tables.tables_are_double) {
      args.positions_are_int64 ? gather(double{}, int64_t{}) : gather(double{}, int32_t{});
    } else {
      args.positions_are_int64 ? gather(float{}, int64_t{}) : gather(float{}, int32_t{});
    }
  });

  // The positions become the row index of the compact tables: row-major over the varying dims.
  RowGeometry& geometry = shared.args.geometry;
  int64_t stride = 1;
  for (int32_t i = num_dims - 1; i >= 0; --i) {
    geometry.pos_strides[dims[i]] = stride;
    stride *= sizes[i];
  }
  for (int32_t d = 0; d < geometry.ndim; ++d) {
    if (g.pos_strides[d] == 0 || g.row_sizes[d] == 1) {
      geometry.pos_strides[d] = 0;
    }
  }
  shared.args.positions = index;
  shared.args.positions_are_int64 = true;
  shared.args.axis_stride = 0;
  shared.tables.cos = compact_cos;
  shared.tables.sin = compact_sin;
  shared.tables.max_seq_len = distinct;
  shared.tables.table_stride = half;
  shared.tables.axes = AxisMap{};
  return shared;
}

}  // namespace rope::cpu
