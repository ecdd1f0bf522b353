// SPDX-License-Identifier: BSD-3-Clause
// The CUDA kernels compiled as host C++ (host_kernel.cpp), as the driver sees them:
// rope_kernel.cuh and the row streams' common_stream_kernel.cuh. Torch-free,
// and free of the shims too: the driver includes torch, the kernels' translation unit does not.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common_kernel_args.h"
#include "common_row_streams.h"
#include "cuda/rope_launch_plan.h"

namespace rope_host {

enum class Storage { kDouble, kFloat, kHalf, kBFloat16 };

// Sees every global access of a host launch and every failed device assert. `thread` is the
// linear id of the device thread (block * blockDim.x + threadIdx.x).
class Observer {
 public:
  virtual ~Observer() = default;
  virtual void load(const void* p, size_t bytes, int64_t thread) = 0;   // x (plain loads)
  virtual void store(const void* p, size_t bytes, int64_t thread) = 0;  // out
  virtual void ldg(const void* p, size_t bytes, int64_t thread) = 0;    // tables, positions
  virtual void device_assert(const char* cond, int64_t thread) = 0;
};

// A simulated GPU. The occupancy query of the kernel header is cached per device ordinal and
// kernel, so the answer here is a fixed function of both: 1 + hash(ordinal, kernel) % 8 resident
// blocks per SM (what registers allow on sm_80/sm_90 for 256-thread blocks spans 1..8).
struct Device {
  int ordinal = 0;
  int num_sms = 1;
};

// The launch the kernel header made, as the shim's cudaLaunchKernel saw it.
struct LaunchRecord {
  bool launched = false;
  const void* kernel = nullptr;  // the kernel variant's address
  rope::cuda::KernelParams params;
  int64_t blocks = 0;
  int64_t block_threads = 0;
  bool vector_kernel = false;  // which kernel variant was launched
  int resident_blocks = 0;     // the occupancy answer for that variant on that device
  int64_t grid[3] = {0, 0, 0};
  const void* stream = nullptr;  // the stream handed to cudaLaunchKernel
  int device = -1;               // the simulated current device at the launch
};

// How to launch: the stream the glue chose, and optionally a sample of the grid's blocks (see
// rope_shim::Hooks::only_blocks): only those run, the launch is checked in full.
struct LaunchOptions {
  const void* stream = nullptr;
  const int64_t* only_blocks = nullptr;
  size_t num_only_blocks = 0;
};

// rope::cuda::rotate<scalar_t> of rope_kernel.cuh for `storage`: the real launch planning, then
// the grid run serially on this thread. Returns the cudaError_t value (0: success).
// `device.ordinal` becomes the simulated current device (cudaGetDevice) for the call.
int rotate(Storage storage, const rope::RotationArgs& first, const rope::RotationArgs* second,
           const rope::TableArgs& tables, rope::RotationMode mode, const Device& device,
           Observer* observer, LaunchRecord* record, const LaunchOptions& options = {});

// A launch of a one-dimensional grid (the row streams' kernel), as the shim saw it.
struct GridLaunchRecord {
  bool launched = false;
  int64_t blocks = 0;
  int64_t grid[3] = {0, 0, 0};
  int64_t block_threads = 0;
  const void* stream = nullptr;
  int device = -1;
};

// rope::cuda::run_row_streams<scalar_t> of common_stream_kernel.cuh for `storage` (the fused
// ops), the grid (or the sample of its blocks that `options` names) run serially on this
// thread. `vector_streams` (if given) receives, per stream, whether its plan took the vector path.
// Returns the cudaError_t value (0: success).
int streams_launch(Storage storage, const rope::StreamArgs& args, const rope::TableArgs& tables,
                   const Device& device, Observer* observer, GridLaunchRecord* record,
                   const LaunchOptions& options, bool* vector_streams = nullptr);

// How often the kernel header asked the (simulated) runtime for occupancy: once per device and
// kernel variant, thanks to its cache.
int64_t occupancy_queries();

// The order the launches run their blocks and threads in from now on (the shim's
// State::reverse_order): a GPU has none, so the host runs alternate between the two.
void set_reverse_order(bool reverse);

// Memory the simulated runtime knows to be on the host (the shim's HostMemory): from now on,
// every launch counts the words of its parameter block that point into one of these ranges.
struct HostRange {
  const void* begin = nullptr;
  size_t bytes = 0;
};
void set_host_memory(const HostRange* ranges, size_t count);
// The parameter words counted since set_host_memory, and the first address seen.
int64_t host_pointers_seen(const void** first = nullptr);

// The shim's storage conversions, for a cross-check against c10::Half / c10::BFloat16.
uint16_t float_to_half_bits(float f);
float half_bits_to_float(uint16_t bits);
uint16_t float_to_bfloat16_bits(float f);
float bfloat16_bits_to_float(uint16_t bits);

}  // namespace rope_host
