// SPDX-License-Identifier: BSD-3-Clause
// torch-rope: rotary position embedding ops for LibTorch.
//
// Each function calls the `rope::` op through the PyTorch dispatcher, so C++ callers get the same
// CPU/CUDA kernels, autograd, and tracing as `torch.ops.rope.*` in Python.
//
// Conventions shared by all ops:
//  - x (q, k): floating tensor (float64, float32, float16, bfloat16) of shape (..., head_dim), any
//    strides; last-dim stride 1 is read without a copy, other layouts are copied once.
//  - cos, sin: tables of shape (max_seq_len, rotary_dim / 2), float32 or float64, usually from
//    rope::rope_tables(). rotary_dim = 2 * cos.size(-1) must be <= head_dim; features
//    [rotary_dim, head_dim) pass through unchanged.
//  - positions: int32 or int64, broadcastable (NumPy rules, aligned from the right) to
//    x.shape[:-1]: (S,) for (B, H, S, D); (B, 1, S) per sequence; (S, 1) or (B, S, 1) for
//    (B, S, H, D); (T, 1) for packed (T, H, D); start_pos + arange(S) when decoding with a KV
//    cache. Values must lie in [0, max_seq_len): CPU raises an IndexError-type c10::Error naming
//    the value and the bound; CUDA fails a device-side assert (no host sync).
//  - interleaved = true: plane k is features (2k, 2k+1) (GPT-J / Meta Llama / complex view).
//    interleaved = false: plane k is (k, k + rotary_dim/2) (rotate_half / GPT-NeoX / HF).
//  - Plane k at position p turns by p * inv_freq[k]; inverse = true turns by the negative angle,
//    which undoes the rotation and is its gradient.
//  - Multi-axis positions (M-RoPE: Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4V; 2-D vision RoPE):
//    with mrope_section = {s_0, ..., s_{A-1}} (planes per axis, adding up to rotary_dim / 2,
//    at most 4 axes), positions has a trailing axis dim of size A: positions[..., a] is axis a,
//    and positions.shape[:-1] broadcasts to x.shape[:-1]. Plane k turns by the position of its
//    axis: mrope_interleaved = false gives contiguous runs (the first s_0 planes read axis 0, the
//    next s_1 axis 1, ...); true (Qwen3-VL, A == 3) gives plane k axis 1 if k % 3 == 1 and
//    k < 3 * s_1, axis 2 if k % 3 == 2 and k < 3 * s_2, else axis 0. The section layout and the
//    pair layout (interleaved) are independent.
//  - Math runs in float32 (float64 for float64 inputs), whatever the storage dtype.
//  - Gradients flow to x (q, k) only; cos, sin and positions are not differentiable.
//  - Errors are c10::Error with a message naming the argument, the expectation and the value;
//    nothing is written when a check fails.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch_rope/tables.h>  // rope_tables: the cos/sin tables the ops take

#include <optional>
#include <string>
#include <tuple>

namespace rope {

// Returns x rotated by the angles of `positions`: a new contiguous tensor of x's shape and dtype.
at::Tensor apply(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                 const at::Tensor& positions, bool interleaved = true, bool inverse = false,
                 at::OptionalIntArrayRef mrope_section = std::nullopt,
                 bool mrope_interleaved = false);

// Rotates x in place (x must not have overlapping memory). All checks run before anything is
// written. Differentiable only when x is not a leaf that requires grad, as any in-place op.
void apply_(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
            const at::Tensor& positions, bool interleaved = true, bool inverse = false,
            at::OptionalIntArrayRef mrope_section = std::nullopt, bool mrope_interleaved = false);

// Writes x rotated into `out` (e.g. a KV-cache slot) and returns it. out must have x's shape,
// dtype and device, may be strided, is never resized, and must not share memory with any input.
// Not differentiable: throws when grad mode is on and an input requires grad, as aten's out= ops.
at::Tensor& apply_out(at::Tensor& out, const at::Tensor& x, const at::Tensor& cos,
                      const at::Tensor& sin, const at::Tensor& positions, bool interleaved = true,
                      bool inverse = false, at::OptionalIntArrayRef mrope_section = std::nullopt,
                      bool mrope_interleaved = false);

// Rotates queries and keys together; q and k may have different head counts (GQA) and positions
// broadcasts against q.shape[:-1] and k.shape[:-1] separately. On CUDA this is one kernel launch.
std::tuple<at::Tensor, at::Tensor> apply_qk(const at::Tensor& q, const at::Tensor& k,
                                            const at::Tensor& cos, const at::Tensor& sin,
                                            const at::Tensor& positions, bool interleaved = true,
                                            bool inverse = false,
                                            at::OptionalIntArrayRef mrope_section = std::nullopt,
                                            bool mrope_interleaved = false);

// ---- the frequency and packed-sequence forms (docs/architecture.md, "Angle sources and position
// sources"). Two small value types select them, so each call reads as what it does:
//   rope::apply(x, cos, sin, positions)                                   tables, positions
//   rope::apply(x, rope::Frequencies{freqs, af}, positions)               table-free
//   rope::apply(x, cos, sin, rope::PackedSequences{cu_seqlens})           packed sequences
//   rope::apply(x, rope::Frequencies{freqs}, rope::PackedSequences{cu})   both
// and likewise apply_, apply_out and apply_qk.

// The frequency form (table-free): plane k at position p turns by the exact real number
// p * freqs[k], freqs a float64 (rotary_dim / 2,) tensor on x's device (with multi-axis positions,
// plane k's own axis frequency), and the outputs are scaled by attention_factor (the tables carry
// it in cos and sin). Every float32 output of a pair (a, b) is within 2^-23 * attention_factor *
// (|a| + |b|) of the exact rotation, at any position p >= 0 (int64); 16-bit outputs are that
// float32 result rounded once; float64 ones are rotated in double. No memory per position, no
// position bound: positions need only be >= 0. freqs must be finite (checked on CPU tensors).
// rope::rope_frequencies (tables.h) gives a scaling variant's freqs and attention factor.
struct Frequencies {
  at::Tensor freqs;
  double attention_factor = 1.0;
};

// Packed sequences instead of positions (TransformerEngine's thd, flash-attn's varlen): x is
// (T, ..., head_dim) with its tokens on dim 0; cu_seqlens (N + 1,) int32/int64 holds the
// boundaries of N sequences (cu_seqlens[0] == 0, non-decreasing, cu_seqlens[N] == T * cp_size);
// token t of sequence i has position t - cu_seqlens[i] + seq_offsets[i] (seq_offsets (N,),
// default 0, >= 0). With context parallelism (cp_size > 1, TransformerEngine's zigzag layout)
// cu_seqlens holds the global, padded boundaries: every length divisible by 2 * cp_size, cut into
// 2 * cp_size chunks of c tokens, of which rank cp_rank holds chunks cp_rank and
// 2 * cp_size - 1 - cp_rank; local token j of sequence i (its local tokens start at
// cu_seqlens[i] / cp_size) has position cp_rank * c + j for j < c, else
// (2 * cp_size - 1 - cp_rank) * c + j - c, plus seq_offsets[i]. cu_seqlens and seq_offsets live on
// x's device or, for a CUDA x, on the CPU. Values are checked before anything is written where
// they are on the CPU; on CUDA, device values are checked by a device assert (no host sync).
struct PackedSequences {
  at::Tensor cu_seqlens;
  std::optional<at::Tensor> seq_offsets = std::nullopt;
  int64_t cp_size = 1;
  int64_t cp_rank = 0;
};

at::Tensor apply(const at::Tensor& x, const Frequencies& angles, const at::Tensor& positions,
                 bool interleaved = true, bool inverse = false,
                 at::OptionalIntArrayRef mrope_section = std::nullopt,
                 bool mrope_interleaved = false);
at::Tensor apply(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                 const PackedSequences& packed, bool interleaved = true, bool inverse = false);
at::Tensor apply(const at::Tensor& x, const Frequencies& angles, const PackedSequences& packed,
                 bool interleaved = true, bool inverse = false);

void apply_(at::Tensor& x, const Frequencies& angles, const at::Tensor& positions,
            bool interleaved = true, bool inverse = false,
            at::OptionalIntArrayRef mrope_section = std::nullopt, bool mrope_interleaved = false);
void apply_(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
            const PackedSequences& packed, bool interleaved = true, bool inverse = false);
void apply_(at::Tensor& x, const Frequencies& angles, const PackedSequences& packed,
            bool interleaved = true, bool inverse = false);

at::Tensor& apply_out(at::Tensor& out, const at::Tensor& x, const Frequencies& angles,
                      const at::Tensor& positions, bool interleaved = true, bool inverse = false,
                      at::OptionalIntArrayRef mrope_section = std::nullopt,
                      bool mrope_interleaved = false);
at::Tensor& apply_out(at::Tensor& out, const at::Tensor& x, const at::Tensor& cos,
                      const at::Tensor& sin, const PackedSequences& packed, bool interleaved = true,
                      bool inverse = false);
at::Tensor& apply_out(at::Tensor& out, const at::Tensor& x, const Frequencies& angles,
                      const PackedSequences& packed, bool interleaved = true, bool inverse = false);

std::tuple<at::Tensor, at::Tensor> apply_qk(const at::Tensor& q, const at::Tensor& k,
                                            const Frequencies& angles, const at::Tensor& positions,
                                            bool interleaved = true, bool inverse = false,
                                            at::OptionalIntArrayRef mrope_section = std::nullopt,
                                            bool mrope_interleaved = false);
std::tuple<at::Tensor, at::Tensor> apply_qk(const at::Tensor& q, const at::Tensor& k,
                                            const at::Tensor& cos, const at::Tensor& sin,
                                            const PackedSequences& packed, bool interleaved = true,
                                            bool inverse = false);
std::tuple<at::Tensor, at::Tensor> apply_qk(const at::Tensor& q, const at::Tensor& k,
                                            const Frequencies& angles,
                                            const PackedSequences& packed, bool interleaved = true,
                                            bool inverse = false);

// Rotates q and k as apply_qk and writes the rotated k, and v, into row slot_mapping[t] of
// k_cache / v_cache; returns the rotated q (a new tensor). q (T, Hq, D), k (T, Hkv, D), v
// (T, Hkv, Dv) or nullopt (then v_cache too); caches (num_slots, H, D) or paged (num_blocks,
// block_size, H, D), slot s = (s / block_size, s % block_size); slot_mapping int64 (T,), a
// negative slot skips the token's cache writes. A cache has its source's dtype, or is float8
// (e4m3fn, e5m2) with a float32 one-element scale on its device: stored =
// (value / scale).clamp(-max, max) rounded to fp8, bit for bit as torch. Bad input (slot out of
// range or repeated: CPU error, CUDA device assert / unspecified) writes nothing. Not
// differentiable. See docs/api.md, "RoPE into a KV cache".
at::Tensor apply_qk_cache(const at::Tensor& q, const at::Tensor& k,
                          const std::optional<at::Tensor>& v, const at::Tensor& cos,
                          const at::Tensor& sin, const at::Tensor& positions, at::Tensor& k_cache,
                          const std::optional<at::Tensor>& v_cache, const at::Tensor& slot_mapping,
                          bool interleaved = true,
                          const std::optional<at::Tensor>& k_scale = std::nullopt,
                          const std::optional<at::Tensor>& v_scale = std::nullopt,
                          at::OptionalIntArrayRef mrope_section = std::nullopt,
                          bool mrope_interleaved = false);

// QK-RMSNorm + RoPE + KV-cache write in one pass: rms_norm_apply_qk's norm and rotation of q and
// k (each row over its head_dim, y = x / sqrt(mean(x^2) + eps) * (weight + weight_offset), then
// rotated), k and v written into their cache rows as apply_qk_cache writes them (flat or paged,
// k/v's dtype or float8 with k_scale / v_scale, negative slot = skip). Returns q_out, in q's dtype
// or, with q_dtype float8, stored = (value / q_scale).clamp(-max, max) (q_scale: nullopt is 1).
// Every value is rounded once from the float32 (float64) math. Not differentiable. See
// docs/api.md, "QK-RMSNorm + RoPE into a KV cache".
at::Tensor rms_norm_apply_qk_cache(const at::Tensor& q, const at::Tensor& k,
                                   const std::optional<at::Tensor>& v, const at::Tensor& q_weight,
                                   const at::Tensor& k_weight, const at::Tensor& cos,
                                   const at::Tensor& sin, const at::Tensor& positions,
                                   at::Tensor& k_cache, const std::optional<at::Tensor>& v_cache,
                                   const at::Tensor& slot_mapping, double eps = 1e-6,
                                   double weight_offset = 0.0, bool interleaved = true,
                                   const std::optional<at::Tensor>& k_scale = std::nullopt,
                                   const std::optional<at::Tensor>& v_scale = std::nullopt,
                                   std::optional<at::ScalarType> q_dtype = std::nullopt,
                                   const std::optional<at::Tensor>& q_scale = std::nullopt,
                                   at::OptionalIntArrayRef mrope_section = std::nullopt,
                                   bool mrope_interleaved = false);
// Fused QK-RMSNorm + RoPE: each row of q (k) is normalised over its whole head_dim,
// y = x / sqrt(mean(x^2) + eps) * (weight + weight_offset), then rotated exactly as apply_qk
// rotates (features [rotary_dim, head_dim) are only normalised), and rounded once to q's (k's)
// dtype; math in float32 (float64 for float64 inputs). q_weight and k_weight are (head_dim,), any
// floating dtype, on q's device. eps must be finite and > 0; weight_offset = 1 is Gemma's (1 + w).
// Gradients flow to q, k and both weights (double backward included, through the composite
// backward); forward-mode AD is refused.
std::tuple<at::Tensor, at::Tensor> rms_norm_apply_qk(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& q_weight,
    const at::Tensor& k_weight, const at::Tensor& cos, const at::Tensor& sin,
    const at::Tensor& positions, double eps = 1e-6, double weight_offset = 0.0,
    bool interleaved = true, bool inverse = false,
    at::OptionalIntArrayRef mrope_section = std::nullopt, bool mrope_interleaved = false);

// ---- the serving fusions -------------------------------------------------------------------
// fp8 rules shared by them: a float8 output (float8_e4m3fn or float8_e5m2) stores
// saturate(value / scale) rounded to nearest even, bit for bit as torch's
// (value / scale).clamp(-max, max).to(fp8) of the float32 value (float64 for float64 inputs);
// with multiply_by_scale (FlashInfer's rule) saturate(value * scale). A scale is a float32
// one-element tensor on the output's device (finite and > 0; nullopt: 1). Not differentiable.

// Rotates q (T, Hq, D) and k (T, Hk, D) as apply_qk and returns them as float8 (`dtype`,
// float8_e4m3fn by default), with q_nope (T, Hq, Nq) and k_nope (T, Hk, Nk), the heads' parts
// that are not rotated, quantized with q_scale / k_scale; an absent nope part gives an empty
// (T, H, 0) output. Returns (q_out, k_out, q_nope_out, k_nope_out). inverse rotates by -angle
// (apply's inverse) before quantizing. See docs/api.md.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> apply_qk_fp8(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
    const at::Tensor& positions, const std::optional<at::Tensor>& q_nope = std::nullopt,
    const std::optional<at::Tensor>& k_nope = std::nullopt,
    const std::optional<at::Tensor>& q_scale = std::nullopt,
    const std::optional<at::Tensor>& k_scale = std::nullopt,
    std::optional<at::ScalarType> dtype = std::nullopt, bool interleaved = true,
    bool multiply_by_scale = false, at::OptionalIntArrayRef mrope_section = std::nullopt,
    bool mrope_interleaved = false, bool inverse = false);

// The same into the caller's float8 buffers (one fp8 dtype for all; shapes of q, k, q_nope,
// k_nope; any strides with a unit last stride; sharing no memory with an input or each other).
// A nope buffer goes with its nope input.
void apply_qk_fp8_out(at::Tensor& q_out, at::Tensor& k_out,
                      const std::optional<at::Tensor>& q_nope_out,
                      const std::optional<at::Tensor>& k_nope_out, const at::Tensor& q,
                      const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
                      const at::Tensor& positions,
                      const std::optional<at::Tensor>& q_nope = std::nullopt,
                      const std::optional<at::Tensor>& k_nope = std::nullopt,
                      const std::optional<at::Tensor>& q_scale = std::nullopt,
                      const std::optional<at::Tensor>& k_scale = std::nullopt,
                      bool interleaved = true, bool multiply_by_scale = false,
                      at::OptionalIntArrayRef mrope_section = std::nullopt,
                      bool mrope_interleaved = false, bool inverse = false);

// apply_qk_fp8 with dynamic scales: q and k rotated, then quantized with scales computed from the
// rotated rows, amax / (the fp8 dtype's largest value) over each (token, head) row, or over all
// heads of a token with per_token, rounded up to a power of two with pow2_scale (UE8M0). Returns
// (q_out, k_out, q_scale, k_scale): the float8 rows and float32 scales (T, Hq, 1) and (T, Hk, 1)
// ((T, 1, 1) with per_token), so that q_out.to(float) * q_scale dequantizes. amax 0 gives scale 1;
// an inf in a row gives scale inf (2^127 with pow2_scale), a NaN gives NaN. See
// docs/quant_formats.md.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> apply_qk_fp8_dynamic(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
    const at::Tensor& positions, std::optional<at::ScalarType> dtype = std::nullopt,
    bool interleaved = true, bool per_token = false, bool pow2_scale = false,
    at::OptionalIntArrayRef mrope_section = std::nullopt, bool mrope_interleaved = false,
    bool inverse = false);

// The same into the caller's buffers: float8 q_out and k_out (q's and k's shapes, a unit last
// stride) and float32 scales (T, Hq, 1) and (T, Hk, 1) ((T, 1, 1) with per_token; any strides),
// none sharing memory with an input or another output. Every check runs before anything is
// written.
void apply_qk_fp8_dynamic_out(at::Tensor& q_out, at::Tensor& k_out, at::Tensor& q_scale_out,
                              at::Tensor& k_scale_out, const at::Tensor& q, const at::Tensor& k,
                              const at::Tensor& cos, const at::Tensor& sin,
                              const at::Tensor& positions, bool interleaved = true,
                              bool per_token = false, bool pow2_scale = false,
                              at::OptionalIntArrayRef mrope_section = std::nullopt,
                              bool mrope_interleaved = false, bool inverse = false);

// MLA (multi-head latent attention, DeepSeek-V2/V3) cache rows: rotates q_pe (T, H, R) and the
// single-head k_pe (T, R) at positions (T, 1), writes [kv_c | k_pe] rows into kv_cache (width
// kv_lora_rank + R; kpe_cache = nullopt) or kv_c's rows into kv_cache and k_pe's into kpe_cache,
// flat (num_slots, width) or paged (num_blocks, block_size, width), token t into slot
// slot_mapping[t] (int64; negative: skipped). A cache has k_pe's dtype or is float8 with
// kv_scale. Returns (q_pe_out, q_nope_out) in q_dtype (q_pe's dtype, or float8 with q_scale).
// Key parts with a heads dim (k_pe (T, Hk, R), kv_c (T, Hk, L)) and v / v_cache write
// FlashInfer's split GQA rows. multiply_by_scale: every scale multiplies. Bad input (shapes,
// dtypes, overlapping caches, slots out of range or repeated on the CPU) writes nothing. See
// docs/api.md, "MLA cache rows".
std::tuple<at::Tensor, at::Tensor> mla_apply_cache(
    const at::Tensor& q_pe, const at::Tensor& k_pe, const at::Tensor& kv_c, const at::Tensor& cos,
    const at::Tensor& sin, const at::Tensor& positions, at::Tensor& kv_cache,
    const std::optional<at::Tensor>& kpe_cache, const at::Tensor& slot_mapping,
    const std::optional<at::Tensor>& q_nope = std::nullopt,
    const std::optional<at::Tensor>& v = std::nullopt,
    const std::optional<at::Tensor>& v_cache = std::nullopt, bool interleaved = true,
    const std::optional<at::Tensor>& kv_scale = std::nullopt,
    const std::optional<at::Tensor>& v_scale = std::nullopt,
    std::optional<at::ScalarType> q_dtype = std::nullopt,
    const std::optional<at::Tensor>& q_scale = std::nullopt, bool multiply_by_scale = false);

// True when this build of the library contains the CUDA kernels.
bool compiled_with_cuda();

// The instruction set of the CPU kernel copy this process runs: "AVX512", "AVX2" or "DEFAULT".
// It is the widest one the CPU supports and torch's capability setting (ATEN_CPU_CAPABILITY)
// allows.
std::string cpu_kernel_isa();

// The CPU kernel copy this process runs: "AVX512_BF16" (AVX-512 with the native float ->
// bfloat16 conversion, chosen when the CPU has AVX512-BF16), "AVX512", "AVX2" or "DEFAULT".
// The environment variable TORCH_ROPE_CPU_KERNEL (default, avx2, avx512 or avx512_bf16) caps it.
std::string cpu_kernel_variant();

}  // namespace rope
