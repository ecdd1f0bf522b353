// SPDX-License-Identifier: BSD-3-Clause
// The host run of the new argument forms (csrc/rope_forms.h): random calls of rope.apply,
// apply_, apply.*_out and apply_qk with frequencies instead of tables (rope_kernel.cuh's
// rope_freqs_kernel) and with packed sequences instead of positions, through the CUDA glue
// (common_glue.h's Forms) with the simulated runtime. Each case is held against:
//   - the frequency form: an independent reference in binary128 (__float128: p * f exact, the
//     reduction by fmodq) within the accuracy the op states, 2^-23 af (|a| + |b|) per float32
//     output (16-bit: that plus one rounding; float64: 2^-50 af (|a| + |b|));
//   - packed sequences: the same host-run op given the positions this file writes out from the
//     rules, bit for bit (and, with tables, compare.h's reference and the CPU backend);
//   - the access rules of access_tracker.h (with a bad packing or a negative position: device
//     asserts, and nothing of the bad rows written), unchanged inputs, and the CPU backend's
//     acceptance or refusal of the same call.
// Each case is a pure function of (seed, index).
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "compare.h"

namespace rope_host {

struct FormsRun {
  int64_t cases = 0;
  int64_t failures = 0;
  int64_t assert_cases = 0;
  int64_t launches = 0;
  double worst = 0;       // largest error / bound of the frequency form against binary128
  int64_t bounded = 0;    // elements held to that bound
  int64_t same_bits = 0;  // elements bit for bit against the positions form
  std::map<std::string, int64_t> coverage;
  // (device, kernel) of every launch below device 64, and the launches above: for the driver's
  // check of the occupancy cache.
  std::set<std::pair<int, const void*>> cached_queries;
  int64_t uncached_queries = 0;
};

// Runs cases [0, count) (or only `only` when >= 0); prints each failure with its rerun line.
FormsRun run_form_cases(uint64_t seed, int64_t count, int64_t only, int64_t max_failures,
                        bool verbose, const CpuVectorPath& cpu_path, Tally& tally);

}  // namespace rope_host
