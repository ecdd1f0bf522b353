// SPDX-License-Identifier: BSD-3-Clause
#include "common_prepare.h"

#include <ATen/EmptyTensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>

#include <cstdint>

#include "cpu/common_fresh_output.h"

namespace rope::detail {
namespace {

// A fresh, contiguous tensor of x's shape and dtype. On the CPU it is allocated without a second
// trip through the dispatcher (we are already inside the op's CPU kernel, and the kernel writes
// every element, so at::empty's deterministic-fill mode has nothing to do), large ones with pages
// of their own (cpu/common_fresh_output.h).
at::Tensor new_output(const at::Tensor& x) {
  if (x.device().is_cpu()) {
    return empty_cpu_output(x.sizes(), x.scalar_type());
  }
  return at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
}

// positions' strides as if expanded to `row_shape` (NumPy broadcasting, aligned right): 0 along
// every broadcast dim. The same numbers positions.expand(row_shape).strides() gives, without
// creating the view (a TensorImpl per call, which costs more than a decode-sized rotation).
// check_rotated_input has already checked that positions broadcasts. `pos_dims` is the number of
// positions' dims that broadcast: all of them, or all but the trailing axis dim (multi-axis).
void broadcast_strides(const at::Tensor& positions, int64_t pos_dims, at::IntArrayRef row_shape,
                       c10::SmallVector<int64_t, kMaxRowDims>& strides) {
  const int64_t n = static_cast<int64_t>(row_shape.size());
  const int64_t lead = n - pos_dims;
  strides.resize(n);
  for (int64_t d = 0; d < n; ++d) {
    const int64_t pd = d - lead;
    strides[d] = (pd >= 0 && positions.size(pd) != 1) ? positions.stride(pd) : 0;
  }
}

}  // namespace

bool build_row_geometry(at::IntArrayRef sizes, at::IntArrayRef in_strides,
                        at::IntArrayRef out_strides, at::IntArrayRef pos_strides, RowGeometry& g) {
  g = RowGeometry{};
  int64_t num_rows = 1;
  for (const int64_t s : sizes) {
    num_rows *= s;
  }
  g.num_rows = num_rows;
  if (num_rows == 0) {
    return true;
  }
  // Walk from the outermost dim inwards. A dim merges into the previous kept one when, for every
  // tensor, stepping the outer dim once equals stepping the inner dim size times.
  int32_t n = 0;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 1) {
      continue;  // contributes nothing to addressing
    }
    if (n > 0) {
      const int32_t p = n - 1;
      const bool mergeable = in_strides[d] * sizes[d] == g.in_strides[p] &&
                             out_strides[d] * sizes[d] == g.out_strides[p] &&
                             pos_strides[d] * sizes[d] == g.pos_strides[p];
      if (mergeable) {
        g.row_sizes[p] *= sizes[d];
        g.in_strides[p] = in_strides[d];
        g.out_strides[p] = out_strides[d];
        g.pos_strides[p] = pos_strides[d];
        continue;
      }
    }
    if (n == kMaxRowDims) {
      return false;
    }
    g.row_sizes[n] = sizes[d];
    g.in_strides[n] = in_strides[d];
    g.out_strides[n] = out_strides[d];
    g.pos_strides[n] = pos_strides[d];
    ++n;
  }
  g.ndim = n;
  return true;
}

RowGeometry make_row_geometry(at::IntArrayRef sizes, at::IntArrayRef in_strides,
                              at::IntArrayRef out_strides, at::IntArrayRef pos_strides) {
  RowGeometry g;
  TORCH_CHECK(build_row_geometry(sizes, in_strides, out_strides, pos_strides, g),
              "rope: more than ", kMaxRowDims, " non-mergeable row dims in shape ", sizes);
  return g;
}

PreparedTables prepare_tables(const at::Tensor& cos, const at::Tensor& sin,
                              const MultiAxisArgs& axes) {
  PreparedTables t;
  // The kernels index both tables with one row stride, so the tables are read in place only
  // when both have unit last stride (a size-1 last dim is never stepped) and the same row
  // stride; otherwise both are copied, which gives both the row stride cos.size(1). Copying only
  // the odd one out would leave the two with different row strides.
  const auto unit_last_stride = [](const at::Tensor& t) {
    return t.size(1) <= 1 || t.stride(1) == 1;
  };
  const bool single_row = cos.size(0) <= 1;  // never stepped: any row stride will do
  const bool keep = unit_last_stride(cos) && unit_last_stride(sin) &&
                    (single_row || cos.stride(0) == sin.stride(0));
  t.cos = keep ? cos : cos.contiguous();
  t.sin = keep ? sin : sin.contiguous();
  t.args.cos = t.cos.const_data_ptr();
  t.args.sin = t.sin.const_data_ptr();
  t.args.tables_are_double = cos.scalar_type() == at::kDouble;
  t.args.max_seq_len = cos.size(0);
  t.args.table_stride = single_row ? cos.size(1) : t.cos.stride(0);
  t.args.axes = axis_map(axes);
  return t;
}

namespace {
bool last_dim_contiguous(const at::Tensor& t) { return t.stride(-1) == 1 || t.size(-1) == 1; }
}  // namespace

PreparedRotation prepare_rotation(const at::Tensor& x, const at::Tensor& positions,
                                  int64_t rotary_dim, Destination destination,
                                  const at::Tensor& out, const MultiAxisArgs& axes) {
  PreparedRotation p;
  const bool x_last_dim_contiguous = last_dim_contiguous(x);
  p.input = x_last_dim_contiguous ? c10::MaybeOwned<at::Tensor>::borrowed(x)
                                  : c10::MaybeOwned<at::Tensor>::owned(x.contiguous());
  switch (destination) {
    case Destination::kNewTensor:
      p.output = new_output(x);
      break;
    case Destination::kInPlace:
      p.output = *p.input;
      if (!x_last_dim_contiguous) {
        p.write_back_to = x;
      }
      break;
    case Destination::kOut:
      if (last_dim_contiguous(out)) {
        p.output = out;
      } else {
        p.output = new_output(x);
        p.write_back_to = out;
      }
      break;
  }
  p.positions = c10::MaybeOwned<at::Tensor>::borrowed(positions);
  const auto row_shape = x.sizes().slice(0, x.dim() - 1);
  const bool multi_axis = axes.active();
  const int64_t pos_dims = positions.dim() - (multi_axis ? 1 : 0);
  c10::SmallVector<int64_t, kMaxRowDims> pos_strides;
  broadcast_strides(positions, pos_dims, row_shape, pos_strides);
  int64_t axis_stride = multi_axis && positions.size(-1) > 1 ? positions.stride(-1) : 0;
  const auto batch_strides = [&](const at::Tensor& t) { return t.strides().slice(0, x.dim() - 1); };
  RowGeometry geometry;
  if (!build_row_geometry(row_shape, batch_strides(*p.input), batch_strides(p.output), pos_strides,
                          geometry)) {
    // More than kMaxRowDims dims that no stride pattern merges (rare: e.g. a 9-D permuted x, or
    // positions broadcast in alternating dims). Copy x, the broadcast positions and, where it is
    // the caller's, the output into contiguous tensors, which always merge into one row dim.
    p.input = c10::MaybeOwned<at::Tensor>::owned(x.contiguous());
    c10::SmallVector<int64_t, kMaxRowDims + 1> expanded(row_shape.begin(), row_shape.end());
    if (multi_axis) {
      expanded.push_back(positions.size(-1));  // the axis dim stays innermost, stride 1
      axis_stride = 1;
    }
    p.positions = c10::MaybeOwned<at::Tensor>::owned(positions.expand(expanded).contiguous());
    if (destination == Destination::kInPlace) {
      p.output = *p.input;
      p.write_back_to = p.input->is_same(x) ? at::Tensor() : x;
    } else if (destination == Destination::kOut && !p.output.is_contiguous()) {
      p.output = new_output(x);
      p.write_back_to = out;
    }
    geometry = make_row_geometry(row_shape, batch_strides(*p.input), batch_strides(p.output),
                                 p.positions->strides().slice(0, row_shape.size()));
  }

  auto& a = p.args;
  a.in = p.input->const_data_ptr();
  a.out = p.output.data_ptr();
  a.positions = p.positions->const_data_ptr();
  a.positions_are_int64 = positions.scalar_type() == at::kLong;
  a.head_dim = x.size(-1);
  a.rotary_dim = rotary_dim;
  // In place, the tail features already hold their values; everywhere else they are copied.
  a.copy_tail = destination != Destination::kInPlace;
  a.geometry = geometry;
  a.axis_stride = axis_stride;
  return p;
}

PreparedFrequencies prepare_frequencies(const at::Tensor& freqs, double attention_factor,
                                        const MultiAxisArgs& axes) {
  PreparedFrequencies f;
  f.args.use_frequencies = true;
  f.args.frequencies.freqs = freqs.const_data_ptr<double>();
  f.args.frequencies.freq_stride = freqs.size(0) > 1 ? freqs.stride(0) : 1;
  f.args.frequencies.attention_factor = attention_factor;
  const float hi = static_cast<float>(attention_factor);
  f.args.frequencies.af_hi = hi;
  f.args.frequencies.af_lo = static_cast<float>(attention_factor - static_cast<double>(hi));
  f.args.axes = axis_map(axes);
  return f;
}

PreparedRotation prepare_packed_rotation(const at::Tensor& x, const PackedArgs& packed,
                                         int64_t rotary_dim, Destination destination,
                                         const at::Tensor& out) {
  PreparedRotation p;
  const bool x_last_dim_contiguous = last_dim_contiguous(x);
  p.input = x_last_dim_contiguous ? c10::MaybeOwned<at::Tensor>::borrowed(x)
                                  : c10::MaybeOwned<at::Tensor>::owned(x.contiguous());
  switch (destination) {
    case Destination::kNewTensor:
      p.output = new_output(x);
      break;
    case Destination::kInPlace:
      p.output = *p.input;
      if (!x_last_dim_contiguous) {
        p.write_back_to = x;
      }
      break;
    case Destination::kOut:
      if (last_dim_contiguous(out)) {
        p.output = out;
      } else {
        p.output = new_output(x);
        p.write_back_to = out;
      }
      break;
  }
  const auto row_shape = x.sizes().slice(0, x.dim() - 1);
  // Virtual position offsets: a row's offset is its token's index along dim 0.
  c10::SmallVector<int64_t, kMaxRowDims> pos_strides(row_shape.size(), 0);
  pos_strides[0] = 1;
  const auto batch_strides = [&](const at::Tensor& t) { return t.strides().slice(0, x.dim() - 1); };
  RowGeometry geometry;
  if (!build_row_geometry(row_shape, batch_strides(*p.input), batch_strides(p.output), pos_strides,
                          geometry)) {
    // More than kMaxRowDims dims that do not merge: contiguous copies, whose dims after the token
    // dim always merge into one.
    p.input = c10::MaybeOwned<at::Tensor>::owned(x.contiguous());
    if (destination == Destination::kInPlace) {
      p.output = *p.input;
      p.write_back_to = p.input->is_same(x) ? at::Tensor() : x;
    } else if (destination == Destination::kOut && !p.output.is_contiguous()) {
      p.output = new_output(x);
      p.write_back_to = out;
    }
    geometry =
        make_row_geometry(row_shape, batch_strides(*p.input), batch_strides(p.output), pos_strides);
  }
  p.positions = c10::MaybeOwned<at::Tensor>::owned(at::Tensor());
  p.cu_seqlens = packed.cu_seqlens.contiguous();
  if (packed.seq_offsets.defined()) {
    p.seq_offsets = packed.seq_offsets.contiguous();
  }

  auto& a = p.args;
  a.in = p.input->const_data_ptr();
  a.out = p.output.data_ptr();
  a.positions = nullptr;
  a.head_dim = x.size(-1);
  a.rotary_dim = rotary_dim;
  a.copy_tail = destination != Destination::kInPlace;
  a.geometry = geometry;
  a.position_kind = PositionKind::kPacked;
  a.packed.cu_seqlens = p.cu_seqlens.const_data_ptr();
  a.packed.cu_seqlens_are_int64 = p.cu_seqlens.scalar_type() == at::kLong;
  a.packed.seq_offsets = p.seq_offsets.defined() ? p.seq_offsets.const_data_ptr() : nullptr;
  a.packed.seq_offsets_are_int64 =
      !p.seq_offsets.defined() || p.seq_offsets.scalar_type() == at::kLong;
  a.packed.num_seqs = p.cu_seqlens.size(0) - 1;
  a.packed.num_tokens = x.size(0);
  a.packed.cp_size = packed.cp_size;
  a.packed.cp_rank = packed.cp_rank;
  return p;
}

void PreparedRotation::write_back() {
  if (write_back_to.defined()) {
    write_back_to.copy_(output);
  }
}

}  // namespace rope::detail
