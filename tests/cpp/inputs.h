// Sample inputs shared by the CPU and CUDA tests: the three layouts real models use, each with
// the positions shape that goes with it (DESIGN.md section 2).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

namespace rope_test {

enum class Layout {
  kBHSD,    // (B, H, S, D) with positions (S,)
  kBSHD,    // (B, S, H, D) with positions (S, 1)  (Llama decode layout)
  kPacked,  // (T, H, D) with positions (T, 1)     (packed varlen)
};

inline std::string layout_name(Layout layout) {
  switch (layout) {
    case Layout::kBHSD:
      return "BHSD";
    case Layout::kBSHD:
      return "BSHD";
    case Layout::kPacked:
      return "Packed";
  }
  return "?";
}

struct Sample {
  torch::Tensor x;
  torch::Tensor positions;
};

// Random x and random (not arange) positions in [0, max_seq_len), so a kernel that ignores
// positions or broadcasts them along the wrong dim is caught.
inline Sample make_sample(Layout layout, int64_t head_dim, torch::Dtype dtype, int64_t max_seq_len,
                          torch::Device device = torch::kCPU,
                          torch::Dtype pos_dtype = torch::kLong) {
  constexpr int64_t B = 2, H = 3, S = 5, T = 7;
  const auto xo = torch::TensorOptions().dtype(dtype).device(device);
  const auto po = torch::TensorOptions().dtype(pos_dtype).device(device);
  switch (layout) {
    case Layout::kBHSD:
      return {torch::randn({B, H, S, head_dim}, xo), torch::randint(0, max_seq_len, {S}, po)};
    case Layout::kBSHD:
      return {torch::randn({B, S, H, head_dim}, xo), torch::randint(0, max_seq_len, {S, 1}, po)};
    case Layout::kPacked:
      return {torch::randn({T, H, head_dim}, xo), torch::randint(0, max_seq_len, {T, 1}, po)};
  }
  return {};
}

// (head_dim, rotary_dim) pairs: scalar-only (few planes), one vector plus a scalar tail, and
// several whole vectors, each with full and partial rotary.
struct RotaryShape {
  int64_t head_dim;
  int64_t rotary_dim;
};

inline std::vector<RotaryShape> rotary_shapes() {
  return {{10, 10}, {10, 6}, {40, 40}, {40, 24}, {128, 128}, {128, 64}};
}

}  // namespace rope_test
