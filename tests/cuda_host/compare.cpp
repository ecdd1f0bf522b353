// SPDX-License-Identifier: BSD-3-Clause
#include "compare.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <sstream>

#include "cpu/common_kernel_choice.h"

namespace rope_host {
namespace {

constexpr size_t kMaxProblemsPerCall = 3;

// Unit roundoff and smallest subnormal of a storage type.
struct Precision {
  double unit;
  double tiny;
};

Precision storage_precision(at::ScalarType t) {
  switch (t) {
    case at::kDouble:
      return {std::ldexp(1.0, -53), std::ldexp(1.0, -1074)};
    case at::kFloat:
      return {std::ldexp(1.0, -24), std::ldexp(1.0, -149)};
    case at::kHalf:
      return {std::ldexp(1.0, -11), std::ldexp(1.0, -24)};
    default:  // bfloat16: 8 significant bits, float's exponent range
      return {std::ldexp(1.0, -8), std::ldexp(1.0, -133)};
  }
}

uint64_t bits_at(const at::Tensor& contiguous, int64_t i) {
  const auto* base = static_cast<const unsigned char*>(contiguous.const_data_ptr());
  const size_t size = contiguous.element_size();
  uint64_t v = 0;
  std::memcpy(&v, base + i * size, size);
  return v;
}

// The axis each of `half` planes reads, from the definition of M-RoPE. Contiguous sections
// (Qwen2-VL): axis 0 owns the first sections[0] planes, axis 1 the next sections[1], and so on.
// Interleaved (Qwen3-VL, three axes t, h, w): the planes cycle t, h, w, ...; the j-th plane of
// the h slot (k = 3j + 1) reads h while j < sections[1], the j-th of the w slot (k = 3j + 2) reads
// w while j < sections[2]; every other plane reads t. One-axis positions: all zero.
std::vector<int64_t> reference_plane_axes(int64_t half, const std::vector<int64_t>& sections,
                                          bool mrope_interleaved) {
  std::vector<int64_t> axes(static_cast<size_t>(half), 0);
  if (sections.empty()) {
    return axes;
  }
  if (mrope_interleaved) {
    for (int64_t j = 0; 3 * j < half; ++j) {
      for (int64_t slot = 1; slot <= 2; ++slot) {
        if (3 * j + slot < half && j < sections[static_cast<size_t>(slot)]) {
          axes[static_cast<size_t>(3 * j + slot)] = slot;
        }
      }
    }
    return axes;
  }
  size_t k = 0;
  for (size_t a = 0; a < sections.size(); ++a) {
    for (int64_t n = 0; n < sections[a] && k < axes.size(); ++n) {
      axes[k++] = static_cast<int64_t>(a);
    }
  }
  return axes;
}

}  // namespace

CpuVectorPath cpu_vector_path() {
  CpuVectorPath p;
  p.name = rope::cpu::row_kernel_name();
  if (p.name == "AVX512") {
    p.fused = true;
    p.width = 16;
  } else if (p.name == "AVX2") {
    p.fused = true;
    p.width = 8;
  }
  return p;
}

void compare_rotation(const char* name, const at::Tensor& got, const at::Tensor& cpu,
                      const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                      const at::Tensor& positions, bool interleaved, bool inverse,
                      const CpuVectorPath& cpu_path, Tally& tally,
                      std::vector<std::string>& problems, const std::vector<int64_t>& mrope_section,
                      bool mrope_interleaved) {
  size_t reported = 0;
  const auto report = [&](const std::string& m) {
    if (reported++ < kMaxProblemsPerCall) {
      problems.push_back(std::string(name) + ": " + m);
    }
  };
  if (!got.sizes().equals(x.sizes()) || got.scalar_type() != x.scalar_type()) {
    std::ostringstream m;
    m << "result has shape " << got.sizes() << " and dtype " << got.scalar_type() << ", expected "
      << x.sizes() << " and " << x.scalar_type();
    report(m.str());
    return;
  }
  if (x.numel() == 0) {
    return;
  }
  const at::ScalarType dtype = x.scalar_type();
  const int64_t head_dim = x.size(-1);
  const int64_t rows = x.numel() / head_dim;
  const int64_t half = cos.size(1);
  const int64_t rotary_dim = 2 * half;

  const at::Tensor xs = x.contiguous();
  const at::Tensor xd = xs.to(at::kDouble);
  const at::Tensor gs = got.contiguous();
  const at::Tensor gd = gs.to(at::kDouble);
  const at::Tensor cs = cpu.contiguous();
  const at::Tensor cd = cs.to(at::kDouble);
  // Positions per row, [rows, num_axes]: one-axis positions as one axis.
  const int64_t num_axes = mrope_section.empty() ? 1 : static_cast<int64_t>(mrope_section.size());
  std::vector<int64_t> pos_shape(x.sizes().begin(), x.sizes().end() - 1);
  at::Tensor pos_rows = positions;
  if (!mrope_section.empty()) {
    pos_shape.push_back(num_axes);
  } else {
    pos_rows = positions.unsqueeze(-1);
    pos_shape.push_back(1);
  }
  const at::Tensor pos =
      pos_rows.expand(pos_shape).contiguous().to(at::kLong).reshape({rows, num_axes});
  const std::vector<int64_t> plane_axis =
      reference_plane_axes(cos.size(1), mrope_section, mrope_interleaved);
  const at::Tensor cosd = cos.to(at::kDouble).contiguous();
  const at::Tensor sind = sin.to(at::kDouble).contiguous();
  const double* xv = xd.const_data_ptr<double>();
  const double* gv = gd.const_data_ptr<double>();
  const double* cv = cd.const_data_ptr<double>();
  const int64_t* pv = pos.const_data_ptr<int64_t>();
  const double* cosv = cosd.const_data_ptr<double>();
  const double* sinv = sind.const_data_ptr<double>();

  const Precision st = storage_precision(dtype);
  const Precision acc = storage_precision(dtype == at::kDouble ? at::kDouble : at::kFloat);
  const double ref_unit = LDBL_EPSILON / 2;
  const int64_t exact_planes =
      cpu_path.fused && cos.scalar_type() == at::kFloat && dtype != at::kDouble
          ? half / cpu_path.width * cpu_path.width
          : 0;

  for (int64_t r = 0; r < rows; ++r) {
    const int64_t row = r * head_dim;
    // The tail is copied (or left in place): bit for bit the input, on both backends.
    for (int64_t f = rotary_dim; f < head_dim; ++f) {
      const uint64_t want = bits_at(xs, row + f);
      if (bits_at(gs, row + f) != want || bits_at(cs, row + f) != want) {
        std::ostringstream m;
        m << "row " << r << " feature " << f << " (tail) is not the input's: host " << gv[row + f]
          << ", cpu " << cv[row + f] << ", input " << xv[row + f];
        report(m.str());
      }
      ++tally.exact;
    }
    for (int64_t k = 0; k < half; ++k) {
      const int64_t p = pv[r * num_axes + plane_axis[static_cast<size_t>(k)]];
      const int64_t ia = interleaved ? 2 * k : k;
      const int64_t ib = interleaved ? 2 * k + 1 : k + half;
      const long double a = xv[row + ia];
      const long double b = xv[row + ib];
      const long double c = cosv[p * half + k];
      const long double s = inverse ? -sinv[p * half + k] : sinv[p * half + k];
      const long double want[2] = {a * c - b * s, a * s + b * c};
      // Float math (double for double storage) with float tables rounded from double ones: at
      // most 3 roundings of the magnitude S; then one rounding to storage.
      const double scale =
          static_cast<double>((std::fabs(a) + std::fabs(b)) * std::max(std::fabs(c), std::fabs(s)));
      const double slack = 3 * acc.unit * scale + 4 * acc.tiny;
      const int64_t idx[2] = {ia, ib};
      for (int side = 0; side < 2; ++side) {
        const int64_t i = row + idx[side];
        // In extended precision: rounding the reference to double would cost as much as the
        // float64 result's own error.
        const long double ref = want[side];
        const double bound = st.unit * (static_cast<double>(std::fabs(ref)) + slack) + slack +
                             st.tiny + 4 * ref_unit * scale;
        const double err = static_cast<double>(std::fabs(gv[i] - ref));
        tally.worst = std::max(tally.worst, err / bound);
        if (!(err <= bound)) {
          std::ostringstream m;
          m.precision(10);
          m << "row " << r << " feature " << idx[side] << " (plane " << k << ", axis "
            << plane_axis[static_cast<size_t>(k)] << ", position " << p << "): got " << gv[i]
            << ", reference " << static_cast<double>(ref) << ", error " << err << " > bound "
            << bound;
          report(m.str());
        }
        if (k < exact_planes) {
          ++tally.exact;
          if (bits_at(gs, i) != bits_at(cs, i)) {
            std::ostringstream m;
            m.precision(10);
            m << "row " << r << " feature " << idx[side] << " (plane " << k
              << ") differs from the CPU backend, which rounds the same way here: host " << gv[i]
              << ", cpu " << cv[i];
            report(m.str());
          }
        } else {
          ++tally.bounded;
          if (!(std::fabs(gv[i] - cv[i]) <= 2 * bound)) {
            std::ostringstream m;
            m.precision(10);
            m << "row " << r << " feature " << idx[side] << " (plane " << k << "): host " << gv[i]
              << " and cpu " << cv[i] << " differ by more than twice the bound " << bound;
            report(m.str());
          }
        }
      }
    }
  }
}

namespace {

// Unit roundoff of a storage type, and the smallest spacing near zero (subnormals).
long double unit_roundoff(at::ScalarType t) {
  switch (t) {
    case at::kDouble:
      return std::ldexp(1.0L, -53);
    case at::kFloat:
      return std::ldexp(1.0L, -24);
    case at::kHalf:
      return std::ldexp(1.0L, -11);
    default:
      return std::ldexp(1.0L, -8);
  }
}
long double tiny(at::ScalarType t) {
  return t == at::kHalf ? std::ldexp(1.0L, -25) : std::ldexp(1.0L, -126);
}

}  // namespace

void compare_norm_rotation(const char* name, const at::Tensor& got, const at::Tensor& x,
                           const at::Tensor& weight, const at::Tensor& cos, const at::Tensor& sin,
                           const at::Tensor& positions, const std::vector<int64_t>& section,
                           bool mrope_interleaved, double eps, double weight_offset,
                           bool interleaved, bool inverse, Tally& tally,
                           std::vector<std::string>& problems) {
  const int64_t D = x.size(-1);
  if (x.numel() == 0 || D == 0) {
    return;
  }
  if (!got.sizes().equals(x.sizes()) || got.scalar_type() != x.scalar_type()) {
    problems.push_back(std::string(name) + ": wrong shape or dtype");
    return;
  }
  const int64_t rows = x.numel() / D;
  const bool dbl = x.scalar_type() == at::kDouble;
  const at::Tensor xd = x.to(at::kDouble).contiguous();
  const at::Tensor gd = got.to(at::kDouble).contiguous();
  // The weight as the kernels take it: converted to the math type first.
  const at::Tensor wd = weight.to(dbl ? at::kDouble : at::kFloat).to(at::kDouble).contiguous();
  const int64_t A = static_cast<int64_t>(section.size());
  std::vector<int64_t> row_shape(x.sizes().begin(), x.sizes().end() - 1);
  std::vector<int64_t> pos_shape = row_shape;
  if (A > 0) {
    pos_shape.push_back(A);
  }
  const at::Tensor pd = positions.to(at::kLong).expand(pos_shape).contiguous();
  const at::Tensor cd = cos.to(at::kDouble).contiguous();
  const at::Tensor sd = sin.to(at::kDouble).contiguous();
  const int64_t half = cos.size(1);
  const double* xp = xd.const_data_ptr<double>();
  const double* gp = gd.const_data_ptr<double>();
  const double* wp = wd.const_data_ptr<double>();
  const int64_t* pp = pd.const_data_ptr<int64_t>();
  const double* cp = cd.const_data_ptr<double>();
  const double* sp = sd.const_data_ptr<double>();
  const long double us = unit_roundoff(x.scalar_type());
  const long double ua = dbl ? std::ldexp(1.0L, -53) : std::ldexp(1.0L, -24);
  const long double small = tiny(x.scalar_type());
  int64_t reported = 0;
  const auto check = [&](int64_t row, int64_t d, long double want, long double mag) {
    const long double have = gp[row * D + d];
    const long double err = std::fabs(have - want);
    const long double bound = us * std::fabs(want) + (D + 8) * ua * mag + small;
    ++tally.bounded;
    if (!(err <= bound)) {
      if (reported++ < 3) {
        std::ostringstream m;
        m << name << ": row " << row << " feature " << d << ": got " << static_cast<double>(have)
          << ", reference " << static_cast<double>(want) << " (error " << static_cast<double>(err)
          << " > bound " << static_cast<double>(bound) << ")";
        problems.push_back(m.str());
      }
      return;
    }
    tally.worst = std::max(tally.worst, static_cast<double>(err / bound));
  };
  std::vector<long double> y(static_cast<size_t>(D));
  for (int64_t row = 0; row < rows; ++row) {
    const double* xr = xp + row * D;
    long double ss = 0;
    for (int64_t d = 0; d < D; ++d) {
      ss += static_cast<long double>(xr[d]) * xr[d];
    }
    const long double r = 1.0L / std::sqrt(ss / D + static_cast<long double>(eps));
    for (int64_t d = 0; d < D; ++d) {
      y[d] = xr[d] * r * (static_cast<long double>(wp[d]) + weight_offset);
    }
    for (int64_t k = 0; k < half; ++k) {
      const int64_t ia = interleaved ? 2 * k : k;
      const int64_t ib = interleaved ? 2 * k + 1 : k + half;
      const int64_t p =
          A > 0 ? pp[row * A + reference_axis(section, mrope_interleaved, k)] : pp[row];
      const long double c = cp[p * half + k];
      const long double s = inverse ? -static_cast<long double>(sp[p * half + k])
                                    : static_cast<long double>(sp[p * half + k]);
      const long double mag =
          std::fabs(y[ia] * c) + std::fabs(y[ib] * s) + std::fabs(y[ia] * s) + std::fabs(y[ib] * c);
      check(row, ia, y[ia] * c - y[ib] * s, mag);
      check(row, ib, y[ia] * s + y[ib] * c, mag);
    }
    for (int64_t d = 2 * half; d < D; ++d) {
      check(row, d, y[d], std::fabs(y[d]));
    }
  }
}

int64_t reference_axis(const std::vector<int64_t>& section, bool mrope_interleaved, int64_t k) {
  if (section.empty()) {
    return 0;
  }
  if (mrope_interleaved) {
    if (k % 3 == 1 && k < 3 * section[1]) return 1;
    if (k % 3 == 2 && k < 3 * section[2]) return 2;
    return 0;
  }
  int64_t end = 0;
  for (size_t a = 0; a < section.size(); ++a) {
    end += section[a];
    if (k < end) return static_cast<int64_t>(a);
  }
  return static_cast<int64_t>(section.size()) - 1;
}

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor ac = a.contiguous();
  const at::Tensor bc = b.contiguous();
  return ac.sizes().equals(bc.sizes()) &&
         (ac.nbytes() == 0 ||
          std::memcmp(ac.const_data_ptr(), bc.const_data_ptr(), ac.nbytes()) == 0);
}

bool outside_unchanged(const at::Tensor& buffer_before, const at::Tensor& buffer_after,
                       const at::Tensor& view) {
  at::Tensor outside = at::ones({buffer_after.numel()}, at::kBool);
  outside.as_strided(view.sizes(), view.strides(), view.storage_offset()).fill_(false);
  const int64_t n = buffer_after.numel();
  const size_t size = buffer_after.element_size();
  const auto* a = static_cast<const unsigned char*>(buffer_before.const_data_ptr());
  const auto* b = static_cast<const unsigned char*>(buffer_after.const_data_ptr());
  const bool* keep = outside.const_data_ptr<bool>();
  for (int64_t i = 0; i < n; ++i) {
    if (keep[i] && std::memcmp(a + i * size, b + i * size, size) != 0) {
      return false;
    }
  }
  return true;
}

}  // namespace rope_host
