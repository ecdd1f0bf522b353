// SPDX-License-Identifier: BSD-3-Clause
#include "serving_support.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/accumulate.h>

#include <cstdio>
#include <sstream>

namespace rope_host {

Draw::Draw(uint64_t seed, uint64_t family, int64_t index)
    : rng(seed * 0x9e3779b97f4a7c15ull + family * 0xbf58476d1ce4e5b9ull +
          static_cast<uint64_t>(index) * 104729 + 11),
      gen(at::make_generator<at::CPUGeneratorImpl>(rng())) {}

int64_t Draw::pick(int64_t n) { return static_cast<int64_t>(rng() % static_cast<uint64_t>(n)); }

at::Tensor random_bits(Draw& d, at::IntArrayRef sizes, at::ScalarType dtype) {
  const int64_t bytes = static_cast<int64_t>(c10::elementSize(dtype));
  const at::ScalarType as_int = bytes == 1   ? at::kByte
                                : bytes == 2 ? at::kShort
                                : bytes == 4 ? at::kInt
                                             : at::kLong;
  if (bytes == 8) {
    return at::randint(-(int64_t{1} << 62), int64_t{1} << 62, sizes, d.gen,
                       at::TensorOptions().dtype(at::kLong))
        .view(dtype);
  }
  const int64_t hi = bytes == 1 ? 256 : bytes == 2 ? 65536 : int64_t{1} << 32;
  const int64_t lo = bytes == 1 ? 0 : -(hi / 2);
  return at::randint(lo, lo + hi, sizes, d.gen, at::TensorOptions().dtype(at::kLong))
      .to(as_int)
      .view(dtype);
}

at::Tensor bits_of(const at::Tensor& t) {
  const int64_t bytes = static_cast<int64_t>(t.element_size());
  return t.view(bytes == 1   ? at::kByte
                : bytes == 2 ? at::kShort
                : bytes == 4 ? at::kInt
                             : at::kLong);
}

Buffered padded(Draw& d, at::IntArrayRef sizes, at::ScalarType dtype, bool allow_misaligned) {
  std::vector<int64_t> big(sizes.begin(), sizes.end());
  const int64_t n = static_cast<int64_t>(big.size());
  std::vector<int64_t> pads(static_cast<size_t>(n), 0);
  for (int64_t i = 0; i < n; ++i) {
    pads[i] = d.one_in(2) ? d.pick(3) : 0;
    big[i] += pads[i];
  }
  const int64_t offset = allow_misaligned && d.one_in(4) ? 1 : 0;
  Buffered b;
  const int64_t numel = c10::multiply_integers(big) + offset;
  b.buffer = random_bits(d, {numel}, dtype);
  std::vector<int64_t> strides(static_cast<size_t>(n), 1);
  for (int64_t i = n - 2; i >= 0; --i) {
    strides[i] = strides[i + 1] * big[i + 1];
  }
  b.view = b.buffer.as_strided(sizes, strides, offset);
  return b;
}

Buffered copy_of(const Buffered& b) {
  Buffered out;
  out.buffer = b.buffer.clone();
  out.view = out.buffer.as_strided(b.view.sizes(), b.view.strides(), b.view.storage_offset());
  return out;
}

at::Tensor random_rows(Draw& d, int64_t T, int64_t H, int64_t W, at::ScalarType dtype,
                       std::string& layout) {
  const double scales[] = {0.01, 1.0, 30.0, 3000.0};
  const double scale = scales[d.pick(4)];
  const auto opts = at::TensorOptions().dtype(at::kDouble);
  const auto values = [&](at::IntArrayRef sizes) {
    at::Tensor v = at::randn(sizes, d.gen, opts) * scale;
    if (d.one_in(3)) {  // a few fp8 subnormals and saturating values among the others
      v = v * at::where(at::rand(sizes, d.gen, opts) < 0.1, 1e-5, 1.0);
      v = v * at::where(at::rand(sizes, d.gen, opts) < 0.05, 1e4, 1.0);
    }
    return v.to(dtype);
  };
  switch (d.pick(5)) {
    case 0:
      layout = "heads padded";
      return values({T, H, W + 8}).narrow(2, 0, W);
    case 1:
      layout = "heads first, transposed";
      return values({H, T, W}).transpose(0, 1);
    case 2: {
      layout = "sliced from a fused projection";
      const at::Tensor fused = values({T, 3 * H * W + 8});
      return fused.narrow(1, H * W, H * W).view({T, H, W});
    }
    case 3: {
      layout = "one element off alignment";
      const at::Tensor flat = values({T * H * W + 1});
      return flat.narrow(0, 1, T * H * W).view({T, H, W});
    }
    default:
      layout = "contiguous";
      return values({T, H, W});
  }
}

std::optional<at::Tensor> random_fp8_scale(Draw& d, bool fp8) {
  const float scales[] = {1.0f, 0.37f, 2.5f, 0.0173f, 7.0f};
  if (!fp8) {
    return std::nullopt;
  }
  const at::Tensor s = at::full({}, scales[d.pick(5)], at::TensorOptions().dtype(at::kFloat));
  return d.one_in(2) ? s : s.view({1});
}

void finish_case(std::vector<std::string>& problems, const NamedTensors& got,
                 const NamedTensors& want, const std::vector<at::Tensor>& inputs,
                 const std::vector<at::Tensor>& before,
                 const std::vector<std::string>& runtime_problems, size_t launches, int64_t tokens,
                 ServingRun& run) {
  for (size_t i = 0; i < got.size(); ++i) {
    expect_same_bits(problems, got[i].first, got[i].second, want[i].second, run.elements_same_bits);
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!at::equal(bits_of(inputs[i]), bits_of(before[i]))) {
      problems.push_back("input " + std::to_string(i) + " changed");
    }
  }
  problems.insert(problems.end(), runtime_problems.begin(), runtime_problems.end());
  const size_t want_launches = tokens > 0 ? 1 : 0;
  if (launches != want_launches) {
    problems.push_back("expected " + std::to_string(want_launches) + " launch(es), got " +
                       std::to_string(launches));
  }
}

void expect_same_bits(std::vector<std::string>& problems, const std::string& what,
                      const at::Tensor& got, const at::Tensor& want, int64_t& elements) {
  if (!got.sizes().equals(want.sizes()) || got.scalar_type() != want.scalar_type()) {
    std::ostringstream m;
    m << what << ": shape or dtype differs from the CPU backend's (" << got.sizes() << " "
      << c10::toString(got.scalar_type()) << " vs " << want.sizes() << " "
      << c10::toString(want.scalar_type()) << ")";
    problems.push_back(m.str());
    return;
  }
  if (got.numel() == 0) {
    return;
  }
  // A NaN compares equal to any other NaN code of its format (float8 and 16/32/64-bit alike). The
  // sign of a NaN that arithmetic creates (inf - inf in a rotation of infinite inputs) is not
  // specified by IEEE 754: x86 makes the negative default NaN, a GPU the positive canonical one,
  // and the host build of the kernel whichever its libm's fmaf gives. So the sign and payload of a
  // NaN are not held to the CPU's here, copied ones included
  // (tests/python/kernels/test_fp8_fusions_quantization.py holds copied NaNs of every 16-bit
  // pattern to torch's cast on each CPU kernel copy).
  const auto comparable = [](const at::Tensor& t) {
    at::Tensor b = bits_of(t.contiguous());
    if (t.scalar_type() == at::kFloat8_e4m3fn) {
      return at::where(b.bitwise_and(0x7f).eq(0x7f), at::full({}, 0x7f, b.options()), b);
    }
    if (t.scalar_type() == at::kFloat8_e5m2) {
      return at::where(b.bitwise_and(0x7f).gt(0x7c), at::full({}, 0x7f, b.options()), b);
    }
    if (at::isFloatingType(t.scalar_type())) {  // 16/32/64-bit outputs: all ones is a NaN code
      return at::where(t.contiguous().isnan(), at::full({}, -1, b.options()), b);
    }
    return b;
  };
  const at::Tensor differ = comparable(got).ne(comparable(want));
  const int64_t n = differ.sum().item<int64_t>();
  if (n > 0) {
    const int64_t first = differ.flatten().nonzero()[0][0].item<int64_t>();
    std::ostringstream m;
    m << what << ": " << n << " of " << got.numel() << " elements differ from the CPU backend's"
      << " bits; first at flat index " << first << ": got bits "
      << bits_of(got.contiguous()).flatten()[first].item<int64_t>() << ", CPU "
      << bits_of(want.contiguous()).flatten()[first].item<int64_t>();
    problems.push_back(m.str());
  } else {
    elements += got.numel();
  }
}

void random_tables(Draw& d, int64_t max_seq_len, int64_t rotary_dim, at::ScalarType dtype,
                   at::Tensor& cos, at::Tensor& sin) {
  const auto opts = at::TensorOptions().dtype(at::kDouble);
  const int64_t half = rotary_dim / 2;
  const at::Tensor p = at::arange(max_seq_len, opts).unsqueeze(1);
  const at::Tensor ang =
      p * at::pow(10000.0, -2.0 * at::arange(half, opts) / std::max<int64_t>(rotary_dim, 1));
  if (d.one_in(3)) {
    at::Tensor buf = at::zeros({max_seq_len, 2 * half + 4}, opts.dtype(dtype));
    buf.narrow(1, 0, half).copy_(at::cos(ang));
    buf.narrow(1, half + 4, half).copy_(at::sin(ang));
    cos = buf.narrow(1, 0, half);
    sin = buf.narrow(1, half + 4, half);
  } else {
    cos = at::cos(ang).to(dtype);
    sin = at::sin(ang).to(dtype);
  }
}

void run_family(const char* family, const char* rerun_flag, uint64_t seed, int64_t count,
                int64_t only, int64_t max_failures, bool verbose, ServingRun& run,
                const std::function<std::string(int64_t, std::vector<std::string>&, bool)>& one) {
  const int64_t first = only >= 0 ? only : 0;
  const int64_t last = only >= 0 ? only + 1 : count;
  for (int64_t i = first; i < last; ++i) {
    // Odd cases run their launches' blocks and threads in reverse order (a rerun of one case
    // keeps its order).
    set_reverse_order(i % 2 == 1);
    std::vector<std::string> problems;
    const std::string described = one(i, problems, verbose);
    ++run.cases;
    if (!problems.empty()) {
      ++run.failures;
      std::printf("FAILED %s case %lld: %s\n", family, static_cast<long long>(i),
                  described.c_str());
      for (const std::string& p : problems) {
        std::printf("    %s\n", p.c_str());
      }
      std::printf("  rerun: cuda_host_run --seed %llu %s %lld -v\n",
                  static_cast<unsigned long long>(seed), rerun_flag, static_cast<long long>(i));
      if (run.failures >= max_failures) {
        break;
      }
    }
  }
}

}  // namespace rope_host
