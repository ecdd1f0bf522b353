// rope::RotaryPositionalEmbedding: the LibTorch module form of the rope ops.
//
//   rope::RotaryPositionalEmbedding rope(/*theta=*/10000.0, /*d_k=*/128, /*max_seq_len=*/4096);
//   auto q_rot = rope(q);                       // positions = arange(q.size(-2))
//   auto k_rot = rope(k, positions);            // explicit int positions, broadcast to k.shape[:-1]
//
// The cos/sin tables are derived state: they are built once at construction (float32, by
// rope::rope_tables), registered as buffers so `to(device)` moves them, but kept out of saved
// archives (like Python's persistent=False) and kept float32 when the model is cast to
// bfloat16/half. The module has no parameters.
#pragma once

#include <torch/nn/modules/common.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any_value.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <optional>
#include <ostream>

namespace rope {

// Keyword options of the constructor (the positional ones are theta, d_k, max_seq_len).
struct RotaryPositionalEmbeddingOptions {
  // Features rotated per head, even and <= d_k; the rest pass through. Default: d_k.
  TORCH_ARG(std::optional<int64_t>, rotary_dim) = std::nullopt;
  // true: pairs (2k, 2k+1) (Llama reference); false: (k, k + rotary_dim/2) (HF rotate_half).
  TORCH_ARG(bool, interleaved) = true;
  // Where the tables are built; default CPU. Module::to(device) moves them later.
  TORCH_ARG(std::optional<torch::Device>, device) = std::nullopt;
};

class RotaryPositionalEmbeddingImpl
    : public torch::nn::Cloneable<RotaryPositionalEmbeddingImpl> {
 public:
  // theta: base of the frequencies (10000 in most models); d_k: head_dim of the inputs;
  // max_seq_len: number of positions the tables cover. Throws c10::Error on bad values.
  RotaryPositionalEmbeddingImpl(double theta, int64_t d_k, int64_t max_seq_len,
                                const RotaryPositionalEmbeddingOptions& options = {});

  // x: (..., seq_len, d_k). token_positions: int32/int64 broadcastable to x.shape[:-1]; when
  // absent, arange(x.size(-2)) on x's device. Returns a new tensor of x's shape and dtype.
  torch::Tensor forward(const torch::Tensor& x,
                        const std::optional<torch::Tensor>& token_positions = std::nullopt);

  // (Re)builds the tables from the constructor's arguments; clone() calls it too.
  void reset() override;

  const torch::Tensor& cos_table() const { return cos_; }
  const torch::Tensor& sin_table() const { return sin_; }
  double theta() const { return theta_; }
  int64_t d_k() const { return d_k_; }
  int64_t max_seq_len() const { return max_seq_len_; }
  int64_t rotary_dim() const { return rotary_dim_; }
  bool interleaved() const { return interleaved_; }

  // The tables are rebuilt from the constructor's arguments, so archives carry none of them.
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

  // Device moves apply to the tables; dtype casts do not (the tables stay float32).
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Device device, bool non_blocking = false) override;

  void pretty_print(std::ostream& stream) const override;

 protected:
  FORWARD_HAS_DEFAULT_ARGS({1, torch::nn::AnyValue(std::optional<torch::Tensor>())})

 private:
  double theta_;
  int64_t d_k_;
  int64_t max_seq_len_;
  int64_t rotary_dim_;
  bool interleaved_;
  std::optional<torch::Device> device_;
  torch::Tensor cos_;
  torch::Tensor sin_;
};

TORCH_MODULE(RotaryPositionalEmbedding);

}  // namespace rope
