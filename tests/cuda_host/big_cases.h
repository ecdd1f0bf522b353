// SPDX-License-Identifier: BSD-3-Clause
// Fixed cases of the host run at sizes the random cases cannot reach, at almost no memory cost:
//   - element offsets past 2^31 and 2^32 (rows of a "KV cache" of 12 GiB, out=, in place, and as
//     an input), so that an index or stride held in 32 bits is caught;
//   - grids of 65,536 blocks (a (16, 8192, 64, 128) bf16 prefill) and of more than 2^31 threads,
//     launched in full but run on a sample of blocks, so that a grid put in gridDim.y, capped at
//     65,535 blocks, or block arithmetic in 32 bits is caught;
//   - the row streams' kernel (every fused op) past 2^32 threads with source rows past 2^33
//     elements (sampled), and into a cache of more than 2^32 elements, so that its thread index,
//     source offset or cache row held in 32 bits is caught.
// The large tensors live in sparse memory: one mmap(MAP_NORESERVE) reservation of which only the
// touched pages are ever backed.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "compare.h"

namespace rope_host {

struct BigCaseResult {
  std::string name;
  std::vector<std::string> problems;
  std::vector<std::pair<int, const void*>> launches;  // (device, kernel) of each launch
};

std::vector<BigCaseResult> run_big_cases(const CpuVectorPath& cpu_path, Tally& tally);

}  // namespace rope_host
