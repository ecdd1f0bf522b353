// SPDX-License-Identifier: BSD-3-Clause
// The two yardsticks of the host run: an independent reference in extended precision, written
// here from the definition of RoPE, and the CPU backend's answer.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace rope_host {

// Which planes the CPU kernel rotates with the same operations, in the same order, as the CUDA
// kernel: its vector path (at::vec fmsub / fmadd, i.e. fused multiply-adds) covers the planes
// [0, half / width * width) of float32 tables and non-double storage when it runs a copy
// compiled with FMA. Elsewhere (double storage or tables, the scalar remainder, a CPU copy
// without FMA) the compiler decides the rounding, so only a bound applies.
struct CpuVectorPath {
  bool fused = false;
  int64_t width = 0;  // floats per vector
  std::string name;   // the CPU kernel's name
};

CpuVectorPath cpu_vector_path();

struct Tally {
  int64_t exact = 0;    // elements that had to match the CPU backend bit for bit
  int64_t bounded = 0;  // elements held to the error bound only
  double worst = 0;     // largest |error| / bound against the reference
};

// Checks `got` (the host run's result for input `x`) against the reference and against `cpu`
// (the CPU backend's result for the same call). `x` is the input before the call. Appends
// problems, at most a few per call. A non-empty `mrope_section` makes the positions multi-axis
// (a trailing axis dim of that many entries): the reference then gathers each plane's position
// by its axis, by a rule written here from the definition (not common_kernel_args.h's
// axis_of_plane).
void compare_rotation(const char* name, const at::Tensor& got, const at::Tensor& cpu,
                      const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                      const at::Tensor& positions, bool interleaved, bool inverse,
                      const CpuVectorPath& cpu_path, Tally& tally,
                      std::vector<std::string>& problems,
                      const std::vector<int64_t>& mrope_section = {},
                      bool mrope_interleaved = false);

// rope.rms_norm_apply_qk: checks `got` (a result of the host run or of the CPU backend for input
// `x`, weight `weight`) against an independent extended-precision reference written here from
// the definition: y = x / sqrt(mean(x^2) + eps) * (weight + weight_offset) over the whole row,
// then plane k of the first 2 * cos.size(1) features turned by the table row of its position
// (its axis' position with a `section`). `positions` as the op took it. Every element is held
// to a bound of one rounding to the storage type plus the float (double) math of a row.
void compare_norm_rotation(const char* name, const at::Tensor& got, const at::Tensor& x,
                           const at::Tensor& weight, const at::Tensor& cos, const at::Tensor& sin,
                           const at::Tensor& positions, const std::vector<int64_t>& section,
                           bool mrope_interleaved, double eps, double weight_offset,
                           bool interleaved, bool inverse, Tally& tally,
                           std::vector<std::string>& problems);

// Bitwise equality of two tensors of one dtype and shape.
bool same_bits(const at::Tensor& a, const at::Tensor& b);

// The elements of `buffer_after` outside `view` (a view of that buffer) kept the bits they had in
// `buffer_before`.
bool outside_unchanged(const at::Tensor& buffer_before, const at::Tensor& buffer_after,
                       const at::Tensor& view);

// The axis plane k reads, from the definition of mrope_section / mrope_interleaved (written here
// again rather than taken from common_kernel_args.h, so a bug there cannot hide); 0 for one axis.
int64_t reference_axis(const std::vector<int64_t>& section, bool mrope_interleaved, int64_t k);

}  // namespace rope_host
