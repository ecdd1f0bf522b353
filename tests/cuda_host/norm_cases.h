// SPDX-License-Identifier: BSD-3-Clause
// The host run of rope.rms_norm_apply_qk's CUDA kernel (the row streams' common_stream_kernel.cuh,
// through common_stream_layout.h's rows of any apply_qk shape): random
// calls through its glue (common_glue.h) with the simulated runtime, each held against the
// extended-precision reference of compare.h, the CPU backend, the access rules of
// access_tracker.h and unchanged inputs. Each case is a pure function of (seed, index).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "compare.h"

namespace rope_host {

struct NormRun {
  int64_t cases = 0;
  int64_t failures = 0;
  int64_t elements_same_bits = 0;  // host run against the CPU backend, bit for bit
  int64_t assert_cases = 0;
  std::map<std::string, int64_t> coverage;
};

// Runs cases [0, count) (or only `only` when >= 0); prints each failure with its rerun line.
// `cpu_path.fused`: the CPU copy fuses its multiply-adds as the CUDA kernel does, so the host run
// must equal the CPU backend bit for bit (both run the row streams' math).
NormRun run_norm_cases(uint64_t seed, int64_t count, int64_t only, int64_t max_failures,
                       bool verbose, const CpuVectorPath& cpu_path, Tally& tally);

}  // namespace rope_host
