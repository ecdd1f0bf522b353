// SPDX-License-Identifier: BSD-3-Clause
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>

#include <cstddef>

namespace rope::detail {

// CPU outputs of at least this many bytes get pages of their own (empty_cpu_output). Below it
// they are allocated as torch's own ops allocate them: glibc often hands such blocks back from heap
// memory it already faulted in.
constexpr size_t kOwnPagesBytes = size_t{16} << 20;

// A fresh, contiguous, uninitialised CPU tensor for an op's output. Below kOwnPagesBytes it is
// at::detail::empty_cpu. From kOwnPagesBytes up (on Linux) the storage is a mapping of its own: a
// kept one of the same length if a freed output left one (see below), else a new one, 2 MiB
// aligned, advised for transparent huge pages and populated for writing by the calling thread.
// When the storage dies its mapping is kept for the next output of that length, up to 256 MiB and
// 8 mappings in all, the oldest unmapped first.
//
// Why (docs/performance.md, "Large tensors"): a large output's cost is mostly its page faults.
// glibc serves a large block from a fresh mapping (faulted 4 KiB at a time, as x.clone()'s is) or
// from its heap (already faulted in, or faulted as the heap grows), depending on what was freed
// before, so the same call cost 11 ms in one round and 42 ms in another; huge pages faulted by two
// threads at once stalled for tens of milliseconds on the 2-core VM, one thread never did; and a
// fresh mapping alone lost to glibc's reused heap (a 32 MiB output: 4.7 ms against the clone's
// 1.5 ms). Kept mappings cost what reused heap costs, and a new one is populated in huge pages
// (64 MiB in 4.8 ms, against 20 ms in 4 KiB pages).
at::Tensor empty_cpu_output(c10::IntArrayRef sizes, c10::ScalarType dtype);

}  // namespace rope::detail
