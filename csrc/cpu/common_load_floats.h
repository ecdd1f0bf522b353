// SPDX-License-Identifier: BSD-3-Clause
// kW elements of float, half or bfloat16 storage as one float vector: the load the per-capability
// row kernels that work in float share (rms_norm_rows.cpp, kv_cache_fp8_rows.cpp). Include it
// inside rope::cpu::CPU_CAPABILITY, after at::vec, like the kernels' other per-copy helpers.
#pragma once

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <type_traits>

namespace rope::cpu::CPU_CAPABILITY {
namespace {

template <typename scalar_t>
inline at::vec::Vectorized<float> load_floats(const scalar_t* p) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    return at::vec::Vectorized<float>::loadu(p);
  } else {
    at::vec::Vectorized<float> v;
    at::vec::load_to_float<scalar_t>(p, v);
    return v;
  }
}

}  // namespace
}  // namespace rope::cpu::CPU_CAPABILITY
