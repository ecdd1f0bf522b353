// SPDX-License-Identifier: BSD-3-Clause
// Fused QK-RMSNorm + RoPE on CUDA (rope.rms_norm_apply_qk): the kernel and its launcher, free of
// torch, like rope_kernel.cuh; its device helpers are common_device.cuh's.
//
// One thread per row (q's rows, then k's, in one launch). A thread sums the squares of its row's
// head_dim features, then reads the row again (from L1/L2), scales each feature by
// r = 1 / sqrt(mean + eps) and by (weight + weight_offset), rotates the first rotary_dim
// features as rope_kernel.cuh rotates them (rotate_plane), and rounds once to the storage type.
// The reduction stays inside the thread. Multi-axis positions (mrope_section) read the
// position of each plane's axis (common_device.cuh's plane_axis), from positions whose axis dim
// may have any stride (hf.patch hands Qwen3-VL's axis-first position ids to this op).
//
// One thread per row is simple, not fast: a warp touches 32 rows at once, so its loads are
// strided by head_dim. The row streams (common_stream_kernel.cuh) give a normalised row a
// half-warp and fold its sum by shuffles, which the host run checks; this kernel is to retire
// into them. scripts/sass_report.py applies its general rules to this kernel (no spills, no
// atomics); its vector / paired-access rules are for rope_kernel.cuh's
// variants, which it recognises by name, and do not apply: every access here is scalar.
#pragma once

#include "../rms_norm_args.h"
#include "common_device.cuh"

namespace rope::cuda {

constexpr int kNormBlockThreads =
    256;  // as kBlockThreads (scripts/sass_report.py sizes occupancy by it)

// The parameter block of one launch: q's rows are [0, first_rows), k's the rest.
struct NormKernelParams {
  NormRotationArgs tensor[2];
  int64_t first_rows = 0;
  int64_t total_rows = 0;
  TableArgs tables;
  double eps = 1e-6;
  double weight_offset = 0.0;
  bool inverse = false;
};

namespace kernel {

using namespace ::rope::cuda::device;

template <typename scalar_t, typename table_t, bool kInterleaved>
__device__ __forceinline__ void norm_row(const NormRotationArgs& na, const TableArgs& tb,
                                         double eps, double weight_offset, bool inverse,
                                         int64_t row) {
  using acc_t = typename AccType<scalar_t>::type;
  const RotationArgs& a = na.rot;
  const RowGeometry& g = a.geometry;
  // Unravel the row index over the row dims, innermost first.
  int64_t in_off = 0;
  int64_t out_off = 0;
  int64_t pos_off = 0;
  int64_t rest = row;
  for (int d = g.ndim - 1; d > 0; --d) {
    const QuotRem qr = div_rem(rest, g.row_sizes[d]);
    in_off += qr.rem * g.in_strides[d];
    out_off += qr.rem * g.out_strides[d];
    pos_off += qr.rem * g.pos_strides[d];
    rest = qr.quot;
  }
  if (g.ndim > 0) {
    in_off += rest * g.in_strides[0];
    out_off += rest * g.out_strides[0];
    pos_off += rest * g.pos_strides[0];
  }
  // The table row of every axis of the row's position (one-axis positions: rows[0]), each
  // checked before anything is written.
  int64_t rows[kMaxAxes] = {};
  if (tb.axes.num_axes == 0) {
    int64_t pos;
    if (!load_position(a, tb, pos_off, pos)) {
      return;
    }
    rows[0] = pos * tb.table_stride;
  } else if (!load_axis_rows(a, tb, pos_off, a.axis_stride, tb.table_stride, rows)) {
    return;
  }
  const auto* x = static_cast<const scalar_t*>(a.in) + in_off;
  auto* y = static_cast<scalar_t*>(a.out) + out_off;
  const auto* w = static_cast<const acc_t*>(na.weight);
  const int64_t head_dim = a.head_dim;

  acc_t ss = 0;
  for (int64_t d = 0; d < head_dim; ++d) {
    const acc_t v = to_acc(load_scalar(x + d));
    ss = fused(v, v, ss);
  }
  const acc_t r = acc_t(1) / acc_sqrt(ss / static_cast<acc_t>(head_dim) + static_cast<acc_t>(eps));
  const acc_t offset = static_cast<acc_t>(weight_offset);

  const int64_t half = a.rotary_dim / 2;
  const auto* cos = static_cast<const table_t*>(tb.cos);
  const auto* sin = static_cast<const table_t*>(tb.sin);
  for (int64_t k = 0; k < half; ++k) {
    const int64_t ia = kInterleaved ? 2 * k : k;
    const int64_t ib = kInterleaved ? 2 * k + 1 : k + half;
    const acc_t xa = to_acc(load_scalar(x + ia)) * r * (__ldg(w + ia) + offset);
    const acc_t xb = to_acc(load_scalar(x + ib)) * r * (__ldg(w + ib) + offset);
    const int32_t axis = tb.axes.num_axes > 0 ? plane_axis(tb.axes, k) : 0;
    const int64_t t = pick_axis(rows, axis) + k;
    const acc_t c = static_cast<acc_t>(__ldg(cos + t));
    const acc_t s =
        inverse ? -static_cast<acc_t>(__ldg(sin + t)) : static_cast<acc_t>(__ldg(sin + t));
    acc_t ra;
    acc_t rb;
    rotate_plane(xa, xb, c, s, ra, rb);
    store_scalar(y + ia, from_acc<scalar_t>(ra));
    store_scalar(y + ib, from_acc<scalar_t>(rb));
  }
  for (int64_t d = a.rotary_dim; d < head_dim; ++d) {
    const acc_t v = to_acc(load_scalar(x + d)) * r * (__ldg(w + d) + offset);
    store_scalar(y + d, from_acc<scalar_t>(v));
  }
}

template <typename scalar_t, typename table_t, bool kInterleaved>
__global__ void __launch_bounds__(kNormBlockThreads)
    qk_norm_rotary_kernel(const __grid_constant__ NormKernelParams params) {
  const int64_t row = grid_thread_index<kNormBlockThreads>();
  if (row < params.first_rows) {
    norm_row<scalar_t, table_t, kInterleaved>(params.tensor[0], params.tables, params.eps,
                                              params.weight_offset, params.inverse, row);
  } else if (row < params.total_rows) {
    norm_row<scalar_t, table_t, kInterleaved>(params.tensor[1], params.tables, params.eps,
                                              params.weight_offset, params.inverse,
                                              row - params.first_rows);
  }
}

template <typename scalar_t, typename table_t, bool kInterleaved>
cudaError_t launch_norm(const NormKernelParams& params, cudaStream_t stream) {
  return launch_grid(qk_norm_rotary_kernel<scalar_t, table_t, kInterleaved>,
                     blocks_for<kNormBlockThreads>(params.total_rows), kNormBlockThreads, params,
                     stream);
}

}  // namespace kernel

// Normalises and rotates q and k (rows of `q` then of `k`) in one launch on `stream`. scalar_t:
// double, float, __half or __nv_bfloat16; the weights (NormRotationArgs::weight) are head_dim
// values of the math type (double for double, else float); the kernel adds weight_offset.
// Does not synchronize; positions outside [0, max_seq_len) trip ROPE_DEVICE_ASSERT and leave
// their row unwritten.
template <typename scalar_t>
cudaError_t norm_rotate(const NormRotationArgs& q, const NormRotationArgs& k,
                        const TableArgs& tables, RotationMode mode, NormParams norm,
                        cudaStream_t stream) {
  NormKernelParams p;
  p.tensor[0] = q;
  p.tensor[1] = k;
  p.first_rows = q.rot.geometry.num_rows;
  p.total_rows = q.rot.geometry.num_rows + k.rot.geometry.num_rows;
  p.tables = tables;
  p.eps = norm.eps;
  p.weight_offset = norm.weight_offset;
  p.inverse = mode.inverse;
  if (tables.tables_are_double) {
    return mode.interleaved ? kernel::launch_norm<scalar_t, double, true>(p, stream)
                            : kernel::launch_norm<scalar_t, double, false>(p, stream);
  }
  return mode.interleaved ? kernel::launch_norm<scalar_t, float, true>(p, stream)
                          : kernel::launch_norm<scalar_t, float, false>(p, stream);
}

}  // namespace rope::cuda
