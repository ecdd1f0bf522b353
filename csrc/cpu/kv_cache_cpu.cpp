// SPDX-License-Identifier: BSD-3-Clause
// CPU backend of rope.apply_qk_cache: one parallel region over tokens. Each range of tokens
// rotates its q rows with the row kernel (into the new q_out), then, per token with a slot, its k
// rows with the same row kernel whose output pointer and strides are the cache rows, and copies
// its v rows. fp8 caches go through a per-thread float scratch row (the rotation in float32, or
// float64 for float64 inputs), then quantize as kv_cache_args.h's quantize_fp8 does, with the
// vectorised row helpers of kv_cache_fp8_rows.h.
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "../kv_cache_body.h"
#include "common_kernel_choice.h"
#include "common_stream_backend.h"
#include "kv_cache_fp8_rows.h"
#include "rope_parallel.h"  // kGrainFeatures

namespace rope::cpu {

Fp8RowKernels fp8_row_kernels() {
  static const Fp8RowKernels kernels = []() -> Fp8RowKernels {
#ifdef TORCH_ROPE_CPU_X86_DISPATCH
    [[maybe_unused]] const char* v = row_kernel_variant();
#if ROPE_CPU_HAS_AVX512_BF16
    if (std::strcmp(v, "AVX512_BF16") == 0) {
      return {&AVX512_BF16::quantize_fp8_row, &AVX512_BF16::widen_row};
    }
#endif
#if ROPE_CPU_HAS_AVX512
    if (std::strcmp(v, "AVX512") == 0) return {&AVX512::quantize_fp8_row, &AVX512::widen_row};
#endif
#if ROPE_CPU_HAS_AVX2
    if (std::strcmp(v, "AVX2") == 0) return {&AVX2::quantize_fp8_row, &AVX2::widen_row};
#endif
#endif
    return {&DEFAULT::quantize_fp8_row, &DEFAULT::widen_row};
  }();
  return kernels;
}

namespace {

template <typename T>
const T* at_offset(const void* base, int64_t elements) {
  return static_cast<const T*>(base) + elements;
}
template <typename T>
T* at_offset(void* base, int64_t elements) {
  return static_cast<T*>(base) + elements;
}

// Row-kernel arguments for the kv_heads rows of one token of `src` (k), written to `out` with
// head stride `out_head_stride`.
RotationArgs token_rows(const KvCacheArgs& a, const void* in, int64_t in_head_stride, void* out,
                        int64_t out_head_stride, int64_t token) {
  RotationArgs r;
  r.in = in;
  r.out = out;
  r.positions =
      a.positions_are_int64
          ? static_cast<const void*>(at_offset<int64_t>(a.positions, token * a.k_pos_token_stride))
          : static_cast<const void*>(at_offset<int32_t>(a.positions, token * a.k_pos_token_stride));
  r.positions_are_int64 = a.positions_are_int64;
  r.geometry.ndim = 1;
  r.geometry.num_rows = a.kv_heads;
  r.geometry.row_sizes[0] = a.kv_heads;
  r.geometry.in_strides[0] = in_head_stride;
  r.geometry.out_strides[0] = out_head_stride;
  r.geometry.pos_strides[0] = a.k_pos_head_stride;
  r.head_dim = a.head_dim;
  r.rotary_dim = a.rotary_dim;
  r.copy_tail = true;
  return r;
}

template <typename scalar_t>
void write_tokens(const KvCacheArgs& a, const TableArgs& tables, RotationMode mode,
                  RotateRowsFn rotate_rows, const Fp8RowKernels& fp8, int64_t t0, int64_t t1) {
  constexpr bool kDouble = std::is_same_v<scalar_t, double>;
  using acc_t = std::conditional_t<kDouble, double, float>;
  const c10::ScalarType dtype = c10::CppTypeToScalarType<scalar_t>::value;
  const c10::ScalarType acc_dtype = kDouble ? c10::kDouble : c10::kFloat;
  const CacheArgs& kc = a.k_cache;
  const CacheArgs& vc = a.v_cache;
  const int64_t D = a.head_dim;
  std::vector<acc_t> scratch;  // fp8 k: the token's rotated rows, (kv_heads, head_dim)
  if (kc.format != CacheFormat::kSame) {
    scratch.resize(static_cast<size_t>(a.kv_heads * D));
  }
  const float k_scale = kc.format != CacheFormat::kSame ? *kc.scale : 1.0f;
  const float v_scale = a.v != nullptr && vc.format != CacheFormat::kSame ? *vc.scale : 1.0f;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t slot = a.slots[t * a.slot_stride];
    if (slot < 0) {
      continue;  // padding: q only
    }
    const scalar_t* k = at_offset<scalar_t>(a.k, t * a.k_token_stride);
    if (kc.format == CacheFormat::kSame) {
      rotate_rows(
          dtype,
          token_rows(a, k, a.k_head_stride, at_offset<scalar_t>(kc.data, cache_row(kc, slot, 0)),
                     kc.head_stride, t),
          tables, mode, 0, a.kv_heads);
    } else {
      if constexpr (std::is_same_v<scalar_t, acc_t>) {
        rotate_rows(dtype, token_rows(a, k, a.k_head_stride, scratch.data(), D, t), tables, mode, 0,
                    a.kv_heads);
      } else {
        // 16-bit k: widen to float first (exact), then rotate in float without a rounding to
        // the 16-bit type in between: the value is rounded once, to fp8.
        for (int64_t h = 0; h < a.kv_heads; ++h) {
          fp8.widen(dtype, k + h * a.k_head_stride, scratch.data() + h * D, D);
        }
        RotationArgs in_place = token_rows(a, scratch.data(), D, scratch.data(), D, t);
        in_place.copy_tail = false;  // the tail is already there (memcpy onto itself is UB)
        rotate_rows(acc_dtype, in_place, tables, mode, 0, a.kv_heads);
      }
      const int64_t k_row0 = cache_row(kc, slot, 0);
      for (int64_t h = 0; h < a.kv_heads; ++h) {
        fp8.quantize(acc_dtype, scratch.data() + h * D,
                     at_offset<uint8_t>(kc.data, k_row0 + h * kc.head_stride), D, k_scale,
                     kc.format, ScaleRule::kDivide);
      }
    }
    if (a.v == nullptr) {
      continue;
    }
    const int64_t v_row0 = cache_row(vc, slot, 0);  // one division per token, not per head
    for (int64_t h = 0; h < a.kv_heads; ++h) {
      const scalar_t* v = at_offset<scalar_t>(a.v, t * a.v_token_stride + h * a.v_head_stride);
      const int64_t row = v_row0 + h * vc.head_stride;
      if (vc.format == CacheFormat::kSame) {
        std::memcpy(at_offset<scalar_t>(vc.data, row), v, sizeof(scalar_t) * a.v_dim);
      } else {
        fp8.quantize(dtype, v, at_offset<uint8_t>(vc.data, row), a.v_dim, v_scale, vc.format,
                     ScaleRule::kDivide);
      }
    }
  }
}

// The row streams' policy (host-side checks of positions and slots, and run_streams for
// multi-axis positions) plus the cache kernel of this file.
struct CpuKvBackend : CpuStreamsBackend {
  static void write_cache(c10::ScalarType dtype, const detail::PreparedKvCache& p,
                          bool interleaved) {
    const KvCacheArgs& a = p.args;
    const RotationMode mode{interleaved, false};
    const RotateRowsFn rotate_rows = row_kernel();
    const Fp8RowKernels fp8 = fp8_row_kernels();
    const int64_t per_token =
        std::max<int64_t>(1, (a.q_heads + a.kv_heads) * a.head_dim + a.kv_heads * a.v_dim);
    const int64_t grain = std::max<int64_t>(1, kGrainFeatures / per_token);
    at::parallel_for(0, a.num_tokens, grain, [&](int64_t t0, int64_t t1) {
      rotate_rows(dtype, p.q_call.args, p.tables.args, mode, t0 * a.q_heads, t1 * a.q_heads);
      switch (dtype) {
        case c10::kDouble:
          write_tokens<double>(a, p.tables.args, mode, rotate_rows, fp8, t0, t1);
          break;
        case c10::kFloat:
          write_tokens<float>(a, p.tables.args, mode, rotate_rows, fp8, t0, t1);
          break;
        case c10::kHalf:
          write_tokens<c10::Half>(a, p.tables.args, mode, rotate_rows, fp8, t0, t1);
          break;
        case c10::kBFloat16:
          write_tokens<c10::BFloat16>(a, p.tables.args, mode, rotate_rows, fp8, t0, t1);
          break;
        default:
          TORCH_INTERNAL_ASSERT(false, "rope.apply_qk_cache: unexpected dtype ", dtype);
      }
    });
  }
};

at::Tensor apply_qk_cache_cpu(const at::Tensor& q, const at::Tensor& k,
                              const std::optional<at::Tensor>& v, const at::Tensor& cos,
                              const at::Tensor& sin, const at::Tensor& positions,
                              const at::Tensor& k_cache, const std::optional<at::Tensor>& v_cache,
                              const at::Tensor& slot_mapping, bool interleaved,
                              const std::optional<at::Tensor>& k_scale,
                              const std::optional<at::Tensor>& v_scale,
                              at::OptionalIntArrayRef mrope_section, bool mrope_interleaved) {
  return detail::apply_qk_cache_body<CpuKvBackend>({q,
                                                    k,
                                                    v,
                                                    cos,
                                                    sin,
                                                    positions,
                                                    k_cache,
                                                    v_cache,
                                                    slot_mapping,
                                                    k_scale,
                                                    v_scale,
                                                    {mrope_section, mrope_interleaved}},
                                                   interleaved);
}

}  // namespace
}  // namespace rope::cpu

TORCH_LIBRARY_IMPL(rope, CPU, m) { m.impl("apply_qk_cache", &rope::cpu::apply_qk_cache_cpu); }
