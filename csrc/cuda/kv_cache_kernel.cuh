// SPDX-License-Identifier: BSD-3-Clause
// rope.apply_qk_cache on CUDA: the kernel and its launcher, free of torch (like rope_kernel.cuh;
// its device helpers are common_device.cuh's), so tests/cuda_host runs it on the host with the
// shims. Every thread works alone (no collective: each output element depends on its own row).
//
// One thread per unit of work, in three segments of one grid:
//   q: (token, q head, unit)  -> q_out            unit = a plane (rotary_dim / 2 of them) or a
//   k: (token, kv head, unit) -> k_cache row         tail feature (head_dim - rotary_dim)
//   v: (token, kv head, feature) -> v_cache row
// A token whose slot_mapping entry is negative (padding) writes no cache row; its q is rotated.
// The math is the CPU kernel's: rotate_plane (fma(a, c, -(b s)), fma(a, s, b c)) in float
// (double for double storage), rounded once to the storage type, or quantized for fp8 caches
// (kv_cache_args.h). A slot outside [0, num_slots) or a position outside the tables trips
// ROPE_DEVICE_ASSERT and writes nothing. Two tokens with one slot race: which one's row the cache
// keeps is unspecified (the CPU backend refuses such a slot_mapping).
#pragma once

#include "../kv_cache_args.h"
#include "common_device.cuh"

namespace rope::cuda {
namespace kv {

using namespace ::rope::cuda::device;

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

// Stores `value` as element `i` of a row in `format`: rounded once to the storage type, or
// quantized to fp8.
template <typename scalar_t, typename A>
__device__ __forceinline__ void store(void* row, int64_t i, A value, CacheFormat format,
                                      const float* scale) {
  if (format == CacheFormat::kSame) {
    store_scalar(static_cast<scalar_t*>(row) + i, from_acc<scalar_t>(value));
  } else {
    store_scalar(static_cast<uint8_t*>(row) + i, quantize_fp8(value, __ldg(scale), format));
  }
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
  using A = typename AccType<scalar_t>::type;
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
    store<scalar_t>(out, f, to_acc(load_scalar(in + f)), format, scale);
    return;
  }
  const int64_t ia = p.interleaved ? 2 * u : u;
  const int64_t ib = p.interleaved ? 2 * u + 1 : u + planes;
  const int64_t t_off = pos * p.tables.table_stride + u;
  const A c = static_cast<A>(__ldg(static_cast<const table_t*>(p.tables.cos) + t_off));
  const A s = static_cast<A>(__ldg(static_cast<const table_t*>(p.tables.sin) + t_off));
  A ra;
  A rb;
  rotate_plane(to_acc(load_scalar(in + ia)), to_acc(load_scalar(in + ib)), c, s, ra, rb);
  store<scalar_t>(out, ia, ra, format, scale);
  store<scalar_t>(out, ib, rb, format, scale);
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
  store<scalar_t>(out, feature.rem, to_acc(load_scalar(in + feature.rem)), vc.format, vc.scale);
}

template <typename scalar_t, typename table_t>
__global__ void __launch_bounds__(kBlockThreads)
    kv_cache_kernel(const __grid_constant__ KvKernelParams params) {
  const int64_t w = grid_thread_index<kBlockThreads>();
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
  const kv::KvKernelParams params = kv::plan(args, tables, interleaved);
  const int64_t blocks = device::blocks_for<kv::kBlockThreads>(params.total);
  return tables.tables_are_double ? device::launch_grid(kv::kv_cache_kernel<scalar_t, double>,
                                                        blocks, kv::kBlockThreads, params, stream)
                                  : device::launch_grid(kv::kv_cache_kernel<scalar_t, float>,
                                                        blocks, kv::kBlockThreads, params, stream);
}

}  // namespace rope::cuda
