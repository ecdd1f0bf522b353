// SPDX-License-Identifier: BSD-3-Clause
#include "kv_cache_cases.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <torch_rope/ops.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <vector>

#include "host_backend.h"
#include "serving_support.h"

namespace rope_host {
namespace {

// A cache and the buffer it views: the buffer holds padding (heads, features, rows or blocks)
// that no call may write, and is what the comparisons read, byte for byte.
struct Cache {
  at::Tensor buffer;
  at::Tensor view;
  bool paged = false;
  int64_t block_size = 1;
};

struct KvCase {
  int64_t index = 0;
  at::ScalarType dtype = at::kFloat;
  bool interleaved = true;
  int64_t T = 0, Hq = 0, Hkv = 0, D = 0, R = 0, Dv = 0;
  std::string layout;
  at::Tensor qkv;  // the buffer q, k and v slice (fused qkv), or undefined
  at::Tensor q, k, cos, sin, positions, slots;
  std::optional<at::Tensor> v;
  Cache k_cache, v_cache;
  std::optional<at::Tensor> k_scale, v_scale;
  int64_t padding_tokens = 0;
  int device = 0;

  std::string describe() const {
    std::ostringstream m;
    m << "kv cache case " << index << ": " << c10::toString(dtype) << " q" << q.sizes() << " k"
      << k.sizes() << " v" << (v.has_value() ? v->sizes() : at::IntArrayRef{}) << " (" << layout
      << "), rotary_dim " << R << (interleaved ? ", interleaved" : ", half split") << ", positions "
      << c10::toString(positions.scalar_type()) << positions.sizes() << ", k_cache "
      << c10::toString(k_cache.view.scalar_type()) << k_cache.view.sizes() << " strides "
      << k_cache.view.strides();
    if (v.has_value()) {
      m << ", v_cache " << c10::toString(v_cache.view.scalar_type()) << v_cache.view.sizes();
    }
    m << ", " << padding_tokens << " padding tokens";
    return m.str();
  }
};

// Random bits of the buffer's width: every byte of a cache starts distinct from what a call
// writes, NaN and subnormal codes included.
at::Tensor random_bits(at::Generator& gen, at::IntArrayRef sizes, at::ScalarType dtype) {
  const int64_t bytes = static_cast<int64_t>(c10::elementSize(dtype));
  const at::ScalarType as_int = bytes == 1 ? at::kByte : bytes == 2 ? at::kShort : at::kInt;
  const int64_t hi = bytes == 1 ? 256 : bytes == 2 ? 65536 : int64_t{1} << 32;
  const int64_t lo = bytes == 1 ? 0 : -(hi / 2);
  return at::randint(lo, lo + hi, sizes, gen, at::TensorOptions().dtype(at::kLong))
      .to(as_int)
      .view(dtype);
}

Cache make_cache(at::Generator& gen, const std::function<int64_t(int64_t)>& pick,
                 at::ScalarType dtype, bool paged, int64_t num_slots, int64_t H, int64_t Dm,
                 int64_t block_size) {
  Cache c;
  c.paged = paged;
  c.block_size = block_size;
  const int64_t head_pad = pick(3);  // features after each head
  const int64_t extra_heads = pick(2);
  if (paged) {
    const int64_t blocks = num_slots / block_size;
    c.buffer = random_bits(gen, {blocks + 1, block_size, H + extra_heads, Dm + head_pad}, dtype);
    c.view = c.buffer.narrow(0, 1, blocks).narrow(2, 0, H).narrow(3, 0, Dm);
  } else {
    c.buffer = random_bits(gen, {num_slots + 2, H + extra_heads, Dm + head_pad}, dtype);
    c.view = c.buffer.narrow(0, 1, num_slots).narrow(1, 0, H).narrow(2, 0, Dm);
  }
  return c;
}

KvCase make_kv_case(uint64_t seed, int64_t index, const CpuVectorPath& cpu_path) {
  std::mt19937_64 rng(seed * 0xbf58476d1ce4e5b9ull + static_cast<uint64_t>(index) * 104729 + 3);
  const std::function<int64_t(int64_t)> pick = [&](int64_t n) {
    return static_cast<int64_t>(rng() % static_cast<uint64_t>(n));
  };
  auto gen = at::make_generator<at::CPUGeneratorImpl>(rng());
  KvCase c;
  c.index = index;
  const at::ScalarType dtypes[] = {at::kFloat, at::kHalf, at::kBFloat16};
  c.dtype = dtypes[pick(3)];
  c.interleaved = pick(2) == 0;
  c.T = pick(8) == 0 ? 0 : pick(6) == 0 ? 40 + pick(30) : 1 + pick(9);
  c.Hkv = 1 + pick(3);
  c.Hq = c.Hkv * (1 + pick(3));
  // Rotary dims whose planes the CPU kernel's vector path covers whole (a multiple of its width
  // in planes), so that every element must match it bit for bit.
  const int64_t width = std::max<int64_t>(cpu_path.width, 8);
  c.R = 2 * width * (1 + pick(3));
  const int64_t tails[] = {0, 0, 2, 6};
  c.D = c.R + tails[pick(4)];
  const int64_t v_dims[] = {c.D, 8, 24, 3};
  c.Dv = v_dims[pick(4)];
  const bool has_v = pick(5) != 0;

  const auto opts = at::TensorOptions().dtype(at::kDouble);
  const double scales[] = {0.01, 1.0, 30.0};
  const double scale = scales[pick(3)];
  const auto rnd = [&](at::IntArrayRef sizes) {
    return (at::randn(sizes, gen, opts) * scale).to(c.dtype);
  };
  const int64_t T = c.T, Hq = c.Hq, Hkv = c.Hkv, D = c.D, Dv = c.Dv;
  switch (pick(3)) {
    case 0:
      c.layout = "contiguous (T, H, D)";
      c.q = rnd({T, Hq, D});
      c.k = rnd({T, Hkv, D});
      if (has_v) {
        c.v = rnd({T, Hkv, Dv});
      }
      break;
    case 1: {
      c.layout = "fused qkv slices";
      const int64_t width_qkv = (Hq + Hkv) * D + (has_v ? Hkv * Dv : 0) + 5;
      c.qkv = rnd({T, width_qkv});
      c.q = c.qkv.narrow(1, 0, Hq * D).view({T, Hq, D});
      c.k = c.qkv.narrow(1, Hq * D, Hkv * D).view({T, Hkv, D});
      if (has_v) {
        c.v = c.qkv.narrow(1, (Hq + Hkv) * D, Hkv * Dv).view({T, Hkv, Dv});
      }
      break;
    }
    default:
      c.layout = "heads first (H, T, D) transposed";
      c.q = rnd({Hq, T, D}).transpose(0, 1);
      c.k = rnd({Hkv, T, D}).transpose(0, 1);
      if (has_v) {
        c.v = rnd({Hkv, T, Dv}).transpose(0, 1);
      }
      break;
  }

  // Tables: angle p * theta^(-2k / R) in double, rounded once to float32; sometimes the two
  // halves of one fused (max_seq_len, R + 4) buffer, so rows are padded.
  const int64_t half = c.R / 2;
  const int64_t max_seq_len = 1 + pick(48);
  const at::Tensor p = at::arange(max_seq_len, opts).unsqueeze(1);
  const at::Tensor ang = p * at::pow(10000.0, -2.0 * at::arange(half, opts) / c.R);
  if (pick(3) == 0) {
    at::Tensor buf = at::zeros({max_seq_len, 2 * half + 4}, opts.dtype(at::kFloat));
    buf.narrow(1, 0, half).copy_(at::cos(ang));
    buf.narrow(1, half + 4, half).copy_(at::sin(ang));
    c.cos = buf.narrow(1, 0, half);
    c.sin = buf.narrow(1, half + 4, half);
  } else {
    c.cos = at::cos(ang).to(at::kFloat);
    c.sin = at::sin(ang).to(at::kFloat);
  }

  // Positions (T, 1), or (T, H) per head when q and k have as many heads; int32 or int64.
  const bool per_head = Hq == Hkv && pick(3) == 0;
  const auto pos_dtype = pick(3) == 0 ? at::kInt : at::kLong;
  c.positions = at::randint(0, max_seq_len, {T, per_head ? Hq : 1}, gen,
                            at::TensorOptions().dtype(pos_dtype));

  // Caches: flat or paged, their source's dtype or fp8 with a scale; distinct slots, some padding.
  const bool paged = pick(2) == 0;
  const int64_t block_size = paged ? 1 + pick(4) : 1;
  const int64_t min_slots = T + pick(5);
  const int64_t num_slots =
      std::max<int64_t>(1, (min_slots + block_size - 1) / block_size) * block_size;
  const at::ScalarType formats[] = {c.dtype, c.dtype, at::kFloat8_e4m3fn, at::kFloat8_e5m2};
  const float fp8_scales[] = {1.0f, 0.37f, 2.5f, 0.0173f};
  const auto make_scale = [&](at::ScalarType fmt) -> std::optional<at::Tensor> {
    if (fmt != at::kFloat8_e4m3fn && fmt != at::kFloat8_e5m2) {
      return std::nullopt;
    }
    return at::full({}, fp8_scales[pick(4)], at::TensorOptions().dtype(at::kFloat));
  };
  const at::ScalarType k_format = formats[pick(4)];
  c.k_cache = make_cache(gen, pick, k_format, paged, num_slots, Hkv, D, block_size);
  c.k_scale = make_scale(k_format);
  if (has_v) {
    const at::ScalarType v_format = formats[pick(4)];
    c.v_cache = make_cache(gen, pick, v_format, paged, num_slots, Hkv, Dv, block_size);
    c.v_scale = make_scale(v_format);
  }
  std::vector<int64_t> perm(static_cast<size_t>(num_slots));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  at::Tensor slots = at::empty({T}, at::TensorOptions().dtype(at::kLong));
  for (int64_t t = 0; t < T; ++t) {
    const bool padding = pick(5) == 0;
    slots[t].fill_(padding ? -1 - pick(3) : perm[static_cast<size_t>(t)]);
    c.padding_tokens += padding ? 1 : 0;
  }
  c.slots = pick(4) == 0 ? at::stack({slots, slots}, 1).select(1, 0) : slots;  // strided too
  c.device = static_cast<int>(pick(68));
  return c;
}

std::vector<std::string> run_kv_case(const KvCase& c, const CpuVectorPath& cpu_path,
                                     KvCacheRun& run) {
  std::map<std::string, int64_t>& cov = run.coverage;
  Tally& tally = run.reference;
  CaseContext ctx;
  ctx.device = Device{c.device, 1 + c.device % 7};
  ctx.start_device = (c.device + 1 + static_cast<int>(c.index % 5)) % 68;
  std::vector<std::string>& problems = ctx.problems;
  const bool has_v = c.v.has_value();
  std::vector<at::Tensor> inputs = {
      c.qkv.defined() ? c.qkv : c.q, c.k, c.cos, c.sin, c.positions, c.slots};
  if (has_v) {
    inputs.push_back(*c.v);
  }
  for (const auto& s : {c.k_scale, c.v_scale}) {
    if (s.has_value()) {
      inputs.push_back(*s);
    }
  }
  std::vector<at::Tensor> before;
  for (const at::Tensor& t : inputs) {
    ctx.place(t);
    before.push_back(t.clone());
  }
  ctx.place(c.k_cache.buffer);
  if (has_v) {
    ctx.place(c.v_cache.buffer);
  }

  // The CPU backend's answer, on copies of the caches (the same views of copied buffers).
  const auto copy_of = [](const Cache& cache) {
    Cache out = cache;
    out.buffer = cache.buffer.clone();
    out.view = out.buffer.as_strided(cache.view.sizes(), cache.view.strides(),
                                     cache.view.storage_offset());
    return out;
  };
  Cache cpu_k = copy_of(c.k_cache);
  std::optional<Cache> cpu_v = has_v ? std::optional<Cache>(copy_of(c.v_cache)) : std::nullopt;
  const std::optional<at::Tensor> cpu_v_view =
      has_v ? std::optional<at::Tensor>(cpu_v->view) : std::nullopt;
  const std::optional<at::Tensor> v_view =
      has_v ? std::optional<at::Tensor>(c.v_cache.view) : std::nullopt;
  at::Tensor cpu_q;
  try {
    cpu_q = rope::apply_qk_cache(c.q, c.k, c.v, c.cos, c.sin, c.positions, cpu_k.view, cpu_v_view,
                                 c.slots, c.interleaved, c.k_scale, c.v_scale);
  } catch (const c10::Error& e) {
    problems.push_back(std::string("the CPU backend raised: ") + e.what_without_backtrace());
    return problems;
  }
  at::Tensor host_q;
  at::Tensor k_cache_view = c.k_cache.view;
  try {
    host_q = host_apply_qk_cache(ctx, c.q, c.k, c.v, c.cos, c.sin, c.positions, k_cache_view,
                                 v_view, c.slots, c.interleaved, c.k_scale, c.v_scale);
  } catch (const c10::Error& e) {
    problems.push_back(std::string("the host-run op raised: ") + e.what_without_backtrace());
    return problems;
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!at::equal(bits_of(inputs[i]), bits_of(before[i]))) {
      problems.push_back("input " + std::to_string(i) + " changed");
    }
  }
  const size_t want_launches = c.T > 0 ? 1 : 0;
  if (ctx.grid_launches.size() != want_launches) {
    problems.push_back("expected " + std::to_string(want_launches) + " launch(es), got " +
                       std::to_string(ctx.grid_launches.size()));
  }

  // Bit for bit as the CPU backend: q_out, and every byte of each cache buffer.
  const auto same_bits = [&](const char* what, const at::Tensor& got, const at::Tensor& want) {
    if (!got.sizes().equals(want.sizes()) || got.scalar_type() != want.scalar_type()) {
      problems.push_back(std::string(what) + ": shape or dtype differs from the CPU backend's");
      return;
    }
    const at::Tensor differ = bits_of(got.contiguous()).ne(bits_of(want.contiguous()));
    const int64_t n = differ.sum().item<int64_t>();
    if (n > 0) {
      const int64_t first = differ.flatten().nonzero()[0][0].item<int64_t>();
      std::ostringstream m;
      m << what << ": " << n << " of " << got.numel() << " elements differ from the CPU backend's"
        << " bits; first at flat index " << first << ": got "
        << got.contiguous().flatten()[first].to(at::kDouble).item<double>() << ", CPU "
        << want.contiguous().flatten()[first].to(at::kDouble).item<double>();
      problems.push_back(m.str());
    } else {
      run.elements_same_bits += got.numel();
    }
  };
  same_bits("q_out", host_q, cpu_q);
  same_bits("k_cache buffer", c.k_cache.buffer, cpu_k.buffer);
  if (has_v) {
    same_bits("v_cache buffer", c.v_cache.buffer, cpu_v->buffer);
  }

  // Against the extended-precision reference as well: q, and the k rows of a cache of k's dtype.
  compare_rotation("q_out (reference)", host_q, cpu_q, c.q, c.cos, c.sin, c.positions,
                   c.interleaved, false, cpu_path, tally, problems);
  if (c.k_cache.view.scalar_type() == c.dtype && c.T > 0) {
    std::vector<at::Tensor> got, cpu, x, pos;
    const int64_t bs = c.k_cache.block_size;
    for (int64_t t = 0; t < c.T; ++t) {
      const int64_t s = c.slots[t].item<int64_t>();
      if (s < 0) {
        continue;
      }
      const auto row = [&](const at::Tensor& cache) {
        return c.k_cache.paged ? cache[s / bs][s % bs] : cache[s];
      };
      got.push_back(row(c.k_cache.view));
      cpu.push_back(row(cpu_k.view));
      x.push_back(c.k[t]);
      pos.push_back(c.positions[t]);
    }
    if (!got.empty()) {
      compare_rotation("k_cache rows (reference)", at::stack(got), at::stack(cpu), at::stack(x),
                       c.cos, c.sin, at::stack(pos), c.interleaved, false, cpu_path, tally,
                       problems);
    }
  }

  const auto hit = [&](const std::string& what, bool cond) { cov[what] += cond ? 1 : 0; };
  for (const at::ScalarType t : {at::kFloat, at::kHalf, at::kBFloat16}) {
    hit(std::string("kv cache: dtype ") + c10::toString(t), c.dtype == t);
  }
  const auto fp8 = [&](at::ScalarType f) {
    return c.k_cache.view.scalar_type() == f || (has_v && c.v_cache.view.scalar_type() == f);
  };
  hit("kv cache: float8_e4m3fn cache", fp8(at::kFloat8_e4m3fn));
  hit("kv cache: float8_e5m2 cache", fp8(at::kFloat8_e5m2));
  hit("kv cache: paged", c.k_cache.paged);
  hit("kv cache: padding tokens", c.padding_tokens > 0);
  hit("kv cache: fused qkv slices", c.qkv.defined());
  hit("kv cache: GQA (more q heads)", c.Hq > c.Hkv);
  hit("kv cache: positions per head", c.positions.size(1) > 1);
  hit("kv cache: no v", !has_v);
  hit("kv cache: half split", !c.interleaved);
  hit("kv cache: partial rotary", c.D > c.R);
  hit("kv cache: several blocks", !ctx.grid_launches.empty() && ctx.grid_launches[0].blocks > 1);
  return problems;
}

}  // namespace

KvCacheRun run_kv_cache_cases(uint64_t seed, int64_t count, int64_t only, int64_t max_failures,
                              bool verbose, const CpuVectorPath& cpu_path) {
  KvCacheRun run;
  if (!cpu_path.fused) {
    // Without FMA the CPU kernel rounds differently from the CUDA kernel: no bit comparison is
    // possible, so these cases do not run (and say so); stream_host.cpp still runs.
    run.bit_exact = false;
    return run;
  }
  const int64_t first = only >= 0 ? only : 0;
  const int64_t last = only >= 0 ? only + 1 : count;
  for (int64_t i = first; i < last; ++i) {
    // Odd cases run their launches' blocks and threads in reverse order (a rerun of one case
    // keeps its order).
    set_reverse_order(i % 2 == 1);
    const KvCase c = make_kv_case(seed, i, cpu_path);
    if (verbose) {
      std::printf("%s\n", c.describe().c_str());
    }
    const std::vector<std::string> problems = run_kv_case(c, cpu_path, run);
    ++run.cases;
    if (!problems.empty()) {
      ++run.failures;
      std::printf("FAILED %s\n", c.describe().c_str());
      for (const std::string& p : problems) {
        std::printf("    %s\n", p.c_str());
      }
      std::printf("  rerun: cuda_host_run --seed %llu --kv-only %lld -v\n",
                  static_cast<unsigned long long>(seed), static_cast<long long>(i));
      if (run.failures >= max_failures) {
        break;
      }
    }
  }
  return run;
}

}  // namespace rope_host
