// SPDX-License-Identifier: BSD-3-Clause
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>

#include <cstddef>

namespace rope::detail {

// CPU outputs of at least this many bytes get pages of their own (empty_cpu_output): glibc's
// largest mmap threshold (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit), from which glibc maps every block
// fresh anyway, so a mapping of our own costs nothing more. Below it glibc may hand back heap
// memory it already faulted in, which no fresh mapping can beat (measured: 4-16 MiB outputs took
// 1.5-2x longer from fresh mappings than from glibc's reused heap).
constexpr size_t kOwnPagesBytes = size_t{32} << 20;

// A fresh, contiguous, uninitialised CPU tensor for an op's output. Below kOwnPagesBytes it is
// at::detail::empty_cpu (as torch's own ops allocate). From kOwnPagesBytes up (on Linux) the
// storage is a mapping of its own, 2 MiB aligned, advised for transparent huge pages and populated
// for writing by the calling thread before it is returned, and unmapped when the storage dies.
// Why (docs/performance.md, "Large tensors"): a fresh 64 MiB output takes 32 huge-page faults
// instead of 16,384 small ones (x.clone() takes the small ones); huge pages faulted by two threads
// at once stalled for tens of milliseconds on the 2-core VM, one thread never did; and advising
// part of glibc's heap instead (the previous way) made the first rounds of a process slow while
// glibc grew its heap.
at::Tensor empty_cpu_output(c10::IntArrayRef sizes, c10::ScalarType dtype);

}  // namespace rope::detail
