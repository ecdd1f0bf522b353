// SPDX-License-Identifier: BSD-3-Clause
// What the host-run cases of the serving fusions share (qk_fp8_cases.cpp, and each further
// fusion's cases file): random rows in the layouts callers hand over, buffers
// of random bits whose views the ops write (so every byte the op must not touch is compared too),
// the bit comparison with the CPU backend, and the tally of a family's run. Each family's run
// calls every op twice on the same inputs, once through the CPU backend and once through the
// CUDA glue with the host build of the row streams' kernel, and holds the two to the same bits:
// the kernels compute the math of csrc/common_row_streams.h in the same order (the CPU kernel's
// FMA copies), so any difference is a bug in one of them.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace rope_host {

struct ServingRun {
  int64_t cases = 0;
  int64_t failures = 0;
  bool bit_exact = true;           // false: the CPU kernel has no FMA copy here, no case ran
  int64_t elements_same_bits = 0;  // compared bit for bit with the CPU backend
  std::map<std::string, int64_t> coverage;
};

// The random draws of one case: a pure function of (seed, family, index).
struct Draw {
  Draw(uint64_t seed, uint64_t family, int64_t index);
  int64_t pick(int64_t n);  // uniform in [0, n)
  bool one_in(int64_t n) { return pick(n) == 0; }
  std::mt19937_64 rng;
  at::Generator gen;
};

// Random bits of `dtype`'s width: every byte distinct from what a call writes, NaN and subnormal
// codes included.
at::Tensor random_bits(Draw& d, at::IntArrayRef sizes, at::ScalarType dtype);

// The bytes of a tensor's elements as integers of their width, so that NaN codes compare equal.
at::Tensor bits_of(const at::Tensor& t);

// A view of `sizes` inside a larger buffer of random bits: padding after each row and between
// the leading dims, and sometimes one element of offset (a 16-byte misaligned view).
struct Buffered {
  at::Tensor buffer;
  at::Tensor view;
};
Buffered padded(Draw& d, at::IntArrayRef sizes, at::ScalarType dtype, bool allow_misaligned);

// The same buffer and view on fresh storage (the CPU backend's copy of a written tensor).
Buffered copy_of(const Buffered& b);

// (T, H, W) rows of `dtype`: contiguous, heads padded, heads-first transposed, sliced from a wider
// buffer, or one element off 16-byte alignment; values of a few magnitudes (some saturate fp8,
// some are fp8 subnormals). `layout` names what was drawn.
at::Tensor random_rows(Draw& d, int64_t T, int64_t H, int64_t W, at::ScalarType dtype,
                       std::string& layout);

// A per-tensor scale when `fp8` (a 0-d or 1-element float32 tensor of an assorted value), else
// none: a 16/32-bit target takes no scale.
std::optional<at::Tensor> random_fp8_scale(Draw& d, bool fp8);

// Named tensors of a case: outputs, or the buffers an op writes.
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// The checks that end every case: each got[i] bit for bit as want[i], every input as its copy
// taken before the call, the simulated runtime's problems, and one launch when there are tokens.
void finish_case(std::vector<std::string>& problems, const NamedTensors& got,
                 const NamedTensors& want, const std::vector<at::Tensor>& inputs,
                 const std::vector<at::Tensor>& before,
                 const std::vector<std::string>& runtime_problems, size_t launches, int64_t tokens,
                 ServingRun& run);

// Appends a problem when got's bits differ from want's; counts the elements compared.
void expect_same_bits(std::vector<std::string>& problems, const std::string& what,
                      const at::Tensor& got, const at::Tensor& want, int64_t& elements);

// The tables: angle p * theta^(-2k / R) in double, rounded once to `dtype`, as two views of one
// padded buffer sometimes.
void random_tables(Draw& d, int64_t max_seq_len, int64_t rotary_dim, at::ScalarType dtype,
                   at::Tensor& cos, at::Tensor& sin);

// Runs cases [0, count) (or only `only` when >= 0) of a family: `one(index, problems)` runs and
// checks case `index`, returning its description; failures print with their rerun line.
void run_family(const char* family, const char* rerun_flag, uint64_t seed, int64_t count,
                int64_t only, int64_t max_failures, bool verbose, ServingRun& run,
                const std::function<std::string(int64_t, std::vector<std::string>&, bool)>& one);

}  // namespace rope_host
