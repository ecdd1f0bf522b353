// SPDX-License-Identifier: BSD-3-Clause
// rope::RotaryPositionalEmbedding: the LibTorch module form of the rope ops.
//
//   rope::RotaryPositionalEmbedding rope(/*theta=*/10000.0, /*d_k=*/128, /*max_seq_len=*/4096);
//   auto q_rot = rope(q);                       // positions = arange along the sequence dim
//   auto k_rot = rope(k, positions);            // (S,) or (B, S) int positions
//
//   // The CS336 signature, device fourth, plus keyword-style options:
//   rope::RotaryPositionalEmbedding llama(500000.0, 128, 8192, torch::kCUDA,
//       rope::RotaryPositionalEmbeddingOptions()
//           .scaling(rope::Llama3Scaling().factor(8.0))
//           .seq_dim(-3));                      // x is [b, s, h, d]
//
// The cos/sin tables are derived state: they are built once at construction by the shared table
// builder (rope_tables, float64 math rounded once), registered as buffers so `to(device)` moves
// them, but kept out of saved archives (like Python's persistent=False) and kept in their own
// dtype (float32 or float64) when the model is cast to bfloat16/half. The module has no
// parameters. forward calls rope::apply through the dispatcher.
#pragma once

#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/common.h>
#include <torch/nn/modules/container/any_value.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>
#include <torch_rope/ops.h>
#include <torch_rope/tables.h>

#include <optional>
#include <ostream>
#include <vector>

namespace rope {

// Keyword options of the constructor (the positional ones are theta, d_k, max_seq_len, device).
struct RotaryPositionalEmbeddingOptions {
  // Features rotated per head, even and <= d_k; the rest pass through. Default: d_k.
  TORCH_ARG(std::optional<int64_t>, rotary_dim) = std::nullopt;
  // true: pairs (2k, 2k+1) (Llama reference, CS336); false: (k, k + rotary_dim/2) (HF rotate_half).
  TORCH_ARG(bool, interleaved) = true;
  // Where the tables are built when the constructor's device argument is absent; default CPU.
  // Module::to(device) moves them later.
  TORCH_ARG(std::optional<torch::Device>, device) = std::nullopt;
  // A RoPE scaling variant (torch_rope/tables.h). LongRopeScaling without a seq_len keeps both
  // its short and long tables and switches per call on the device, as transformers does.
  TORCH_ARG(RopeScaling, scaling) = NoScaling {};
  // Table dtype: float32 (default) or float64 (for float64 inputs accurate to the angle's float64
  // rounding). Casting the module never changes it.
  TORCH_ARG(torch::Dtype, dtype) = torch::kFloat;
  // The sequence axis of x, counted from the end: -2 for (..., seq_len, d_k) / [b, h, s, d],
  // -3 for [b, s, h, d]. Default positions run along it, and (S,) or (B, S) positions are
  // aligned with it.
  TORCH_ARG(int64_t, seq_dim) = -2;
  // Multi-axis positions (M-RoPE: Qwen2-VL, Qwen3-VL, GLM-4V; 2-D vision RoPE): the planes that
  // read each axis, adding up to rotary_dim / 2 (see rope::apply). forward then takes
  // token_positions with a trailing axis dim of this many axes; absent positions give every axis
  // the arange.
  TORCH_ARG(std::optional<std::vector<int64_t>>, mrope_section) = std::nullopt;
  // Qwen3-VL's interleaved assignment of planes to 3 axes instead of contiguous runs.
  TORCH_ARG(bool, mrope_interleaved) = false;
  // false: table-free (the frequency form of rope::apply). The module then holds only the float64
  // frequencies (buffer "freqs", and LongRoPE's long set "long_freqs") and the attention factor:
  // no memory per position, any max_seq_len up to 2^62, every float32 output within
  // 2^-23 * attention_factor * (|a| + |b|) of the exact rotation at any position. dtype is unused.
  TORCH_ARG(bool, tables) = true;
};

class RotaryPositionalEmbeddingImpl : public torch::nn::Cloneable<RotaryPositionalEmbeddingImpl> {
 public:
  // theta: base of the frequencies (10000 in most models); d_k: head_dim of the inputs;
  // max_seq_len: number of positions the tables cover; device: where to build the tables.
  // Throws c10::ValueError naming the argument on bad values.
  RotaryPositionalEmbeddingImpl(double theta, int64_t d_k, int64_t max_seq_len,
                                std::optional<torch::Device> device = std::nullopt,
                                const RotaryPositionalEmbeddingOptions& options = {});
  // The options-only form (device inside the options).
  RotaryPositionalEmbeddingImpl(double theta, int64_t d_k, int64_t max_seq_len,
                                const RotaryPositionalEmbeddingOptions& options);

  // x: (..., d_k) with the sequence at seq_dim. token_positions: int32/int64; (S,) and (B, S) are
  // aligned with x's sequence (and first) axis, tensors of 3+ dims broadcast to x.shape[:-1]
  // as the op does; absent means arange(x.size(seq_dim)) on x's device. With mrope_section,
  // token_positions carry a trailing axis dim ((S, A), (B, S, A), ...). Returns a new tensor of
  // x's shape and dtype. Positions must be < max_seq_len (see extend_tables).
  //
  // packed: packed sequences instead of positions (rope::PackedSequences, as rope::apply takes
  // them): x is (T, ..., d_k) with its tokens on dim 0, token_positions must be absent.
  torch::Tensor forward(const torch::Tensor& x,
                        const std::optional<torch::Tensor>& token_positions = std::nullopt,
                        const std::optional<PackedSequences>& packed = std::nullopt);

  // Rebuilds the tables with max_seq_len rows, on the device and in the dtype they have now, so
  // positions up to max_seq_len - 1 work (extrapolation, or Meta's 2 * max_seq_len habit).
  // Explicit on purpose: forward never grows the tables, so it never syncs with the device. For
  // dynamic NTK scaling without a fixed seq_len the frequencies are re-evaluated at the new length.
  void extend_tables(int64_t max_seq_len);

  // (Re)builds the tables from the constructor's arguments; clone() calls it too.
  void reset() override;

  const torch::Tensor& cos_table() const { return cos_; }
  const torch::Tensor& sin_table() const { return sin_; }
  // The table-free module's float64 frequencies (undefined with tables), LongRoPE's long set
  // (undefined unless it switches), and the attention factor (1 with tables: they carry it).
  const torch::Tensor& frequencies() const { return freqs_; }
  const torch::Tensor& long_frequencies() const { return long_freqs_; }
  double attention_factor() const { return attention_factor_; }
  bool tables() const { return options_.tables(); }
  double theta() const { return theta_; }
  int64_t d_k() const { return d_k_; }
  int64_t max_seq_len() const { return max_seq_len_; }
  int64_t rotary_dim() const { return rotary_dim_; }
  bool interleaved() const { return options_.interleaved(); }
  int64_t seq_dim() const { return options_.seq_dim(); }
  const RopeScaling& scaling() const { return options_.scaling(); }
  // Row offset of LongRoPE's long tables (0 when the tables have no short/long switch).
  int64_t long_offset() const { return long_offset_; }

  // The tables are rebuilt from the constructor's arguments, so archives carry none of them.
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

  // Device moves apply to the tables; dtype casts do not.
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Device device, bool non_blocking = false) override;

  void pretty_print(std::ostream& stream) const override;

 protected:
  FORWARD_HAS_DEFAULT_ARGS({1, torch::nn::AnyValue(std::optional<torch::Tensor>())},
                           {2, torch::nn::AnyValue(std::optional<PackedSequences>())})

 private:
  void build_tables(std::optional<torch::Device> device);
  void build_frequencies(std::optional<torch::Device> device);
  void reread_buffers();

  double theta_;
  int64_t d_k_;
  int64_t max_seq_len_;
  int64_t rotary_dim_;
  RotaryPositionalEmbeddingOptions options_;
  int64_t long_offset_ = 0;
  int64_t long_after_ = 0;  // the switch: a call whose largest position is >= this uses long
  torch::Tensor cos_;
  torch::Tensor sin_;
  torch::Tensor freqs_;       // tables = false
  torch::Tensor long_freqs_;  // tables = false, LongRoPE's switch
  double attention_factor_ = 1.0;
};

TORCH_MODULE(RotaryPositionalEmbedding);

}  // namespace rope
