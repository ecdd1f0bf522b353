// SPDX-License-Identifier: BSD-3-Clause
// The host run of the serving fusions' CUDA code (the row streams' kernel,
// csrc/cuda/common_stream_kernel.cuh) through the glue every CUDA op shares (common_glue.h) with
// the simulated runtime: random calls of each op on CPU tensors, each held bit for bit against
// the CPU backend's answer to the same call (every output, and every byte of the buffers and
// caches the op writes, padding and untouched slots included), the inputs against their copies,
// and each launch for its device and stream. Each case is a pure function of (seed, index). The
// cases need the CPU kernel's FMA copy (compare.h's CpuVectorPath::fused); without it none runs,
// and the torch-free run (stream_host.cpp) still checks the kernel against its own reference.
#pragma once

#include <cstdint>

#include "compare.h"
#include "serving_support.h"

namespace rope_host {

// rope.apply_qk_fp8 and its out= overload (qk_fp8_cases.cpp).
ServingRun run_qk_fp8_cases(uint64_t seed, int64_t count, int64_t only, int64_t max_failures,
                            bool verbose, const CpuVectorPath& cpu_path);

// rope.rms_norm_apply_qk_cache, and rope.apply_qk_cache with multi-axis positions
// (kv_norm_cases.cpp).
ServingRun run_kv_norm_cases(uint64_t seed, int64_t count, int64_t only, int64_t max_failures,
                             bool verbose, const CpuVectorPath& cpu_path);

// rope.mla_apply_cache (mla_cases.cpp).
ServingRun run_mla_cases(uint64_t seed, int64_t count, int64_t only, int64_t max_failures,
                         bool verbose, const CpuVectorPath& cpu_path);

}  // namespace rope_host
