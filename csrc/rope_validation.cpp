// SPDX-License-Identifier: BSD-3-Clause
#include "rope_validation.h"

#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>
#include <c10/core/SymBool.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

namespace rope::detail {
namespace {

// Exactly the storage types the kernels implement. isFloatingType() would also admit the float8
// types, which would then fail deep inside a kernel instead of here.
bool is_supported_storage(at::ScalarType t) {
  return t == at::kDouble || t == at::kFloat || t == at::kHalf || t == at::kBFloat16;
}

// An optional-looking argument passed as None reaches C++ as an undefined tensor; say which.
void check_defined(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.defined(), op, ": ", name, " must be a tensor, got None");
}

// Devices first: a call that mixes devices (including "meta" with real tensors, which the
// dispatcher routes to the Meta kernel) must fail here rather than compute on the wrong memory.
void check_same_device(const char* op, const char* a_name, const at::Tensor& a, const char* b_name,
                       const at::Tensor& b) {
  TORCH_CHECK(a.device() == b.device(), op, ": ", a_name, " and ", b_name,
              " must be on the same device, got ", a_name, " on ", a.device(), " and ", b_name,
              " on ", b.device());
}

void check_tables(const char* op, const at::Tensor& cos, const at::Tensor& sin) {
  check_defined(op, "cos", cos);
  check_defined(op, "sin", sin);
  check_same_device(op, "cos", cos, "sin", sin);
  TORCH_CHECK(cos.dim() == 2, op, ": cos must be a 2-D table [max_seq_len, rotary_dim / 2], got ",
              cos.dim(), "-D tensor of shape ", cos.sym_sizes());
  TORCH_CHECK(cos.sym_sizes().equals(sin.sym_sizes()), op,
              ": cos and sin must have the same shape, got cos ", cos.sym_sizes(), " and sin ",
              sin.sym_sizes());
  const auto dtype = cos.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble, op,
              ": cos must be float32 or float64 (half-precision tables lose accuracy at long "
              "context), got ",
              dtype);
  TORCH_CHECK(sin.scalar_type() == dtype, op, ": cos and sin must have the same dtype, got cos ",
              dtype, " and sin ", sin.scalar_type());
}

// mrope_section and mrope_interleaved against the planes of the angle source (`planes`, described
// as `planes_name` in messages): what every multi-axis call needs before positions are looked at.
void check_multi_axis_planes(const char* op, const c10::SymInt& planes, const char* planes_name,
                             const MultiAxisArgs& axes);

void check_multi_axis(const char* op, const at::Tensor& cos, const MultiAxisArgs& axes) {
  check_multi_axis_planes(op, cos.sym_size(1), "rotary_dim / 2 = cos.size(-1)", axes);
}

void check_multi_axis_planes(const char* op, const c10::SymInt& planes_given,
                             const char* planes_name, const MultiAxisArgs& axes) {
  if (!axes.active()) {
    TORCH_CHECK(!axes.interleaved, op,
                ": mrope_interleaved=True needs mrope_section (the planes per axis), got "
                "mrope_section=None");
    return;
  }
  const auto section = *axes.section;
  const auto num_axes = static_cast<int64_t>(section.size());
  TORCH_CHECK(num_axes >= 1 && num_axes <= kMaxAxes, op,
              ": mrope_section must list the planes of 1 to ", kMaxAxes, " axes, got ", num_axes,
              " entries: ", section);
  int64_t planes = 0;
  for (int64_t a = 0; a < num_axes; ++a) {
    TORCH_CHECK(section[a] >= 0, op, ": mrope_section[", a, "] must be >= 0, got ", section[a],
                " in mrope_section=", section);
    planes += section[a];
  }
  TORCH_SYM_CHECK(planes_given.sym_eq(planes), op, ": sum(mrope_section) must equal ", planes_name,
                  " = ", planes_given, ", got sum(", section, ") = ", planes);
  TORCH_CHECK(!axes.interleaved || num_axes == 3, op,
              ": mrope_interleaved=True (Qwen3-VL) needs 3 axes (time, height, width), got "
              "mrope_section=",
              section, " with ", num_axes);
}

// The angle source as check_rotated_input sees it: the tensor x must share a device with, and
// the rotary_dim it gives.
struct AngleShape {
  const char* tensor_name;    // "cos" or "freqs"
  const at::Tensor* tensor;   // cos or freqs
  c10::SymInt rotary_dim;     // 2 * cos.size(1) or 2 * freqs.size(0)
  const char* rotary_source;  // "2 * cos.size(-1)" or "2 * freqs.size(0)"
};

AngleShape angle_shape(const at::Tensor& cos) {
  return {"cos", &cos, 2 * cos.sym_size(1), "2 * cos.size(-1)"};
}

// x (q, k) against its angle source: defined, on the angles' device, a supported dtype, and at
// least rotary_dim features.
void check_rotated_tensor(const char* op, const char* name, const at::Tensor& x,
                          const AngleShape& angles) {
  check_defined(op, name, x);
  check_same_device(op, name, x, angles.tensor_name, *angles.tensor);
  TORCH_CHECK(is_supported_storage(x.scalar_type()), op, ": ", name,
              " must be a floating tensor of dtype float64, float32, float16 or bfloat16, got ",
              x.scalar_type());
  TORCH_CHECK(x.dim() >= 1, op, ": ", name, " must have at least 1 dim (..., head_dim), got a ",
              "0-dim tensor");
  TORCH_SYM_CHECK(x.sym_size(-1).sym_ge(angles.rotary_dim), op, ": ", name,
                  ".size(-1) (head_dim) must be >= rotary_dim = ", angles.rotary_source, " = ",
                  angles.rotary_dim, ", got ", x.sym_size(-1));
}

// positions against x (q, k): integer, on x's device, broadcastable to x.shape[:-1] (with a
// trailing axis dim for multi-axis positions).
void check_positions_for(const char* op, const char* name, const at::Tensor& x,
                         const at::Tensor& positions, const MultiAxisArgs& axes);

// One rotated input (x, q or k); `name` is the argument's name in the op's schema.
void check_rotated_input(const char* op, const char* name, const at::Tensor& x,
                         const at::Tensor& cos, const at::Tensor& positions,
                         const MultiAxisArgs& axes) {
  check_defined(op, name, x);
  check_defined(op, "positions", positions);
  check_same_device(op, name, x, "cos", cos);
  check_same_device(op, "positions", positions, name, x);
  check_rotated_tensor(op, name, x, angle_shape(cos));
  check_positions_for(op, name, x, positions, axes);
}

void check_positions_for(const char* op, const char* name, const at::Tensor& x,
                         const at::Tensor& positions, const MultiAxisArgs& axes) {
  const auto pos_dtype = positions.scalar_type();
  TORCH_CHECK(pos_dtype == at::kInt || pos_dtype == at::kLong, op,
              ": positions must be an integer tensor (int32 or int64), got ", pos_dtype);
  const auto row_shape = x.sym_sizes().slice(0, x.dim() - 1);
  auto pos_shape = positions.sym_sizes();
  if (axes.active()) {
    const auto num_axes = static_cast<int64_t>(axes.section->size());
    TORCH_CHECK(positions.dim() >= 1, op,
                ": positions must have a trailing axis dim of size len(mrope_section) = ", num_axes,
                ", got a 0-dim tensor");
    TORCH_SYM_CHECK(
        positions.sym_size(-1).sym_eq(num_axes), op,
        ": positions must have a trailing axis dim of size len(mrope_section) = ", num_axes,
        " (positions[..., a] is axis a), got positions of shape ", positions.sym_sizes());
    pos_shape = pos_shape.slice(0, positions.dim() - 1);
  }
  TORCH_CHECK(at::is_expandable_to(pos_shape, row_shape), op, ": positions",
              axes.active() ? ".shape[:-1] (without the axis dim) " : " ", "of shape ", pos_shape,
              " cannot be broadcast to ", name, ".shape[:-1] = ", row_shape,
              " (shapes align from the right; use e.g. (S,) for (B, H, S, D) or (S, 1) for "
              "(B, S, H, D); when ",
              name,
              " is a DTensor these are global shapes: positions must be global and "
              "broadcastable to the global shape)");
}

// Whether two elements of `t` share an address, decided exactly from its sizes and strides
// (PyTorch's has_internal_overlap proves overlap only for stride 0 and answers "too hard" for
// views such as as_strided((4, 64), (32, 1)), whose rows overlap each other). Writing such a view
// from several threads is a data race, so the writing ops refuse it.
//
// First the cheap proof of no overlap: with the dims sorted by stride, each stride must reach past
// everything the dims inside it can span. Every layout that views, slices, permutes or pads
// produce passes it. Only a layout that fails it (interleaved dims, or a real overlap) pays for
// the exact answer, which lists the addresses and looks for a repeat; past kMaxEnumerated
// elements that is too costly, and such a view is refused as "cannot prove".
enum class SelfOverlap { No, Yes, TooLarge };

constexpr int64_t kMaxEnumerated = int64_t{1} << 22;

SelfOverlap self_overlap(const at::Tensor& t) {
  if (t.is_non_overlapping_and_dense()) {
    return SelfOverlap::No;  // the common case, a flag torch keeps: no per-call work
  }
  std::vector<std::pair<int64_t, int64_t>> dims;  // (|stride|, size) of dims with size > 1
  for (int64_t d = 0; d < t.dim(); ++d) {
    const auto size = t.sym_size(d).maybe_as_int();
    const auto stride = t.sym_stride(d).maybe_as_int();
    if (!size || !stride) {
      return SelfOverlap::No;  // symbolic: decided again on real tensors by the real kernel
    }
    if (*size == 0) {
      return SelfOverlap::No;  // no elements, nothing to overlap
    }
    if (*size > 1) {
      dims.emplace_back(std::abs(*stride), *size);
    }
  }
  std::sort(dims.begin(), dims.end());
  int64_t span = 1;  // elements covered by the dims inside the current one: max offset + 1
  bool proven = true;
  for (const auto& [stride, size] : dims) {
    if (stride < span) {
      proven = false;
      break;
    }
    span += stride * (size - 1);
  }
  if (proven) {
    return SelfOverlap::No;
  }
  int64_t numel = 1;
  for (const auto& dim : dims) {
    numel *= dim.second;
  }
  if (numel > kMaxEnumerated) {
    return SelfOverlap::TooLarge;
  }
  std::vector<int64_t> offsets{0};
  offsets.reserve(numel);
  for (const auto& [stride, size] : dims) {
    const size_t inner = offsets.size();
    for (int64_t i = 1; i < size; ++i) {
      for (size_t j = 0; j < inner; ++j) {
        offsets.push_back(offsets[j] + i * stride);
      }
    }
  }
  std::sort(offsets.begin(), offsets.end());
  return std::adjacent_find(offsets.begin(), offsets.end()) == offsets.end() ? SelfOverlap::No
                                                                             : SelfOverlap::Yes;
}

// What to do instead of writing `name` where it overlaps itself. x (apply_) and out (out=) have
// the out-of-place op; a KV cache has no out-of-place form: it must be a buffer of its own.
std::string instead_of_writing(const char* name, bool has_out_of_place_form, bool copy_back) {
  if (!has_out_of_place_form) {
    return c10::str("allocate ", name,
                    " as a buffer of its own (e.g. torch.zeros of its shape), whose elements do "
                    "not share memory");
  }
  return copy_back ? c10::str("pass ", name, ".contiguous() (copy the result back) or use the ",
                              "out-of-place op")
                   : c10::str("pass ", name, ".clone() or use the out-of-place op");
}

void check_writable(const char* op, const char* name, const at::Tensor& t,
                    bool has_out_of_place_form = true) {
  TORCH_CHECK(at::has_internal_overlap(t) != at::MemOverlap::Yes, op, ": ", name,
              " has overlapping memory (e.g. a result of expand()), so it cannot be written in "
              "place; ",
              instead_of_writing(name, has_out_of_place_form, false));
  const SelfOverlap overlap = self_overlap(t);
  TORCH_CHECK(overlap != SelfOverlap::Yes, op, ": ", name,
              " has overlapping memory: two of its elements share an address (sizes ",
              t.sym_sizes(), ", strides ", t.sym_strides(), "), so writing it is a data race; ",
              instead_of_writing(name, has_out_of_place_form, false));
  TORCH_CHECK(overlap != SelfOverlap::TooLarge, op, ": ", name,
              " may have overlapping memory: its strides ", t.sym_strides(), " for sizes ",
              t.sym_sizes(), " interleave, and with more than ", kMaxEnumerated,
              " elements the exact check is not run; ",
              instead_of_writing(name, has_out_of_place_form, true));
}

// The bytes [first, last] a strided tensor can touch, relative to its storage.
std::pair<int64_t, int64_t> byte_span(const at::Tensor& t) {
  int64_t lo = t.storage_offset();
  int64_t hi = t.storage_offset();
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t reach = (t.size(d) - 1) * t.stride(d);
    (reach < 0 ? lo : hi) += reach;
  }
  const int64_t item = static_cast<int64_t>(t.element_size());
  return {lo * item, hi * item + item - 1};
}

// Whether `written` may share memory with `read`. Conservative: two views of one storage whose
// spans intersect count as overlapping even if their elements interleave (buf[::2], buf[1::2]).
// Meta tensors have no memory, so nothing can overlap there.
bool may_share_memory(const at::Tensor& written, const at::Tensor& read) {
  if (written.is_meta() || read.is_meta() || !written.has_storage() || !read.has_storage() ||
      written.numel() == 0 || read.numel() == 0) {
    return false;
  }
  if (!written.storage().is_alias_of(read.storage())) {
    return false;
  }
  const auto [w_lo, w_hi] = byte_span(written);
  const auto [r_lo, r_hi] = byte_span(read);
  return w_lo <= r_hi && r_lo <= w_hi;
}

void check_no_shared_memory(
    const char* op, const char* written_name, const at::Tensor& written,
    std::initializer_list<std::pair<const char*, const at::Tensor*>> reads) {
  for (const auto& [read_name, read] : reads) {
    TORCH_CHECK(!may_share_memory(written, *read), op, ": ", written_name, " shares memory with ",
                read_name, ", which it would overwrite while reading; pass ", read_name,
                ".clone() or a separate buffer");
  }
}

// ---- the argument forms ----------------------------------------------------------------------

// The angle source's own checks; returns what x is checked against.
AngleShape check_angle_source(const char* op, const AngleSource& angles,
                              const MultiAxisArgs& axes) {
  if (!angles.frequencies()) {
    check_tables(op, *angles.cos, *angles.sin);
    check_multi_axis(op, *angles.cos, axes);
    return angle_shape(*angles.cos);
  }
  const at::Tensor& freqs = *angles.freqs;
  check_defined(op, "freqs", freqs);
  TORCH_CHECK(freqs.dim() == 1, op,
              ": freqs must be a 1-D tensor of rotary_dim / 2 frequencies (one per plane), got a ",
              freqs.dim(), "-D tensor of shape ", freqs.sym_sizes());
  TORCH_CHECK(freqs.scalar_type() == at::kDouble, op,
              ": freqs must be float64 (plane k turns by position * freqs[k] exactly, with "
              "freqs[k] as stored), got ",
              freqs.scalar_type());
  TORCH_CHECK(std::isfinite(angles.attention_factor), op, ": attention_factor must be finite, got ",
              angles.attention_factor);
  check_multi_axis_planes(op, freqs.sym_size(0), "rotary_dim / 2 = freqs.size(0)", axes);
  return {"freqs", &freqs, 2 * freqs.sym_size(0), "2 * freqs.size(0)"};
}

// An index tensor of the packed sequences (cu_seqlens, seq_offsets): 1-D, int32 or int64, on x's
// device or (for a CUDA x) on the CPU, whose values are then checked on the host.
void check_packed_index(const char* op, const char* name, const at::Tensor& t, const char* x_name,
                        const at::Tensor& x) {
  TORCH_CHECK(t.dim() == 1, op, ": ", name, " must be a 1-D tensor, got a ", t.dim(),
              "-D tensor of shape ", t.sym_sizes());
  TORCH_CHECK(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, op, ": ", name,
              " must be an integer tensor (int32 or int64), got ", t.scalar_type());
  const bool host_for_device = t.device().is_cpu() && !x.device().is_cpu();
  TORCH_CHECK(t.device() == x.device() || host_for_device, op, ": ", name, " must be on ", x_name,
              "'s device (", x.device(), ")",
              x.device().is_cpu() ? "" : " or on the CPU (checked on the host, then copied)",
              ", got ", name, " on ", t.device());
}

// x (q, k) against packed sequences: (T, ..., head_dim) with the tokens on dim 0, and the
// packed sequences' own metadata.
void check_packed_for(const char* op, const char* name, const at::Tensor& x,
                      const PackedArgs& packed, const MultiAxisArgs& axes) {
  TORCH_CHECK(!axes.active(), op,
              ": mrope_section (multi-axis positions) cannot be combined with cu_seqlens; pass "
              "the multi-axis positions themselves");
  TORCH_CHECK(x.dim() >= 2, op, ": ", name,
              " must be (T, ..., head_dim) with the tokens of the packed sequences on dim 0 when "
              "cu_seqlens is given, got a ",
              x.dim(), "-D tensor");
  check_defined(op, "cu_seqlens", packed.cu_seqlens);
  check_packed_index(op, "cu_seqlens", packed.cu_seqlens, name, x);
  TORCH_SYM_CHECK(packed.cu_seqlens.sym_size(0).sym_ge(1), op,
                  ": cu_seqlens must hold N + 1 boundaries of N packed sequences (at least the "
                  "0 that starts them), got an empty tensor");
  if (packed.seq_offsets.defined()) {
    check_packed_index(op, "seq_offsets", packed.seq_offsets, name, x);
    check_same_device(op, "seq_offsets", packed.seq_offsets, "cu_seqlens", packed.cu_seqlens);
    TORCH_SYM_CHECK(packed.seq_offsets.sym_size(0).sym_eq(packed.cu_seqlens.sym_size(0) - 1), op,
                    ": seq_offsets must hold one start position per sequence, N = "
                    "cu_seqlens.size(0) - 1 = ",
                    packed.cu_seqlens.sym_size(0) - 1, ", got ", packed.seq_offsets.sym_size(0));
  }
  TORCH_CHECK(packed.cp_size >= 1, op,
              ": cp_size must be >= 1 (the context-parallel ranks a sequence is split over), got ",
              packed.cp_size);
  TORCH_CHECK(packed.cp_rank >= 0 && packed.cp_rank < packed.cp_size, op,
              ": cp_rank must be in [0, cp_size) = [0, ", packed.cp_size, "), got ",
              packed.cp_rank);
}

// One rotated input of any form: x against the angle source, then its position source.
void check_rotated_form(const char* op, const char* name, const at::Tensor& x,
                        const AngleShape& angles, const PositionSource& where,
                        const MultiAxisArgs& axes) {
  check_defined(op, name, x);
  if (!where.is_packed()) {
    check_defined(op, "positions", *where.positions);
    check_same_device(op, name, x, angles.tensor_name, *angles.tensor);
    check_same_device(op, "positions", *where.positions, name, x);
  }
  check_rotated_tensor(op, name, x, angles);
  if (where.is_packed()) {
    check_packed_for(op, name, x, *where.packed, axes);
  } else {
    check_positions_for(op, name, x, *where.positions, axes);
  }
}

// The tensors a call reads besides x, by name, for the overlap checks of the writing ops.
std::vector<std::pair<const char*, const at::Tensor*>> read_tensors(const AngleSource& angles,
                                                                    const PositionSource& where) {
  std::vector<std::pair<const char*, const at::Tensor*>> reads;
  if (angles.frequencies()) {
    reads.emplace_back("freqs", angles.freqs);
  } else {
    reads.emplace_back("cos", angles.cos);
    reads.emplace_back("sin", angles.sin);
  }
  if (where.is_packed()) {
    reads.emplace_back("cu_seqlens", &where.packed->cu_seqlens);
    if (where.packed->seq_offsets.defined()) {
      reads.emplace_back("seq_offsets", &where.packed->seq_offsets);
    }
  } else {
    reads.emplace_back("positions", where.positions);
  }
  return reads;
}

void check_no_shared_memory_with(
    const char* op, const char* written_name, const at::Tensor& written,
    const std::vector<std::pair<const char*, const at::Tensor*>>& reads) {
  for (const auto& [read_name, read] : reads) {
    check_no_shared_memory(op, written_name, written, {{read_name, read}});
  }
}

// Reads element i of a CPU int32 / int64 tensor (any strides) as int64.
int64_t index_value(const at::Tensor& t, int64_t i) {
  const int64_t at = i * t.stride(0);
  return t.scalar_type() == at::kLong ? t.const_data_ptr<int64_t>()[at]
                                      : static_cast<int64_t>(t.const_data_ptr<int32_t>()[at]);
}

}  // namespace

void check_apply(const char* op, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                 const at::Tensor& positions, const MultiAxisArgs& axes) {
  check_tables(op, cos, sin);
  check_multi_axis(op, cos, axes);
  check_rotated_input(op, "x", x, cos, positions, axes);
}

void check_rotated(const char* op, const char* name, const at::Tensor& x, const at::Tensor& cos,
                   const at::Tensor& sin, const at::Tensor& positions, const MultiAxisArgs& axes) {
  check_tables(op, cos, sin);
  check_multi_axis(op, cos, axes);
  check_rotated_input(op, name, x, cos, positions, axes);
}

void check_apply_inplace(const char* op, const at::Tensor& x, const at::Tensor& cos,
                         const at::Tensor& sin, const at::Tensor& positions,
                         const MultiAxisArgs& axes) {
  check_apply(op, x, cos, sin, positions, axes);
  check_writable(op, "x", x);
  check_no_shared_memory(op, "x", x, {{"cos", &cos}, {"sin", &sin}, {"positions", &positions}});
}

void check_apply_out(const char* op, const at::Tensor& x, const at::Tensor& cos,
                     const at::Tensor& sin, const at::Tensor& positions, const at::Tensor& out,
                     const MultiAxisArgs& axes) {
  check_apply(op, x, cos, sin, positions, axes);
  check_defined(op, "out", out);
  check_same_device(op, "out", out, "x", x);
  TORCH_CHECK(out.scalar_type() == x.scalar_type(), op, ": out must have x's dtype ",
              x.scalar_type(), ", got ", out.scalar_type());
  TORCH_CHECK(out.sym_sizes().equals(x.sym_sizes()), op, ": out must have x's shape ",
              x.sym_sizes(), ", got ", out.sym_sizes(), " (out= never resizes)");
  check_writable(op, "out", out);
  check_no_shared_memory(op, "out", out,
                         {{"x", &x}, {"cos", &cos}, {"sin", &sin}, {"positions", &positions}});
}

void check_apply_qk(const char* op, const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                    const at::Tensor& sin, const at::Tensor& positions, const MultiAxisArgs& axes) {
  check_tables(op, cos, sin);
  check_multi_axis(op, cos, axes);
  check_rotated_input(op, "q", q, cos, positions, axes);
  check_rotated_input(op, "k", k, cos, positions, axes);
  TORCH_CHECK(q.scalar_type() == k.scalar_type(), op, ": q and k must have the same dtype, got q ",
              q.scalar_type(), " and k ", k.scalar_type());
  TORCH_SYM_CHECK(q.sym_size(-1).sym_eq(k.sym_size(-1)), op,
                  ": q and k must have the same head_dim (size(-1)), got q ", q.sym_size(-1),
                  " and k ", k.sym_size(-1));
}

void check_positions_in_range(const char* op, const at::Tensor& positions, int64_t max_seq_len,
                              const MultiAxisArgs& axes) {
  TORCH_INTERNAL_ASSERT(positions.device().is_cpu(), op, ": host-side range check on ",
                        positions.device());
  // positions is usually tiny (S or B entries, before broadcasting): one scan beats a reduction
  // op plus two .item() calls, and it can name the first offending entry.
  const at::Tensor p = positions.contiguous();
  auto scan = [&](const auto* data) {
    const int64_t n = p.numel();
    const int64_t num_axes = axes.active() ? static_cast<int64_t>(axes.section->size()) : 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t value = static_cast<int64_t>(data[i]);
      if (num_axes > 0 && !(value >= 0 && value < max_seq_len)) {
        TORCH_CHECK_INDEX(
            false, op, ": positions of axis ", i % num_axes, " (positions[..., ", i % num_axes,
            "]) must be in [0, max_seq_len) with max_seq_len = cos.size(0) = ", max_seq_len,
            ", got ", value, " at flat index ", i,
            " of positions (build longer tables or check the positions)");
      }
      TORCH_CHECK_INDEX(value >= 0 && value < max_seq_len, op,
                        ": positions must be in [0, max_seq_len) with max_seq_len = cos.size(0) = ",
                        max_seq_len, ", got ", value, " at flat index ", i,
                        " of positions (build longer tables or check the positions)");
    }
  };
  if (p.scalar_type() == at::kLong) {
    scan(p.const_data_ptr<int64_t>());
  } else {
    scan(p.const_data_ptr<int32_t>());
  }
}

void check_writable_arg(const char* op, const char* name, const at::Tensor& t) {
  check_writable(op, name, t, /*has_out_of_place_form=*/false);
}

void check_disjoint(const char* op, const char* written_name, const at::Tensor& written,
                    const char* other_name, const at::Tensor& other) {
  check_no_shared_memory(op, written_name, written, {{other_name, &other}});
}

int64_t rotary_dim_of(const AngleSource& angles) {
  return angles.frequencies() ? 2 * angles.freqs->size(0) : 2 * angles.cos->size(1);
}

void check_apply_form(const char* op, const at::Tensor& x, const AngleSource& angles,
                      const PositionSource& where, const MultiAxisArgs& axes) {
  const AngleShape shape = check_angle_source(op, angles, axes);
  check_rotated_form(op, "x", x, shape, where, axes);
}

void check_apply_inplace_form(const char* op, const at::Tensor& x, const AngleSource& angles,
                              const PositionSource& where, const MultiAxisArgs& axes) {
  check_apply_form(op, x, angles, where, axes);
  check_writable(op, "x", x);
  check_no_shared_memory_with(op, "x", x, read_tensors(angles, where));
}

void check_apply_out_form(const char* op, const at::Tensor& x, const AngleSource& angles,
                          const PositionSource& where, const at::Tensor& out,
                          const MultiAxisArgs& axes) {
  check_apply_form(op, x, angles, where, axes);
  check_defined(op, "out", out);
  check_same_device(op, "out", out, "x", x);
  TORCH_CHECK(out.scalar_type() == x.scalar_type(), op, ": out must have x's dtype ",
              x.scalar_type(), ", got ", out.scalar_type());
  TORCH_CHECK(out.sym_sizes().equals(x.sym_sizes()), op, ": out must have x's shape ",
              x.sym_sizes(), ", got ", out.sym_sizes(), " (out= never resizes)");
  check_writable(op, "out", out);
  auto reads = read_tensors(angles, where);
  reads.insert(reads.begin(), {"x", &x});
  check_no_shared_memory_with(op, "out", out, reads);
}

void check_apply_qk_form(const char* op, const at::Tensor& q, const at::Tensor& k,
                         const AngleSource& angles, const PositionSource& where,
                         const MultiAxisArgs& axes) {
  const AngleShape shape = check_angle_source(op, angles, axes);
  check_rotated_form(op, "q", q, shape, where, axes);
  check_rotated_form(op, "k", k, shape, where, axes);
  TORCH_CHECK(q.scalar_type() == k.scalar_type(), op, ": q and k must have the same dtype, got q ",
              q.scalar_type(), " and k ", k.scalar_type());
  TORCH_SYM_CHECK(q.sym_size(-1).sym_eq(k.sym_size(-1)), op,
                  ": q and k must have the same head_dim (size(-1)), got q ", q.sym_size(-1),
                  " and k ", k.sym_size(-1));
  if (where.is_packed()) {
    TORCH_SYM_CHECK(q.sym_size(0).sym_eq(k.sym_size(0)), op,
                    ": q and k must have the same number of tokens (size(0)) when cu_seqlens "
                    "is given, got q ",
                    q.sym_size(0), " and k ", k.sym_size(0));
  }
}

void check_frequencies_finite(const char* op, const at::Tensor& freqs) {
  TORCH_INTERNAL_ASSERT(freqs.device().is_cpu(), op, ": host-side check of freqs on ",
                        freqs.device());
  const auto* f = freqs.const_data_ptr<double>();
  for (int64_t k = 0; k < freqs.size(0); ++k) {
    const double v = f[k * freqs.stride(0)];
    TORCH_CHECK_VALUE(std::isfinite(v), op, ": freqs must be finite, got ", v, " at index ", k,
                      " of freqs");
  }
}

void check_positions_not_negative(const char* op, const at::Tensor& positions,
                                  const MultiAxisArgs& axes) {
  TORCH_INTERNAL_ASSERT(positions.device().is_cpu(), op, ": host-side check of positions on ",
                        positions.device());
  const at::Tensor p = positions.contiguous();
  const int64_t num_axes = axes.active() ? static_cast<int64_t>(axes.section->size()) : 0;
  auto scan = [&](const auto* data) {
    for (int64_t i = 0; i < p.numel(); ++i) {
      const int64_t value = static_cast<int64_t>(data[i]);
      if (value >= 0) {
        continue;
      }
      if (num_axes > 0) {
        TORCH_CHECK_INDEX(false, op, ": positions of axis ", i % num_axes, " (positions[..., ",
                          i % num_axes,
                          "]) must be >= 0 (the frequency form has no upper bound), got ", value,
                          " at flat index ", i, " of positions");
      }
      TORCH_CHECK_INDEX(false, op,
                        ": positions must be >= 0 (the frequency form has no upper bound), got ",
                        value, " at flat index ", i, " of positions");
    }
  };
  if (p.scalar_type() == at::kLong) {
    scan(p.const_data_ptr<int64_t>());
  } else {
    scan(p.const_data_ptr<int32_t>());
  }
}

void check_packed_values(const char* op, const PackedArgs& packed, int64_t num_tokens,
                         int64_t max_seq_len) {
  const at::Tensor& cu = packed.cu_seqlens;
  const at::Tensor& offsets = packed.seq_offsets;
  TORCH_INTERNAL_ASSERT(cu.device().is_cpu() && (!offsets.defined() || offsets.device().is_cpu()),
                        op, ": host-side check of cu_seqlens on ", cu.device());
  const int64_t cp = packed.cp_size;
  const int64_t r = packed.cp_rank;
  const int64_t n = cu.size(0) - 1;
  const int64_t first = index_value(cu, 0);
  TORCH_CHECK_VALUE(first == 0, op,
                    ": cu_seqlens[0] must be 0 (the first sequence starts at token 0), got ",
                    first);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t begin = index_value(cu, i);
    const int64_t end = index_value(cu, i + 1);
    TORCH_CHECK_VALUE(end >= begin, op,
                      ": cu_seqlens must be non-decreasing (the boundaries of the packed "
                      "sequences in token order), got cu_seqlens[",
                      i + 1, "] = ", end, " after cu_seqlens[", i, "] = ", begin);
  }
  int64_t total = 0;
  const bool overflow = __builtin_mul_overflow(num_tokens, cp, &total);
  const int64_t last = index_value(cu, n);
  TORCH_CHECK_VALUE(!overflow && last == total, op,
                    ": cu_seqlens[-1] must equal x.size(0) * cp_size = ", num_tokens, " * ", cp,
                    cp > 1 ? " (the global token count: cu_seqlens holds the global boundaries)"
                           : " (every token of x belongs to a sequence)",
                    ", got ", last);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t begin = index_value(cu, i);
    const int64_t length = index_value(cu, i + 1) - begin;
    TORCH_CHECK_VALUE(cp == 1 || length % (2 * cp) == 0, op, ": with cp_size = ", cp,
                      " every sequence length must be divisible by 2 * cp_size = ", 2 * cp,
                      " (TransformerEngine's zigzag layout: pass the padded global boundaries), "
                      "got length ",
                      length, " of sequence ", i, " (cu_seqlens[", i, "] = ", begin,
                      ", cu_seqlens[", i + 1, "] = ", begin + length, ")");
    const int64_t offset = offsets.defined() ? index_value(offsets, i) : 0;
    TORCH_CHECK_VALUE(offset >= 0, op,
                      ": seq_offsets must be >= 0 (the position of each sequence's first token), "
                      "got ",
                      offset, " for sequence ", i);
    if (length == 0) {
      continue;
    }
    // The last position this rank gives the sequence: its own last token (cp_size 1), or the
    // last of chunk 2 cp_size - 1 - cp_rank.
    const int64_t last_relative = cp == 1 ? length - 1 : length - r * (length / (2 * cp)) - 1;
    int64_t last_position = 0;
    TORCH_CHECK_VALUE(!__builtin_add_overflow(offset, last_relative, &last_position), op,
                      ": seq_offsets[", i, "] = ", offset, " plus the sequence's positions (up to ",
                      last_relative, ") overflows int64");
    if (max_seq_len >= 0) {
      TORCH_CHECK_INDEX(last_position < max_seq_len, op,
                        ": positions from cu_seqlens and seq_offsets must be < max_seq_len = "
                        "cos.size(0) = ",
                        max_seq_len, ", got ", last_position, " for sequence ", i, " (length ",
                        length, ", seq_offsets[", i, "] = ", offset,
                        cp > 1 ? c10::str(", cp_rank ", r, " of ", cp) : std::string(),
                        "); build longer tables or check the offsets");
    }
  }
}

void check_form_values_on_host(const char* op, const AngleSource& angles,
                               const PositionSource& where, int64_t num_tokens,
                               const MultiAxisArgs& axes) {
  check_form_values_on_host(op, angles, where, num_tokens, axes,
                            [](const at::Tensor& t) { return t.device().is_cpu(); });
}

void check_form_values_on_host(const char* op, const AngleSource& angles,
                               const PositionSource& where, int64_t num_tokens,
                               const MultiAxisArgs& axes,
                               const std::function<bool(const at::Tensor&)>& on_host) {
  if (angles.frequencies() && on_host(*angles.freqs)) {
    check_frequencies_finite(op, *angles.freqs);
  }
  if (where.is_packed()) {
    const PackedArgs& packed = *where.packed;
    // seq_offsets are read with cu_seqlens: both on the host, or both asserted on the device.
    if (on_host(packed.cu_seqlens) &&
        (!packed.seq_offsets.defined() || on_host(packed.seq_offsets))) {
      check_packed_values(op, packed, num_tokens, angles.frequencies() ? -1 : angles.cos->size(0));
    }
  } else if (angles.frequencies() && on_host(*where.positions)) {
    check_positions_not_negative(op, *where.positions, axes);
  }
}

AxisMap axis_map(const MultiAxisArgs& axes) {
  AxisMap m;
  if (!axes.active()) {
    return m;
  }
  const auto section = *axes.section;
  m.num_axes = static_cast<int32_t>(section.size());
  m.interleaved = axes.interleaved;
  for (size_t a = 0; a < section.size(); ++a) {
    m.sections[a] = section[a];
  }
  return m;
}

}  // namespace rope::detail
