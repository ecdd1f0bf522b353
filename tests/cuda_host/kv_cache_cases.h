// SPDX-License-Identifier: BSD-3-Clause
// The host run of rope.apply_qk_cache on CUDA (the row streams' kernel,
// csrc/cuda/common_stream_kernel.cuh) through the glue every CUDA op shares (common_glue.h) with
// the simulated runtime: random calls on CPU tensors, each held bit for bit against the CPU
// backend's answer to the same call (q_out, and every byte of the cache buffers, padding and
// untouched slots included: the 16-bit rounding and the fp8 quantization alike), q and the rotated
// k rows also against the extended-precision reference of compare.h, the inputs against their
// copies, and each launch for its device and stream. Each case is a pure function of (seed, index).
//
// The cases are the configurations in which the CPU kernel computes every element exactly as the
// CUDA kernel does (compare.h's CpuVectorPath: float32 tables, 16/32-bit storage, a rotary dim
// its vector path covers whole). Float64 math, float64 tables and odd rotary dims, and calls with
// an out-of-range position or slot, are checked against an independent reference by the
// torch-free run of the same kernel (stream_host.cpp).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "compare.h"

namespace rope_host {

struct KvCacheRun {
  int64_t cases = 0;
  int64_t failures = 0;
  bool bit_exact = true;           // false: the CPU kernel has no FMA copy here, no case ran
  int64_t elements_same_bits = 0;  // compared bit for bit with the CPU backend
  Tally reference;  // elements also held to the extended-precision reference (q, k rows)
  std::map<std::string, int64_t> coverage;
};

// Runs cases [0, count) (or only `only` when >= 0); prints each failure with its rerun line.
KvCacheRun run_kv_cache_cases(uint64_t seed, int64_t count, int64_t only, int64_t max_failures,
                              bool verbose, const CpuVectorPath& cpu_path);

}  // namespace rope_host
