// SPDX-License-Identifier: BSD-3-Clause
// Host-run cases of rope.mla_apply_cache (serving_cases.h): MLA's one cache of [kv_c | k_pe]
// rows (vLLM) or two caches (FlashInfer's ckv / kpe, sometimes the two column slices of one
// buffer), flat or paged, 16/32-bit or float8 with either scale rule, q outputs in q_pe's dtype or
// float8, padding slots; the key parts with a heads dim and v into a v cache (FlashInfer's split
// GQA rows) too. Every byte of every cache buffer is held to the CPU backend's.
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

// A cache of random bits: (slots, [H,] W) or (blocks, block_size, [H,] W), each a view of a
// padded buffer; `buffer` is what is compared.
Buffered random_cache(Draw& d, int64_t num_slots, int64_t block_size, int64_t H, int64_t W,
                      at::ScalarType dtype) {
  std::vector<int64_t> sizes;
  if (block_size > 0) {
    sizes = {num_slots / block_size, block_size};
  } else {
    sizes = {num_slots};
  }
  if (H > 0) {
    sizes.push_back(H);
  }
  sizes.push_back(W);
  return padded(d, sizes, dtype, /*allow_misaligned=*/true);
}

std::string one_mla_case(uint64_t seed, int64_t index, std::vector<std::string>& problems,
                         ServingRun& run) {
  Draw d(seed, 3, index);
  const at::ScalarType dtypes[] = {at::kFloat, at::kHalf, at::kBFloat16, at::kDouble};
  const at::ScalarType dtype = dtypes[d.pick(4)];
  const bool interleaved = d.one_in(2);
  const int64_t T = d.one_in(8) ? 0 : d.one_in(6) ? 40 + d.pick(30) : 1 + d.pick(9);
  const int64_t H = d.pick(5);  // q_pe heads; 0: a call with no q (vLLM's concat_and_cache_mla)
  const int64_t rope_dims[] = {16, 32, 64, 6, 2};
  const int64_t R = rope_dims[d.pick(5)];
  const int64_t ranks[] = {16, 64, 128, 7, 0};
  const int64_t L = ranks[d.pick(5)];
  const bool gqa = d.one_in(4);  // key parts (T, Hk, W) with v: FlashInfer's split rows
  const int64_t Hk = gqa ? 1 + d.pick(3) : 0;
  const int64_t Dv = gqa ? 8 * (1 + d.pick(3)) : 0;
  const bool two_caches = gqa || d.one_in(2);
  const bool one_buffer = two_caches && d.one_in(2);  // ckv and kpe as column slices of one
  const int64_t block_size = d.one_in(2) ? 1 + d.pick(8) : 0;
  const int64_t num_slots =
      (block_size > 0 ? block_size : 1) * (1 + (T + 4) / std::max<int64_t>(block_size, 1));
  const at::ScalarType fp8 = d.one_in(2) ? at::kFloat8_e4m3fn : at::kFloat8_e5m2;
  const bool cache_fp8 = d.one_in(2);
  const at::ScalarType cache_dtype = cache_fp8 ? fp8 : dtype;
  const bool q_fp8 = d.one_in(3);
  const bool multiply = d.one_in(2);
  const bool with_q_nope = d.one_in(2);
  const bool tables_double = d.one_in(4);

  std::string layout;
  const at::Tensor q_pe = random_rows(d, T, H, R, dtype, layout);
  const at::Tensor k_pe3 = random_rows(d, T, gqa ? Hk : 1, R, dtype, layout);
  const at::Tensor kv_c3 = random_rows(d, T, gqa ? Hk : 1, L, dtype, layout);
  const at::Tensor k_pe = gqa ? k_pe3 : k_pe3.select(1, 0);
  const at::Tensor kv_c = gqa ? kv_c3 : kv_c3.select(1, 0);
  const std::optional<at::Tensor> q_nope =
      with_q_nope
          ? std::optional<at::Tensor>(random_rows(d, T, H, 8 + d.pick(3) * 8, dtype, layout))
          : std::nullopt;
  const std::optional<at::Tensor> v =
      gqa ? std::optional<at::Tensor>(random_rows(d, T, Hk, Dv, dtype, layout)) : std::nullopt;
  const int64_t max_seq_len = 1 + d.pick(48);
  at::Tensor cos, sin;
  random_tables(d, max_seq_len, R, tables_double ? at::kDouble : at::kFloat, cos, sin);
  const at::Tensor positions = at::randint(
      0, max_seq_len, {T, 1}, d.gen, at::TensorOptions().dtype(d.one_in(3) ? at::kInt : at::kLong));
  // Distinct slots, about one token in five padding.
  const at::Tensor perm = at::randperm(num_slots, d.gen, at::TensorOptions().dtype(at::kLong));
  at::Tensor slots = perm.narrow(0, 0, T).clone();
  if (T > 0) {
    slots.masked_fill_(at::rand({T}, d.gen, at::TensorOptions().dtype(at::kDouble)) < 0.2, -1);
  }

  // The caches.
  const int64_t row_heads = gqa ? Hk : 0;
  Buffered kv_cache, kpe_cache, v_cache;
  at::Tensor kv_view, kpe_view;
  if (two_caches && one_buffer) {
    kv_cache = random_cache(d, num_slots, block_size, row_heads, R + L, cache_dtype);
    kpe_view = kv_cache.view.narrow(-1, 0, R);
    kv_view = kv_cache.view.narrow(-1, R, L);
  } else if (two_caches) {
    kv_cache = random_cache(d, num_slots, block_size, row_heads, L, cache_dtype);
    kpe_cache = random_cache(d, num_slots, block_size, row_heads, R, cache_dtype);
    kv_view = kv_cache.view;
    kpe_view = kpe_cache.view;
  } else {
    kv_cache = random_cache(d, num_slots, block_size, row_heads, L + R, cache_dtype);
    kv_view = kv_cache.view;
  }
  if (gqa) {
    v_cache = random_cache(d, num_slots, block_size, Hk, Dv, cache_dtype);
  }
  const std::optional<at::Tensor> kv_scale = random_fp8_scale(d, cache_fp8);
  const std::optional<at::Tensor> v_scale = gqa ? random_fp8_scale(d, cache_fp8) : std::nullopt;
  const std::optional<at::ScalarType> q_dtype =
      q_fp8 ? std::optional<at::ScalarType>(fp8) : std::nullopt;
  const std::optional<at::Tensor> q_scale = random_fp8_scale(d, q_fp8);

  std::ostringstream described;
  described << c10::toString(dtype) << (tables_double ? " (double tables)" : "") << " q_pe"
            << q_pe.sizes() << " k_pe" << k_pe.sizes() << " kv_c" << kv_c.sizes()
            << (with_q_nope ? " q_nope" : "") << (gqa ? " v" : "")
            << (two_caches ? (one_buffer ? ", two caches in one buffer" : ", two caches")
                           : ", one [kv_c | k_pe] cache")
            << (block_size > 0 ? ", paged block " + std::to_string(block_size) : ", flat") << ", "
            << c10::toString(cache_dtype) << (q_fp8 ? ", q float8" : "")
            << (multiply ? ", multiply" : ", divide")
            << (interleaved ? ", interleaved" : ", half split");

  CaseContext ctx;
  ctx.device = Device{static_cast<int>(d.pick(68)), 1 + static_cast<int>(d.pick(7))};
  ctx.start_device = (ctx.device.ordinal + 1 + static_cast<int>(index % 5)) % 68;
  std::vector<at::Tensor> inputs = {q_pe, k_pe, kv_c, cos, sin, positions, slots};
  for (const auto* t : {&q_nope, &v, &kv_scale, &v_scale, &q_scale}) {
    if (t->has_value()) {
      inputs.push_back(**t);
    }
  }
  std::vector<at::Tensor> before;
  for (const at::Tensor& t : inputs) {
    ctx.place(t);
    before.push_back(t.clone());
  }

  // The CPU backend writes copies of the caches; the host run the originals.
  std::vector<Buffered> originals = {kv_cache};
  if (two_caches && !one_buffer) {
    originals.push_back(kpe_cache);
  }
  if (gqa) {
    originals.push_back(v_cache);
  }
  std::vector<Buffered> copies;
  for (const Buffered& b : originals) {
    copies.push_back(copy_of(b));
  }
  // The copies' views, in the same places of their buffers.
  const auto same_view = [](const at::Tensor& view, const Buffered& to) {
    return to.buffer.as_strided(view.sizes(), view.strides(), view.storage_offset());
  };
  at::Tensor cpu_kv = same_view(kv_view, copies[0]);
  std::optional<at::Tensor> cpu_kpe, host_kpe;
  if (two_caches) {
    cpu_kpe = same_view(kpe_view, one_buffer ? copies[0] : copies[1]);
    host_kpe = kpe_view;
  }
  std::optional<at::Tensor> cpu_v, host_v;
  if (gqa) {
    cpu_v = copies.back().view;
    host_v = v_cache.view;
  }

  NamedTensors got, want;
  try {
    const auto cpu =
        rope::mla_apply_cache(q_pe, k_pe, kv_c, cos, sin, positions, cpu_kv, cpu_kpe, slots, q_nope,
                              v, cpu_v, interleaved, kv_scale, v_scale, q_dtype, q_scale, multiply);
    for (const Buffered& b : originals) {
      ctx.place(b.buffer);
    }
    const auto host = host_mla_apply_cache(ctx, q_pe, k_pe, kv_c, cos, sin, positions, kv_view,
                                           host_kpe, slots, q_nope, v, host_v, interleaved,
                                           kv_scale, v_scale, q_dtype, q_scale, multiply);
    want = {{"q_pe_out", std::get<0>(cpu)}, {"q_nope_out", std::get<1>(cpu)}};
    got = {{"q_pe_out", std::get<0>(host)}, {"q_nope_out", std::get<1>(host)}};
    for (size_t i = 0; i < originals.size(); ++i) {
      got.emplace_back("cache buffer " + std::to_string(i), originals[i].buffer);
      want.emplace_back("cache buffer " + std::to_string(i), copies[i].buffer);
    }
  } catch (const c10::Error& e) {
    problems.push_back(std::string("raised: ") + e.what_without_backtrace());
    return described.str();
  }
  finish_case(problems, got, want, inputs, before, ctx.problems, ctx.grid_launches.size(), T, run);

  const auto hit = [&](const std::string& what, bool cond) { run.coverage[what] += cond ? 1 : 0; };
  hit("mla: one [kv_c | k_pe] cache", !two_caches);
  hit("mla: two caches in one buffer", one_buffer);
  hit("mla: paged", block_size > 0);
  hit("mla: float8 cache", cache_fp8);
  hit("mla: float8 q", q_fp8);
  hit("mla: GQA rows with v", gqa);
  hit("mla: padding slots", T > 0 && slots.lt(0).any().item<bool>());
  return described.str();
}

}  // namespace

ServingRun run_mla_cases(uint64_t seed, int64_t count, int64_t only, int64_t max_failures,
                         bool verbose, const CpuVectorPath& cpu_path) {
  ServingRun run;
  if (!cpu_path.fused) {
    run.bit_exact = false;
    return run;
  }
  run_family("mla_apply_cache", "--mla-only", seed, count, only, max_failures, verbose, run,
             [&](int64_t i, std::vector<std::string>& problems, bool) {
               return one_mla_case(seed, i, problems, run);
             });
  return run;
}

}  // namespace rope_host
