// SPDX-License-Identifier: BSD-3-Clause
#include "norm_cases.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <torch_rope/ops.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <sstream>

#include "compare.h"
#include "host_backend.h"
#include "serving_support.h"  // expect_same_bits

namespace rope_host {
namespace {

struct NormCase {
  int64_t index = 0;
  at::ScalarType dtype = at::kFloat;
  at::ScalarType table_dtype = at::kFloat;
  bool interleaved = true;
  bool inverse = false;
  int64_t head_dim = 0;
  int64_t rotary_dim = 0;
  at::Tensor qkv;  // the buffer q and k view (fused qkv), or undefined
  at::Tensor q, k, q_weight, k_weight, cos, sin, positions;
  std::vector<int64_t> section;
  bool mrope_interleaved = false;
  double eps = 1e-6;
  double weight_offset = 0.0;
  bool positions_in_range = true;
  bool axes_first = false;  // multi-axis positions built (A, ...) and moved to (..., A)
  std::string layout;
  int device = 0;

  std::string describe() const {
    std::ostringstream m;
    m << "norm case " << index << ": " << c10::toString(dtype) << " q" << q.sizes() << " k"
      << k.sizes() << " (" << layout << "), head_dim " << head_dim << ", rotary_dim "
      << rotary_dim << (interleaved ? ", interleaved" : ", half split")
      << (inverse ? ", inverse" : "") << ", tables " << c10::toString(table_dtype)
      << ", weights " << c10::toString(q_weight.scalar_type()) << ", eps " << eps
      << ", weight_offset " << weight_offset << ", positions " << positions.sizes()
      << (section.empty() ? "" : ", mrope_section ") << (section.empty() ? "" : [&] {
           std::ostringstream s;
           s << at::IntArrayRef(section);
           return s.str();
         }())
      << (mrope_interleaved ? " interleaved" : "") << (axes_first ? ", axis-first" : "")
      << (positions_in_range ? "" : ", BAD position");
    return m.str();
  }
};

NormCase make_norm_case(uint64_t seed, int64_t index) {
  std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(index) * 7919 + 17);
  const auto pick = [&](int64_t n) { return static_cast<int64_t>(rng() % n); };
  auto gen = at::make_generator<at::CPUGeneratorImpl>(rng());
  NormCase c;
  c.index = index;
  const at::ScalarType dtypes[] = {at::kDouble, at::kFloat, at::kHalf, at::kBFloat16};
  c.dtype = dtypes[pick(4)];
  c.table_dtype = c.dtype == at::kDouble ? (pick(4) ? at::kDouble : at::kFloat)
                                         : (pick(4) == 0 ? at::kDouble : at::kFloat);
  const int64_t head_dims[] = {2, 4, 6, 8, 10, 16, 18, 32, 34, 64, 72};
  c.head_dim = head_dims[pick(11)];
  const int64_t D = c.head_dim;
  const int64_t rd_choices[] = {D, D, D - 2, (D / 2) & ~int64_t{1}, 0};
  c.rotary_dim = std::max<int64_t>(0, rd_choices[pick(5)]);
  const int64_t half = c.rotary_dim / 2;
  c.interleaved = pick(2) == 0;
  c.inverse = pick(2) == 0;
  const int64_t B = 1 + pick(2);
  const int64_t S = pick(8) == 0 ? 33 + pick(20) : 1 + pick(4);  // sometimes several blocks
  const int64_t Hq = 1 + pick(4);
  const int64_t Hk = 1 + pick(Hq);
  const double scales[] = {0.01, 1.0, 30.0};
  const double scale = scales[pick(3)];
  const auto opts = at::TensorOptions().dtype(at::kDouble);
  const auto rnd = [&](at::IntArrayRef sizes) {
    return (at::randn(sizes, gen, opts) * scale).to(c.dtype);
  };
  const int64_t layout = pick(4);
  bool heads_first = false;
  switch (layout) {
    case 0:
      c.layout = "(B, S, H, D) contiguous";
      c.q = rnd({B, S, Hq, D});
      c.k = rnd({B, S, Hk, D});
      break;
    case 1:
      c.layout = "fused qkv slices";
      c.qkv = rnd({B, S, (Hq + 2 * Hk) * D + 3});
      c.q = c.qkv.narrow(-1, 0, Hq * D).view({B, S, Hq, D});
      c.k = c.qkv.narrow(-1, Hq * D, Hk * D).view({B, S, Hk, D});
      break;
    case 2:
      c.layout = "(B, H, S, D)";
      heads_first = true;
      c.q = rnd({B, Hq, S, D});
      c.k = rnd({B, S, Hk, D}).transpose(1, 2);
      break;
    default:
      c.layout = "last-dim stride 2";
      c.q = rnd({B, S, Hq, D, 2}).select(-1, 1);
      c.k = rnd({B, S, Hk, D});
      break;
  }
  const at::ScalarType wdtype = dtypes[pick(4)];
  const auto weight = [&]() {
    at::Tensor w = 1.0 + 0.5 * at::randn({2 * D}, gen, opts);
    return (pick(3) == 0 ? w.slice(0, 0, 2 * D, 2) : w.slice(0, 0, D)).to(wdtype);
  };
  c.q_weight = weight();
  c.k_weight = weight();
  const double eps_choices[] = {1e-6, 0.25, 3.0};
  c.eps = eps_choices[pick(3)];
  const double offsets[] = {0.0, 1.0, -0.5};
  c.weight_offset = offsets[pick(3)];

  // Tables: angle p * theta^(-2k / rotary_dim) in double, rounded once.
  const int64_t max_seq_len = 1 + pick(20);
  const at::Tensor p = at::arange(max_seq_len, opts).unsqueeze(1);
  const at::Tensor kk = at::arange(half, opts);
  const at::Tensor ang = p * at::pow(10000.0, -2.0 * kk / std::max<int64_t>(c.rotary_dim, 1));
  if (pick(3) == 0 && half > 0) {  // rows padded, as a slice of a wider cache
    at::Tensor buf = at::zeros({max_seq_len, 2 * half + 3}, opts.dtype(c.table_dtype));
    buf.narrow(1, 0, half).copy_(at::cos(ang));
    buf.narrow(1, half + 3, half).copy_(at::sin(ang));
    c.cos = buf.narrow(1, 0, half);
    c.sin = buf.narrow(1, half + 3, half);
  } else {
    c.cos = at::cos(ang).to(c.table_dtype);
    c.sin = at::sin(ang).to(c.table_dtype);
  }

  // Positions: one axis, or a multi-axis section (with a trailing axis dim).
  const bool multi = half > 0 && pick(3) == 0;
  std::vector<int64_t> pos_shape;
  if (heads_first) {
    pos_shape = pick(2) ? std::vector<int64_t>{S} : std::vector<int64_t>{B, 1, S};
  } else {
    pos_shape = pick(2) ? std::vector<int64_t>{S, 1} : std::vector<int64_t>{B, S, 1};
  }
  if (multi) {
    // 1 to kMaxAxes axes: hf.patch hands this op 3-axis positions (Qwen3-VL), and 4 is the most
    // the kernels take, so a 4th axis reading the 3rd one's position must show.
    const int64_t A = 1 + pick(rope::kMaxAxes);
    c.section.assign(static_cast<size_t>(A), 0);
    for (int64_t k = 0; k < half; ++k) {
      ++c.section[static_cast<size_t>(pick(A))];
    }
    c.mrope_interleaved = A == 3 && pick(2) == 0;
    pos_shape.push_back(A);
  }
  const auto pos_dtype = pick(3) == 0 ? at::kInt : at::kLong;
  // Multi-axis positions are often built axis-first, (A, ...), and moved to (..., A), as hf.patch
  // moves Qwen3-VL's position ids: the axis dim then has the largest stride, not 1.
  c.axes_first = multi && pick(2) == 0;
  std::vector<int64_t> base_shape = pos_shape;
  if (c.axes_first) {
    std::rotate(base_shape.rbegin(), base_shape.rbegin() + 1, base_shape.rend());
  }
  const at::Tensor base =
      at::randint(0, max_seq_len, base_shape, gen, at::TensorOptions().dtype(pos_dtype));
  if (pick(16) == 0) {
    c.positions_in_range = false;
    const int64_t bad = pick(2) ? -1 - pick(3) : max_seq_len + pick(3);
    base.view({-1})[pick(base.numel())] = bad;
  }
  c.positions = c.axes_first ? base.movedim(0, -1) : base;
  c.device = static_cast<int>(pick(68));
  return c;
}

std::vector<std::string> run_norm_case(const NormCase& c, const CpuVectorPath& cpu_path,
                                       Tally& tally, NormRun& run) {
  std::map<std::string, int64_t>& cov = run.coverage;
  CaseContext ctx;
  ctx.device = Device{c.device, 1 + c.device % 7};
  ctx.start_device = (c.device + 1 + static_cast<int>(c.index % 5)) % 68;
  ctx.positions_in_range = c.positions_in_range;
  const std::vector<at::Tensor> inputs = {
      c.qkv.defined() ? c.qkv : c.q, c.k, c.q_weight, c.k_weight, c.cos, c.sin, c.positions};
  std::vector<at::Tensor> before;
  for (const at::Tensor& t : inputs) {
    ctx.place(t);
    before.push_back(t.clone());
  }
  const at::OptionalIntArrayRef section =
      c.section.empty() ? at::OptionalIntArrayRef() : at::OptionalIntArrayRef(c.section);
  std::vector<std::string>& problems = ctx.problems;

  at::Tensor cpu_q, cpu_k;
  bool cpu_rejected = false;
  try {
    std::tie(cpu_q, cpu_k) = rope::rms_norm_apply_qk(
        c.q, c.k, c.q_weight, c.k_weight, c.cos, c.sin, c.positions, c.eps, c.weight_offset,
        c.interleaved, c.inverse, section, c.mrope_interleaved);
  } catch (const c10::IndexError&) {
    cpu_rejected = true;
  }
  if (c.positions_in_range == cpu_rejected) {
    problems.push_back(cpu_rejected ? "the CPU backend rejected positions that are all in range"
                                    : "the CPU backend accepted an out-of-range position");
  }
  at::Tensor host_q, host_k;
  try {
    std::tie(host_q, host_k) = host_rms_norm_apply_qk(
        ctx, c.q, c.k, c.q_weight, c.k_weight, c.cos, c.sin, c.positions, c.eps, c.weight_offset,
        c.interleaved, c.inverse, section, c.mrope_interleaved);
  } catch (const c10::Error& e) {
    problems.push_back(std::string("the host-run op raised: ") + e.what_without_backtrace());
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!same_bits(inputs[i], before[i])) {
      problems.push_back("input " + std::to_string(i) + " changed");
    }
  }
  // One launch for q and k, or one each where they cannot share positions and a token count
  // (common_stream_layout.h: heads-first q and k with per-sequence positions).
  if (ctx.grid_launches.empty() || ctx.grid_launches.size() > 2) {
    problems.push_back("expected one or two launches, got " +
                       std::to_string(ctx.grid_launches.size()));
  }
  if (c.positions_in_range && problems.empty()) {
    for (const auto& [name, got, x, w] :
         {std::tuple<const char*, at::Tensor, at::Tensor, at::Tensor>{"q (host run)", host_q, c.q,
                                                                      c.q_weight},
          {"k (host run)", host_k, c.k, c.k_weight},
          {"q (CPU backend)", cpu_q, c.q, c.q_weight},
          {"k (CPU backend)", cpu_k, c.k, c.k_weight}}) {
      compare_norm_rotation(name, got, x, w, c.cos, c.sin, c.positions, c.section,
                            c.mrope_interleaved, c.eps, c.weight_offset, c.interleaved, c.inverse,
                            tally, problems);
    }
    if (!host_q.is_contiguous() || !host_k.is_contiguous()) {
      problems.push_back("the results are not contiguous");
    }
    // One engine on both backends (the row streams): the same bits where the CPU copy fuses its
    // multiply-adds as the kernel does.
    if (cpu_path.fused) {
      expect_same_bits(problems, "q (host run vs CPU backend)", host_q, cpu_q,
                       run.elements_same_bits);
      expect_same_bits(problems, "k (host run vs CPU backend)", host_k, cpu_k,
                       run.elements_same_bits);
    }
  }
  const auto hit = [&](const std::string& what, bool cond) { cov[what] += cond ? 1 : 0; };
  for (const at::ScalarType t : {at::kDouble, at::kFloat, at::kHalf, at::kBFloat16}) {
    hit(std::string("norm: dtype ") + c10::toString(t), c.dtype == t);
  }
  hit("norm: float64 tables", c.table_dtype == at::kDouble);
  hit("norm: partial rotary", c.rotary_dim > 0 && c.rotary_dim < c.head_dim);
  hit("norm: rotary_dim 0", c.rotary_dim == 0);
  hit("norm: multi-axis positions", !c.section.empty());
  hit("norm: 4-axis positions", c.section.size() == 4);
  hit("norm: axis-first positions (axis stride > 1)",
      c.axes_first && c.positions.size(-1) > 1 && c.positions.stride(-1) > 1);
  hit("norm: Qwen3-VL interleaved sections", c.mrope_interleaved);
  hit("norm: fused qkv slices", c.qkv.defined());
  hit("norm: weight_offset", c.weight_offset != 0);
  hit("norm: eps large", c.eps > 0.1);
  hit("norm: out-of-range position asserted", !c.positions_in_range);
  hit("norm: int32 positions", c.positions.scalar_type() == at::kInt);
  hit("norm: several blocks", !ctx.grid_launches.empty() && ctx.grid_launches[0].blocks > 1);
  hit("norm: q and k in two launches", ctx.grid_launches.size() == 2);
  return problems;
}

}  // namespace

NormRun run_norm_cases(uint64_t seed, int64_t count, int64_t only, int64_t max_failures,
                       bool verbose, const CpuVectorPath& cpu_path, Tally& tally) {
  NormRun run;
  const int64_t first = only >= 0 ? only : 0;
  const int64_t last = only >= 0 ? only + 1 : count;
  for (int64_t i = first; i < last; ++i) {
    // Odd cases run their launches' blocks and threads in reverse order (a rerun of one case
    // keeps its order).
    set_reverse_order(i % 2 == 1);
    const NormCase c = make_norm_case(seed, i);
    if (verbose) {
      std::printf("%s\n", c.describe().c_str());
    }
    const std::vector<std::string> problems = run_norm_case(c, cpu_path, tally, run);
    ++run.cases;
    if (!c.positions_in_range) {
      ++run.assert_cases;
    }
    if (!problems.empty()) {
      ++run.failures;
      std::printf("FAILED %s\n", c.describe().c_str());
      for (const std::string& p : problems) {
        std::printf("    %s\n", p.c_str());
      }
      std::printf("  rerun: cuda_host_run --seed %llu --norm-only %lld -v\n",
                  static_cast<unsigned long long>(seed), static_cast<long long>(i));
      if (run.failures >= max_failures) {
        break;
      }
    }
  }
  return run;
}

}  // namespace rope_host
