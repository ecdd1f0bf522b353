// SPDX-License-Identifier: BSD-3-Clause
// The CPU row kernel. This file is compiled several times, once per CPU capability, with
// CPU_CAPABILITY set to DEFAULT, AVX2, AVX512 or AVX512_BF16 (CMakeLists.txt), so each copy lives
// in its own namespace. The x86 copies rotate whole vectors of planes with the intrinsics of
// common_planes_avx2.h / common_planes_avx512.h; DEFAULT (and non-x86 builds) use portable at::vec
// code. It includes no torch tensor headers on purpose: only at::vec and the plain structs of
// common_kernel_args.h.
#include "rope_rows.h"

#include <ATen/OpMathType.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/macros/Macros.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "common_mixed_rows.h"
#include "common_planes.h"
#include "common_row_cursor.h"
#include "rope_packed_lookup.h"

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
#include "rope_exact_planes.h"
#endif

#ifndef CPU_CAPABILITY
#error "rope_rows.cpp must be compiled with -DCPU_CAPABILITY=<DEFAULT|AVX2|AVX512|AVX512_BF16>"
#endif

namespace rope::cpu::CPU_CAPABILITY {
namespace {

// The intrinsic copies inline the row body into both visiting orders of rotate_rows_runs (it is
// small there); the portable copy leaves that to the compiler, whose at::vec code is large and
// loses its vectorisation when forced into one function.
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
#define ROPE_ROW_INLINE C10_ALWAYS_INLINE
#else
#define ROPE_ROW_INLINE inline
#endif

// Vector planes of a float64 row (double math, float or double tables): the AVX2 code in every
// intrinsic copy, none in the portable one. Other storage types with double tables keep the
// scalar loop. Returns the first plane left for the scalar loop.
template <bool kInterleaved, bool kInverse, typename scalar_t, typename table_t>
inline int64_t rotate_planes_f64(const scalar_t* in, scalar_t* out, const table_t* cos,
                                 const table_t* sin, int64_t half) {
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  if constexpr (std::is_same_v<scalar_t, double>) {
    return avx2::rotate_planes_f64<kInterleaved, kInverse>(in, out, cos, sin, half, 0);
  }
#endif
  return 0;
}

// ---- one row ------------------------------------------------------------------------------------

// Planes [k_begin, half) one at a time: any storage type, float or double tables. Math in
// opmath (float for half types, double for double). Reads a plane fully before writing it, so
// in == out is safe.
template <bool kInterleaved, bool kInverse, typename scalar_t, typename table_t>
inline void rotate_planes_scalar(const scalar_t* in, scalar_t* out, const table_t* cos,
                                 const table_t* sin, int64_t half, int64_t k_begin) {
  using acc_t = at::opmath_type<scalar_t>;
  for (int64_t k = k_begin; k < half; ++k) {
    const int64_t ia = kInterleaved ? 2 * k : k;
    const int64_t ib = kInterleaved ? 2 * k + 1 : k + half;
    const acc_t c = static_cast<acc_t>(cos[k]);
    const acc_t s = kInverse ? -static_cast<acc_t>(sin[k]) : static_cast<acc_t>(sin[k]);
    const acc_t a = static_cast<acc_t>(in[ia]);
    const acc_t b = static_cast<acc_t>(in[ib]);
    out[ia] = static_cast<scalar_t>(a * c - b * s);
    out[ib] = static_cast<scalar_t>(a * s + b * c);
  }
}

// The frequency form's exact rotation (tables.exact_rotation: float64 tables of exact angles),
// planes [k_begin, half): double math and one rounding to float for every storage type, then one
// more to 16-bit storage (rope_exact_planes.h says why, and computes the same bits in vectors).
template <bool kInterleaved, bool kInverse, typename scalar_t>
inline void rotate_planes_exact_scalar(const scalar_t* in, scalar_t* out, const double* cos,
                                       const double* sin, int64_t half, int64_t k_begin) {
  for (int64_t k = k_begin; k < half; ++k) {
    const int64_t ia = kInterleaved ? 2 * k : k;
    const int64_t ib = kInterleaved ? 2 * k + 1 : k + half;
    const double a = static_cast<double>(static_cast<float>(in[ia]));
    const double b = static_cast<double>(static_cast<float>(in[ib]));
    const double c = cos[k];
    const double s = kInverse ? -sin[k] : sin[k];
    const float ra = static_cast<float>(std::fma(a, c, -(b * s)));
    const float rb = static_cast<float>(std::fma(a, s, b * c));
    out[ia] = static_cast<scalar_t>(ra);
    out[ib] = static_cast<scalar_t>(rb);
  }
}

// Float64 rows with the exact tables: double math, fused as rotate_f64 of the angle core.
template <bool kInterleaved, bool kInverse>
inline void rotate_planes_exact_scalar(const double* in, double* out, const double* cos,
                                       const double* sin, int64_t half, int64_t k_begin) {
  for (int64_t k = k_begin; k < half; ++k) {
    const int64_t ia = kInterleaved ? 2 * k : k;
    const int64_t ib = kInterleaved ? 2 * k + 1 : k + half;
    const double a = in[ia];
    const double b = in[ib];
    const double c = cos[k];
    const double s = kInverse ? -sin[k] : sin[k];
    out[ia] = std::fma(a, c, -(b * s));
    out[ib] = std::fma(a, s, b * c);
  }
}

// The exact rotation of one row's planes, vectors first where this copy has them.
template <bool kInterleaved, bool kInverse, typename scalar_t>
inline void rotate_planes_exact(const scalar_t* x, scalar_t* y, const double* cos,
                                const double* sin, int64_t half) {
  int64_t k = 0;
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  if constexpr (std::is_same_v<scalar_t, double>) {
    k = avx2::rotate_planes_f64<kInterleaved, kInverse>(x, y, cos, sin, half, 0);
  } else {
    k = exact::rotate_planes<kInterleaved, kInverse>(x, y, cos, sin, half, 0);
  }
#endif
  rotate_planes_exact_scalar<kInterleaved, kInverse>(x, y, cos, sin, half, k);
}

// One row at table row `pos`. kHalf: the number of planes when it is a compile-time constant (the
// common rotary dims), else 0. A constant lets the vector loops unroll fully and drops the
// remainder and scalar code, which is a large part of a row's cost at head_dim 64..128.
template <typename scalar_t, bool kInterleaved, bool kInverse, int64_t kHalf>
ROPE_ROW_INLINE void rotate_row(const scalar_t* x, scalar_t* y, int64_t pos,
                                const RotationArgs& args, const TableArgs& tables) {
  const int64_t half = kHalf != 0 ? kHalf : args.rotary_dim / 2;
  // float32 tables with float/half/bfloat16 storage take the float vector path. Double storage
  // keeps double math (4-lane double vectors, rotate_planes_f64), and double tables keep their
  // precision (16/32-bit storage with double tables: the scalar loop).
  constexpr bool kVecStorage = !std::is_same_v<scalar_t, double>;
  const int64_t table_offset = pos * tables.table_stride;
  if constexpr (kHalf != 0) {
    // Only float tables and vector storage come here (rotate_rows_sized), and the 8-plane steps
    // of every intrinsic copy cover a multiple of 8 planes exactly.
    static_assert(kHalf % 8 == 0 && kVecStorage);
    const auto* cos = static_cast<const float*>(tables.cos) + table_offset;
    const auto* sin = static_cast<const float*>(tables.sin) + table_offset;
    rotate_planes_vec<kInterleaved, kInverse>(x, y, cos, sin, half);
  } else if (kVecStorage && !tables.tables_are_double) {
    const auto* cos = static_cast<const float*>(tables.cos) + table_offset;
    const auto* sin = static_cast<const float*>(tables.sin) + table_offset;
    int64_t k = 0;
    if constexpr (kVecStorage) {
      k = rotate_planes_vec<kInterleaved, kInverse>(x, y, cos, sin, half);
    }
    rotate_planes_scalar<kInterleaved, kInverse>(x, y, cos, sin, half, k);
  } else if (tables.exact_rotation) {
    rotate_planes_exact<kInterleaved, kInverse>(
        x, y, static_cast<const double*>(tables.cos) + table_offset,
        static_cast<const double*>(tables.sin) + table_offset, half);
  } else {
    // The double vector planes (double storage only), then the scalar loop, with either table.
    const auto rotate_with = [&](const auto* cos, const auto* sin) {
      rotate_planes_scalar<kInterleaved, kInverse>(
          x, y, cos, sin, half, rotate_planes_f64<kInterleaved, kInverse>(x, y, cos, sin, half));
    };
    if (tables.tables_are_double) {
      rotate_with(static_cast<const double*>(tables.cos) + table_offset,
                  static_cast<const double*>(tables.sin) + table_offset);
    } else {
      rotate_with(static_cast<const float*>(tables.cos) + table_offset,
                  static_cast<const float*>(tables.sin) + table_offset);
    }
  }
  if (args.copy_tail && args.head_dim > args.rotary_dim) {
    std::memcpy(y + args.rotary_dim, x + args.rotary_dim,
                (args.head_dim - args.rotary_dim) * sizeof(scalar_t));
  }
}

// Positions per tile when rows are visited in tiles (see rotate_rows_runs): 16 table rows of a
// 128-wide rotary_dim are 8 KiB of cos and sin, which stay in L1 while every head reads them.
constexpr int64_t kTilePositions = 16;
// The most x bytes a group of tiled heads may span: about one core's L2. Beyond it x streams from
// L3 or memory, and visiting many heads at once breaks the hardware prefetcher's streams
// (measured: a 128 MiB in-place rotation became 1.6x slower tiled); rows then go in plain order.
constexpr int64_t kTileGroupBytes = int64_t{1} << 20;

// Rows [row_begin, row_end) as runs along the innermost row dim: within a run the x, out and
// positions offsets advance by constant strides held in registers, and the cursor's carry logic
// runs once per run rather than once per row.
//
// When positions change along the innermost dim but not along the next one out (x in (B, H, S, D)
// with positions (S,) or (B, 1, S)), consecutive rows read different table rows, and the tables
// then compete with x and out for L1: a quarter more L2 traffic than a copy. Runs of several whole
// heads (up to kTileGroupBytes of x) are then visited in tiles of kTilePositions positions across
// those heads, so each table row comes from L1 for every head after the first. Rows are
// independent (also in place), so the order is free.
//
// `angles` says which table row each row reads: OneAxisAngles (the row's position in `tables`)
// or MixedRows (multi-axis positions: rows gathered once per tile position, or per run of rows
// with equal positions, into a scratch table); see common_mixed_rows.h.
template <typename scalar_t, bool kInterleaved, bool kInverse, int64_t kHalf, typename pos_t,
          typename Angles>
void rotate_rows_runs(const RotationArgs& args, Angles& angles, int64_t row_begin,
                      int64_t row_end) {
  const TableArgs& tables = angles.tables();
  const auto* in = static_cast<const scalar_t*>(args.in);
  auto* out = static_cast<scalar_t*>(args.out);
  const auto* positions = static_cast<const pos_t*>(args.positions);
  const RowGeometry& g = args.geometry;
  const int32_t inner = g.ndim - 1;  // -1: a single row
  const int64_t in_step = inner >= 0 ? g.in_strides[inner] : 0;
  const int64_t out_step = inner >= 0 ? g.out_strides[inner] : 0;
  const int64_t pos_step = inner >= 0 ? g.pos_strides[inner] : 0;
  const int64_t run_len = inner >= 0 ? g.row_sizes[inner] : 1;
  const bool tiled = kHasIntrinsics && inner >= 1 && pos_step != 0 &&
                     g.pos_strides[inner - 1] == 0 && run_len > kTilePositions;
  const auto rows_of = [&](const scalar_t* x, scalar_t* y, const pos_t* p, int64_t n,
                           bool in_tile) {
    if constexpr (!std::is_same_v<Angles, OneAxisAngles<pos_t>>) {
      if (!in_tile && pos_step == 0) {
        // Multi-axis, one position for the whole run (the heads of a decode token): its angles
        // once, not a comparison of every axis per row. (The one-axis loop stays as it was: the
        // same hoist there measured 10% slower on fp32 decode.)
        const int64_t row = angles.row(p);
        for (int64_t i = 0; i < n; ++i, x += in_step, y += out_step) {
          rotate_row<scalar_t, kInterleaved, kInverse, kHalf>(x, y, row, args, tables);
        }
        return;
      }
    }
    for (int64_t i = 0; i < n; ++i, x += in_step, y += out_step, p += pos_step) {
      const int64_t row = in_tile ? angles.tile_row(p, i) : angles.row(p);
      rotate_row<scalar_t, kInterleaved, kInverse, kHalf>(x, y, row, args, tables);
    }
  };
  RowCursor cur(g, row_begin);
  for (int64_t row = row_begin; row < row_end;) {
    if (tiled && cur.index(inner) == 0) {
      // Whole runs of consecutive heads (same outer index, hence the same positions).
      const int64_t heads =
          std::min({(row_end - row) / run_len, g.row_sizes[inner - 1] - cur.index(inner - 1),
                    kTileGroupBytes / (run_len * args.head_dim * int64_t{sizeof(scalar_t)})});
      if (heads >= 2) {
        const scalar_t* x0 = in + cur.in();
        scalar_t* y0 = out + cur.out();
        const pos_t* p0 = positions + cur.pos();
        const int64_t head_in = g.in_strides[inner - 1];
        const int64_t head_out = g.out_strides[inner - 1];
        for (int64_t s0 = 0; s0 < run_len; s0 += kTilePositions) {
          const int64_t n = std::min(kTilePositions, run_len - s0);
          angles.gather_tile(p0 + s0 * pos_step, pos_step, n);
          for (int64_t h = 0; h < heads; ++h) {
            rows_of(x0 + h * head_in + s0 * in_step, y0 + h * head_out + s0 * out_step,
                    p0 + s0 * pos_step, n, /*in_tile=*/true);
          }
        }
        row += heads * run_len;
        for (int64_t h = 0; h < heads; ++h) {
          cur.skip(run_len);
        }
        continue;
      }
    }
    const int64_t run = std::min(row_end - row, cur.rows_left_in_run());
    rows_of(in + cur.in(), out + cur.out(), positions + cur.pos(), run, /*in_tile=*/false);
    row += run;
    cur.skip(run);
  }
}

// ---- positions without a positions tensor (PositionKind kPacked, kIndex) ----------------------

// kIndex: the virtual offset is the row of the compact tables itself.
struct IndexLookup {
  int64_t operator()(int64_t t) const { return t; }
};

// Rows [row_begin, row_end) whose position offsets are virtual (RowGeometry::pos_strides of 1 on
// the token dim): runs along the innermost row dim, one lookup per run where the run shares its
// token (the heads of (T, H, D)), one per row otherwise.
template <typename scalar_t, bool kInterleaved, bool kInverse, int64_t kHalf, typename Lookup>
void rotate_rows_virtual(const RotationArgs& args, const TableArgs& tables, Lookup& lookup,
                         int64_t row_begin, int64_t row_end) {
  const auto* in = static_cast<const scalar_t*>(args.in);
  auto* out = static_cast<scalar_t*>(args.out);
  const RowGeometry& g = args.geometry;
  const int32_t inner = g.ndim - 1;
  const int64_t in_step = inner >= 0 ? g.in_strides[inner] : 0;
  const int64_t out_step = inner >= 0 ? g.out_strides[inner] : 0;
  const int64_t pos_step = inner >= 0 ? g.pos_strides[inner] : 0;
  RowCursor cur(g, row_begin);
  for (int64_t row = row_begin; row < row_end;) {
    const int64_t run = std::min(row_end - row, cur.rows_left_in_run());
    const scalar_t* x = in + cur.in();
    scalar_t* y = out + cur.out();
    if (pos_step == 0) {
      const int64_t table_row = lookup(cur.pos());
      for (int64_t i = 0; i < run; ++i, x += in_step, y += out_step) {
        rotate_row<scalar_t, kInterleaved, kInverse, kHalf>(x, y, table_row, args, tables);
      }
    } else {
      int64_t offset = cur.pos();
      for (int64_t i = 0; i < run; ++i, x += in_step, y += out_step, offset += pos_step) {
        rotate_row<scalar_t, kInterleaved, kInverse, kHalf>(x, y, lookup(offset), args, tables);
      }
    }
    row += run;
    cur.skip(run);
  }
}

template <typename scalar_t, bool kInterleaved, bool kInverse, int64_t kHalf, typename pos_t>
void rotate_rows_positioned(const RotationArgs& args, const TableArgs& tables, int64_t row_begin,
                            int64_t row_end) {
  if (tables.axes.num_axes == 0) {
    OneAxisAngles<pos_t> angles(tables);
    return rotate_rows_runs<scalar_t, kInterleaved, kInverse, kHalf, pos_t>(args, angles, row_begin,
                                                                            row_end);
  }
  // Multi-axis: the scratch table has the tables' element type (kHalf != 0 only with float).
  if constexpr (kHalf == 0) {
    if (tables.tables_are_double) {
      MixedRows<double, pos_t> angles(args, tables, kTilePositions);
      return rotate_rows_runs<scalar_t, kInterleaved, kInverse, kHalf, pos_t>(args, angles,
                                                                              row_begin, row_end);
    }
  }
  MixedRows<float, pos_t> angles(args, tables, kTilePositions);
  rotate_rows_runs<scalar_t, kInterleaved, kInverse, kHalf, pos_t>(args, angles, row_begin,
                                                                   row_end);
}

template <typename scalar_t, bool kInterleaved, bool kInverse, int64_t kHalf>
void rotate_rows_typed(const RotationArgs& args, const TableArgs& tables, int64_t row_begin,
                       int64_t row_end) {
  if (args.position_kind == PositionKind::kPacked) {
    PackedLookup lookup(args.packed);
    return rotate_rows_virtual<scalar_t, kInterleaved, kInverse, kHalf>(args, tables, lookup,
                                                                        row_begin, row_end);
  }
  if (args.position_kind == PositionKind::kIndex) {
    IndexLookup lookup;
    return rotate_rows_virtual<scalar_t, kInterleaved, kInverse, kHalf>(args, tables, lookup,
                                                                        row_begin, row_end);
  }
  if (args.positions_are_int64) {
    rotate_rows_positioned<scalar_t, kInterleaved, kInverse, kHalf, int64_t>(args, tables,
                                                                             row_begin, row_end);
  } else {
    rotate_rows_positioned<scalar_t, kInterleaved, kInverse, kHalf, int32_t>(args, tables,
                                                                             row_begin, row_end);
  }
}

template <typename scalar_t, bool kInterleaved, bool kInverse>
void rotate_rows_sized(const RotationArgs& args, const TableArgs& tables, int64_t row_begin,
                       int64_t row_end) {
  // The common rotary dims get their own copies on the vector path: 32, 64, 128 (head_dim 128
  // with partial or full rotation, 64), 80 and 96 (Phi), 256 (Gemma); measured in cache
  // (benchmarks/bench_shapes.py), the general loop cost up to a third more at 80 and 96. Anything
  // else, double storage and double tables take the general one.
  // The portable copy is not specialised: it is the fallback, not the fast path.
  constexpr bool kSpecialise = kHasIntrinsics && !std::is_same_v<scalar_t, double>;
  if constexpr (!kSpecialise) {
    rotate_rows_typed<scalar_t, kInterleaved, kInverse, 0>(args, tables, row_begin, row_end);
  } else {
    switch (tables.tables_are_double ? 0 : args.rotary_dim) {
      case 32:
        return rotate_rows_typed<scalar_t, kInterleaved, kInverse, 16>(args, tables, row_begin,
                                                                       row_end);
      case 64:
        return rotate_rows_typed<scalar_t, kInterleaved, kInverse, 32>(args, tables, row_begin,
                                                                       row_end);
      case 80:
        return rotate_rows_typed<scalar_t, kInterleaved, kInverse, 40>(args, tables, row_begin,
                                                                       row_end);
      case 96:
        return rotate_rows_typed<scalar_t, kInterleaved, kInverse, 48>(args, tables, row_begin,
                                                                       row_end);
      case 128:
        return rotate_rows_typed<scalar_t, kInterleaved, kInverse, 64>(args, tables, row_begin,
                                                                       row_end);
      case 256:
        return rotate_rows_typed<scalar_t, kInterleaved, kInverse, 128>(args, tables, row_begin,
                                                                        row_end);
      default:
        return rotate_rows_typed<scalar_t, kInterleaved, kInverse, 0>(args, tables, row_begin,
                                                                      row_end);
    }
  }
}

template <typename scalar_t>
void rotate_rows_layout(const RotationArgs& args, const TableArgs& tables, RotationMode mode,
                        int64_t row_begin, int64_t row_end) {
  // Both flags are template parameters: the inner loops carry no branch and no sign multiply.
  if (mode.interleaved) {
    if (mode.inverse) {
      rotate_rows_sized<scalar_t, true, true>(args, tables, row_begin, row_end);
    } else {
      rotate_rows_sized<scalar_t, true, false>(args, tables, row_begin, row_end);
    }
  } else {
    if (mode.inverse) {
      rotate_rows_sized<scalar_t, false, true>(args, tables, row_begin, row_end);
    } else {
      rotate_rows_sized<scalar_t, false, false>(args, tables, row_begin, row_end);
    }
  }
}

}  // namespace

void rotate_rows(c10::ScalarType dtype, const RotationArgs& args, const TableArgs& tables,
                 RotationMode mode, int64_t row_begin, int64_t row_end) {
  switch (dtype) {
    case c10::ScalarType::Double:
      return rotate_rows_layout<double>(args, tables, mode, row_begin, row_end);
    case c10::ScalarType::Float:
      return rotate_rows_layout<float>(args, tables, mode, row_begin, row_end);
    case c10::ScalarType::Half:
      return rotate_rows_layout<c10::Half>(args, tables, mode, row_begin, row_end);
    case c10::ScalarType::BFloat16:
      return rotate_rows_layout<c10::BFloat16>(args, tables, mode, row_begin, row_end);
    default:
      // Unreachable: validation admits only these four dtypes.
      TORCH_INTERNAL_ASSERT(false, "rope cpu kernel: unsupported dtype ", dtype);
  }
}

}  // namespace rope::cpu::CPU_CAPABILITY
