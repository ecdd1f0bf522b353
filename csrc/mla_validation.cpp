// SPDX-License-Identifier: BSD-3-Clause
#include <ATen/EmptyTensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/SymBool.h>
#include <c10/util/Exception.h>

#include "common_optional.h"
#include "mla_body.h"

namespace rope::detail {
namespace {

// A key part (k_pe, kv_c, v): (T, W), or (T, H, W) when the key parts carry heads.
void check_key_part(const char* op, const char* name, const at::Tensor& t, int64_t dims,
                    const at::Tensor& q_pe) {
  TORCH_CHECK(t.defined(), op, ": ", name, " must be a tensor, got None");
  TORCH_CHECK(t.device() == q_pe.device(), op, ": ", name, " must be on q_pe's device ",
              q_pe.device(), ", got ", t.device());
  TORCH_CHECK(t.scalar_type() == q_pe.scalar_type(), op, ": ", name, " must have q_pe's dtype ",
              q_pe.scalar_type(), ", got ", t.scalar_type());
  TORCH_CHECK(t.dim() == dims, op, ": ", name, " must be ",
              dims == 2 ? "2-D (num_tokens, width), as k_pe"
                        : "3-D (num_tokens, num_heads, "
                          "width), as k_pe",
              ", got shape ", t.sym_sizes());
  TORCH_SYM_CHECK(t.sym_size(0).sym_eq(q_pe.sym_size(0)), op, ": ", name,
                  ".size(0) (tokens) must equal q_pe.size(0) = ", q_pe.sym_size(0), ", got ", name,
                  " of shape ", t.sym_sizes());
}

// One cache: (num_slots, [H,] width) or paged (num_blocks, block_size, [H,] width), `row_dims`
// = 1 or 2 trailing dims per slot; of the key's dtype or float8 (with its scale), unit last
// stride, writable.
void check_cache(const char* op, const char* name, const at::Tensor& cache, int64_t row_dims,
                 const c10::SymInt& width, const char* width_what, const at::Tensor& src,
                 const char* src_name, const char* scale_name,
                 const std::optional<at::Tensor>& scale) {
  TORCH_CHECK(cache.defined(), op, ": ", name, " must be a tensor, got None");
  TORCH_CHECK(cache.device() == src.device(), op, ": ", name, " must be on ", src_name,
              "'s device ", src.device(), ", got ", cache.device());
  const char* shape = row_dims == 1 ? "(num_slots, width) or paged (num_blocks, block_size, width)"
                                    : "(num_slots, num_heads, width) or paged (num_blocks, "
                                      "block_size, num_heads, width)";
  TORCH_CHECK(cache.dim() == row_dims + 1 || cache.dim() == row_dims + 2, op, ": ", name,
              " must be ", shape, ", got a ", cache.dim(), "-D tensor of shape ",
              cache.sym_sizes());
  TORCH_SYM_CHECK(cache.sym_size(-1).sym_eq(width), op, ": ", name, ".size(-1) must be ",
                  width_what, " = ", width, ", got ", name, " of shape ", cache.sym_sizes());
  if (row_dims == 2) {
    TORCH_SYM_CHECK(cache.sym_size(-2).sym_eq(src.sym_size(1)), op, ": ", name,
                    ".size(-2) (heads) must equal ", src_name, ".size(1) = ", src.sym_size(1),
                    ", got ", name, " of shape ", cache.sym_sizes());
  }
  const auto dtype = cache.scalar_type();
  TORCH_CHECK(dtype == src.scalar_type() || is_fp8(dtype), op, ": ", name, " must have ", src_name,
              "'s dtype ", src.scalar_type(),
              " or be float8 (torch.float8_e4m3fn, torch.float8_e5m2), got ", dtype);
  TORCH_SYM_CHECK(cache.sym_size(-1).sym_le(1) || cache.sym_stride(-1).sym_eq(1), op, ": ", name,
                  " must have a unit last stride (stride(-1) == 1), got strides ",
                  cache.sym_strides());
  check_writable_arg(op, name, cache);
  if (is_fp8(dtype)) {
    TORCH_CHECK(given(scale), op, ": ", scale_name, " is required with a float8 ", name,
                " (stored = saturate(value / ", scale_name, "), or value * ", scale_name,
                " with multiply_by_scale), got None");
    check_scale_tensor(op, scale_name, scale, cache.device());
  } else {
    TORCH_CHECK(!given(scale), op, ": ", scale_name, " applies to float8 caches only; ", name,
                " is ", dtype, " (values are stored unscaled), so pass ", scale_name, "=None");
  }
}

void check_same_slots(const char* op, const char* name, const at::Tensor& cache,
                      const at::Tensor& kv_cache, int64_t row_dims) {
  TORCH_CHECK(cache.dim() == kv_cache.dim(), op, ": ", name,
              " must be laid out like kv_cache (both flat or both paged), got kv_cache of shape ",
              kv_cache.sym_sizes(), " and ", name, " of shape ", cache.sym_sizes());
  const int64_t lead = kv_cache.dim() - row_dims;
  TORCH_CHECK(cache.sym_sizes().slice(0, lead).equals(kv_cache.sym_sizes().slice(0, lead)), op,
              ": ", name, " must have kv_cache's slots (leading dims ",
              kv_cache.sym_sizes().slice(0, lead), "), got ", name, " of shape ",
              cache.sym_sizes());
}

}  // namespace

at::ScalarType check_mla_apply_cache(const char* op, const MlaInputs& in) {
  const at::Tensor& q_pe = in.q_pe;
  TORCH_CHECK(q_pe.defined(), op, ": q_pe must be a tensor, got None");
  TORCH_CHECK(q_pe.dim() == 3, op, ": q_pe must be 3-D (num_tokens, num_heads, rope_dim), got ",
              "shape ", q_pe.sym_sizes());
  TORCH_CHECK(in.k_pe.defined(), op, ": k_pe must be a tensor, got None");
  TORCH_CHECK(in.k_pe.dim() == 2 || in.k_pe.dim() == 3, op,
              ": k_pe must be 2-D (num_tokens, rope_dim), one latent head, or 3-D (num_tokens, "
              "num_heads, rope_dim), got shape ",
              in.k_pe.sym_sizes());
  const int64_t key_dims = in.k_pe.dim();
  const int64_t row_dims = key_dims - 1;
  check_key_part(op, "k_pe", in.k_pe, key_dims, q_pe);
  check_key_part(op, "kv_c", in.kv_c, key_dims, q_pe);
  if (key_dims == 3) {
    TORCH_SYM_CHECK(in.kv_c.sym_size(1).sym_eq(in.k_pe.sym_size(1)), op,
                    ": kv_c must have k_pe's head count k_pe.size(1) = ", in.k_pe.sym_size(1),
                    ", got kv_c of shape ", in.kv_c.sym_sizes());
  }
  // q_pe and k_pe rotate at the positions (k_pe as (T, 1, rope_dim) without heads).
  check_rotated(op, "q_pe", q_pe, in.cos, in.sin, in.positions);
  check_rotated(op, "k_pe", key_dims == 3 ? in.k_pe : in.k_pe.unsqueeze(1), in.cos, in.sin,
                in.positions);
  TORCH_SYM_CHECK(in.k_pe.sym_size(-1).sym_eq(q_pe.sym_size(-1)), op,
                  ": q_pe and k_pe must have the same rope_dim (size(-1)), got q_pe ",
                  q_pe.sym_size(-1), " and k_pe ", in.k_pe.sym_size(-1));
  if (given(in.q_nope)) {
    check_row_tensor(op, "q_nope", *in.q_nope, "q_pe", q_pe);
    TORCH_SYM_CHECK(in.q_nope->sym_size(1).sym_eq(q_pe.sym_size(1)), op,
                    ": q_nope must have q_pe's head count q_pe.size(1) = ", q_pe.sym_size(1),
                    ", got q_nope of shape ", in.q_nope->sym_sizes());
  }
  // slot_mapping.
  const at::Tensor& slots = in.slot_mapping;
  TORCH_CHECK(slots.defined(), op, ": slot_mapping must be a tensor, got None");
  TORCH_CHECK(slots.device() == q_pe.device(), op, ": slot_mapping must be on q_pe's device ",
              q_pe.device(), ", got ", slots.device());
  TORCH_CHECK(slots.scalar_type() == at::kLong, op,
              ": slot_mapping must be int64 (one cache slot per token, negative = padding), got ",
              slots.scalar_type());
  TORCH_CHECK(slots.dim() == 1, op, ": slot_mapping must be 1-D (num_tokens,), got shape ",
              slots.sym_sizes());
  TORCH_SYM_CHECK(slots.sym_size(0).sym_eq(q_pe.sym_size(0)), op,
                  ": slot_mapping must have one entry per token, q_pe.size(0) = ", q_pe.sym_size(0),
                  ", got ", slots.sym_size(0));
  // The caches: one [kv_c | k_pe] cache, or kv_c's and k_pe's.
  const c10::SymInt L = in.kv_c.sym_size(-1);
  const c10::SymInt R = in.k_pe.sym_size(-1);
  if (given(in.kpe_cache)) {
    check_cache(op, "kv_cache", in.kv_cache, row_dims, L, "kv_c.size(-1) (kv_lora_rank)", in.kv_c,
                "kv_c", "kv_scale", in.kv_scale);
    check_cache(op, "kpe_cache", *in.kpe_cache, row_dims, R, "k_pe.size(-1) (rope_dim)", in.k_pe,
                "k_pe", "kv_scale", in.kv_scale);
    check_same_slots(op, "kpe_cache", *in.kpe_cache, in.kv_cache, row_dims);
    TORCH_CHECK(in.kpe_cache->scalar_type() == in.kv_cache.scalar_type(), op,
                ": kpe_cache must have kv_cache's dtype ", in.kv_cache.scalar_type(),
                " (one kv_scale for both), got ", in.kpe_cache->scalar_type());
  } else {
    check_cache(op, "kv_cache", in.kv_cache, row_dims, L + R,
                "kv_c.size(-1) + k_pe.size(-1) (kv_lora_rank + rope_dim: rows [kv_c | k_pe])",
                in.kv_c, "kv_c", "kv_scale", in.kv_scale);
  }
  // v: FlashInfer's GQA rows (key parts with heads) only.
  TORCH_CHECK(given(in.v) == given(in.v_cache), op, ": v and v_cache go together, got v ",
              given(in.v) ? "a tensor" : "None", " and v_cache ",
              given(in.v_cache) ? "a tensor" : "None");
  if (given(in.v)) {
    TORCH_CHECK(key_dims == 3, op,
                ": v (and v_cache) need key parts with a heads dim (k_pe of shape (num_tokens, "
                "num_heads, rope_dim)); MLA's single latent head has no v, got k_pe of shape ",
                in.k_pe.sym_sizes());
    check_key_part(op, "v", *in.v, 3, q_pe);
    TORCH_SYM_CHECK(in.v->sym_size(1).sym_eq(in.k_pe.sym_size(1)), op,
                    ": v must have k_pe's head count k_pe.size(1) = ", in.k_pe.sym_size(1),
                    ", got v of shape ", in.v->sym_sizes());
    check_cache(op, "v_cache", *in.v_cache, 2, in.v->sym_size(-1), "v.size(-1)", *in.v, "v",
                "v_scale", in.v_scale);
    check_same_slots(op, "v_cache", *in.v_cache, in.kv_cache, 2);
  } else {
    TORCH_CHECK(!given(in.v_scale), op, ": v_scale given without v_cache");
  }
  // q's outputs.
  const at::ScalarType dtype = in.q_dtype.value_or(q_pe.scalar_type());
  TORCH_CHECK(dtype == q_pe.scalar_type() || is_fp8(dtype), op, ": q_dtype must be q_pe's dtype ",
              q_pe.scalar_type(), " or float8 (torch.float8_e4m3fn, torch.float8_e5m2), got ",
              dtype);
  if (is_fp8(dtype)) {
    check_scale_tensor(op, "q_scale", in.q_scale, q_pe.device());
  } else {
    TORCH_CHECK(!given(in.q_scale), op, ": q_scale applies to a float8 q_dtype only; the q ",
                "outputs are ", dtype, " (stored unscaled), so pass q_scale=None");
  }
  // What the caches must not share memory with: every input, and each other (two column slices
  // of one cache, FlashInfer's [k_rope | k_nope] rows, do not overlap).
  NamedTensors written = {{"kv_cache", &in.kv_cache}};
  if (given(in.kpe_cache)) {
    written.emplace_back("kpe_cache", &*in.kpe_cache);
  }
  if (given(in.v_cache)) {
    written.emplace_back("v_cache", &*in.v_cache);
  }
  NamedTensors read = {{"q_pe", &q_pe},         {"k_pe", &in.k_pe}, {"kv_c", &in.kv_c},
                       {"cos", &in.cos},        {"sin", &in.sin},   {"positions", &in.positions},
                       {"slot_mapping", &slots}};
  const std::pair<const char*, const std::optional<at::Tensor>*> optional_reads[] = {
      {"q_nope", &in.q_nope},
      {"v", &in.v},
      {"kv_scale", &in.kv_scale},
      {"v_scale", &in.v_scale},
      {"q_scale", &in.q_scale}};
  for (const auto& [name, t] : optional_reads) {
    if (given(*t)) {
      read.emplace_back(name, &**t);
    }
  }
  check_writes_disjoint(op, written, read);
  return dtype;
}

int64_t mla_cache_slots(const MlaInputs& in) { return slots_of(in.kv_cache, in.k_pe.dim() - 1); }

std::tuple<at::Tensor, at::Tensor> new_mla_outputs(const MlaInputs& in, at::ScalarType dtype) {
  at::Tensor q_pe_out = new_stream_output(in.q_pe, in.q_pe.sym_sizes(), dtype);
  if (given(in.q_nope)) {
    return {q_pe_out, new_stream_output(*in.q_nope, in.q_nope->sym_sizes(), dtype)};
  }
  const c10::SymInt sizes[] = {in.q_pe.sym_size(0), in.q_pe.sym_size(1), c10::SymInt(0)};
  return {q_pe_out, new_stream_output(in.q_pe, sizes, dtype)};
}

PreparedStreams prepare_mla(const MlaInputs& in, const at::Tensor& q_pe_out,
                            const at::Tensor& q_nope_out, bool interleaved,
                            bool multiply_by_scale) {
  const ScaleRule rule = multiply_by_scale ? ScaleRule::kMultiply : ScaleRule::kDivide;
  const int64_t rotary_dim = 2 * in.cos.size(1);
  const int64_t row_dims = in.k_pe.dim() - 1;
  PreparedStreams p;
  const PositionStrides pos =
      p.begin(in.cos, in.sin, in.positions, {}, in.q_pe.size(0), interleaved, in.slot_mapping);
  p.add(in.q_pe, rotary_dim, pos, tensor_target(q_pe_out, in.q_scale, rule));
  if (given(in.q_nope)) {
    p.add(*in.q_nope, 0, pos, tensor_target(q_nope_out, in.q_scale, rule));
  }
  if (given(in.kpe_cache)) {
    p.add(in.kv_c, 0, pos, cache_target(in.kv_cache, row_dims, 0, in.kv_scale, rule));
    p.add(in.k_pe, rotary_dim, pos, cache_target(*in.kpe_cache, row_dims, 0, in.kv_scale, rule));
  } else {
    const int64_t L = in.kv_c.size(-1);
    p.add(in.kv_c, 0, pos, cache_target(in.kv_cache, row_dims, 0, in.kv_scale, rule));
    p.add(in.k_pe, rotary_dim, pos, cache_target(in.kv_cache, row_dims, L, in.kv_scale, rule));
  }
  if (given(in.v)) {
    p.add(*in.v, 0, pos, cache_target(*in.v_cache, 2, 0, in.v_scale, rule));
  }
  return p;
}

}  // namespace rope::detail
