// SPDX-License-Identifier: BSD-3-Clause
#include "cases.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <sstream>
#include <vector>

namespace rope_host {
namespace {

using Rng = std::mt19937_64;

bool chance(Rng& rng, double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; }

int64_t uniform(Rng& rng, int64_t lo, int64_t hi) {  // inclusive
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

template <typename T>
T pick(Rng& rng, std::initializer_list<T> options) {
  return *(options.begin() + uniform(rng, 0, static_cast<int64_t>(options.size()) - 1));
}

std::string shape_str(at::IntArrayRef s) {
  std::ostringstream o;
  o << s;
  return o.str();
}

// Element strides for `sizes` in a random memory order, with random padding and offset; the
// buffer holds the view plus a few guard elements. The last dim is innermost and dense in most
// views (the kernel's own case); otherwise common_prepare.cpp copies it first.
//
// For 16-bit storage (`elem_bytes` 2) the offset and paddings are drawn so that the kernel's three
// access widths all come often: rows 16-byte aligned, rows 4-byte but not 16-byte aligned (an even
// offset or padding that is not a multiple of 8 elements: the paired path), and rows only 2-byte
// aligned (an odd one).
struct Layout {
  std::vector<int64_t> strides;
  int64_t offset = 0;
  int64_t buffer_numel = 0;
  std::string desc;
};

Layout random_layout(Rng& rng, const std::vector<int64_t>& sizes, bool allow_expand,
                     int elem_bytes = 0) {
  const bool sixteen_bit = elem_bytes == 2;
  const int n = static_cast<int>(sizes.size());
  Layout l;
  l.strides.assign(n, 0);
  std::ostringstream desc;
  // order[0] is the innermost dim in memory.
  std::vector<int> order(n);
  std::iota(order.rbegin(), order.rend(), 0);
  if (n > 1 && chance(rng, 0.1)) {
    std::shuffle(order.begin(), order.end(), rng);
    desc << "permuted ";
  } else if (n > 2 && chance(rng, 0.3)) {
    std::shuffle(order.begin() + 1, order.end(), rng);
    desc << "rows-permuted ";
  }
  int64_t step = 1;
  if (n > 0 && chance(rng, 0.05)) {
    step = 2;
    desc << "inner-step-2 ";
  }
  int64_t extent = 1;  // elements spanned by the dims placed so far
  for (int i = 0; i < n; ++i) {
    const int d = order[i];
    int64_t pad = 0;
    if (i > 0 && chance(rng, 0.25)) {
      pad = sixteen_bit ? pick<int64_t>(rng, {1, 2, 4, 6, 8, 10, 16})
                        : pick<int64_t>(rng, {1, 2, 3, 5, 8, 16, 24});
      desc << "pad" << pad << "@" << d << " ";
    }
    l.strides[d] = i == 0 ? step : extent + pad;
    extent = l.strides[d] * std::max<int64_t>(sizes[d], 1);
  }
  if (allow_expand && n > 1 && chance(rng, 0.12)) {
    const int d = static_cast<int>(uniform(rng, 0, n - 2));
    if (sizes[d] > 1) {
      l.strides[d] = 0;
      desc << "expanded@" << d << " ";
    }
  }
  const double r = std::uniform_real_distribution<double>(0, 1)(rng);
  if (r < (sixteen_bit ? 0.45 : 0.6)) {
    l.offset = 0;
  } else if (r < (sixteen_bit ? 0.6 : 0.8)) {
    l.offset = 8 * uniform(rng, 1, 3);  // 16-byte aligned for every dtype
  } else if (sixteen_bit && r < 0.85) {
    l.offset = pick<int64_t>(rng, {2, 4, 6, 10, 12, 14, 18});  // 4-byte, not 16-byte aligned
  } else {
    l.offset = uniform(rng, 1, 7);
  }
  if (l.offset != 0) {
    desc << "offset" << l.offset << " ";
  }
  int64_t span = 1;
  for (int d = 0; d < n; ++d) {
    if (sizes[d] == 0) {
      span = 0;
      break;
    }
    span += (sizes[d] - 1) * l.strides[d];
  }
  l.buffer_numel = l.offset + span + uniform(rng, 0, 9);
  l.desc = desc.str().empty() ? "dense" : desc.str();
  if (!l.desc.empty() && l.desc.back() == ' ') {
    l.desc.pop_back();
  }
  return l;
}

at::Tensor random_values(at::Generator& gen, int64_t numel, at::ScalarType dtype) {
  return at::randn({numel}, gen, at::TensorOptions().dtype(at::kDouble)).to(dtype);
}

Viewed random_view(Rng& rng, at::Generator& gen, const std::vector<int64_t>& sizes,
                   at::ScalarType dtype, bool allow_expand) {
  const Layout l =
      random_layout(rng, sizes, allow_expand, static_cast<int>(c10::elementSize(dtype)));
  Viewed v;
  v.buffer = random_values(gen, l.buffer_numel, dtype);
  v.view = v.buffer.as_strided(sizes, l.strides, l.offset);
  v.layout = l.desc;
  return v;
}

// cos or sin: [max_seq_len, half] holding `values`, in one of the layouts a caller may pass.
Viewed table_view(Rng& rng, at::Generator& gen, const at::Tensor& values, at::ScalarType dtype,
                  const std::string& forced) {
  const int64_t rows = values.size(0);
  const int64_t half = values.size(1);
  const std::string kind =
      !forced.empty() ? forced
                      : pick<const char*>(rng, {"dense", "dense", "row-padded", "col-step-2",
                                                "transposed", "offset", "offset-aligned"});
  std::vector<int64_t> strides{half, 1};
  int64_t offset = 0;
  int64_t numel = rows * half;
  if (kind == "row-padded") {
    strides = {half + uniform(rng, 1, 9), 1};
  } else if (kind == "row-padded-2x") {  // the row stride of "col-step-2": the shared-stride defect
    strides = {2 * half, 1};
  } else if (kind == "col-step-2") {
    strides = {2 * half, 2};
  } else if (kind == "transposed") {
    strides = {1, rows};
  } else if (kind == "offset") {
    offset = uniform(rng, 1, 3);  // breaks 8- and 16-byte alignment of table rows
  } else if (kind == "offset-aligned") {
    offset = 4;
  }
  numel = offset + 1 + std::max<int64_t>(rows - 1, 0) * strides[0] +
          std::max<int64_t>(half - 1, 0) * strides[1] + uniform(rng, 0, 5);
  Viewed v;
  v.buffer = random_values(gen, numel, dtype);
  v.view = v.buffer.as_strided({rows, half}, strides, offset);
  v.view.copy_(values);
  v.layout = kind;
  return v;
}

// mrope_section for `half` planes over `num_axes` axes: cut points over [0, half], either anywhere
// (lanes then often straddle a section boundary) or on multiples of 4 or 8 planes (lanes mostly
// within one section, so the kernel's vector table loads apply), sometimes two of them equal or
// at an end (a zero-sized section), or an even split.
std::vector<int64_t> random_sections(Rng& rng, int64_t half, int64_t num_axes, std::string& desc) {
  std::vector<int64_t> cuts;
  const double r = std::uniform_real_distribution<double>(0, 1)(rng);
  if (r < 0.2) {
    desc = "even";
    for (int64_t a = 1; a < num_axes; ++a) {
      cuts.push_back(half * a / num_axes);
    }
  } else if (r < 0.55) {
    const int64_t g = pick<int64_t>(rng, {4, 8});
    desc = "multiples of " + std::to_string(g);
    for (int64_t a = 1; a < num_axes; ++a) {
      cuts.push_back(std::min(half, g * uniform(rng, 0, half / g + 1)));
    }
  } else {
    desc = "random";
    for (int64_t a = 1; a < num_axes; ++a) {
      cuts.push_back(uniform(rng, 0, half));
    }
  }
  if (num_axes > 1 && chance(rng, 0.25)) {
    // A zero-sized section: a cut on its neighbour or on an end.
    const auto i = static_cast<size_t>(uniform(rng, 0, num_axes - 2));
    cuts[i] = chance(rng, 0.5) ? (chance(rng, 0.5) ? 0 : half) : cuts[(i + 1) % cuts.size()];
    desc += ", a zero-sized section";
  }
  std::sort(cuts.begin(), cuts.end());
  std::vector<int64_t> sections;
  int64_t prev = 0;
  for (const int64_t c : cuts) {
    sections.push_back(c - prev);
    prev = c;
  }
  sections.push_back(half - prev);
  return sections;
}

int64_t numel_of(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (const int64_t v : s) {
    n *= v;
  }
  return n;
}

}  // namespace

const char* op_name(Op op) {
  switch (op) {
    case Op::kApply:
      return "apply";
    case Op::kApplyInPlace:
      return "apply_";
    case Op::kApplyOut:
      return "apply.out";
    case Op::kApplyQK:
      return "apply_qk";
  }
  return "?";
}

Case make_case(uint64_t seed, int64_t index) {
  Rng rng(seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(index));
  at::Generator gen = at::detail::createCPUGenerator(seed ^ (static_cast<uint64_t>(index) << 20));
  Case c;
  c.seed = seed;
  c.index = index;
  const double op_r = std::uniform_real_distribution<double>(0, 1)(rng);
  c.op = op_r < 0.35   ? Op::kApply
         : op_r < 0.6  ? Op::kApplyInPlace
         : op_r < 0.72 ? Op::kApplyOut
                       : Op::kApplyQK;
  c.dtype = pick(rng, {at::kDouble, at::kFloat, at::kHalf, at::kBFloat16});
  c.table_dtype = chance(rng, 0.8) ? at::kFloat : at::kDouble;
  c.interleaved = chance(rng, 0.5);
  c.inverse = chance(rng, 0.5);

  // head_dim and rotary_dim: the shapes models use, and odd ones that break alignment.
  // (36, 52 and 100: even but not a multiple of 8, so 16-bit rows are 4-byte aligned only.)
  c.head_dim = chance(rng, 0.5) ? pick<int64_t>(rng, {8, 16, 24, 32, 36, 48, 52, 64, 80, 96, 100,
                                                      112, 120, 128, 136, 160})
                                : uniform(rng, 1, 72);
  const double rot_r = std::uniform_real_distribution<double>(0, 1)(rng);
  const int64_t even_max = c.head_dim - c.head_dim % 2;
  if (rot_r < 0.5) {
    c.rotary_dim = even_max;
  } else if (rot_r < 0.62 && even_max >= 32) {
    c.rotary_dim = 32 * uniform(rng, 1, even_max / 32);
  } else if (rot_r < 0.66) {
    c.rotary_dim = 0;
  } else {
    c.rotary_dim = 2 * uniform(rng, 0, even_max / 2);
  }
  // Multi-axis positions (M-RoPE) in a share of the cases, drawn from a generator of their own
  // so that the one-axis cases stay what they were: 1 to kMaxAxes axes in contiguous sections,
  // or the interleaved layout of Qwen3-VL (3 axes). More often than one-axis ones they get a
  // position out of range, then often with rotary_dim 0: rows without a rotating lane must
  // range-check every axis too.
  Rng axis_rng(seed * 0xd1b54a32d192ed03ull + static_cast<uint64_t>(index) * 0x2545f4914f6cdd1dull +
               1);
  const bool multi_axis = chance(axis_rng, 0.3);
  const bool multi_axis_bad = multi_axis && chance(axis_rng, 0.1);
  if (multi_axis && chance(axis_rng, multi_axis_bad ? 0.3 : 0.05)) {
    c.rotary_dim = 0;
  }
  const int64_t half = c.rotary_dim / 2;

  // Row dims (x.shape[:-1]), at most a few hundred rows.
  const int rank = static_cast<int>(uniform(rng, 0, 4));
  std::vector<int64_t> rows(rank);
  for (int d = 0; d < rank; ++d) {
    rows[d] = chance(rng, 0.15) ? uniform(rng, 6, 40) : uniform(rng, 1, 5);
  }
  while (numel_of(rows) > 384 || numel_of(rows) * c.head_dim > 24000) {
    auto it = std::max_element(rows.begin(), rows.end());
    *it = std::max<int64_t>(1, *it / 2);
  }
  if (rank > 0 && chance(rng, 0.02)) {
    rows[uniform(rng, 0, rank - 1)] = 0;  // an empty input
  }

  // Positions: broadcastable to the rows (trailing alignment), each kept dim full or 1.
  const int pos_rank = static_cast<int>(uniform(rng, 0, rank));
  std::vector<int64_t> pos_sizes(pos_rank);
  for (int i = 0; i < pos_rank; ++i) {
    const int d = rank - pos_rank + i;
    pos_sizes[i] = chance(rng, 0.55) ? rows[d] : 1;
  }
  const int64_t max_seq_len = uniform(rng, 1, 48);

  // apply_qk: k differs from q in one "heads" dim along which positions broadcast (GQA).
  std::vector<int64_t> k_rows = rows;
  int heads_dim = -1;
  if (c.op == Op::kApplyQK) {
    std::vector<int> candidates;
    for (int d = 0; d < rank; ++d) {
      const int pd = d - (rank - pos_rank);
      if (pd < 0 || pos_sizes[pd] == 1) {
        candidates.push_back(d);
      }
    }
    if (!candidates.empty()) {
      heads_dim = candidates[uniform(rng, 0, static_cast<int64_t>(candidates.size()) - 1)];
      k_rows[heads_dim] = uniform(rng, 1, std::max<int64_t>(rows[heads_dim], 1) + 2);
    }
  }

  std::vector<int64_t> x_sizes = rows;
  x_sizes.push_back(c.head_dim);
  std::vector<int64_t> k_sizes = k_rows;
  k_sizes.push_back(c.head_dim);
  const bool may_expand = c.op != Op::kApplyInPlace;  // apply_ rejects overlapping x
  if (c.op == Op::kApplyQK && heads_dim >= 0 && chance(rng, 0.4)) {
    // q and k sliced out of one fused projection [..., Hq + 2 Hk, ..., head_dim].
    std::vector<int64_t> qkv = x_sizes;
    qkv[heads_dim] = rows[heads_dim] + 2 * k_rows[heads_dim];
    Viewed all = random_view(rng, gen, qkv, c.dtype, false);
    c.x = {all.view.narrow(heads_dim, 0, rows[heads_dim]), all.buffer, "qkv[q] " + all.layout};
    c.k = {all.view.narrow(heads_dim, rows[heads_dim], k_rows[heads_dim]), all.buffer,
           "qkv[k] " + all.layout};
    c.fused_qk = true;
  } else {
    c.x = random_view(rng, gen, x_sizes, c.dtype, may_expand);
    if (c.op == Op::kApplyQK) {
      c.k = random_view(rng, gen, k_sizes, c.dtype, may_expand);
    }
    if (c.op == Op::kApplyOut) {
      // A buffer of its own (out= refuses overlap with inputs), never expanded (not writable).
      c.out = random_view(rng, gen, x_sizes, c.dtype, false);
    }
  }

  if (multi_axis) {
    c.mrope_interleaved = chance(axis_rng, 0.3);
    const int64_t axes = c.mrope_interleaved ? 3 : uniform(axis_rng, 1, rope::kMaxAxes);
    c.mrope_section = random_sections(axis_rng, half, axes, c.sections_layout);
  }
  const int64_t num_axes = c.num_axes();

  // Positions: int32 or int64, any strides (expanded too), values in [0, max_seq_len). Multi-axis
  // ones have the axis dim last, in any layout too; sometimes built as (A, ...) and moved to
  // (..., A), as a caller holding one tensor per axis would (the axis stride is then the largest).
  const at::ScalarType pos_dtype = chance(rng, 0.5) ? at::kLong : at::kInt;
  {
    std::vector<int64_t> sizes = pos_sizes;
    const bool axes_first = num_axes > 0 && chance(axis_rng, 0.3);
    if (axes_first) {
      sizes.insert(sizes.begin(), num_axes);
    } else if (num_axes > 0) {
      sizes.push_back(num_axes);
    }
    const Layout l = random_layout(rng, sizes, true);
    c.positions.buffer =
        at::randint(0, max_seq_len, {l.buffer_numel}, gen, at::TensorOptions().dtype(pos_dtype));
    c.positions.view = c.positions.buffer.as_strided(sizes, l.strides, l.offset);
    c.positions.layout = l.desc;
    if (axes_first) {
      c.positions.view = c.positions.view.movedim(0, -1);
      c.positions.layout = "axes-first moved last, " + l.desc;
    }
  }
  // (More often with multi-axis positions, whose range check covers every axis.)
  const bool out_of_range = chance(rng, 0.06) || multi_axis_bad;
  if (out_of_range && c.positions.view.numel() > 0 &&
      (c.op == Op::kApplyQK ? c.x.view.numel() > 0 || c.k.view.numel() > 0
                            : c.x.view.numel() > 0)) {
    // One position outside the tables: the kernel must assert (and write nothing for it).
    // int64 positions also past 32 bits, where a position narrowed to 32 bits before the range
    // check would wrap: 2^31 turns negative, 2^32 + p and -2^32 + p into p, in range.
    const int64_t p = max_seq_len / 2;
    const int64_t bad = pos_dtype == at::kLong && chance(rng, 0.6)
                            ? pick<int64_t>(rng, {int64_t{1} << 31, (int64_t{1} << 32) + p,
                                                  -(int64_t{1} << 32) + p, (int64_t{1} << 40) + p})
                            : pick<int64_t>(rng, {max_seq_len, max_seq_len + 7, -1, -1000});
    c.bad_position = bad;
    const int64_t flat = uniform(rng, 0, c.positions.view.numel() - 1);
    at::Tensor element = c.positions.view;
    int64_t rest = flat;
    for (int i = static_cast<int>(pos_sizes.size()) - 1; i >= 0; --i) {
      element = element.select(i, rest % pos_sizes[i]);
      rest /= pos_sizes[i];
    }
    if (num_axes > 0) {
      // Mostly on an axis other than 0, which a range check of axis 0 alone would miss.
      c.bad_axis = num_axes > 1 && chance(axis_rng, 0.75) ? uniform(axis_rng, 1, num_axes - 1) : 0;
      element = element.select(0, c.bad_axis);
    }
    element.fill_(bad);
    c.positions_in_range = false;
  }

  // Tables from random angles, each of cos and sin in its own layout.
  const at::Tensor angles =
      (at::rand({max_seq_len, half}, gen, at::TensorOptions().dtype(at::kDouble)) - 0.5) * 6.3;
  std::string cos_layout;
  std::string sin_layout;
  if (chance(rng, 0.08)) {
    // The table-stride defect: equal row strides, only one of them with a unit last stride.
    cos_layout = "row-padded-2x";
    sin_layout = "col-step-2";
    if (chance(rng, 0.5)) {
      std::swap(cos_layout, sin_layout);
    }
  }
  if (cos_layout.empty() && chance(rng, 0.12)) {
    // One cache holding both, [max_seq_len, cos | sin | pad] (vLLM's cos_sin_cache): equal row
    // strides and unit last strides, so the kernel reads them in place, at any row alignment.
    const int64_t pad = pick<int64_t>(rng, {0, 0, 1, 2, 3, 4, 8});
    const int64_t width = 2 * half + pad;
    const int64_t numel = max_seq_len * width + uniform(rng, 0, 5);
    at::Tensor buffer = random_values(gen, numel, c.table_dtype);
    at::Tensor both = buffer.as_strided({max_seq_len, 2 * half}, {width, 1}, 0);
    both.narrow(1, 0, half).copy_(angles.cos());
    both.narrow(1, half, half).copy_(angles.sin());
    const std::string layout = "fused-cos-sin pad" + std::to_string(pad);
    c.cos = {both.narrow(1, 0, half), buffer, layout};
    c.sin = {both.narrow(1, half, half), buffer, layout};
  } else {
    c.cos = table_view(rng, gen, angles.cos().to(c.table_dtype), c.table_dtype, cos_layout);
    c.sin = table_view(rng, gen, angles.sin().to(c.table_dtype), c.table_dtype, sin_layout);
  }

  // The simulated GPU: few SMs often, so that small inputs still fill a wave and threads take
  // several rows; ordinals past the occupancy cache's 64 sometimes.
  c.device.ordinal = static_cast<int>(uniform(rng, 0, 67));
  c.device.num_sms = chance(rng, 0.5) ? static_cast<int>(uniform(rng, 1, 4))
                                      : static_cast<int>(uniform(rng, 1, 132));
  return c;
}

std::string Case::describe() const {
  std::ostringstream o;
  o << "case " << index << " (seed " << seed << "): " << op_name(op) << " " << dtype << " tables "
    << table_dtype << (interleaved ? " interleaved" : " half-split") << (inverse ? " inverse" : "")
    << ", head_dim " << head_dim << ", rotary_dim " << rotary_dim << "\n  x"
    << (op == Op::kApplyQK ? " (q)" : "") << " " << shape_str(x.view.sizes()) << " strides "
    << shape_str(x.view.strides()) << " offset " << x.view.storage_offset() << " [" << x.layout
    << "]";
  if (op == Op::kApplyQK) {
    o << "\n  k " << shape_str(k.view.sizes()) << " strides " << shape_str(k.view.strides())
      << " offset " << k.view.storage_offset() << " [" << k.layout << "]"
      << (fused_qk ? " (fused with q)" : "");
  }
  if (op == Op::kApplyOut) {
    o << "\n  out " << shape_str(out.view.sizes()) << " strides " << shape_str(out.view.strides())
      << " offset " << out.view.storage_offset() << " [" << out.layout << "]";
  }
  o << "\n  positions " << positions.view.scalar_type() << " " << shape_str(positions.view.sizes())
    << " strides " << shape_str(positions.view.strides()) << " [" << positions.layout << "]"
    << (positions_in_range ? "" : " ONE OUT OF RANGE: " + std::to_string(bad_position))
    << (positions_in_range || mrope_section.empty() ? "" : " on axis " + std::to_string(bad_axis));
  if (!mrope_section.empty()) {
    o << "\n  mrope_section " << shape_str(mrope_section)
      << (mrope_interleaved ? " interleaved (Qwen3-VL)" : " contiguous") << " [" << sections_layout
      << "]";
  }
  o << "\n  cos " << shape_str(cos.view.sizes()) << " strides " << shape_str(cos.view.strides())
    << " [" << cos.layout << "], sin strides " << shape_str(sin.view.strides()) << " ["
    << sin.layout << "]\n  device: ordinal " << device.ordinal << ", " << device.num_sms << " SMs";
  return o.str();
}

}  // namespace rope_host
