// SPDX-License-Identifier: BSD-3-Clause
// Input checks shared by every backend (CPU, CUDA and Meta), so that a bad call fails the same way
// on each, under torch.compile as in eager, and before anything is written. Messages name the op,
// the argument, what was expected and what came, so the caller can fix the call from the message
// alone.
//
// Everything here reads only metadata (shapes, strides, dtypes, devices), through the SymInt
// accessors, so the Meta kernels can run the same checks on symbolic shapes. The one check that
// reads data, check_positions_in_range, is the CPU backend's alone.
#pragma once

#include <ATen/core/Tensor.h>

#include "common_kernel_args.h"

namespace rope::detail {

// The multi-axis arguments every op takes (mrope_section, mrope_interleaved), as the dispatcher
// passes them. No section: one-axis positions.
struct MultiAxisArgs {
  at::OptionalIntArrayRef section;
  bool interleaved = false;
  bool active() const { return section.has_value(); }
};

// rope.apply: x (..., head_dim) against the tables and positions.
void check_apply(const char* op, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                 const at::Tensor& positions, const MultiAxisArgs& axes = {});

// rope.apply_: check_apply, and x must be writable in place (no overlapping memory).
void check_apply_inplace(const char* op, const at::Tensor& x, const at::Tensor& cos,
                         const at::Tensor& sin, const at::Tensor& positions,
                         const MultiAxisArgs& axes = {});

// rope.apply.out: check_apply, and `out` must have x's shape, dtype and device, be writable, and
// share no memory with any input (checked where tensors have memory, i.e. not on Meta).
void check_apply_out(const char* op, const at::Tensor& x, const at::Tensor& cos,
                     const at::Tensor& sin, const at::Tensor& positions, const at::Tensor& out,
                     const MultiAxisArgs& axes = {});

// rope.apply_qk: check_apply for q and for k, and q and k agree in dtype and head_dim.
void check_apply_qk(const char* op, const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                    const at::Tensor& sin, const at::Tensor& positions,
                    const MultiAxisArgs& axes = {});

// Host-side range check of positions against [0, max_seq_len): reads positions, so only the CPU
// backend calls it (CUDA asserts inside the kernel instead, to avoid a device-to-host sync).
// With multi-axis positions the message names the axis of the offending value.
void check_positions_in_range(const char* op, const at::Tensor& positions, int64_t max_seq_len,
                              const MultiAxisArgs& axes = {});

// For ops checked outside this file (kv_cache_validation.cpp): the writability check of apply_ /
// out= for a tensor that has no out-of-place form (a KV cache: the message says to allocate a
// buffer of its own), and the overlap check of one written tensor against one read (or written)
// tensor.
void check_writable_arg(const char* op, const char* name, const at::Tensor& t);
void check_disjoint(const char* op, const char* written_name, const at::Tensor& written,
                    const char* other_name, const at::Tensor& other);

// The AxisMap of common_kernel_args.h for checked multi-axis arguments (num_axes 0 when inactive).
AxisMap axis_map(const MultiAxisArgs& axes);

}  // namespace rope::detail
