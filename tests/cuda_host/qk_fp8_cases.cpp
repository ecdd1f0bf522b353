// SPDX-License-Identifier: BSD-3-Clause
// Host-run cases of rope.apply_qk_fp8, rope.apply_qk_fp8.out and rope.apply_qk_fp8_dynamic
// (serving_cases.h).
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch_rope/ops.h>

#include <limits>
#include <optional>
#include <sstream>
#include <vector>

#include "host_backend.h"
#include "serving_cases.h"

namespace rope_host {
namespace {

// Multi-axis positions: sections of `planes` over 1 to 4 axes (some empty), Qwen3-VL's
// interleaved rule sometimes, positions (T, H?, A) with the axis dim innermost or outermost.
struct Axes {
  std::vector<int64_t> section;
  bool interleaved = false;
};

Axes random_axes(Draw& d, int64_t planes) {
  Axes a;
  const int64_t n = 1 + d.pick(4);
  int64_t left = planes;
  for (int64_t i = 0; i + 1 < n; ++i) {
    const int64_t s = d.pick(left + 1);
    a.section.push_back(s);
    left -= s;
  }
  a.section.push_back(left);
  a.interleaved = n == 3 && d.one_in(2);
  return a;
}

at::Tensor random_positions(Draw& d, int64_t T, int64_t H, int64_t max_seq_len, const Axes* axes,
                            bool per_head) {
  const auto dtype = d.one_in(3) ? at::kInt : at::kLong;
  const auto opts = at::TensorOptions().dtype(dtype);
  const int64_t cols = per_head ? H : 1;
  if (axes == nullptr) {
    return at::randint(0, max_seq_len, {T, cols}, d.gen, opts);
  }
  const int64_t A = static_cast<int64_t>(axes->section.size());
  if (d.one_in(2)) {  // axis first in memory, as HF's (3, B, S) position ids permuted
    return at::randint(0, max_seq_len, {A, T, cols}, d.gen, opts).permute({1, 2, 0});
  }
  return at::randint(0, max_seq_len, {T, cols, A}, d.gen, opts);
}

std::optional<at::Tensor> random_scale(Draw& d) {
  const float scales[] = {1.0f, 0.37f, 2.5f, 0.0173f, 7.0f};
  if (d.one_in(4)) {
    return std::nullopt;
  }
  const at::Tensor s = at::full({}, scales[d.pick(5)], at::TensorOptions().dtype(at::kFloat));
  return d.one_in(2) ? s : s.view({1});
}

std::string one_qk_fp8_case(uint64_t seed, int64_t index, const CpuVectorPath& cpu_path,
                            std::vector<std::string>& problems, ServingRun& run) {
  Draw d(seed, 1, index);
  const at::ScalarType dtypes[] = {at::kFloat, at::kHalf, at::kBFloat16, at::kDouble};
  const at::ScalarType dtype = dtypes[d.pick(4)];
  const bool interleaved = d.one_in(2);
  const int64_t T = d.one_in(8) ? 0 : d.one_in(6) ? 40 + d.pick(30) : 1 + d.pick(9);
  const int64_t Hk = 1 + d.pick(3);
  const int64_t Hq = Hk * (1 + d.pick(3));
  // Rotary dims whose lanes are whole (the vector path) and others (the scalar path).
  const int64_t rotary_dims[] = {0, 16, 32, 64, 96, 128, 6, 18, 40};
  const int64_t R = rotary_dims[d.pick(9)];
  const int64_t tails[] = {0, 0, 16, 2, 6, 32};
  const int64_t D = R + tails[d.pick(6)];
  const int64_t nope_dims[] = {-1, -1, 16, 64, 7, 0};
  const int64_t Nq = nope_dims[d.pick(6)];
  const int64_t Nk = nope_dims[d.pick(6)];
  const at::ScalarType fp8 = d.one_in(2) ? at::kFloat8_e4m3fn : at::kFloat8_e5m2;
  const bool multiply = d.one_in(2);
  const bool functional = d.one_in(2);
  const bool explicit_dtype = d.one_in(2);
  const bool tables_double = d.one_in(4);
  // From the case's index, not drawn: the draws after this one (and the cases they make) stay.
  const bool inverse = index % 3 == 2;

  std::string q_layout, k_layout;
  const at::Tensor q = random_rows(d, T, Hq, D, dtype, q_layout);
  const at::Tensor k = random_rows(d, T, Hk, D, dtype, k_layout);
  std::string layout;
  const std::optional<at::Tensor> q_nope =
      Nq >= 0 ? std::optional<at::Tensor>(random_rows(d, T, Hq, Nq, dtype, layout)) : std::nullopt;
  const std::optional<at::Tensor> k_nope =
      Nk >= 0 ? std::optional<at::Tensor>(random_rows(d, T, Hk, Nk, dtype, layout)) : std::nullopt;
  const int64_t max_seq_len = 1 + d.pick(48);
  at::Tensor cos, sin;
  random_tables(d, max_seq_len, R, tables_double ? at::kDouble : at::kFloat, cos, sin);
  const std::optional<Axes> axes =
      R > 0 && d.one_in(4) ? std::optional<Axes>(random_axes(d, R / 2)) : std::nullopt;
  const bool per_head = Hq == Hk && d.one_in(3);
  const at::Tensor positions =
      random_positions(d, T, Hq, max_seq_len, axes ? &*axes : nullptr, per_head);
  const std::optional<at::Tensor> q_scale = random_scale(d);
  const std::optional<at::Tensor> k_scale = random_scale(d);
  const at::OptionalIntArrayRef section =
      axes ? at::OptionalIntArrayRef(axes->section) : at::OptionalIntArrayRef(std::nullopt);
  const bool section_interleaved = axes && axes->interleaved;
  // rope.apply_qk_fp8_dynamic (scales from the rows; no nope parts, no static scales), with rows
  // that meet the scales' edges now and then: all zero, tiny (the scale subnormal), an inf, a NaN.
  const bool dynamic = d.one_in(3);
  const bool per_token = d.one_in(2);
  const bool pow2 = d.one_in(2);
  const bool edge_rows = dynamic && T > 0 && d.one_in(2);
  if (edge_rows) {
    const double edges[] = {0.0, 1e-41, std::numeric_limits<double>::infinity(),
                            std::numeric_limits<double>::quiet_NaN(), -3e4};
    for (int i = 0; i < 3; ++i) {
      at::Tensor x = d.one_in(2) ? q : k;
      if (x.size(1) == 0 || x.size(2) == 0) {
        continue;
      }
      at::Tensor row = x.select(0, d.pick(T)).select(0, d.pick(x.size(1)));
      const double e = edges[d.pick(5)];
      if (e == 0.0 || e == 1e-41 || d.one_in(2)) {
        row.fill_(e == 1e-41 && dtype != at::kDouble ? 1e-38 : e);  // below 448 * 2^-126
      } else {
        row.select(0, d.pick(row.size(0))).fill_(e);
      }
    }
  }

  std::ostringstream described;
  described << c10::toString(dtype) << (tables_double ? " (double tables)" : "") << " q"
            << q.sizes() << " (" << q_layout << ") k" << k.sizes() << " (" << k_layout
            << "), rotary_dim " << R << (interleaved ? ", interleaved" : ", half split")
            << (inverse ? ", inverse" : "") << ", q_nope " << Nq << ", k_nope " << Nk << ", "
            << c10::toString(fp8) << (multiply ? " multiply" : " divide")
            << (functional ? ", functional" : ", out=") << ", positions " << positions.sizes()
            << (axes ? ", mrope " + c10::str(at::IntArrayRef(axes->section)) : std::string());

  CaseContext ctx;
  ctx.device = Device{static_cast<int>(d.pick(68)), 1 + static_cast<int>(d.pick(7))};
  ctx.start_device = (ctx.device.ordinal + 1 + static_cast<int>(index % 5)) % 68;
  std::vector<at::Tensor> inputs = {q, k, cos, sin, positions};
  for (const auto* t : {&q_nope, &k_nope, &q_scale, &k_scale}) {
    if (t->has_value()) {
      inputs.push_back(**t);
    }
  }
  std::vector<at::Tensor> before;
  for (const at::Tensor& t : inputs) {
    ctx.place(t);
    before.push_back(t.clone());
  }

  if (dynamic) {
    described << ", dynamic " << (per_token ? "per-token" : "per-row") << (pow2 ? " pow2" : "")
              << (edge_rows ? ", edge rows" : "") << (functional ? "" : ", out=");
  }

  NamedTensors got, want;
  try {
    if (dynamic && !functional) {
      // The out= overload: padded fp8 rows and padded (maybe strided) float32 scales.
      const int64_t sq = per_token ? 1 : Hq;
      const int64_t sk = per_token ? 1 : Hk;
      const Buffered q_out = padded(d, q.sizes(), fp8, true);
      const Buffered k_out = padded(d, k.sizes(), fp8, true);
      const Buffered qs_out = padded(d, {T, sq, 1}, at::kFloat, false);
      const Buffered ks_out = padded(d, {T, sk, 1}, at::kFloat, false);
      const Buffered cq = copy_of(q_out), ck = copy_of(k_out);
      const Buffered cqs = copy_of(qs_out), cks = copy_of(ks_out);
      at::Tensor cq_view = cq.view, ck_view = ck.view, cqs_view = cqs.view, cks_view = cks.view;
      rope::apply_qk_fp8_dynamic_out(cq_view, ck_view, cqs_view, cks_view, q, k, cos, sin,
                                     positions, interleaved, per_token, pow2, section,
                                     section_interleaved, inverse);
      for (const Buffered* b : {&q_out, &k_out, &qs_out, &ks_out}) {
        ctx.place(b->buffer);
      }
      host_apply_qk_fp8_dynamic_out(ctx, q, k, cos, sin, positions, interleaved, per_token, pow2,
                                    section, section_interleaved, inverse, q_out.view, k_out.view,
                                    qs_out.view, ks_out.view);
      got = {{"q_out buffer", q_out.buffer},
             {"k_out buffer", k_out.buffer},
             {"q_scale_out buffer", qs_out.buffer},
             {"k_scale_out buffer", ks_out.buffer}};
      want = {{"q_out buffer", cq.buffer},
              {"k_out buffer", ck.buffer},
              {"q_scale_out buffer", cqs.buffer},
              {"k_scale_out buffer", cks.buffer}};
    } else if (dynamic) {
      const std::optional<at::ScalarType> asked =
          fp8 != at::kFloat8_e4m3fn ? std::optional<at::ScalarType>(fp8) : std::nullopt;
      const auto cpu =
          rope::apply_qk_fp8_dynamic(q, k, cos, sin, positions, asked, interleaved, per_token, pow2,
                                     section, section_interleaved, inverse);
      const auto host =
          host_apply_qk_fp8_dynamic(ctx, q, k, cos, sin, positions, asked, interleaved, per_token,
                                    pow2, section, section_interleaved, inverse);
      want = {{"q_out", std::get<0>(cpu)},
              {"k_out", std::get<1>(cpu)},
              {"q_scale", std::get<2>(cpu)},
              {"k_scale", std::get<3>(cpu)}};
      got = {{"q_out", std::get<0>(host)},
             {"k_out", std::get<1>(host)},
             {"q_scale", std::get<2>(host)},
             {"k_scale", std::get<3>(host)}};
    } else if (functional) {
      const std::optional<at::ScalarType> asked = explicit_dtype || fp8 != at::kFloat8_e4m3fn
                                                      ? std::optional<at::ScalarType>(fp8)
                                                      : std::nullopt;
      const auto cpu =
          rope::apply_qk_fp8(q, k, cos, sin, positions, q_nope, k_nope, q_scale, k_scale, asked,
                             interleaved, multiply, section, section_interleaved, inverse);
      const auto host =
          host_apply_qk_fp8(ctx, q, k, cos, sin, positions, q_nope, k_nope, q_scale, k_scale, asked,
                            interleaved, multiply, section, section_interleaved, inverse);
      want = {{"q_out", std::get<0>(cpu)},
              {"k_out", std::get<1>(cpu)},
              {"q_nope_out", std::get<2>(cpu)},
              {"k_nope_out", std::get<3>(cpu)}};
      got = {{"q_out", std::get<0>(host)},
             {"k_out", std::get<1>(host)},
             {"q_nope_out", std::get<2>(host)},
             {"k_nope_out", std::get<3>(host)}};
    } else {
      const Buffered q_out = padded(d, q.sizes(), fp8, true);
      const Buffered k_out = padded(d, k.sizes(), fp8, true);
      std::optional<Buffered> qn_out, kn_out;
      if (q_nope) {
        qn_out = padded(d, q_nope->sizes(), fp8, true);
      }
      if (k_nope) {
        kn_out = padded(d, k_nope->sizes(), fp8, true);
      }
      const auto view = [](const std::optional<Buffered>& b) {
        return b ? std::optional<at::Tensor>(b->view) : std::nullopt;
      };
      const Buffered cq = copy_of(q_out), ck = copy_of(k_out);
      const std::optional<Buffered> cqn =
          qn_out ? std::optional<Buffered>(copy_of(*qn_out)) : std::nullopt;
      const std::optional<Buffered> ckn =
          kn_out ? std::optional<Buffered>(copy_of(*kn_out)) : std::nullopt;
      at::Tensor cq_view = cq.view, ck_view = ck.view;
      rope::apply_qk_fp8_out(cq_view, ck_view, view(cqn), view(ckn), q, k, cos, sin, positions,
                             q_nope, k_nope, q_scale, k_scale, interleaved, multiply, section,
                             section_interleaved, inverse);
      for (const Buffered* b : {&q_out, &k_out}) {
        ctx.place(b->buffer);
      }
      for (const auto* b : {&qn_out, &kn_out}) {
        if (b->has_value()) {
          ctx.place((*b)->buffer);
        }
      }
      host_apply_qk_fp8_out(ctx, q, k, cos, sin, positions, q_nope, k_nope, q_scale, k_scale,
                            interleaved, multiply, section, section_interleaved, q_out.view,
                            k_out.view, view(qn_out), view(kn_out), inverse);
      got = {{"q_out buffer", q_out.buffer}, {"k_out buffer", k_out.buffer}};
      want = {{"q_out buffer", cq.buffer}, {"k_out buffer", ck.buffer}};
      if (qn_out) {
        got.emplace_back("q_nope_out buffer", qn_out->buffer);
        want.emplace_back("q_nope_out buffer", cqn->buffer);
      }
      if (kn_out) {
        got.emplace_back("k_nope_out buffer", kn_out->buffer);
        want.emplace_back("k_nope_out buffer", ckn->buffer);
      }
    }
  } catch (const c10::Error& e) {
    problems.push_back(std::string("raised: ") + e.what_without_backtrace());
    return described.str();
  }
  finish_case(problems, got, want, inputs, before, ctx.problems, ctx.grid_launches.size(), T, run);

  const auto hit = [&](const std::string& what, bool cond) { run.coverage[what] += cond ? 1 : 0; };
  bool vector = false, scalar = false;
  for (const auto& paths : ctx.stream_vector_paths) {
    for (bool v : paths) {
      vector = vector || v;
      scalar = scalar || !v;
    }
  }
  hit("qk_fp8: a stream on the vector path", vector);
  hit("qk_fp8: a stream on the scalar path", scalar);
  hit("qk_fp8: out=", !functional && !dynamic);
  hit("qk_fp8 dynamic: out=", dynamic && !functional && T > 0);
  hit("qk_fp8: multiply by the scale", multiply);
  hit("qk_fp8: float8_e5m2", fp8 == at::kFloat8_e5m2);
  hit("qk_fp8: nope parts", q_nope.has_value() && k_nope.has_value());
  hit("qk_fp8: multi-axis positions", axes.has_value());
  hit("qk_fp8: half split", !interleaved);
  hit("qk_fp8: float64", dtype == at::kDouble);
  hit("qk_fp8: float64 tables", tables_double);
  hit("qk_fp8: the inverse rotation", inverse && R > 0 && T > 0);
  hit("qk_fp8 dynamic: per-row scales", dynamic && !per_token && T > 0);
  hit("qk_fp8 dynamic: per-token scales", dynamic && per_token && T > 0);
  hit("qk_fp8 dynamic: power-of-two scales", dynamic && pow2 && T > 0);
  hit("qk_fp8 dynamic: edge rows", edge_rows);
  hit("qk_fp8 dynamic: a per-token group of more than 16 lanes",
      dynamic && per_token && Hq * D > 16 * 16);
  (void)cpu_path;
  return described.str();
}

}  // namespace

ServingRun run_qk_fp8_cases(uint64_t seed, int64_t count, int64_t only, int64_t max_failures,
                            bool verbose, const CpuVectorPath& cpu_path) {
  ServingRun run;
  if (!cpu_path.fused) {
    run.bit_exact = false;
    return run;
  }
  run_family("apply_qk_fp8", "--qk-fp8-only", seed, count, only, max_failures, verbose, run,
             [&](int64_t i, std::vector<std::string>& problems, bool) {
               return one_qk_fp8_case(seed, i, cpu_path, problems, run);
             });
  return run;
}

}  // namespace rope_host
