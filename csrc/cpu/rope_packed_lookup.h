// SPDX-License-Identifier: BSD-3-Clause
// The position of a token of packed sequences on the CPU (PositionKind kPacked of
// common_kernel_args.h), for the per-capability row kernels (rope_rows.cpp, rope_angle_rows.cpp):
// included inside their CPU_CAPABILITY namespace, like the other per-copy helpers, so no copy
// compiled for a wider instruction set can stand in for another's.
#pragma once

#include <cstdint>

#include "../common_kernel_args.h"

namespace rope::cpu::CPU_CAPABILITY {
namespace {

// kPacked: the position of local token t of packed sequences, tracking the current sequence while
// the rows are walked (a binary search only when t leaves it). Values were checked on the host.
class PackedLookup {
 public:
  explicit PackedLookup(const PackedSequenceArgs& s) : s_(s) {}

  int64_t operator()(int64_t t) {
    if (t < begin_ || t >= end_) {
      find(t);
    }
    return packed_position_in(t - begin_, length_, offset_, s_.cp_size, s_.cp_rank);
  }

 private:
  int64_t read(const void* p, bool is64, int64_t i) const {
    return is64 ? static_cast<const int64_t*>(p)[i]
                : static_cast<int64_t>(static_cast<const int32_t*>(p)[i]);
  }
  void find(int64_t t) {
    const auto cu = [&](int64_t i) { return read(s_.cu_seqlens, s_.cu_seqlens_are_int64, i); };
    const int64_t i = packed_sequence_of(s_.num_seqs, s_.cp_size, t, cu);
    const int64_t start = cu(i);
    length_ = cu(i + 1) - start;
    begin_ = start / s_.cp_size;
    end_ = begin_ + length_ / s_.cp_size;
    offset_ = s_.seq_offsets == nullptr ? 0 : read(s_.seq_offsets, s_.seq_offsets_are_int64, i);
  }

  const PackedSequenceArgs& s_;
  int64_t begin_ = 0;
  int64_t end_ = 0;  // empty: the first row finds its sequence
  int64_t length_ = 0;
  int64_t offset_ = 0;
};

}  // namespace
}  // namespace rope::cpu::CPU_CAPABILITY
