// SPDX-License-Identifier: BSD-3-Clause
// The angles of multi-axis positions (M-RoPE) for the CPU row kernel.
//
// With multi-axis positions, plane k of a row turns by the position of axis axis_of_plane(k)
// (common_kernel_args.h), so one row's angles come from up to kMaxAxes table rows. MixedRows
// gathers them into the rows of a small scratch table, which the one-axis row kernel then reads
// like any table: the vector code, and so its speed, are those of one-axis RoPE. A gather runs once
// per distinct position, not once per row: once per tile position for all the heads that share it
// (rotate_rows_runs), and once per run of rows whose positions repeat (the cache of gather_row).
//
// Compiled into every kernel copy (included inside its CPU_CAPABILITY namespace), like the
// intrinsics headers.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "../common_kernel_args.h"

namespace rope::cpu::CPU_CAPABILITY {
namespace {

// The angle source of one-axis positions: the tables themselves, at the row's position.
template <typename pos_t>
class OneAxisAngles {
 public:
  explicit OneAxisAngles(const TableArgs& tables) : tables_(tables) {}
  const TableArgs& tables() const { return tables_; }
  void gather_tile(const pos_t* /*p*/, int64_t /*step*/, int64_t /*n*/) {}
  int64_t tile_row(const pos_t* p, int64_t /*i*/) const { return static_cast<int64_t>(*p); }
  int64_t row(const pos_t* p) const { return static_cast<int64_t>(*p); }

 private:
  const TableArgs& tables_;
};

// The angle source of multi-axis positions: rows gathered into a scratch table of
// tile_slots + 1 rows (tile rows, then one row for rows visited one at a time).
template <typename table_t, typename pos_t>
class MixedRows {
 public:
  MixedRows(const RotationArgs& args, const TableArgs& tables, int64_t tile_slots)
      : half_(args.rotary_dim / 2),
        single_slot_(tile_slots),
        axis_stride_(args.axis_stride),
        table_stride_(tables.table_stride),
        num_axes_(tables.axes.num_axes),
        src_cos_(static_cast<const table_t*>(tables.cos)),
        src_sin_(static_cast<const table_t*>(tables.sin)),
        cos_(static_cast<size_t>((tile_slots + 1) * half_)),
        sin_(cos_.size()) {
    // Runs of consecutive planes that read one axis: one per axis for contiguous sections (a
    // memcpy each), one per plane for most of the interleaved (Qwen3-VL) layout, which then
    // takes the per-plane loop instead.
    plane_axis_.resize(static_cast<size_t>(half_));
    for (int64_t k = 0; k < half_; ++k) {
      plane_axis_[k] = static_cast<int8_t>(axis_of_plane(tables.axes, k));
      if (k == 0 || plane_axis_[k] != plane_axis_[k - 1]) {
        runs_.push_back({k, 0, plane_axis_[k]});
      }
      ++runs_.back().length;
    }
    per_plane_ = static_cast<int64_t>(runs_.size()) > num_axes_;
    scratch_ = tables;
    scratch_.cos = cos_.data();
    scratch_.sin = sin_.data();
    scratch_.max_seq_len = tile_slots + 1;
    scratch_.table_stride = half_;
    scratch_.axes = AxisMap{};
  }

  const TableArgs& tables() const { return scratch_; }

  // Gathers the angles of n rows whose positions are at p, p + step, ... into slots 0..n-1.
  void gather_tile(const pos_t* p, int64_t step, int64_t n) {
    for (int64_t i = 0; i < n; ++i, p += step) {
      gather(p, i);
    }
  }
  int64_t tile_row(const pos_t* /*p*/, int64_t i) const { return i; }

  // The slot holding the angles of the row whose positions are at p; gathered only when they
  // differ from the previous row's (rows of one token across heads share them).
  int64_t row(const pos_t* p) {
    bool same = cached_;
    for (int32_t a = 0; a < num_axes_; ++a) {
      const pos_t v = p[a * axis_stride_];
      same = same && last_[a] == v;
      last_[a] = v;
    }
    if (!same) {
      gather(p, single_slot_);
      cached_ = true;
    }
    return single_slot_;
  }

 private:
  struct Run {
    int64_t begin;
    int64_t length;
    int8_t axis;
  };

  void gather(const pos_t* p, int64_t slot) {
    const table_t* cos_rows[kMaxAxes];
    const table_t* sin_rows[kMaxAxes];
    for (int32_t a = 0; a < num_axes_; ++a) {
      const int64_t offset = static_cast<int64_t>(p[a * axis_stride_]) * table_stride_;
      cos_rows[a] = src_cos_ + offset;
      sin_rows[a] = src_sin_ + offset;
    }
    table_t* c = cos_.data() + slot * half_;
    table_t* s = sin_.data() + slot * half_;
    if (per_plane_) {
      for (int64_t k = 0; k < half_; ++k) {
        c[k] = cos_rows[plane_axis_[k]][k];
        s[k] = sin_rows[plane_axis_[k]][k];
      }
      return;
    }
    for (const Run& r : runs_) {
      std::memcpy(c + r.begin, cos_rows[r.axis] + r.begin, r.length * sizeof(table_t));
      std::memcpy(s + r.begin, sin_rows[r.axis] + r.begin, r.length * sizeof(table_t));
    }
  }

  int64_t half_;
  int64_t single_slot_;
  int64_t axis_stride_;
  int64_t table_stride_;
  int32_t num_axes_;
  const table_t* src_cos_;
  const table_t* src_sin_;
  std::vector<table_t> cos_;
  std::vector<table_t> sin_;
  std::vector<int8_t> plane_axis_;
  std::vector<Run> runs_;
  bool per_plane_ = false;
  TableArgs scratch_;
  pos_t last_[kMaxAxes] = {};
  bool cached_ = false;
};

}  // namespace
}  // namespace rope::cpu::CPU_CAPABILITY
