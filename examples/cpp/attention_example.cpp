// SPDX-License-Identifier: BSD-3-Clause
// A LibTorch program using torch-rope the way a C++ model would: a multi-head attention module
// with rope::RotaryPositionalEmbedding, one training step (backward through the op), and an
// incremental decode loop with a KV cache (positions = start_pos + arange).
//
//   attention_example <inputs.pt> <outputs.pt>
//
// Reads weights and inputs written by tests/integration/check_example.py (torch.save of a dict),
// writes its results the same way, and the script compares them with the Python implementation.
#include <torch/torch.h>
#include <torch_rope/torch_rope.h>

#include <fstream>
#include <iostream>
#include <iterator>

namespace {

struct AttentionImpl : torch::nn::Module {
  AttentionImpl(int64_t d_model, int64_t n_heads, int64_t max_seq_len)
      : n_heads(n_heads),
        head_dim(d_model / n_heads),
        wq(register_module(
            "wq", torch::nn::Linear(torch::nn::LinearOptions(d_model, d_model).bias(false)))),
        wk(register_module(
            "wk", torch::nn::Linear(torch::nn::LinearOptions(d_model, d_model).bias(false)))),
        wv(register_module(
            "wv", torch::nn::Linear(torch::nn::LinearOptions(d_model, d_model).bias(false)))),
        wo(register_module(
            "wo", torch::nn::Linear(torch::nn::LinearOptions(d_model, d_model).bias(false)))),
        rope(register_module(
            "rope", rope::RotaryPositionalEmbedding(10000.0, d_model / n_heads, max_seq_len))) {}

  // x: [B, S, d_model]; positions: [S] int64. With a cache, appends this step's k/v to it and
  // attends over everything cached so far.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& positions,
                        torch::Tensor* k_cache = nullptr, torch::Tensor* v_cache = nullptr) {
    const auto b = x.size(0), s = x.size(1);
    auto heads = [&](const torch::Tensor& t) {
      return t.view({b, s, n_heads, head_dim}).transpose(1, 2);
    };
    auto q = rope(heads(wq(x)), positions);  // [B, H, S, D], positions (S,)
    auto k = rope(heads(wk(x)), positions);
    auto v = heads(wv(x));
    bool causal = true;
    if (k_cache != nullptr) {
      *k_cache = k_cache->defined() ? torch::cat({*k_cache, k}, 2) : k;
      *v_cache = v_cache->defined() ? torch::cat({*v_cache, v}, 2) : v;
      k = *k_cache;
      v = *v_cache;
      causal = s > 1;  // a single new token attends to the whole cache
    }
    auto y = at::scaled_dot_product_attention(q, k, v, {}, 0.0, causal);
    return wo(y.transpose(1, 2).reshape({b, s, -1}));
  }

  int64_t n_heads, head_dim;
  torch::nn::Linear wq, wk, wv, wo;
  rope::RotaryPositionalEmbedding rope;
};
TORCH_MODULE(Attention);

c10::Dict<c10::IValue, c10::IValue> load_dict(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK(in, "cannot open ", path);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return torch::pickle_load(bytes).toGenericDict();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: " << argv[0] << " <inputs.pt> <outputs.pt>\n";
    return 2;
  }
  auto inputs = load_dict(argv[1]);
  auto get = [&](const char* key) { return inputs.at(key).toTensor(); };
  const auto x = get("x");  // [B, S, d_model]
  const int64_t d_model = x.size(2);
  const int64_t n_heads = get("n_heads").item<int64_t>();
  const int64_t prefill = get("prefill").item<int64_t>();

  Attention attn(d_model, n_heads, /*max_seq_len=*/256);
  {
    torch::NoGradGuard no_grad;
    for (const char* name : {"wq", "wk", "wv", "wo"}) {
      attn->named_parameters()[std::string(name) + ".weight"].copy_(get(name));
    }
  }

  const auto seq = x.size(1);
  // 1. Incremental decode, before training changes the weights: a prefill, then one token at
  //    a time at positions start_pos + arange(1), attending over the KV cache.
  torch::Tensor decode_out;
  {
    torch::NoGradGuard no_grad;
    torch::Tensor k_cache, v_cache;
    std::vector<torch::Tensor> steps;
    steps.push_back(
        attn->forward(x.slice(1, 0, prefill), torch::arange(prefill), &k_cache, &v_cache));
    for (int64_t start_pos = prefill; start_pos < seq; ++start_pos) {
      steps.push_back(attn->forward(x.slice(1, start_pos, start_pos + 1),
                                    start_pos + torch::arange(1), &k_cache, &v_cache));
    }
    decode_out = torch::cat(steps, 1);
  }

  // 2. Forward and one training step: backward flows through rope::apply.
  const auto positions = torch::arange(seq);
  auto out = attn->forward(x, positions);
  auto loss = out.pow(2).mean();
  loss.backward();
  auto grad_wq = attn->wq->weight.grad().clone();
  torch::optim::SGD opt(attn->parameters(), /*lr=*/0.1);
  opt.step();
  opt.zero_grad();
  auto loss_after = attn->forward(x, positions).pow(2).mean();

  c10::Dict<std::string, torch::Tensor> results;
  results.insert("out", out.detach());
  results.insert("loss", loss.detach());
  results.insert("grad_wq", grad_wq);
  results.insert("loss_after_step", loss_after.detach());
  results.insert("decode_out", decode_out);
  auto bytes = torch::pickle_save(c10::IValue(results));
  std::ofstream(argv[2], std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  std::cout << "attention_example: loss " << loss.item<float>() << " -> "
            << loss_after.item<float>() << " after one SGD step; decoded " << seq - prefill
            << " tokens after a " << prefill << "-token prefill\n";
  return 0;
}
