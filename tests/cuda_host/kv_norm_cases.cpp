// SPDX-License-Identifier: BSD-3-Clause
// Host-run cases of the KV-cache writes on the row streams (serving_cases.h):
// rope.rms_norm_apply_qk_cache (QK-RMSNorm + RoPE + cache write; q in its dtype or float8) and
// rope.apply_qk_cache with multi-axis positions, over flat or paged caches of random bits,
// 16/32-bit or float8, with or without v, padding slots, runs or interleaved M-RoPE sections.
// Every byte of every cache buffer is held to the CPU backend's.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch_rope/ops.h>

#include <optional>
#include <sstream>
#include <vector>

#include "host_backend.h"
#include "serving_cases.h"

namespace rope_host {
namespace {

// A random M-RoPE section of `planes` planes over 1 to 3 axes (interleaved sections: 3, time,
// height and width).
std::vector<int64_t> random_section(Draw& d, int64_t planes, bool interleaved) {
  const int64_t axes = interleaved ? 3 : 1 + d.pick(3);
  std::vector<int64_t> section(axes, planes / axes);
  section[0] += planes - (planes / axes) * axes;
  return section;
}

std::string one_kv_norm_case(uint64_t seed, int64_t index, std::vector<std::string>& problems,
                             ServingRun& run) {
  Draw d(seed, 4, index);
  const at::ScalarType dtypes[] = {at::kFloat, at::kHalf, at::kBFloat16, at::kDouble};
  const at::ScalarType dtype = dtypes[d.pick(4)];
  const bool norm = !d.one_in(3);  // rms_norm_apply_qk_cache; else apply_qk_cache (multi-axis)
  const bool interleaved = d.one_in(2);
  const int64_t T = d.one_in(8) ? 0 : d.one_in(6) ? 40 + d.pick(30) : 1 + d.pick(9);
  const int64_t Hk = 1 + d.pick(3);
  const int64_t Hq = Hk * (1 + d.pick(3));
  const int64_t head_dims[] = {64, 128, 80, 36, 16};
  const int64_t D = head_dims[d.pick(5)];
  const int64_t rotary_dim = d.one_in(3) ? D / 2 - (D / 2) % 2 : D;
  const int64_t Dv = 8 * (1 + d.pick(4));
  const bool with_v = !d.one_in(4);
  const bool multi_axis = !norm || d.one_in(2);
  const bool mrope_interleaved = multi_axis && d.one_in(2);
  const std::vector<int64_t> section =
      multi_axis ? random_section(d, rotary_dim / 2, mrope_interleaved) : std::vector<int64_t>{};
  const int64_t block_size = d.one_in(2) ? 1 + d.pick(8) : 0;
  const int64_t num_slots =
      (block_size > 0 ? block_size : 1) * (1 + (T + 4) / std::max<int64_t>(block_size, 1));
  const at::ScalarType fp8 = d.one_in(2) ? at::kFloat8_e4m3fn : at::kFloat8_e5m2;
  const bool cache_fp8 = d.one_in(2);
  const at::ScalarType cache_dtype = cache_fp8 ? fp8 : dtype;
  const bool q_fp8 = norm && d.one_in(3);
  const double eps = d.one_in(2) ? 1e-6 : 1e-5;
  const double weight_offset = d.one_in(3) ? 1.0 : 0.0;

  std::string layout;
  const at::Tensor q = random_rows(d, T, Hq, D, dtype, layout);
  const at::Tensor k = random_rows(d, T, Hk, D, dtype, layout);
  const std::optional<at::Tensor> v =
      with_v ? std::optional<at::Tensor>(random_rows(d, T, Hk, Dv, dtype, layout)) : std::nullopt;
  const auto weight_options = at::TensorOptions().dtype(d.one_in(2) ? dtype : at::kFloat);
  const at::Tensor q_weight = at::rand({D}, d.gen, weight_options) + 0.5;
  const at::Tensor k_weight = at::rand({D}, d.gen, weight_options) + 0.5;
  const int64_t max_seq_len = 1 + d.pick(48);
  at::Tensor cos, sin;
  random_tables(d, max_seq_len, rotary_dim, d.one_in(4) ? at::kDouble : at::kFloat, cos, sin);
  const auto pos_options = at::TensorOptions().dtype(d.one_in(3) ? at::kInt : at::kLong);
  const at::Tensor positions =
      multi_axis ? at::randint(0, max_seq_len, {T, 1, static_cast<int64_t>(section.size())}, d.gen,
                               pos_options)
                 : at::randint(0, max_seq_len, {T, 1}, d.gen, pos_options);
  const at::Tensor perm = at::randperm(num_slots, d.gen, at::TensorOptions().dtype(at::kLong));
  at::Tensor slots = perm.narrow(0, 0, T).clone();
  if (T > 0) {
    slots.masked_fill_(at::rand({T}, d.gen, at::TensorOptions().dtype(at::kDouble)) < 0.2, -1);
  }
  const auto cache_sizes = [&](int64_t W) {
    return block_size > 0 ? std::vector<int64_t>{num_slots / block_size, block_size, Hk, W}
                          : std::vector<int64_t>{num_slots, Hk, W};
  };
  std::vector<Buffered> originals = {
      padded(d, cache_sizes(D), cache_dtype, /*allow_misaligned=*/true)};
  if (with_v) {
    originals.push_back(padded(d, cache_sizes(Dv), cache_dtype, /*allow_misaligned=*/true));
  }
  const std::optional<at::Tensor> k_scale = random_fp8_scale(d, cache_fp8);
  const std::optional<at::Tensor> v_scale = with_v ? random_fp8_scale(d, cache_fp8) : std::nullopt;
  const std::optional<at::ScalarType> q_dtype =
      q_fp8 ? std::optional<at::ScalarType>(fp8) : std::nullopt;
  const std::optional<at::Tensor> q_scale = random_fp8_scale(d, q_fp8);
  const at::OptionalIntArrayRef mrope =
      multi_axis ? at::OptionalIntArrayRef(section) : at::OptionalIntArrayRef();

  std::ostringstream described;
  described << (norm ? "rms_norm_apply_qk_cache " : "apply_qk_cache ") << c10::toString(dtype)
            << " q" << q.sizes() << " k" << k.sizes() << (with_v ? " v" : "") << " rotary "
            << rotary_dim << (multi_axis ? ", M-RoPE" : "")
            << (mrope_interleaved ? " interleaved" : "")
            << (block_size > 0 ? ", paged block " + std::to_string(block_size) : ", flat") << ", "
            << c10::toString(cache_dtype) << (q_fp8 ? ", q float8" : "")
            << (interleaved ? ", interleaved" : ", half split");

  CaseContext ctx;
  ctx.device = Device{static_cast<int>(d.pick(68)), 1 + static_cast<int>(d.pick(7))};
  ctx.start_device = (ctx.device.ordinal + 1 + static_cast<int>(index % 5)) % 68;
  std::vector<at::Tensor> inputs = {q, k, q_weight, k_weight, cos, sin, positions, slots};
  for (const auto* t : {&v, &k_scale, &v_scale, &q_scale}) {
    if (t->has_value()) {
      inputs.push_back(**t);
    }
  }
  std::vector<at::Tensor> before;
  for (const at::Tensor& t : inputs) {
    ctx.place(t);
    before.push_back(t.clone());
  }
  std::vector<Buffered> copies;
  for (const Buffered& b : originals) {
    copies.push_back(copy_of(b));
  }
  at::Tensor cpu_k = copies[0].view;
  const std::optional<at::Tensor> cpu_v =
      with_v ? std::optional<at::Tensor>(copies[1].view) : std::nullopt;
  const std::optional<at::Tensor> host_v =
      with_v ? std::optional<at::Tensor>(originals[1].view) : std::nullopt;

  NamedTensors got, want;
  try {
    at::Tensor cpu_q, host_q;
    if (norm) {
      cpu_q = rope::rms_norm_apply_qk_cache(q, k, v, q_weight, k_weight, cos, sin, positions, cpu_k,
                                            cpu_v, slots, eps, weight_offset, interleaved, k_scale,
                                            v_scale, q_dtype, q_scale, mrope, mrope_interleaved);
    } else {
      cpu_q = rope::apply_qk_cache(q, k, v, cos, sin, positions, cpu_k, cpu_v, slots, interleaved,
                                   k_scale, v_scale, mrope, mrope_interleaved);
    }
    for (const Buffered& b : originals) {
      ctx.place(b.buffer);
    }
    if (norm) {
      host_q = host_rms_norm_apply_qk_cache(ctx, q, k, v, q_weight, k_weight, cos, sin, positions,
                                            originals[0].view, host_v, slots, eps, weight_offset,
                                            interleaved, k_scale, v_scale, q_dtype, q_scale, mrope,
                                            mrope_interleaved);
    } else {
      host_q = host_apply_qk_cache(ctx, q, k, v, cos, sin, positions, originals[0].view, host_v,
                                   slots, interleaved, k_scale, v_scale, mrope, mrope_interleaved);
    }
    want = {{"q_out", cpu_q}};
    got = {{"q_out", host_q}};
    for (size_t i = 0; i < originals.size(); ++i) {
      got.emplace_back(i == 0 ? "k cache buffer" : "v cache buffer", originals[i].buffer);
      want.emplace_back(i == 0 ? "k cache buffer" : "v cache buffer", copies[i].buffer);
    }
  } catch (const c10::Error& e) {
    problems.push_back(std::string("raised: ") + e.what_without_backtrace());
    return described.str();
  }
  finish_case(problems, got, want, inputs, before, ctx.problems, ctx.grid_launches.size(), T, run);

  const auto hit = [&](const std::string& what, bool cond) { run.coverage[what] += cond ? 1 : 0; };
  hit("kv streams: rms_norm_apply_qk_cache", norm);
  hit("kv streams: apply_qk_cache, multi-axis", !norm);
  hit("kv streams: M-RoPE interleaved", mrope_interleaved);
  hit("kv streams: paged", block_size > 0);
  hit("kv streams: float8 cache", cache_fp8);
  hit("kv streams: float8 q", q_fp8);
  hit("kv streams: no v", !with_v);
  hit("kv streams: padding slots", T > 0 && slots.lt(0).any().item<bool>());
  return described.str();
}

}  // namespace

ServingRun run_kv_norm_cases(uint64_t seed, int64_t count, int64_t only, int64_t max_failures,
                             bool verbose, const CpuVectorPath& cpu_path) {
  ServingRun run;
  if (!cpu_path.fused) {
    run.bit_exact = false;
    return run;
  }
  run_family("KV-cache streams", "--kv-norm-only", seed, count, only, max_failures, verbose, run,
             [&](int64_t i, std::vector<std::string>& problems, bool) {
               return one_kv_norm_case(seed, i, problems, run);
             });
  return run;
}

}  // namespace rope_host
