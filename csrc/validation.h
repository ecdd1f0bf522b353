// Input checks shared by every backend (CPU, CUDA, Meta), so a bad call fails the same way on each
// and before anything is written. Messages name the op, the argument, what was expected and what
// came, so the caller can fix the call from the message alone.
#pragma once

#include <ATen/core/Tensor.h>

namespace rope::detail {

// cos and sin: same shape [max_seq_len, rotary_dim / 2], float32 or float64, same dtype and device.
void check_tables(const char* op, const at::Tensor& cos, const at::Tensor& sin);

// One rotated input (x, q or k) against the tables and positions: floating dtype, at least 1 dim,
// head_dim >= rotary_dim, same device as the tables, integer positions broadcastable to
// x.shape[:-1]. `name` is the argument's name in the op's schema ("x", "q", "k").
void check_rotated_input(const char* op, const char* name, const at::Tensor& x,
                         const at::Tensor& cos, const at::Tensor& positions);

// Host-side range check of positions against [0, max_seq_len): reads positions, so only the CPU
// backend calls it (CUDA asserts inside the kernel instead, to avoid a device-to-host sync).
void check_positions_in_range(const char* op, const at::Tensor& positions, int64_t max_seq_len);

// For ops that write into x: x must not have overlapping memory (e.g. made by expand()).
void check_writable(const char* op, const char* name, const at::Tensor& x);

}  // namespace rope::detail
