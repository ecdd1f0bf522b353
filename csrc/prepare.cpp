#include "prepare.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

namespace rope::detail {

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

PreparedTables prepare_tables(const at::Tensor& cos, const at::Tensor& sin) {
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
  return t;
}

namespace {
bool last_dim_contiguous(const at::Tensor& t) { return t.stride(-1) == 1 || t.size(-1) == 1; }
}  // namespace

PreparedRotation prepare_rotation(const at::Tensor& x, const at::Tensor& positions,
                                  int64_t rotary_dim, Destination destination,
                                  const at::Tensor& out) {
  PreparedRotation p;
  p.input = last_dim_contiguous(x) ? x : x.contiguous();
  const auto fresh_output = [&] {
    return at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  };
  switch (destination) {
    case Destination::kNewTensor:
      p.output = fresh_output();
      break;
    case Destination::kInPlace:
      p.output = p.input;
      if (!p.input.is_same(x)) {
        p.write_back_to = x;
      }
      break;
    case Destination::kOut:
      if (last_dim_contiguous(out)) {
        p.output = out;
      } else {
        p.output = fresh_output();
        p.write_back_to = out;
      }
      break;
  }
  const auto row_shape = x.sizes().slice(0, x.dim() - 1);
  p.positions = positions.expand(row_shape);
  const auto batch_strides = [&](const at::Tensor& t) { return t.strides().slice(0, x.dim() - 1); };
  RowGeometry geometry;
  if (!build_row_geometry(row_shape, batch_strides(p.input), batch_strides(p.output),
                          p.positions.strides(), geometry)) {
    // More than kMaxRowDims dims that no stride pattern merges (rare: e.g. a 9-D permuted x, or
    // positions broadcast in alternating dims). Copy x, the broadcast positions and, where it is
    // the caller's, the output into contiguous tensors, which always merge into one row dim.
    p.input = x.contiguous();
    p.positions = p.positions.contiguous();
    if (destination == Destination::kInPlace) {
      p.output = p.input;
      p.write_back_to = p.input.is_same(x) ? at::Tensor() : x;
    } else if (destination == Destination::kOut && !p.output.is_contiguous()) {
      p.output = fresh_output();
      p.write_back_to = out;
    }
    geometry = make_row_geometry(row_shape, batch_strides(p.input), batch_strides(p.output),
                                 p.positions.strides());
  }

  auto& a = p.args;
  a.in = p.input.const_data_ptr();
  a.out = p.output.data_ptr();
  a.positions = p.positions.const_data_ptr();
  a.positions_are_int64 = positions.scalar_type() == at::kLong;
  a.head_dim = x.size(-1);
  a.rotary_dim = rotary_dim;
  // In place, the tail features already hold their values; everywhere else they are copied.
  a.copy_tail = destination != Destination::kInPlace;
  a.geometry = geometry;
  return p;
}

void PreparedRotation::write_back() {
  if (write_back_to.defined()) {
    write_back_to.copy_(output);
  }
}

}  // namespace rope::detail
