#include <torch_rope/module.h>
#include <torch_rope/ops.h>

#include <torch/serialize/archive.h>

namespace rope {

RotaryPositionalEmbeddingImpl::RotaryPositionalEmbeddingImpl(
    double theta, int64_t d_k, int64_t max_seq_len,
    const RotaryPositionalEmbeddingOptions& options)
    : theta_(theta),
      d_k_(d_k),
      max_seq_len_(max_seq_len),
      rotary_dim_(options.rotary_dim().value_or(d_k)),
      interleaved_(options.interleaved()),
      device_(options.device()) {
  TORCH_CHECK(d_k >= 1, "RotaryPositionalEmbedding: d_k must be >= 1, got ", d_k);
  TORCH_CHECK(rotary_dim_ <= d_k, "RotaryPositionalEmbedding: rotary_dim must be <= d_k = ", d_k,
              ", got ", rotary_dim_);
  reset();
}

void RotaryPositionalEmbeddingImpl::reset() {
  // rope_tables checks theta, max_seq_len and that rotary_dim is even and >= 2.
  auto [cos, sin] = rope_tables(theta_, rotary_dim_, max_seq_len_, device_);
  cos_ = register_buffer("cos", cos);
  sin_ = register_buffer("sin", sin);
}

torch::Tensor RotaryPositionalEmbeddingImpl::forward(
    const torch::Tensor& x, const std::optional<torch::Tensor>& token_positions) {
  if (token_positions.has_value()) {
    return rope::apply(x, cos_, sin_, *token_positions, interleaved_);
  }
  TORCH_CHECK(x.dim() >= 2, "RotaryPositionalEmbedding: without token_positions, x must be ",
              "(..., seq_len, d_k) with at least 2 dims, got shape ", x.sizes());
  auto positions = torch::arange(x.size(-2), torch::dtype(torch::kLong).device(x.device()));
  return rope::apply(x, cos_, sin_, positions, interleaved_);
}

void RotaryPositionalEmbeddingImpl::save(torch::serialize::OutputArchive& /*archive*/) const {}

void RotaryPositionalEmbeddingImpl::load(torch::serialize::InputArchive& /*archive*/) {}

void RotaryPositionalEmbeddingImpl::to(torch::Device device, torch::Dtype /*dtype*/,
                                       bool non_blocking) {
  to(device, non_blocking);
}

void RotaryPositionalEmbeddingImpl::to(torch::Dtype /*dtype*/, bool /*non_blocking*/) {}

void RotaryPositionalEmbeddingImpl::to(torch::Device device, bool non_blocking) {
  // Module::to moves every registered buffer; re-read the handles it replaced.
  torch::nn::Module::to(device, non_blocking);
  cos_ = named_buffers(/*recurse=*/false)["cos"];
  sin_ = named_buffers(/*recurse=*/false)["sin"];
}

void RotaryPositionalEmbeddingImpl::pretty_print(std::ostream& stream) const {
  stream << "rope::RotaryPositionalEmbedding(theta=" << theta_ << ", d_k=" << d_k_
         << ", max_seq_len=" << max_seq_len_ << ", rotary_dim=" << rotary_dim_
         << ", interleaved=" << (interleaved_ ? "true" : "false") << ")";
}

}  // namespace rope
