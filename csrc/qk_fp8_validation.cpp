// SPDX-License-Identifier: BSD-3-Clause
#include <ATen/EmptyTensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/SymBool.h>
#include <c10/util/Exception.h>

#include "common_optional.h"
#include "qk_fp8_body.h"
#include "rope_validation.h"

namespace rope::detail {
void check_apply_qk_fp8(const char* op, const QkFp8Inputs& in) {
  // The (T, H, D) shapes first: a wrong rank would otherwise surface as a positions mismatch.
  if (in.q.defined() && in.k.defined()) {
    TORCH_CHECK(in.q.dim() == 3, op,
                ": q must be 3-D (num_tokens, num_heads, head_dim), got shape ", in.q.sym_sizes());
    TORCH_CHECK(in.k.dim() == 3, op,
                ": k must be 3-D (num_tokens, num_heads, head_dim), got shape ", in.k.sym_sizes());
    TORCH_SYM_CHECK(in.k.sym_size(0).sym_eq(in.q.sym_size(0)), op,
                    ": k.size(0) (tokens) must equal q.size(0) = ", in.q.sym_size(0),
                    ", got k of shape ", in.k.sym_sizes());
  }
  check_apply_qk(op, in.q, in.k, in.cos, in.sin, in.positions, in.axes);
  if (given(in.q_nope)) {
    check_row_tensor(op, "q_nope", *in.q_nope, "q", in.q);
    TORCH_SYM_CHECK(in.q_nope->sym_size(1).sym_eq(in.q.sym_size(1)), op,
                    ": q_nope must have q's head count q.size(1) = ", in.q.sym_size(1),
                    ", got q_nope of shape ", in.q_nope->sym_sizes());
  }
  if (given(in.k_nope)) {
    check_row_tensor(op, "k_nope", *in.k_nope, "k", in.k);
    TORCH_SYM_CHECK(in.k_nope->sym_size(1).sym_eq(in.k.sym_size(1)), op,
                    ": k_nope must have k's head count k.size(1) = ", in.k.sym_size(1),
                    ", got k_nope of shape ", in.k_nope->sym_sizes());
  }
  check_scale_tensor(op, "q_scale", in.q_scale, in.q.device());
  check_scale_tensor(op, "k_scale", in.k_scale, in.q.device());
}

at::ScalarType qk_fp8_dtype(const char* op, std::optional<at::ScalarType> dtype) {
  const at::ScalarType t = dtype.value_or(at::kFloat8_e4m3fn);
  TORCH_CHECK(is_fp8(t), op,
              ": dtype must be a float8 dtype (torch.float8_e4m3fn or torch.float8_e5m2), got ", t);
  return t;
}

at::ScalarType check_apply_qk_fp8_outputs(const char* op, const QkFp8Inputs& in,
                                          const QkFp8Outputs& out) {
  TORCH_CHECK(out.q_out.defined(), op, ": q_out must be a tensor, got None");
  const at::ScalarType dtype = out.q_out.scalar_type();
  TORCH_CHECK(is_fp8(dtype), op,
              ": q_out must be float8 (torch.float8_e4m3fn or torch.float8_e5m2), got ", dtype);
  check_fp8_output(op, "q_out", out.q_out, dtype, "q", in.q);
  check_fp8_output(op, "k_out", out.k_out, dtype, "k", in.k);
  const auto pair = [&](const char* out_name, const at::Tensor& o, const char* in_name,
                        const std::optional<at::Tensor>& x) {
    TORCH_CHECK(o.defined() == given(x), op, ": ", out_name, " goes with ", in_name, ", got ",
                in_name, given(x) ? " a tensor" : " None", " and ", out_name,
                o.defined() ? " a tensor" : " None");
    if (o.defined()) {
      check_fp8_output(op, out_name, o, dtype, in_name, *x);
    }
  };
  pair("q_nope_out", out.q_nope_out, "q_nope", in.q_nope);
  pair("k_nope_out", out.k_nope_out, "k_nope", in.k_nope);
  NamedTensors written = {{"q_out", &out.q_out}, {"k_out", &out.k_out}};
  if (out.q_nope_out.defined()) {
    written.emplace_back("q_nope_out", &out.q_nope_out);
  }
  if (out.k_nope_out.defined()) {
    written.emplace_back("k_nope_out", &out.k_nope_out);
  }
  NamedTensors read = {
      {"q", &in.q}, {"k", &in.k}, {"cos", &in.cos}, {"sin", &in.sin}, {"positions", &in.positions}};
  const std::pair<const char*, const std::optional<at::Tensor>*> optional_reads[] = {
      {"q_nope", &in.q_nope},
      {"k_nope", &in.k_nope},
      {"q_scale", &in.q_scale},
      {"k_scale", &in.k_scale}};
  for (const auto& [name, t] : optional_reads) {
    if (given(*t)) {
      read.emplace_back(name, &**t);
    }
  }
  check_writes_disjoint(op, written, read);
  return dtype;
}

QkFp8Outputs new_qk_fp8_outputs(const QkFp8Inputs& in, at::ScalarType dtype) {
  QkFp8Outputs out;
  out.q_out = new_stream_output(in.q, in.q.sym_sizes(), dtype);
  out.k_out = new_stream_output(in.k, in.k.sym_sizes(), dtype);
  const auto nope = [&](const std::optional<at::Tensor>& x, const at::Tensor& like) {
    if (given(x)) {
      return new_stream_output(*x, x->sym_sizes(), dtype);
    }
    const c10::SymInt sizes[] = {like.sym_size(0), like.sym_size(1), c10::SymInt(0)};
    return new_stream_output(like, sizes, dtype);
  };
  out.q_nope_out = nope(in.q_nope, in.q);
  out.k_nope_out = nope(in.k_nope, in.k);
  return out;
}

PreparedStreams prepare_qk_fp8(const QkFp8Inputs& in, const QkFp8Outputs& out, RotationMode mode,
                               bool multiply_by_scale) {
  const ScaleRule rule = multiply_by_scale ? ScaleRule::kMultiply : ScaleRule::kDivide;
  const int64_t rotary_dim = 2 * in.cos.size(1);
  PreparedStreams p;
  const PositionStrides pos = p.begin(in.cos, in.sin, in.positions, in.axes, in.q.size(0),
                                      mode.interleaved, /*slot_mapping=*/at::Tensor());
  p.args.inverse = mode.inverse;
  p.add(in.q, rotary_dim, pos, tensor_target(out.q_out, in.q_scale, rule));
  p.add(in.k, rotary_dim, pos, tensor_target(out.k_out, in.k_scale, rule));
  if (given(in.q_nope)) {
    p.add(*in.q_nope, 0, pos, tensor_target(out.q_nope_out, in.q_scale, rule));
  }
  if (given(in.k_nope)) {
    p.add(*in.k_nope, 0, pos, tensor_target(out.k_nope_out, in.k_scale, rule));
  }
  return p;
}

QkFp8Scales new_qk_fp8_scales(const QkFp8Inputs& in, bool per_token) {
  const auto scales = [&](const at::Tensor& x) {
    const c10::SymInt sizes[] = {x.sym_size(0), per_token ? c10::SymInt(1) : x.sym_size(1),
                                 c10::SymInt(1)};
    return new_stream_output(x, sizes, at::kFloat);
  };
  return {scales(in.q), scales(in.k)};
}

void check_qk_fp8_scale_outputs(const char* op, const QkFp8Inputs& in, const QkFp8Outputs& out,
                                const QkFp8Scales& scales, bool per_token) {
  const auto check = [&](const char* name, const at::Tensor& s, const char* like_name,
                         const at::Tensor& like) {
    TORCH_CHECK(s.defined(), op, ": ", name, " must be a tensor, got None");
    TORCH_CHECK(s.device() == like.device(), op, ": ", name, " must be on ", like_name,
                "'s device ", like.device(), ", got ", s.device());
    TORCH_CHECK(s.scalar_type() == at::kFloat, op, ": ", name, " must be float32, got ",
                s.scalar_type());
    const c10::SymInt want[] = {like.sym_size(0), per_token ? c10::SymInt(1) : like.sym_size(1),
                                c10::SymInt(1)};
    TORCH_CHECK(s.sym_sizes().equals(want), op, ": ", name, " must have shape ",
                c10::SymIntArrayRef(want),
                per_token ? " (tokens, 1, 1) with per_token" : " (tokens, heads, 1)", ", got ",
                s.sym_sizes(), " (out= never resizes)");
    check_writable_arg(op, name, s);
  };
  check("q_scale_out", scales.q_scale, "q", in.q);
  check("k_scale_out", scales.k_scale, "k", in.k);
  const NamedTensors written = {{"q_out", &out.q_out},
                                {"k_out", &out.k_out},
                                {"q_scale_out", &scales.q_scale},
                                {"k_scale_out", &scales.k_scale}};
  const NamedTensors read = {
      {"q", &in.q}, {"k", &in.k}, {"cos", &in.cos}, {"sin", &in.sin}, {"positions", &in.positions}};
  check_writes_disjoint(op, written, read);
}

void set_dynamic_scales(PreparedStreams& p, const QkFp8Scales& scales, bool per_token, bool pow2) {
  const at::Tensor* of_stream[] = {&scales.q_scale, &scales.k_scale};
  for (int i = 0; i < 2; ++i) {
    StreamTarget& t = p.args.streams[i].target;
    const at::Tensor& s = *of_stream[i];
    t.scales = s.data_ptr<float>();
    t.scale_token_stride = s.stride(0);
    t.scale_head_stride = per_token ? 0 : s.stride(1);
    t.per_token = per_token;
    t.pow2_scale = pow2;
    t.scale = nullptr;
    t.rule = ScaleRule::kDivide;
  }
}

}  // namespace rope::detail
