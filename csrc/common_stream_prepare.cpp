// SPDX-License-Identifier: BSD-3-Clause
#include "common_stream_prepare.h"

#include <ATen/ops/empty.h>
#include <c10/core/SymBool.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cpu/common_fresh_output.h"

namespace rope::detail {
namespace {

// Whether a and b are disjoint column slices of one buffer: the same storage, sizes and strides
// but for the last dim (unit stride), their feature runs [0, wa) and [delta, delta + wb) apart,
// and the rows of the buffer they slice (the union run, width W) not overlapping each other (each
// outer stride, in increasing order, past what the dims inside it span). FlashInfer's split GQA
// rows write the rotated part and the rest of one cache row as two such slices.
bool disjoint_column_slices(const at::Tensor& a, const at::Tensor& b) {
  if (!a.has_storage() || !b.has_storage() || !a.storage().is_alias_of(b.storage()) ||
      a.dim() != b.dim() || a.dim() == 0 || a.element_size() != b.element_size()) {
    return false;
  }
  const int64_t last = a.dim() - 1;
  if ((a.size(last) > 1 && a.stride(last) != 1) || (b.size(last) > 1 && b.stride(last) != 1)) {
    return false;
  }
  for (int64_t d = 0; d < last; ++d) {
    if (a.size(d) != b.size(d) || (a.size(d) > 1 && a.stride(d) != b.stride(d))) {
      return false;
    }
  }
  const int64_t delta = b.storage_offset() - a.storage_offset();
  const int64_t wa = a.size(last);
  const int64_t wb = b.size(last);
  if (delta < wa && -delta < wb) {
    return false;  // the runs meet
  }
  const int64_t width = std::max(wa, delta + wb) - std::min<int64_t>(0, delta);
  std::vector<std::pair<int64_t, int64_t>> dims;  // (|stride|, size) of the outer dims
  for (int64_t d = 0; d < last; ++d) {
    if (a.size(d) > 1) {
      dims.emplace_back(std::abs(a.stride(d)), a.size(d));
    }
  }
  std::sort(dims.begin(), dims.end());
  int64_t span = width;
  for (const auto& [stride, size] : dims) {
    if (stride < span) {
      return false;
    }
    span += stride * (size - 1);
  }
  return true;
}

}  // namespace

bool is_fp8(at::ScalarType t) { return t == at::kFloat8_e4m3fn || t == at::kFloat8_e5m2; }

CacheFormat format_of_dtype(at::ScalarType t) {
  return t == at::kFloat8_e4m3fn ? CacheFormat::kFp8E4M3
         : t == at::kFloat8_e5m2 ? CacheFormat::kFp8E5M2
                                 : CacheFormat::kSame;
}

void check_row_tensor(const char* op, const char* name, const at::Tensor& t, const char* like_name,
                      const at::Tensor& like) {
  TORCH_CHECK(t.defined(), op, ": ", name, " must be a tensor, got None");
  TORCH_CHECK(t.device() == like.device(), op, ": ", name, " must be on ", like_name, "'s device ",
              like.device(), ", got ", t.device());
  TORCH_CHECK(t.scalar_type() == like.scalar_type(), op, ": ", name, " must have ", like_name,
              "'s dtype ", like.scalar_type(), ", got ", t.scalar_type());
  TORCH_CHECK(t.dim() == 3, op, ": ", name,
              " must be 3-D (num_tokens, num_heads, width), got shape ", t.sym_sizes());
  TORCH_SYM_CHECK(t.sym_size(0).sym_eq(like.sym_size(0)), op, ": ", name,
                  ".size(0) (tokens) must equal ", like_name, ".size(0) = ", like.sym_size(0),
                  ", got ", name, " of shape ", t.sym_sizes());
}

void check_scale_tensor(const char* op, const char* name, const std::optional<at::Tensor>& scale,
                        const at::Device& device) {
  if (!scale.has_value() || !scale->defined()) {
    return;
  }
  TORCH_CHECK(scale->scalar_type() == at::kFloat, op, ": ", name,
              " must be a float32 tensor (or a Python float), got ", scale->scalar_type());
  TORCH_SYM_CHECK(scale->sym_numel().sym_eq(1), op, ": ", name,
                  " must hold one value (0-d or 1 element), got shape ", scale->sym_sizes());
  TORCH_CHECK(scale->device() == device, op, ": ", name, " must be on ", device, ", got ",
              scale->device());
}

void check_scale_value_on_host(const char* op, const char* name,
                               const std::optional<at::Tensor>& scale, ScaleRule rule) {
  if (!scale.has_value() || !scale->defined() || !scale->device().is_cpu()) {
    return;
  }
  // check_scale_tensor has made it one float32 value. 0, a negative, NaN or inf scale is no
  // quantization: it stores +-max or NaN, flips signs or zeroes everything.
  const float value = *scale->const_data_ptr<float>();
  TORCH_CHECK_VALUE(std::isfinite(value) && value > 0, op, ": ", name,
                    " must be a finite number > 0 (stored = saturate(value ",
                    rule == ScaleRule::kMultiply ? "* " : "/ ", name, ")), got ", value);
}

void check_fp8_output(const char* op, const char* name, const at::Tensor& out, at::ScalarType dtype,
                      const char* like_name, const at::Tensor& like) {
  TORCH_CHECK(out.defined(), op, ": ", name, " must be a tensor, got None");
  TORCH_CHECK(out.device() == like.device(), op, ": ", name, " must be on ", like_name,
              "'s device ", like.device(), ", got ", out.device());
  TORCH_CHECK(out.scalar_type() == dtype, op, ": ", name, " must be ", dtype, ", got ",
              out.scalar_type());
  TORCH_CHECK(out.sym_sizes().equals(like.sym_sizes()), op, ": ", name, " must have ", like_name,
              "'s shape ", like.sym_sizes(), ", got ", out.sym_sizes(), " (out= never resizes)");
  TORCH_SYM_CHECK(out.sym_size(-1).sym_le(1) || out.sym_stride(-1).sym_eq(1), op, ": ", name,
                  " must have a unit last stride (stride(-1) == 1), got strides ",
                  out.sym_strides());
  check_writable_arg(op, name, out);
}

void check_writes_disjoint(const char* op, const NamedTensors& written, const NamedTensors& read) {
  std::vector<Span> spans;
  spans.reserve(written.size());
  for (const auto& [name, t] : written) {
    spans.push_back(span_of(*t));
  }
  for (size_t i = 0; i < written.size(); ++i) {
    for (const auto& [name, t] : read) {
      if (spans[i].meets(span_of(*t))) {
        check_disjoint(op, written[i].first, *written[i].second, name, *t);
      }
    }
    for (size_t j = i + 1; j < written.size(); ++j) {
      if (spans[i].meets(spans[j]) &&
          !disjoint_column_slices(*written[i].second, *written[j].second)) {
        check_disjoint(op, written[i].first, *written[i].second, written[j].first,
                       *written[j].second);
      }
    }
  }
}

int64_t slots_of(const at::Tensor& cache, int64_t row_dims) {
  return cache.dim() == row_dims + 2 ? cache.size(0) * cache.size(1) : cache.size(0);
}

Span span_of(const at::Tensor& t) {
  if (t.is_meta() || !t.has_storage() || t.numel() == 0) {
    return {};
  }
  int64_t lo = 0;
  int64_t hi = 0;
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t reach = (t.size(d) - 1) * t.stride(d);
    (reach < 0 ? lo : hi) += reach;
  }
  const auto item = static_cast<int64_t>(t.element_size());
  const auto base = reinterpret_cast<uintptr_t>(t.const_data_ptr());
  return {base + static_cast<uintptr_t>(lo * item),
          base + static_cast<uintptr_t>(hi * item + item - 1)};
}

PositionStrides position_strides(const at::Tensor& positions, const MultiAxisArgs& axes) {
  PositionStrides s;
  const int64_t n = positions.dim() - (axes.active() ? 1 : 0);  // the dims that broadcast
  auto stride_of = [&](int64_t d) -> int64_t {  // d: 0 = token, 1 = head, aligned right
    const int64_t pd = d - (2 - n);
    return pd >= 0 && positions.size(pd) != 1 ? positions.stride(pd) : 0;
  };
  s.token = stride_of(0);
  s.head = stride_of(1);
  s.axis = axes.active() ? positions.stride(-1) : 0;
  return s;
}

at::Tensor new_stream_output(const at::Tensor& like, c10::SymIntArrayRef sizes,
                             at::ScalarType dtype) {
  if (like.device().is_cpu()) {
    return empty_cpu_output(c10::asIntArrayRefUnchecked(sizes), dtype);
  }
  return at::empty_symint(sizes,
                          like.options().dtype(dtype).memory_format(at::MemoryFormat::Contiguous));
}

c10::MaybeOwned<at::Tensor> with_unit_last_stride(const at::Tensor& x) {
  return x.size(-1) <= 1 || x.stride(-1) == 1 ? c10::MaybeOwned<at::Tensor>::borrowed(x)
                                              : c10::MaybeOwned<at::Tensor>::owned(x.contiguous());
}

RowStream source_stream(const at::Tensor& x, int64_t rotary_dim, const PositionStrides& pos) {
  RowStream s;
  s.src = x.const_data_ptr();
  s.token_stride = x.stride(0);
  const bool heads = x.dim() == 3;  // (T, W): one head
  s.head_stride = heads ? x.stride(1) : 0;
  s.heads = heads ? x.size(1) : 1;
  s.width = x.size(-1);
  s.rotary_dim = rotary_dim;
  s.pos_token_stride = pos.token;
  s.pos_head_stride = s.heads == 1 ? 0 : pos.head;  // a size-1 heads dim broadcasts either way
  return s;
}

namespace {
void set_format(StreamTarget& t, const at::Tensor& target, const std::optional<at::Tensor>& scale,
                ScaleRule rule) {
  t.format = format_of_dtype(target.scalar_type());
  t.rule = rule;
  t.scale = t.format != CacheFormat::kSame && scale.has_value() && scale->defined()
                ? scale->const_data_ptr<float>()
                : nullptr;
}
}  // namespace

StreamTarget tensor_target(const at::Tensor& out, const std::optional<at::Tensor>& scale,
                           ScaleRule rule) {
  StreamTarget t;
  t.data = out.data_ptr();
  set_format(t, out, scale, rule);
  t.by_slot = false;
  t.token_stride = out.stride(0);
  t.head_stride = out.stride(1);
  return t;
}

StreamTarget cache_target(const at::Tensor& cache, int64_t row_dims, int64_t feature_offset,
                          const std::optional<at::Tensor>& scale, ScaleRule rule) {
  StreamTarget t;
  t.data = cache.data_ptr();
  set_format(t, cache, scale, rule);
  t.by_slot = true;
  t.num_slots = slots_of(cache, row_dims);
  if (cache.dim() == row_dims + 2) {
    t.block_size = cache.size(1);
    t.block_stride = cache.stride(0);
    t.offset_stride = cache.stride(1);
  } else {
    t.block_size = 1;
    t.block_stride = cache.stride(0);
    t.offset_stride = 0;
  }
  t.head_stride = row_dims == 2 ? cache.stride(-2) : 0;
  t.feature_offset = feature_offset;
  return t;
}

PositionStrides PreparedStreams::begin(const at::Tensor& cos, const at::Tensor& sin,
                                       const at::Tensor& positions, const MultiAxisArgs& axes,
                                       int64_t num_tokens, bool interleaved,
                                       const at::Tensor& slot_mapping) {
  const PositionStrides pos = position_strides(positions, axes);
  tables = prepare_tables(cos, sin, axes);
  args.num_tokens = num_tokens;
  args.interleaved = interleaved;
  args.positions = positions.const_data_ptr();
  args.positions_are_int64 = positions.scalar_type() == at::kLong;
  args.axis_stride = pos.axis;
  if (slot_mapping.defined()) {
    args.slots = slot_mapping.const_data_ptr<int64_t>();
    args.slot_stride = slot_mapping.stride(0);
  }
  return pos;
}

RowStream& PreparedStreams::add(const at::Tensor& x, int64_t rotary_dim, const PositionStrides& pos,
                                const StreamTarget& target) {
  TORCH_INTERNAL_ASSERT(args.num_streams < kMaxStreams, "row streams: more than ", kMaxStreams);
  sources.push_back(with_unit_last_stride(x));
  RowStream& s = args.streams[args.num_streams++];
  s = source_stream(*sources.back(), rotary_dim, pos);
  s.target = target;
  return s;
}

}  // namespace rope::detail
