// SPDX-License-Identifier: BSD-3-Clause
#include <c10/core/SymBool.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kv_cache_body.h"

namespace rope::detail {
namespace {

// One cache against the source it stores (k or v): (num_slots, H, D) or (num_blocks, block_size,
// H, D), the source's dtype or fp8, unit last stride, writable; the scale goes with fp8 only.
void check_cache(const char* op, const char* name, const at::Tensor& cache, const char* src_name,
                 const at::Tensor& src, const char* scale_name,
                 const std::optional<at::Tensor>& scale) {
  TORCH_CHECK(cache.defined(), op, ": ", name, " must be a tensor, got None");
  TORCH_CHECK(cache.device() == src.device(), op, ": ", name, " must be on ", src_name,
              "'s device ", src.device(), ", got ", cache.device());
  TORCH_CHECK(cache.dim() == 3 || cache.dim() == 4, op, ": ", name,
              " must be (num_slots, num_heads, head_dim) or paged (num_blocks, block_size, "
              "num_heads, head_dim), got a ",
              cache.dim(), "-D tensor of shape ", cache.sym_sizes());
  TORCH_SYM_CHECK(cache.sym_size(-2).sym_eq(src.sym_size(1)), op, ": ", name,
                  ".size(-2) (heads) must equal ", src_name, ".size(1) = ", src.sym_size(1),
                  ", got ", name, " of shape ", cache.sym_sizes());
  TORCH_SYM_CHECK(cache.sym_size(-1).sym_eq(src.sym_size(2)), op, ": ", name,
                  ".size(-1) (head_dim) must equal ", src_name, ".size(-1) = ", src.sym_size(2),
                  ", got ", name, " of shape ", cache.sym_sizes());
  const auto dtype = cache.scalar_type();
  TORCH_CHECK(dtype == src.scalar_type() || is_fp8(dtype), op, ": ", name, " must have ", src_name,
              "'s dtype ", src.scalar_type(),
              " or be float8 (torch.float8_e4m3fn, torch.float8_e5m2), got ", dtype);
  TORCH_SYM_CHECK(cache.sym_size(-1).sym_le(1) || cache.sym_stride(-1).sym_eq(1), op, ": ", name,
                  " must have a unit last stride (stride(-1) == 1), got strides ",
                  cache.sym_strides());
  check_writable_arg(op, name, cache);
  if (is_fp8(dtype)) {
    TORCH_CHECK(scale.has_value() && scale->defined(), op, ": ", scale_name,
                " is required with a float8 ", name, " (stored = saturate(value / ", scale_name,
                ") in ", dtype, "), got None");
    TORCH_CHECK(scale->scalar_type() == at::kFloat, op, ": ", scale_name,
                " must be a float32 tensor (or a Python float), got ", scale->scalar_type());
    TORCH_SYM_CHECK(scale->sym_numel().sym_eq(1), op, ": ", scale_name,
                    " must hold one value (0-d or 1 element), got shape ", scale->sym_sizes());
    TORCH_CHECK(scale->device() == cache.device(), op, ": ", scale_name, " must be on ", name,
                "'s device ", cache.device(), ", got ", scale->device());
  } else {
    TORCH_CHECK(!scale.has_value() || !scale->defined(), op, ": ", scale_name,
                " applies to float8 caches only; ", name, " is ", dtype,
                " (values are stored unscaled), so pass ", scale_name, "=None");
  }
}

void check_rows(const char* op, const char* name, const at::Tensor& t, const at::Tensor& q) {
  TORCH_CHECK(t.dim() == 3, op, ": ", name, " must be 3-D (num_tokens, num_heads, head_dim), got ",
              "shape ", t.sym_sizes());
  TORCH_SYM_CHECK(t.sym_size(0).sym_eq(q.sym_size(0)), op, ": ", name,
                  ".size(0) (tokens) must equal q.size(0) = ", q.sym_size(0), ", got ", name,
                  " of shape ", t.sym_sizes());
}

}  // namespace

void check_apply_qk_cache(const char* op, const KvCacheInputs& in) {
  // The (T, H, D) shapes first: a wrong rank would otherwise surface as a positions mismatch.
  if (in.q.defined() && in.k.defined()) {
    TORCH_CHECK(in.q.dim() == 3, op,
                ": q must be 3-D (num_tokens, num_heads, head_dim), got shape ", in.q.sym_sizes());
    check_rows(op, "k", in.k, in.q);
  }
  check_apply_qk(op, in.q, in.k, in.cos, in.sin, in.positions, in.axes);
  const at::Tensor& slots = in.slot_mapping;
  TORCH_CHECK(slots.defined(), op, ": slot_mapping must be a tensor, got None");
  TORCH_CHECK(slots.device() == in.k.device(), op, ": slot_mapping must be on k's device ",
              in.k.device(), ", got ", slots.device());
  TORCH_CHECK(slots.scalar_type() == at::kLong, op,
              ": slot_mapping must be int64 (one cache slot per token, negative = padding), got ",
              slots.scalar_type());
  TORCH_CHECK(slots.dim() == 1, op, ": slot_mapping must be 1-D (num_tokens,), got shape ",
              slots.sym_sizes());
  TORCH_SYM_CHECK(slots.sym_size(0).sym_eq(in.q.sym_size(0)), op,
                  ": slot_mapping must have one entry per token, q.size(0) = ", in.q.sym_size(0),
                  ", got ", slots.sym_size(0));
  const bool has_v = in.v.has_value() && in.v->defined();
  const bool has_v_cache = in.v_cache.has_value() && in.v_cache->defined();
  TORCH_CHECK(has_v == has_v_cache, op, ": v and v_cache go together, got v ",
              has_v ? "a tensor" : "None", " and v_cache ", has_v_cache ? "a tensor" : "None");
  check_cache(op, "k_cache", in.k_cache, "k", in.k, "k_scale", in.k_scale);
  if (has_v) {
    const at::Tensor& v = *in.v;
    TORCH_CHECK(v.device() == in.k.device(), op, ": v must be on k's device ", in.k.device(),
                ", got ", v.device());
    TORCH_CHECK(v.scalar_type() == in.k.scalar_type(), op, ": v must have k's dtype ",
                in.k.scalar_type(), ", got ", v.scalar_type());
    check_rows(op, "v", v, in.q);
    TORCH_SYM_CHECK(v.sym_size(1).sym_eq(in.k.sym_size(1)), op,
                    ": v must have k's head count k.size(1) = ", in.k.sym_size(1), ", got v of ",
                    "shape ", v.sym_sizes());
    const at::Tensor& v_cache = *in.v_cache;
    check_cache(op, "v_cache", v_cache, "v", v, "v_scale", in.v_scale);
    TORCH_CHECK(v_cache.dim() == in.k_cache.dim(), op,
                ": v_cache must be laid out like k_cache (both flat or both paged), got k_cache "
                "of shape ",
                in.k_cache.sym_sizes(), " and v_cache of shape ", v_cache.sym_sizes());
    const int64_t lead = in.k_cache.dim() - 2;
    TORCH_CHECK(v_cache.sym_sizes().slice(0, lead).equals(in.k_cache.sym_sizes().slice(0, lead)),
                op, ": v_cache must have k_cache's slots (leading dims ",
                in.k_cache.sym_sizes().slice(0, lead), "), got v_cache of shape ",
                v_cache.sym_sizes());
  } else {
    TORCH_CHECK(!in.v_scale.has_value() || !in.v_scale->defined(), op,
                ": v_scale given without v_cache");
  }
  // What each cache must not share memory with: everything the op reads, and the other cache.
  std::vector<std::pair<const char*, const at::Tensor*>> reads = {
      {"q", &in.q},
      {"k", &in.k},
      {"cos", &in.cos},
      {"sin", &in.sin},
      {"positions", &in.positions},
      {"slot_mapping", &in.slot_mapping}};
  if (has_v) {
    reads.emplace_back("v", &*in.v);
  }
  if (in.k_scale.has_value() && in.k_scale->defined()) {
    reads.emplace_back("k_scale", &*in.k_scale);
  }
  if (in.v_scale.has_value() && in.v_scale->defined()) {
    reads.emplace_back("v_scale", &*in.v_scale);
  }
  // A decode call is a few microseconds, and a storage alias test per pair costs a library call:
  // compare absolute address ranges first, and run the full check (and its message) only for
  // pairs whose ranges meet.
  const Span k_span = span_of(in.k_cache);
  const Span v_span = has_v ? span_of(*in.v_cache) : Span{};
  for (const auto& [name, t] : reads) {
    const Span r = span_of(*t);
    if (k_span.meets(r)) {
      check_disjoint(op, "k_cache", in.k_cache, name, *t);
    }
    if (v_span.meets(r)) {
      check_disjoint(op, "v_cache", *in.v_cache, name, *t);
    }
  }
  if (k_span.meets(v_span)) {
    check_disjoint(op, "k_cache", in.k_cache, "v_cache", *in.v_cache);
  }
}

void check_scales_on_host(const char* op, const KvCacheInputs& in) {
  const auto check = [op](const char* name, const std::optional<at::Tensor>& scale) {
    if (!scale.has_value() || !scale->defined() || !scale->device().is_cpu()) {
      return;
    }
    // check_apply_qk_cache has made it one float32 value. 0 would store +-max (NaN for a zero
    // value), a negative scale flipped signs, NaN NaN and inf zeros: none is a quantization.
    const float value = *scale->const_data_ptr<float>();
    TORCH_CHECK_VALUE(std::isfinite(value) && value > 0, op, ": ", name,
                      " must be a finite number > 0 (stored = saturate(value / ", name, ")), got ",
                      value);
  };
  check("k_scale", in.k_scale);
  check("v_scale", in.v_scale);
}

int64_t cache_slots(const at::Tensor& cache) {
  return cache.dim() == 4 ? cache.size(0) * cache.size(1) : cache.size(0);
}

void check_slots_on_host(const char* op, const at::Tensor& slot_mapping, int64_t num_slots) {
  TORCH_INTERNAL_ASSERT(slot_mapping.device().is_cpu(), op, ": host-side slot check on ",
                        slot_mapping.device());
  const at::Tensor s = slot_mapping.contiguous();
  const int64_t* data = s.const_data_ptr<int64_t>();
  const int64_t n = s.numel();
  c10::SmallVector<std::pair<int64_t, int64_t>, 64> used;  // (slot, token)
  used.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK_INDEX(data[i] < num_slots, op, ": slot_mapping must be < the caches' slot count ",
                      num_slots, " (negative = padding), got ", data[i], " at index ", i);
    if (data[i] >= 0) {
      used.emplace_back(data[i], i);
    }
  }
  std::sort(used.begin(), used.end());
  for (size_t i = 1; i < used.size(); ++i) {
    TORCH_CHECK(used[i].first != used[i - 1].first, op, ": slot_mapping holds slot ", used[i].first,
                " twice (tokens ", used[i - 1].second, " and ", used[i].second,
                "); each token needs its own slot");
  }
}

}  // namespace rope::detail
