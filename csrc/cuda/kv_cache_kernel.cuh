// SPDX-License-Identifier: BSD-3-Clause
// rope.apply_qk_cache on CUDA: the kernel and its launcher, free of torch (like rope_kernel.cuh),
// so tests/cuda_host runs it on the host with the shims: no shared memory, barriers, shuffles or
// atomics; every thread works alone.
//
// One thread per unit of work, in three segments of one grid:
//   q: (token, q head, unit)  -> q_out            unit = a plane (rotary_dim / 2 of them) or a
//   k: (token, kv head, unit) -> k_cache row         tail feature (head_dim - rotary_dim)
//   v: (token, kv head, feature) -> v_cache row
// A token whose slot_mapping entry is negative (padding) writes no cache row; its q is rotated.
// The math is the CPU kernel's: plane (a, b) -> (fma(a, c, -(b s)), fma(a, s, b c)) in float
// (double for double storage), rounded once to the storage type, or quantized for fp8 caches
// (kv_cache_args.h). A slot outside [0, num_slots) or a position outside the tables trips
// ROPE_DEVICE_ASSERT and writes nothing. Two tokens with one slot race: which one's row the cache
// keeps is unspecified (the CPU backend refuses such a slot_mapping).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cassert>
#include <cstdint>
#include <type_traits>

#include "../kv_cache_args.h"

#ifndef ROPE_DEVICE_ASSERT
#define ROPE_DEVICE_ASSERT(cond) assert(cond)
#endif

namespace rope::cuda {
namespace kv {

constexpr int kBlockThreads = 256;

struct KvKernelParams {
  KvCacheArgs args;
  TableArgs tables;
  bool interleaved = true;
  int64_t units = 0;      // per q or k row: planes + tail features
  int64_t q_threads = 0;  // T * Hq * units
  int64_t k_threads = 0;  // T * Hkv * units
  int64_t total = 0;      // + T * Hkv * v_dim
};

// The grid of one call; total == 0 means nothing to launch.
inline KvKernelParams plan(const KvCacheArgs& a, const TableArgs& tables, bool interleaved) {
  KvKernelParams p;
  p.args = a;
  p.tables = tables;
  p.interleaved = interleaved;
  p.units = a.rotary_dim / 2 + (a.head_dim - a.rotary_dim);
  p.q_threads = a.num_tokens * a.q_heads * p.units;
  p.k_threads = a.num_tokens * a.kv_heads * p.units;
  p.total = p.q_threads + p.k_threads + (a.v != nullptr ? a.num_tokens * a.kv_heads * a.v_dim : 0);
  return p;
}

template <typename T>
using acc_of = std::conditional_t<std::is_same_v<T, double>, double, float>;

__device__ __forceinline__ float widen(float v) { return v; }
__device__ __forceinline__ double widen(double v) { return v; }
__device__ __forceinline__ float widen(__half v) { return __half2float(v); }
__device__ __forceinline__ float widen(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T, typename A>
__device__ __forceinline__ T narrow(A v) {
  if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(v);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(v);
  } else {
    return v;
  }
}

__device__ __forceinline__ float fused(float x, float y, float z) { return fmaf(x, y, z); }
__device__ __forceinline__ double fused(double x, double y, double z) { return fma(x, y, z); }

// Stores `value` as element `i` of a row in `format`.
template <typename scalar_t, typename A>
__device__ __forceinline__ void store(void* row, int64_t i, A value, CacheFormat format,
                                      const float* scale) {
  if (format == CacheFormat::kSame) {
    static_cast<scalar_t*>(row)[i] = narrow<scalar_t>(value);
  } else {
    static_cast<uint8_t*>(row)[i] = quantize_fp8(value, __ldg(scale), format);
  }
}

struct QuotRem {
  int64_t quot;
  int64_t rem;
};

// n / d and n % d for n >= 0, d > 0; 32-bit when both fit.
__device__ __forceinline__ QuotRem div_rem(int64_t n, int64_t d) {
  if ((static_cast<uint64_t>(n) | static_cast<uint64_t>(d)) <= 0xffffffffull) {
    const uint32_t q = static_cast<uint32_t>(n) / static_cast<uint32_t>(d);
    return {static_cast<int64_t>(q), n - static_cast<int64_t>(q) * d};
  }
  return {n / d, n % d};
}

// The position at pos_off, range-checked; false (after the assert) when outside the tables.
__device__ __forceinline__ bool load_position(const KvCacheArgs& a, const TableArgs& tb,
                                              int64_t pos_off, int64_t& pos) {
  pos = a.positions_are_int64
            ? static_cast<int64_t>(__ldg(static_cast<const long long*>(a.positions) + pos_off))
            : static_cast<int64_t>(__ldg(static_cast<const int*>(a.positions) + pos_off));
  ROPE_DEVICE_ASSERT(pos >= 0 && pos < tb.max_seq_len);
  return pos >= 0 && pos < tb.max_seq_len;
}

// The cache slot of token t, range-checked; false for padding and (after the assert) for a slot
// past the cache.
__device__ __forceinline__ bool load_slot(const KvCacheArgs& a, const CacheArgs& c, int64_t t,
                                          int64_t& slot) {
  slot =
      static_cast<int64_t>(__ldg(reinterpret_cast<const long long*>(a.slots) + t * a.slot_stride));
  if (slot < 0) {
    return false;  // padding
  }
  ROPE_DEVICE_ASSERT(slot < c.num_slots);
  return slot < c.num_slots;
}

// Unit u of one row: plane u (u < rotary_dim / 2) or tail feature rotary_dim + u - planes.
template <typename scalar_t, typename table_t>
__device__ __forceinline__ void rotate_unit(const KvKernelParams& p, const scalar_t* in, void* out,
                                            CacheFormat format, const float* scale, int64_t u,
                                            int64_t pos_off) {
  using A = acc_of<scalar_t>;
  const KvCacheArgs& a = p.args;
  const int64_t planes = a.rotary_dim / 2;
  // Every unit checks its row's position (a cached load), so a row with a bad position writes
  // nothing at all, tail included.
  int64_t pos;
  if (!load_position(a, p.tables, pos_off, pos)) {
    return;
  }
  if (u >= planes) {
    const int64_t f = a.rotary_dim + (u - planes);
    store<scalar_t>(out, f, widen(in[f]), format, scale);
    return;
  }
  const int64_t ia = p.interleaved ? 2 * u : u;
  const int64_t ib = p.interleaved ? 2 * u + 1 : u + planes;
  const int64_t t_off = pos * p.tables.table_stride + u;
  const A c = static_cast<A>(__ldg(static_cast<const table_t*>(p.tables.cos) + t_off));
  const A s = static_cast<A>(__ldg(static_cast<const table_t*>(p.tables.sin) + t_off));
  const A xa = widen(in[ia]);
  const A xb = widen(in[ib]);
  store<scalar_t>(out, ia, fused(xa, c, -(xb * s)), format, scale);
  store<scalar_t>(out, ib, fused(xa, s, xb * c), format, scale);
}

template <typename scalar_t, typename table_t>
__device__ __forceinline__ void kv_thread(const KvKernelParams& p, int64_t w) {
  const KvCacheArgs& a = p.args;
  if (w < p.q_threads) {
    const QuotRem unit = div_rem(w, p.units);
    const QuotRem th = div_rem(unit.quot, a.q_heads);
    const auto* in =
        static_cast<const scalar_t*>(a.q) + th.quot * a.q_token_stride + th.rem * a.q_head_stride;
    void* out = static_cast<scalar_t*>(a.q_out) + unit.quot * a.head_dim;
    rotate_unit<scalar_t, table_t>(p, in, out, CacheFormat::kSame, nullptr, unit.rem,
                                   th.quot * a.q_pos_token_stride + th.rem * a.q_pos_head_stride);
    return;
  }
  w -= p.q_threads;
  const CacheArgs& kc = a.k_cache;
  const CacheArgs& vc = a.v_cache;
  if (w < p.k_threads) {
    const QuotRem unit = div_rem(w, p.units);
    const QuotRem th = div_rem(unit.quot, a.kv_heads);
    int64_t slot;
    if (!load_slot(a, kc, th.quot, slot)) {
      return;
    }
    const auto* in =
        static_cast<const scalar_t*>(a.k) + th.quot * a.k_token_stride + th.rem * a.k_head_stride;
    const int64_t row = cache_row(kc, slot, th.rem);
    void* out = kc.format == CacheFormat::kSame
                    ? static_cast<void*>(static_cast<scalar_t*>(kc.data) + row)
                    : static_cast<void*>(static_cast<uint8_t*>(kc.data) + row);
    rotate_unit<scalar_t, table_t>(p, in, out, kc.format, kc.scale, unit.rem,
                                   th.quot * a.k_pos_token_stride + th.rem * a.k_pos_head_stride);
    return;
  }
  w -= p.k_threads;
  const QuotRem feature = div_rem(w, a.v_dim);
  const QuotRem th = div_rem(feature.quot, a.kv_heads);
  int64_t slot;
  if (!load_slot(a, vc, th.quot, slot)) {
    return;
  }
  const auto* in =
      static_cast<const scalar_t*>(a.v) + th.quot * a.v_token_stride + th.rem * a.v_head_stride;
  const int64_t row = cache_row(vc, slot, th.rem);
  void* out = vc.format == CacheFormat::kSame
                  ? static_cast<void*>(static_cast<scalar_t*>(vc.data) + row)
                  : static_cast<void*>(static_cast<uint8_t*>(vc.data) + row);
  store<scalar_t>(out, feature.rem, widen(in[feature.rem]), vc.format, vc.scale);
}

template <typename scalar_t, typename table_t>
__global__ void __launch_bounds__(kBlockThreads)
    kv_cache_kernel(const __grid_constant__ KvKernelParams params) {
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kBlockThreads + threadIdx.x;
  if (w < params.total) {
    kv_thread<scalar_t, table_t>(params, w);
  }
}

}  // namespace kv

// Launches rope.apply_qk_cache's kernel on `stream`; scalar_t is the storage type of q, k, v
// (double, float, __half, __nv_bfloat16). Does not synchronize; returns the launch status.
template <typename scalar_t>
cudaError_t apply_qk_cache(const KvCacheArgs& args, const TableArgs& tables, bool interleaved,
                           cudaStream_t stream) {
  kv::KvKernelParams params = kv::plan(args, tables, interleaved);
  if (params.total == 0) {
    return cudaSuccess;
  }
  const int64_t blocks = (params.total + kv::kBlockThreads - 1) / kv::kBlockThreads;
  if (blocks > 0x7fffffff) {
    return cudaErrorInvalidConfiguration;
  }
  void* kernel_args[] = {&params};
  if (tables.tables_are_double) {
    return cudaLaunchKernel(kv::kv_cache_kernel<scalar_t, double>,
                            dim3(static_cast<unsigned int>(blocks)), dim3(kv::kBlockThreads),
                            kernel_args, 0, stream);
  }
  return cudaLaunchKernel(kv::kv_cache_kernel<scalar_t, float>,
                          dim3(static_cast<unsigned int>(blocks)), dim3(kv::kBlockThreads),
                          kernel_args, 0, stream);
}

}  // namespace rope::cuda
