// SPDX-License-Identifier: BSD-3-Clause
#include "forms_cases.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <quadmath.h>
#include <torch_rope/ops.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>

#include "compare.h"
#include "host_backend.h"

namespace rope_host {
namespace {

enum class FormOp { kApply, kInPlace, kOut, kQK };
enum class Form { kFreqs, kVarlen, kFreqsVarlen };

const char* form_op_name(FormOp op) {
  switch (op) {
    case FormOp::kApply:
      return "apply";
    case FormOp::kInPlace:
      return "apply_";
    case FormOp::kOut:
      return "apply.out";
    default:
      return "apply_qk";
  }
}

const char* form_name(Form f) {
  return f == Form::kFreqs ? "freqs" : f == Form::kVarlen ? "varlen" : "freqs_varlen";
}

struct FormCase {
  int64_t index = 0;
  FormOp op = FormOp::kApply;
  Form form = Form::kFreqs;
  at::ScalarType dtype = at::kFloat;
  bool interleaved = true;
  bool inverse = false;
  int64_t head_dim = 0;
  int64_t rotary_dim = 0;
  double attention_factor = 1.0;
  at::Tensor x, x_buffer, k, k_buffer, out, out_buffer;
  at::Tensor freqs, freqs_buffer;  // float64, possibly a strided view
  at::Tensor cos, sin;             // the tables of the varlen form
  at::Tensor positions;            // the frequency form's
  std::vector<int64_t> section;
  bool mrope_interleaved = false;
  at::Tensor cu_seqlens, seq_offsets;  // packed sequences (seq_offsets may be undefined)
  int64_t cp_size = 1;
  int64_t cp_rank = 0;
  bool packed_on_host = false;  // cu_seqlens / seq_offsets left on the CPU (not on the device)
  at::Tensor rule_positions;    // (T,) int64: the packed sequences' positions, from the rules
  bool valid = true;
  std::string bad;  // what makes the call invalid
  // A non-finite frequency on the device: the CPU backend refuses it (its check reads freqs on the
  // host), the CUDA kernel gives NaN in that plane, as a NaN in a table would (no device check:
  // that would need a host sync). The call is valid on the device.
  bool nonfinite_freq = false;
  std::string layout;
  int device = 0;

  bool packed() const { return form != Form::kFreqs; }
  bool frequencies() const { return form != Form::kVarlen; }

  std::string describe() const {
    std::ostringstream m;
    m << "forms case " << index << ": " << form_op_name(op) << "." << form_name(form) << " "
      << c10::toString(dtype) << " x" << x.sizes() << x.strides() << " (" << layout << ")"
      << ", head_dim " << head_dim << ", rotary_dim " << rotary_dim
      << (interleaved ? ", interleaved" : ", half split") << (inverse ? ", inverse" : "");
    if (frequencies()) {
      m << ", freqs stride " << (freqs.numel() > 1 ? freqs.stride(0) : 1) << ", af "
        << attention_factor;
    } else {
      m << ", tables " << c10::toString(cos.scalar_type()) << " " << cos.sizes();
    }
    if (packed()) {
      m << ", cu_seqlens " << cu_seqlens.sizes() << " " << c10::toString(cu_seqlens.scalar_type())
        << ", cp " << cp_rank << "/" << cp_size << (seq_offsets.defined() ? ", offsets" : "")
        << (packed_on_host ? ", on the host" : "");
    } else {
      m << ", positions " << positions.sizes() << " " << c10::toString(positions.scalar_type());
      if (!section.empty()) {
        m << ", mrope_section " << at::IntArrayRef(section)
          << (mrope_interleaved ? " interleaved" : "");
      }
    }
    if (!valid) {
      m << ", BAD: " << bad;
    }
    if (nonfinite_freq) {
      m << ", a non-finite frequency";
    }
    return m.str();
  }

  rope::detail::AngleSource angles() const {
    return frequencies() ? rope::detail::AngleSource::of_frequencies(freqs, attention_factor)
                         : rope::detail::AngleSource::tables(cos, sin);
  }
  rope::detail::PackedArgs packed_args() const {
    return rope::detail::PackedArgs{cu_seqlens, seq_offsets, cp_size, cp_rank};
  }
  rope::detail::MultiAxisArgs axes() const {
    return section.empty()
               ? rope::detail::MultiAxisArgs{}
               : rope::detail::MultiAxisArgs{at::IntArrayRef(section), mrope_interleaved};
  }
};

// A view of `shape` inside a larger buffer: contiguous, after a storage offset, or with padded
// rows, filled with normal values times `scale`.
struct View {
  at::Tensor view;
  at::Tensor buffer;
};

View make_view(std::mt19937_64& rng, at::Generator& gen, std::vector<int64_t> shape,
               at::ScalarType dtype, double scale, std::string& layout) {
  const auto pick = [&](int64_t n) { return static_cast<int64_t>(rng() % n); };
  const int64_t kind = pick(4);
  std::vector<int64_t> alloc = shape;
  int64_t offset = 0;
  if (kind == 1) {
    alloc.back() += 1 + pick(3);  // padded rows
    layout += "padded-rows ";
  } else if (kind == 2) {
    offset = 1 + pick(3);  // misaligned start
    layout += "offset ";
  }
  int64_t numel = offset;
  int64_t prod = 1;
  for (const int64_t s : alloc) prod *= s;
  numel += prod + 3;
  at::Tensor buffer = at::randn({numel}, gen, at::kDouble).mul(scale).to(dtype);
  at::Tensor v = buffer.narrow(0, offset, prod).view(alloc);
  if (kind == 1) {
    v = v.narrow(-1, 0, shape.back());
  }
  if (kind == 3 && shape.size() >= 3) {
    // dims 0 and 1 swapped in memory: a transposed view
    std::vector<int64_t> swapped = shape;
    std::swap(swapped[0], swapped[1]);
    v = buffer.narrow(0, 0, prod).view(swapped).transpose(0, 1);
    layout += "transposed ";
  } else if (kind == 0 || kind == 3) {
    layout += "contiguous ";
  }
  return {v, buffer};
}

// The positions of local tokens of packed sequences, written out from the rules token by token.
at::Tensor rule_positions(const std::vector<int64_t>& cu, const std::vector<int64_t>& offsets,
                          int64_t cp, int64_t rank) {
  std::vector<int64_t> out;
  for (size_t i = 0; i + 1 < cu.size(); ++i) {
    const int64_t length = cu[i + 1] - cu[i];
    const int64_t off = offsets.empty() ? 0 : offsets[i];
    if (cp == 1) {
      for (int64_t j = 0; j < length; ++j) out.push_back(off + j);
      continue;
    }
    const int64_t c = length / (2 * cp);
    for (int64_t j = 0; j < c; ++j) out.push_back(off + rank * c + j);
    for (int64_t j = 0; j < c; ++j) out.push_back(off + (2 * cp - 1 - rank) * c + j);
  }
  return at::tensor(out, at::kLong);
}

FormCase make_form_case(uint64_t seed, int64_t index) {
  std::mt19937_64 rng(seed * 0x2545f4914f6cdd1dull + static_cast<uint64_t>(index) * 104729 + 35);
  const auto pick = [&](int64_t n) { return static_cast<int64_t>(rng() % n); };
  auto gen = at::make_generator<at::CPUGeneratorImpl>(rng());
  FormCase c;
  c.index = index;
  c.form = static_cast<Form>(pick(3));
  c.op = static_cast<FormOp>(pick(4));
  const at::ScalarType dtypes[] = {at::kDouble, at::kFloat, at::kHalf, at::kBFloat16};
  c.dtype = dtypes[pick(4)];
  const int64_t head_dims[] = {2, 4, 6, 8, 10, 16, 18, 32, 34, 64, 72, 128};
  c.head_dim = head_dims[pick(12)];
  const int64_t D = c.head_dim;
  const int64_t rd_choices[] = {D, D, D - 2, (D / 2) & ~int64_t{1}, 0};
  c.rotary_dim = std::max<int64_t>(0, rd_choices[pick(5)]);
  const int64_t half = c.rotary_dim / 2;
  c.interleaved = pick(2) == 0;
  c.inverse = pick(2) == 0;
  c.attention_factor = pick(2) == 0 ? 1.0 : 0.5 + 1.5 * static_cast<double>(pick(1000)) / 1000;
  c.device = static_cast<int>(pick(8));
  const double scale = pick(4) == 0 ? 1e-3 : pick(3) == 0 ? 50.0 : 1.0;

  // The angle source.
  if (c.frequencies()) {
    std::vector<double> f(static_cast<size_t>(half));
    const bool theta_style = pick(2) == 0;
    const double theta = pick(2) ? 1e4 : 5e5;
    for (int64_t k = 0; k < half; ++k) {
      f[k] = theta_style ? std::pow(theta, -2.0 * static_cast<double>(k) / c.rotary_dim)
                         : std::ldexp(1.0 + static_cast<double>(pick(1 << 20)) / (1 << 20),
                                      -30 + static_cast<int>(pick(34))) *
                               (pick(5) == 0 ? -1.0 : 1.0);
    }
    if (half > 0 && pick(12) == 0) {
      const double nonfinite[] = {HUGE_VAL, -HUGE_VAL, std::nan("")};
      f[pick(half)] = nonfinite[pick(3)];
      c.nonfinite_freq = true;
    }
    const bool strided = pick(3) == 0;
    if (half == 0 && pick(2) == 0) {
      // A fresh empty tensor: its data pointer is null, and it is still the frequency form.
      c.freqs_buffer = at::empty({0}, at::kDouble);
      c.freqs = c.freqs_buffer;
    } else {
      c.freqs_buffer = at::zeros({std::max<int64_t>(1, half * (strided ? 2 : 1))}, at::kDouble);
      for (int64_t k = 0; k < half; ++k) {
        c.freqs_buffer[strided ? 2 * k : k] = f[k];
      }
      c.freqs =
          strided ? c.freqs_buffer.slice(0, 0, 2 * half, 2) : c.freqs_buffer.narrow(0, 0, half);
    }
  }

  const auto position = [&]() -> int64_t {
    switch (pick(4)) {
      case 0:
        return pick(64);
      case 1:
        return pick(int64_t{1} << 31);
      default:
        return static_cast<int64_t>(std::ldexp(1.0, static_cast<int>(pick(41)))) + pick(1000);
    }
  };

  if (!c.packed()) {
    // Frequency form with positions: the documented layouts.
    const int64_t B = 1 + pick(2), H = 1 + pick(4), S = 1 + pick(6);
    std::vector<int64_t> x_shape;
    std::vector<int64_t> pos_shape;
    switch (pick(4)) {
      case 0:
        x_shape = {B, H, S, D}, pos_shape = {S};
        c.layout = "bhsd/(S) ";
        break;
      case 1:
        x_shape = {B, S, H, D}, pos_shape = {B, S, 1};
        c.layout = "bshd/(B,S,1) ";
        break;
      case 2:
        x_shape = {B * S, H, D}, pos_shape = {B * S, 1};
        c.layout = "thd/(T,1) ";
        break;
      default:
        x_shape = {B, H, S, D}, pos_shape = {B, 1, S};
        c.layout = "bhsd/(B,1,S) ";
        break;
    }
    const View v = make_view(rng, gen, x_shape, c.dtype, scale, c.layout);
    c.x = v.view;
    c.x_buffer = v.buffer;
    if (half > 0 && pick(4) == 0) {
      // Multi-axis positions: 1 to 3 axes.
      const int64_t axes = 1 + pick(3);
      c.section.assign(static_cast<size_t>(axes), 0);
      for (int64_t k = 0; k < half; ++k) ++c.section[pick(axes)];
      c.mrope_interleaved = axes == 3 && pick(2) == 0;
      pos_shape.push_back(axes);
    }
    int64_t numel = 1;
    for (const int64_t s : pos_shape) numel *= s;
    std::vector<int64_t> values(static_cast<size_t>(numel));
    const bool int32 = pick(4) == 0;
    for (auto& p : values) {
      p = int32 ? pick(int64_t{1} << 31) : position();
    }
    if (pick(12) == 0) {
      values[pick(numel)] = -1 - pick(5);  // a negative position: asserted, rows unwritten
      c.valid = false;
      c.bad = "a negative position";
    }
    c.positions = at::tensor(values, at::kLong).view(pos_shape).to(int32 ? at::kInt : at::kLong);
  } else {
    // Packed sequences.
    c.cp_size = std::vector<int64_t>{1, 1, 2, 4}[pick(4)];
    c.cp_rank = pick(c.cp_size);
    const int64_t unit = c.cp_size > 1 ? 2 * c.cp_size : 1;
    const int64_t n = pick(10) == 0 ? 40 + pick(30) : pick(6) + (pick(8) == 0 ? 0 : 1);
    std::vector<int64_t> cu{0};
    for (int64_t i = 0; i < n; ++i) {
      cu.push_back(cu.back() + (pick(4) == 0 ? 0 : unit * (1 + pick(4))));
    }
    std::vector<int64_t> offsets;
    if (pick(2) == 0) {
      for (int64_t i = 0; i < n; ++i) {
        offsets.push_back(c.frequencies() && pick(2) ? position() : pick(100));
      }
    }
    const int64_t T = cu.back() / c.cp_size;
    c.rule_positions = rule_positions(cu, offsets, c.cp_size, c.cp_rank);
    const int64_t H = 1 + pick(4);
    const bool two_dim = pick(6) == 0;
    c.layout = two_dim ? "td " : "thd ";
    const View v =
        make_view(rng, gen, two_dim ? std::vector<int64_t>{T, D} : std::vector<int64_t>{T, H, D},
                  c.dtype, scale, c.layout);
    c.x = v.view;
    c.x_buffer = v.buffer;
    c.packed_on_host = pick(4) == 0;
    const int64_t max_position =
        c.rule_positions.numel() > 0 ? c.rule_positions.max().item<int64_t>() : 0;
    bool empty_offsets = false;  // seq_offsets given, with no element (cu_seqlens = [0])
    // Every kind of bad packing the CPU refuses, on the host (refused before a launch) and on the
    // device (asserted, the rows of the tokens concerned unwritten).
    // A kind that does not apply to the case (each says when it does) changes nothing: another
    // is drawn, up to eight times, so that the rarer kinds are drawn often enough.
    for (int attempt = 0; attempt < 8 && c.valid && n > 0 && (attempt > 0 || pick(5) == 0);
         ++attempt) {
      switch (pick(9)) {
        case 0:
          cu.back() += c.cp_size;  // one more token than x has
          c.bad = "cu_seqlens ends past x's tokens";
          c.valid = false;
          break;
        case 3:
          cu.front() = -c.cp_size - pick(3);
          c.bad = "a negative cu_seqlens[0]";
          c.valid = false;
          break;
        case 4:
          // Host only: on the device each token checks what its own sequence shows (a binary
          // search over the boundaries), which a decreasing cu_seqlens need not show to any token.
          if (n >= 2 && c.packed_on_host) {
            const int64_t i = 1 + pick(n - 1);
            cu[i] = cu[i + 1] + c.cp_size;  // after cu[i + 1]: decreasing
            c.bad = "cu_seqlens decreasing";
            c.valid = false;
          }
          break;
        case 5:
          if (c.cp_size > 1) {
            // A boundary moved by cp_size inside a sequence long enough to keep the boundaries
            // in order: two lengths off the 2 * cp_size multiple.
            std::vector<int64_t> movable;
            for (int64_t i = 1; i < n; ++i) {
              if (cu[i + 1] - cu[i] > c.cp_size) movable.push_back(i);
            }
            if (!movable.empty()) {
              cu[movable[pick(static_cast<int64_t>(movable.size()))]] += c.cp_size;
              c.bad = "a sequence length not divisible by 2 * cp_size";
              c.valid = false;
            }
          }
          break;
        case 6:
          if (cu.back() >= c.cp_size) {
            cu.back() -= c.cp_size;  // one token of x in no sequence
            c.bad = "cu_seqlens ends before x's tokens";
            c.valid = false;
          }
          break;
        case 7:
          if (T > 0) {
            // No sequence at all for x's tokens (cu_seqlens[1] and seq_offsets[0] do not exist).
            cu.assign(1, 0);
            empty_offsets = !offsets.empty();
            offsets.clear();
            c.bad = "cu_seqlens = [0] with tokens";
            c.valid = false;
          }
          break;
        case 8:
          if (!offsets.empty() && max_position > 0) {
            // A sequence whose rank holds a position past its first (cp_size 1: two tokens or
            // more; any sequence with tokens otherwise): INT64_MAX plus that position overflows.
            std::vector<int64_t> with_tokens;
            for (int64_t i = 0; i < n; ++i) {
              if (cu[i + 1] - cu[i] >= 2) with_tokens.push_back(i);
            }
            if (!with_tokens.empty()) {
              offsets[with_tokens[pick(static_cast<int64_t>(with_tokens.size()))]] =
                  std::numeric_limits<int64_t>::max();
              c.bad = "seq_offsets + positions past int64";
              c.valid = false;
            }
          }
          break;
        case 1: {
          // On a sequence with tokens: the kernel checks what a token's own sequence shows (an
          // empty sequence's offset is read by no token; the host check refuses it on the CPU).
          std::vector<int64_t> with_tokens;
          for (int64_t i = 0; i < n && !offsets.empty(); ++i) {
            if (cu[i + 1] > cu[i]) with_tokens.push_back(i);
          }
          if (!with_tokens.empty()) {
            offsets[with_tokens[pick(static_cast<int64_t>(with_tokens.size()))]] = -1;
            c.bad = "a negative offset";
            c.valid = false;
          }
          break;
        }
        default:
          if (!c.frequencies() && T > 0 && max_position >= 1) {
            c.bad = "a position past the tables";
            c.valid = false;
          }
          break;
      }
    }
    // int32 only where every value fits (a frequency-form offset may be 2^62); cu_seqlens and
    // seq_offsets each take their own type, as a caller may give them.
    const auto fits_int32 = [](int64_t v) {
      return v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max();
    };
    const auto index_type = [&](const std::vector<int64_t>& values) {
      return pick(2) != 0 || !std::all_of(values.begin(), values.end(), fits_int32) ? at::kLong
                                                                                    : at::kInt;
    };
    c.cu_seqlens = at::tensor(cu, at::kLong).to(index_type(cu));
    if (!offsets.empty()) {
      c.seq_offsets = at::tensor(offsets, at::kLong).to(index_type(offsets));
    } else if (empty_offsets) {
      c.seq_offsets = at::empty({0}, at::kLong).to(index_type(offsets));
    }
    if (!c.frequencies()) {
      const bool past = c.bad == "a position past the tables";
      const int64_t rows = past ? std::max<int64_t>(1, max_position) : max_position + 1 + pick(4);
      const at::ScalarType table_type = pick(4) == 0 ? at::kDouble : at::kFloat;
      c.cos = at::randn({rows, half}, gen, at::kDouble).to(table_type);
      c.sin = at::randn({rows, half}, gen, at::kDouble).to(table_type);
    }
  }
  if (c.op == FormOp::kQK) {
    std::vector<int64_t> k_shape(c.x.sizes().begin(), c.x.sizes().end());
    if (k_shape.size() >= 3) {
      k_shape[k_shape.size() - 2] = 1 + pick(k_shape[k_shape.size() - 2]);
    }
    if (!c.packed() && k_shape.size() == 4 && c.layout.rfind("bhsd", 0) == 0) {
      k_shape[1] = 1 + pick(k_shape[1]);  // GQA over the heads dim of (B, H, S, D)
      k_shape[2] = c.x.size(2);
    }
    std::string k_layout;
    const View kv = make_view(rng, gen, k_shape, c.dtype, scale, k_layout);
    c.k = kv.view;
    c.k_buffer = kv.buffer;
  }
  if (c.op == FormOp::kOut) {
    std::string out_layout;
    const View o = make_view(rng, gen, std::vector<int64_t>(c.x.sizes().begin(), c.x.sizes().end()),
                             c.dtype, 1.0, out_layout);
    c.out = o.view;
    c.out_buffer = o.buffer;
    c.out_buffer.fill_(7);
  }
  return c;
}

// ---- the binary128 reference of the frequency form ---------------------------------------------

// cos and sin of p * f exactly (|p| <= 2^40, |f| < 16: p * f is exact in binary128's 113 bits,
// and fmodq by a 2pi rounded to 113 bits leaves an error below 2^-68).
void exact_sincos(int64_t p, double f, __float128& c, __float128& s) {
  const __float128 angle = static_cast<__float128>(p) * static_cast<__float128>(f);
  const __float128 reduced = fmodq(angle, 2 * M_PIq);
  c = cosq(reduced);
  s = sinq(reduced);
}

// The largest of |got - exact| / bound over `got` (the call's result for x), each element's bound
// that of its storage type; appends a problem for every element past it (a few at most).
double check_frequencies(const FormCase& c, const at::Tensor& got, const at::Tensor& x,
                         const at::Tensor& plane_positions, Tally& tally,
                         std::vector<std::string>& problems) {
  const int64_t half = c.rotary_dim / 2;
  const int64_t D = c.head_dim;
  const at::Tensor x64 = x.to(at::kDouble).contiguous().view({-1, D});
  const at::Tensor y64 = got.to(at::kDouble).contiguous().view({-1, D});
  const at::Tensor pp = plane_positions.contiguous().view({-1, std::max<int64_t>(half, 1)});
  const auto* xa = x64.const_data_ptr<double>();
  const auto* ya = y64.const_data_ptr<double>();
  const auto* pa = pp.const_data_ptr<int64_t>();
  std::vector<double> f(static_cast<size_t>(half));
  for (int64_t k = 0; k < half; ++k) f[k] = c.freqs[k].item<double>();
  const double af = c.attention_factor;
  double worst = 0;
  int reported = 0;
  const int64_t rows = x64.size(0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < half; ++k) {
      const int64_t ia = c.interleaved ? 2 * k : k;
      const int64_t ib = c.interleaved ? 2 * k + 1 : k + half;
      const double a = xa[r * D + ia];
      const double b = xa[r * D + ib];
      __float128 cq, sq;
      exact_sincos(pa[r * half + k], f[k], cq, sq);
      if (c.inverse) sq = -sq;
      const __float128 afq = af;
      const double want[2] = {static_cast<double>(afq * (a * cq - b * sq)),
                              static_cast<double>(afq * (a * sq + b * cq))};
      const double magnitude = af * (std::fabs(a) + std::fabs(b));
      for (int e = 0; e < 2; ++e) {
        const double y = ya[r * D + (e == 0 ? ia : ib)];
        if (!std::isfinite(f[k])) {
          // A non-finite frequency: NaN for any position and any x (cos and sin of inf or NaN).
          if (!std::isnan(y) && reported++ < 3) {
            std::ostringstream m;
            m << "row " << r << " plane " << k << (e == 0 ? " a" : " b") << ": frequency " << f[k]
              << " gave " << y << ", not NaN";
            problems.push_back(m.str());
          }
          continue;
        }
        double bound = 0;
        if (c.dtype == at::kDouble) {
          bound = std::ldexp(magnitude, -49) + 1e-300;
        } else {
          bound = std::ldexp(magnitude, -23) * (1 + std::ldexp(1.0, -10)) + std::ldexp(1.0, -147);
          if (c.dtype != at::kFloat) {
            // then one rounding to the 16-bit type: half an ulp of the float32 result
            const int mant = c.dtype == at::kHalf ? 10 : 7;
            const int min_exp = c.dtype == at::kHalf ? -14 : -126;
            int ex = 0;
            std::frexp(std::fabs(want[e]) + bound, &ex);
            bound += std::ldexp(1.0, std::max(ex - 1, min_exp) - mant - 1);
          }
        }
        const double err = std::fabs(y - want[e]);
        const double ratio = err / bound;
        worst = std::max(worst, ratio);
        if (!(err <= bound) && reported++ < 3) {
          std::ostringstream m;
          m << "row " << r << " plane " << k << (e == 0 ? " a" : " b") << " at position "
            << pa[r * half + k] << ": got " << y << ", exact " << want[e] << " (error " << ratio
            << " of the bound)";
          problems.push_back(m.str());
        }
      }
    }
  }
  tally.bounded += rows * 2 * half;
  tally.worst = std::max(tally.worst, worst);
  return worst;
}

// Each plane's position of each row of x: (rows..., half) int64.
at::Tensor plane_positions(const FormCase& c, const at::Tensor& x) {
  const int64_t half = c.rotary_dim / 2;
  const auto rows = x.sizes().slice(0, x.dim() - 1);
  if (c.packed()) {
    std::vector<int64_t> shape(rows.begin(), rows.end());
    shape.push_back(half);
    std::vector<int64_t> view_shape(rows.size(), 1);
    view_shape[0] = -1;
    view_shape.push_back(1);
    return c.rule_positions.view(view_shape).expand(shape).contiguous();
  }
  if (c.section.empty()) {
    std::vector<int64_t> shape(rows.begin(), rows.end());
    at::Tensor p = at::broadcast_to(c.positions.to(at::kLong), rows).unsqueeze(-1);
    shape.push_back(half);
    return p.expand(shape).contiguous();
  }
  std::vector<int64_t> full(rows.begin(), rows.end());
  full.push_back(static_cast<int64_t>(c.section.size()));
  const at::Tensor p = at::broadcast_to(c.positions.to(at::kLong), full).contiguous();
  std::vector<int64_t> axis(static_cast<size_t>(half));
  for (int64_t k = 0; k < half; ++k) axis[k] = reference_axis(c.section, c.mrope_interleaved, k);
  return p.index_select(-1, at::tensor(axis, at::kLong)).contiguous();
}

// The op of the case on the CPU backend (plain CPU tensors), for its acceptance or refusal.
bool cpu_accepts(const FormCase& c) {
  try {
    if (c.frequencies() && c.packed()) {
      (void)rope::apply(
          c.x, rope::Frequencies{c.freqs, c.attention_factor},
          rope::PackedSequences{
              c.cu_seqlens, c.seq_offsets.defined() ? std::optional(c.seq_offsets) : std::nullopt,
              c.cp_size, c.cp_rank},
          c.interleaved, c.inverse);
    } else if (c.frequencies()) {
      (void)rope::apply(
          c.x, rope::Frequencies{c.freqs, c.attention_factor}, c.positions, c.interleaved,
          c.inverse,
          c.section.empty() ? at::OptionalIntArrayRef() : at::OptionalIntArrayRef(c.section),
          c.mrope_interleaved);
    } else {
      (void)rope::apply(
          c.x, c.cos, c.sin,
          rope::PackedSequences{
              c.cu_seqlens, c.seq_offsets.defined() ? std::optional(c.seq_offsets) : std::nullopt,
              c.cp_size, c.cp_rank},
          c.interleaved, c.inverse);
    }
    return true;
  } catch (const c10::Error&) {
    return false;
  }
}

// The same op of the host run given positions (the rules' for packed sequences): the yardstick
// of the packed forms, bit for bit.
at::Tensor host_with_positions(CaseContext& ctx, const FormCase& c, const at::Tensor& x) {
  std::vector<int64_t> shape(static_cast<size_t>(x.dim() - 1), 1);
  shape[0] = -1;
  const at::Tensor positions = c.rule_positions.view(shape);
  ctx.place(positions);
  if (c.frequencies()) {
    const rope::detail::PositionSource where{&positions, nullptr};
    return host_apply_form(ctx, "rope.apply.freqs", x, c.angles(), where, c.interleaved, c.inverse);
  }
  return host_apply(ctx, x, c.cos, c.sin, positions, c.interleaved, c.inverse);
}

std::vector<std::string> run_form_case(const FormCase& c, const CpuVectorPath& cpu_path,
                                       FormsRun& run, Tally& tally) {
  CaseContext ctx;
  ctx.device = Device{c.device, 1 + c.device % 5};
  ctx.start_device = (c.device + 1) % 8;
  ctx.positions_in_range = c.valid;
  for (const at::Tensor* t :
       {&c.x_buffer, &c.k_buffer, &c.out_buffer, &c.freqs_buffer, &c.cos, &c.sin, &c.positions}) {
    ctx.place(*t);
  }
  if (!c.packed_on_host) {
    ctx.place(c.cu_seqlens);
    ctx.place(c.seq_offsets);
  } else {
    ctx.keep_on_host(c.cu_seqlens);
    ctx.keep_on_host(c.seq_offsets);
  }
  std::vector<std::string>& problems = ctx.problems;
  const at::Tensor x_buffer_before = c.x_buffer.clone();
  const at::Tensor x_before = c.x.clone();
  const at::Tensor k_before = c.k.defined() ? c.k.clone() : at::Tensor();
  const at::Tensor k_buffer_before = c.k.defined() ? c.k_buffer.clone() : at::Tensor();
  const at::Tensor out_buffer_before = c.out.defined() ? c.out_buffer.clone() : at::Tensor();

  const bool cpu_ok = cpu_accepts(c);
  const bool cpu_should_accept = c.valid && !c.nonfinite_freq;
  if (cpu_ok != cpu_should_accept) {
    problems.push_back(cpu_should_accept ? "the CPU backend refused a valid call"
                                         : "the CPU backend accepted an invalid call");
  }

  const auto angles = c.angles();
  const rope::detail::PackedArgs packed = c.packed_args();
  const rope::detail::PositionSource where{c.packed() ? nullptr : &c.positions,
                                           c.packed() ? &packed : nullptr};
  const std::string name = std::string("rope.") + form_op_name(c.op) + "." + form_name(c.form);
  at::Tensor host_x;
  at::Tensor host_k;
  bool raised = false;
  try {
    switch (c.op) {
      case FormOp::kApply:
        host_x = host_apply_form(ctx, name.c_str(), c.x, angles, where, c.interleaved, c.inverse,
                                 c.axes());
        break;
      case FormOp::kInPlace:
        host_apply_inplace_form(ctx, name.c_str(), c.x, angles, where, c.interleaved, c.inverse,
                                c.axes());
        host_x = c.x;
        break;
      case FormOp::kOut:
        host_apply_out_form(ctx, name.c_str(), c.x, angles, where, c.interleaved, c.inverse,
                            c.axes(), c.out);
        host_x = c.out;
        break;
      case FormOp::kQK:
        std::tie(host_x, host_k) = host_apply_qk_form(ctx, name.c_str(), c.x, c.k, angles, where,
                                                      c.interleaved, c.inverse, c.axes());
        break;
    }
  } catch (const c10::Error& e) {
    raised = true;
    // Only packed sequences given on the host are checked on the host; on the device they are
    // asserted in the kernel.
    if (c.valid || !c.packed_on_host) {
      problems.push_back(std::string("the host-run op raised: ") + e.what_without_backtrace());
    }
  }
  if (!c.valid && c.packed_on_host && !raised) {
    problems.push_back("bad packed sequences given on the host were not refused on the host");
  }
  if (raised && !ctx.launches.empty()) {
    problems.push_back("a launch before the host-side refusal");
  }
  if (c.packed_on_host && c.valid && ctx.host_copies == 0 && c.x.numel() > 0) {
    problems.push_back("packed sequences on the host were not copied to the device");
  }

  // Inputs untouched; the writing ops wrote only inside their view.
  if (c.op == FormOp::kInPlace) {
    if (!outside_unchanged(x_buffer_before, c.x_buffer, c.x)) {
      problems.push_back("apply_ changed memory outside x's view");
    }
    if (raised && !same_bits(x_buffer_before, c.x_buffer)) {
      problems.push_back("a refused apply_ wrote x");
    }
  } else if (!same_bits(x_buffer_before, c.x_buffer)) {
    problems.push_back("x's buffer changed");
  }
  if (c.op == FormOp::kOut && !outside_unchanged(out_buffer_before, c.out_buffer, c.out)) {
    problems.push_back("apply.out changed memory outside out's view");
  }
  if (c.op == FormOp::kQK && !same_bits(k_buffer_before, c.k_buffer)) {
    problems.push_back("k's buffer changed");
  }
  if (!raised && c.x.numel() + (c.k.defined() ? c.k.numel() : 0) > 0 && ctx.launches.size() != 1) {
    problems.push_back("expected one launch, got " + std::to_string(ctx.launches.size()));
  }

  if (c.valid && problems.empty() && host_x.defined()) {
    const std::vector<std::pair<at::Tensor, at::Tensor>> results =
        c.op == FormOp::kQK
            ? std::vector<std::pair<at::Tensor, at::Tensor>>{{host_x, x_before}, {host_k, k_before}}
            : std::vector<std::pair<at::Tensor, at::Tensor>>{{host_x, x_before}};
    for (const auto& [got, input] : results) {
      if (c.frequencies()) {
        run.worst = std::max(run.worst, check_frequencies(c, got, input, plane_positions(c, input),
                                                          tally, problems));
        run.bounded += got.numel();
      }
      if (c.packed()) {
        CaseContext ref_ctx;
        ref_ctx.device = ctx.device;
        ref_ctx.start_device = ctx.start_device;
        ref_ctx.place(input);
        for (const at::Tensor* t : {&c.freqs_buffer, &c.cos, &c.sin}) ref_ctx.place(*t);
        const at::Tensor want = host_with_positions(ref_ctx, c, input);
        // The reference's launches query the occupancy cache too (once per device and kernel).
        run.launches += static_cast<int64_t>(ref_ctx.launches.size());
        for (const LaunchRecord& r : ref_ctx.launches) {
          if (c.device < 64) {
            run.cached_queries.emplace(c.device, r.kernel);
          } else {
            ++run.uncached_queries;
          }
        }
        if (!same_bits(got, want)) {
          problems.push_back("the packed form differs from the same op given the rules' positions");
        } else {
          run.same_bits += got.numel();
        }
        if (!c.frequencies()) {
          // And the tables form against compare.h's reference and the CPU backend.
          std::vector<int64_t> shape(static_cast<size_t>(input.dim() - 1), 1);
          shape[0] = -1;
          const at::Tensor p = c.rule_positions.view(shape);
          const at::Tensor cpu = rope::apply(input, c.cos, c.sin, p, c.interleaved, c.inverse);
          compare_rotation("x", got, cpu, input, c.cos, c.sin, p, c.interleaved, c.inverse,
                           cpu_path, tally, problems);
        }
      }
    }
  }

  ++run.cases;
  run.launches += static_cast<int64_t>(ctx.launches.size());
  if (!c.valid) ++run.assert_cases;
  for (const LaunchRecord& r : ctx.launches) {
    if (c.device < 64) {
      run.cached_queries.emplace(c.device, r.kernel);
    } else {
      ++run.uncached_queries;
    }
    const rope::cuda::TensorPlan& t = r.params.tensor[0];
    run.coverage["forms: vector kernel"] += r.vector_kernel;
    run.coverage["forms: scalar-only kernel"] += !r.vector_kernel;
    run.coverage["forms: rotation, vector path"] +=
        t.rot_lanes > 0 && t.rot_access == rope::cuda::Access::kVector;
    run.coverage["forms: rotation, paired path"] +=
        t.rot_lanes > 0 && t.rot_access == rope::cuda::Access::kPair;
    run.coverage["forms: rotation, scalar path"] +=
        t.rot_lanes > 0 && t.rot_access == rope::cuda::Access::kScalar;
    run.coverage["forms: several rows per thread"] += t.rows_per_thread > 1;
  }
  const auto hit = [&](const std::string& what, bool cond) { run.coverage[what] += cond ? 1 : 0; };
  hit(std::string("forms: ") + form_op_name(c.op) + "." + form_name(c.form), true);
  for (const at::ScalarType t : {at::kDouble, at::kFloat, at::kHalf, at::kBFloat16}) {
    hit(std::string("forms: dtype ") + c10::toString(t), c.dtype == t);
  }
  hit("forms: attention factor", c.frequencies() && c.attention_factor != 1.0);
  hit("forms: strided freqs", c.frequencies() && c.freqs.numel() > 1 && c.freqs.stride(0) != 1);
  hit("forms: multi-axis positions with freqs", !c.section.empty());
  hit("forms: a position past 2^32", !c.packed() && c.positions.numel() > 0 &&
                                         c.positions.max().item<int64_t>() > (int64_t{1} << 32));
  hit("forms: a negative position asserted", !c.valid && !c.packed());
  hit("forms: context parallel", c.packed() && c.cp_size > 1);
  hit("forms: seq_offsets", c.packed() && c.seq_offsets.defined());
  hit("forms: int32 cu_seqlens", c.packed() && c.cu_seqlens.scalar_type() == at::kInt);
  hit("forms: an empty sequence",
      c.packed() && (c.cu_seqlens.narrow(0, 1, c.cu_seqlens.size(0) - 1) ==
                     c.cu_seqlens.narrow(0, 0, c.cu_seqlens.size(0) - 1))
                        .any()
                        .item<bool>());
  hit("forms: packed sequences given on the host", c.packed() && c.packed_on_host);
  hit("forms: bad packed sequences asserted", !c.valid && c.packed() && !c.packed_on_host);
  hit("forms: bad packed sequences refused on the host",
      !c.valid && c.packed() && c.packed_on_host);
  hit("forms: a non-finite frequency on the device", c.nonfinite_freq);
  hit("forms: an empty freqs with a null data pointer",
      c.frequencies() && c.freqs.numel() == 0 && c.freqs.data_ptr() == nullptr);
  hit("forms: cu_seqlens and seq_offsets of different types",
      c.packed() && c.seq_offsets.defined() &&
          c.seq_offsets.scalar_type() != c.cu_seqlens.scalar_type());
  for (const char* kind :
       {"a negative cu_seqlens[0]", "a sequence length not divisible by 2 * cp_size",
        "cu_seqlens ends before x's tokens", "cu_seqlens ends past x's tokens",
        "cu_seqlens = [0] with tokens", "seq_offsets + positions past int64",
        "a negative offset"}) {
    hit(std::string("forms: bad packing on the device: ") + kind,
        c.packed() && !c.packed_on_host && c.bad == kind);
  }
  hit("forms: inverse", c.inverse);
  hit("forms: half split", !c.interleaved);
  return problems;
}

}  // namespace

FormsRun run_form_cases(uint64_t seed, int64_t count, int64_t only, int64_t max_failures,
                        bool verbose, const CpuVectorPath& cpu_path, Tally& tally) {
  FormsRun run;
  const int64_t first = only >= 0 ? only : 0;
  const int64_t last = only >= 0 ? only + 1 : count;
  for (int64_t i = first; i < last; ++i) {
    // Odd cases run their launches' blocks and threads in reverse order (a rerun of one case
    // keeps its order).
    set_reverse_order(i % 2 == 1);
    const FormCase c = make_form_case(seed, i);
    if (verbose) {
      std::printf("%s\n", c.describe().c_str());
    }
    const std::vector<std::string> problems = run_form_case(c, cpu_path, run, tally);
    if (!problems.empty()) {
      ++run.failures;
      std::printf("FAILED %s\n", c.describe().c_str());
      for (const std::string& p : problems) {
        std::printf("    %s\n", p.c_str());
      }
      std::printf("  rerun: cuda_host_run --seed %llu --forms-only %lld -v\n",
                  static_cast<unsigned long long>(seed), static_cast<long long>(i));
      if (run.failures >= max_failures) {
        break;
      }
    }
  }
  return run;
}

}  // namespace rope_host
