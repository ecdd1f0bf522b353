// SPDX-License-Identifier: BSD-3-Clause
// The real CUDA kernels (csrc/cuda/rope_kernel.cuh and common_stream_kernel.cuh),
// compiled as host C++ against the shims in shim/, behind the torch-free interface of
// host_kernel.h. Nothing of the kernels is copied or re-typed here: this file only wires the
// shim's hooks to an Observer and picks scalar_t, as the .cu files do.
#include "host_kernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace rope_host {
namespace {

Observer* g_observer = nullptr;
int64_t g_host_pointers = 0;  // kernel parameter words pointing into host memory
const void* g_first_host_pointer = nullptr;
LaunchRecord* g_record = nullptr;
GridLaunchRecord* g_grid_record = nullptr;  // set while a row-streams launch runs
Device g_device;

void on_device_assert(const char* cond, const char* /*file*/, int /*line*/) {
  if (g_observer != nullptr) {
    g_observer->device_assert(cond, rope_shim::thread_id());
  }
}

}  // namespace
}  // namespace rope_host

// The kernel's hooks, pointed at the shim. A failed assert is reported and the thread carries
// on, which is what the kernel does on the GPU when assertions are compiled out (it then must
// write nothing and read nothing outside the tables; the Observer checks that).
#define ROPE_DEVICE_ASSERT(cond) \
  ((cond) ? (void)0 : ::rope_host::on_device_assert(#cond, __FILE__, __LINE__))
#define ROPE_TRACE_LOAD(ptr, bytes) ::rope_host::trace_load((ptr), (bytes))
#define ROPE_TRACE_STORE(ptr, bytes) ::rope_host::trace_store((ptr), (bytes))

namespace rope_host {
namespace {

// The trace hooks also check what the GPU would fault on: every access naturally aligned, i.e.
// a 16-byte one 16-byte aligned, a 4-byte pair of 16-bit elements 4-byte aligned, a scalar one
// aligned to its element.
void check_aligned(const void* p, size_t bytes) {
  if (reinterpret_cast<uintptr_t>(p) % bytes != 0) {
    rope_shim::fail(bytes == 16  ? "misaligned 16-byte global access"
                    : bytes == 4 ? "misaligned 4-byte global access"
                                 : "misaligned global access",
                    p);
  }
}

}  // namespace

inline void trace_load(const void* p, size_t bytes) {
  check_aligned(p, bytes);
  if (g_observer != nullptr) {
    g_observer->load(p, bytes, rope_shim::thread_id());
  }
}

inline void trace_store(const void* p, size_t bytes) {
  check_aligned(p, bytes);
  if (g_observer != nullptr) {
    g_observer->store(p, bytes, rope_shim::thread_id());
  }
}

}  // namespace rope_host

#include "cuda/common_stream_kernel.cuh"
#include "cuda/rope_kernel.cuh"

namespace rope_host {
namespace {

using rope::cuda::kernel::rope_kernel;

// Every kernel variant, so a launch can be named.
struct Variant {
  const void* kernel;
  bool vector_kernel;
};

template <typename scalar_t, typename table_t>
void add_variants(Variant* out, int& n) {
  out[n++] = {reinterpret_cast<const void*>(&rope_kernel<scalar_t, table_t, true, true>), true};
  out[n++] = {reinterpret_cast<const void*>(&rope_kernel<scalar_t, table_t, true, false>), false};
  out[n++] = {reinterpret_cast<const void*>(&rope_kernel<scalar_t, table_t, false, true>), true};
  out[n++] = {reinterpret_cast<const void*>(&rope_kernel<scalar_t, table_t, false, false>), false};
}

// The frequency form's kernel (rope_freqs_kernel: no table type).
template <typename scalar_t>
void add_freqs_variants(Variant* out, int& n) {
  using rope::cuda::kernel::rope_freqs_kernel;
  out[n++] = {reinterpret_cast<const void*>(&rope_freqs_kernel<scalar_t, true, true>), true};
  out[n++] = {reinterpret_cast<const void*>(&rope_freqs_kernel<scalar_t, true, false>), false};
  out[n++] = {reinterpret_cast<const void*>(&rope_freqs_kernel<scalar_t, false, true>), true};
  out[n++] = {reinterpret_cast<const void*>(&rope_freqs_kernel<scalar_t, false, false>), false};
}

// The tables with packed sequences (rope_packed_kernel: the table kernel's work, its own kernel).
template <typename scalar_t, typename table_t>
void add_packed_variants(Variant* out, int& n) {
  using rope::cuda::kernel::rope_packed_kernel;
  out[n++] = {reinterpret_cast<const void*>(&rope_packed_kernel<scalar_t, table_t, true, true>),
              true};
  out[n++] = {reinterpret_cast<const void*>(&rope_packed_kernel<scalar_t, table_t, true, false>),
              false};
  out[n++] = {reinterpret_cast<const void*>(&rope_packed_kernel<scalar_t, table_t, false, true>),
              true};
  out[n++] = {reinterpret_cast<const void*>(&rope_packed_kernel<scalar_t, table_t, false, false>),
              false};
}

struct Variants {
  Variant v[80];
  int n = 0;
  Variants() {
    add_variants<double, float>(v, n);
    add_variants<double, double>(v, n);
    add_variants<float, float>(v, n);
    add_variants<float, double>(v, n);
    add_variants<__half, float>(v, n);
    add_variants<__half, double>(v, n);
    add_variants<__nv_bfloat16, float>(v, n);
    add_variants<__nv_bfloat16, double>(v, n);
    // After the table kernels, whose indices (and so simulated occupancies) stay as they were.
    add_freqs_variants<double>(v, n);
    add_freqs_variants<float>(v, n);
    add_freqs_variants<__half>(v, n);
    add_freqs_variants<__nv_bfloat16>(v, n);
    add_packed_variants<double, float>(v, n);
    add_packed_variants<double, double>(v, n);
    add_packed_variants<float, float>(v, n);
    add_packed_variants<float, double>(v, n);
    add_packed_variants<__half, float>(v, n);
    add_packed_variants<__half, double>(v, n);
    add_packed_variants<__nv_bfloat16, float>(v, n);
    add_packed_variants<__nv_bfloat16, double>(v, n);
  }
  const Variant* find(const void* kernel) const {
    for (int i = 0; i < n; ++i) {
      if (v[i].kernel == kernel) {
        return &v[i];
      }
    }
    return nullptr;
  }
};

const Variants& variants() {
  static const Variants all;
  return all;
}

// A fixed function of (device, kernel), as the real occupancy is: 1..8 blocks of 256 threads.
int resident_blocks(const void* kernel, int device) {
  const Variant* v = variants().find(kernel);
  const uint64_t index = v == nullptr ? 0 : static_cast<uint64_t>(v - variants().v);
  uint64_t h =
      (static_cast<uint64_t>(device) + 1) * 0x9e3779b97f4a7c15ull ^ (index * 0xbf58476d1ce4e5b9ull);
  h ^= h >> 31;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 29;
  return 1 + static_cast<int>(h % 8);
}

// The kernels' own constant tables (common_exact_angle.h's device copies, which the device
// branches read through __ldg): memory of the module, not of a tensor, so not the observer's.
bool in_kernel_constants(const void* p) {
  namespace ead = rope::exact_angle::detail;
  const auto within = [p](const void* table, size_t bytes) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    const auto b = reinterpret_cast<uintptr_t>(table);
    return a >= b && a < b + bytes;
  };
  return within(ead::kInvTwoPiWordsDevice, sizeof(ead::kInvTwoPiWordsDevice)) ||
         within(ead::kSinTableDevice, sizeof(ead::kSinTableDevice));
}

void install_hooks() {
  rope_shim::Hooks& h = rope_shim::hooks();
  h.on_launch = [](void*, const void* kernel, dim3 grid, dim3 block, void** args,
                   cudaStream_t stream) {
    if (g_grid_record != nullptr) {
      g_grid_record->launched = true;
      g_grid_record->blocks = static_cast<int64_t>(grid.x) * grid.y * grid.z;
      g_grid_record->grid[0] = grid.x;
      g_grid_record->grid[1] = grid.y;
      g_grid_record->grid[2] = grid.z;
      g_grid_record->block_threads = static_cast<int64_t>(block.x) * block.y * block.z;
      g_grid_record->stream = stream;
      g_grid_record->device = rope_shim::state().device;
      return;
    }
    if (g_record == nullptr) {
      return;
    }
    g_record->launched = true;
    g_record->kernel = kernel;
    g_record->params = *static_cast<const rope::cuda::KernelParams*>(args[0]);
    g_record->blocks = static_cast<int64_t>(grid.x) * grid.y * grid.z;
    g_record->block_threads = static_cast<int64_t>(block.x) * block.y * block.z;
    g_record->grid[0] = grid.x;
    g_record->grid[1] = grid.y;
    g_record->grid[2] = grid.z;
    g_record->stream = stream;
    g_record->device = rope_shim::state().device;
    const Variant* v = variants().find(kernel);
    if (v == nullptr) {
      rope_shim::fail("launch of an unknown kernel", kernel);
    }
    g_record->vector_kernel = v->vector_kernel;
    g_record->resident_blocks = resident_blocks(kernel, rope_shim::state().device);
  };
  h.on_ldg = [](void*, const void* p, size_t bytes, int64_t thread) {
    if (g_observer != nullptr && !in_kernel_constants(p)) {
      g_observer->ldg(p, bytes, thread);
    }
  };
  h.resident_blocks = [](void*, int device, const void* kernel, int /*block_threads*/) {
    return resident_blocks(kernel, device);
  };
  h.on_host_pointer = [](void*, size_t /*offset*/, const void* p) {
    if (g_host_pointers++ == 0) {
      g_first_host_pointer = p;
    }
  };
}

template <typename scalar_t>
int rotate_typed(const rope::RotationArgs& first, const rope::RotationArgs* second,
                 const rope::TableArgs& tables, rope::RotationMode mode, const void* stream) {
  return static_cast<int>(
      rope::cuda::rotate<scalar_t>(first, second, tables, mode, g_device.num_sms,
                                   reinterpret_cast<cudaStream_t>(const_cast<void*>(stream))));
}

}  // namespace

int rotate(Storage storage, const rope::RotationArgs& first, const rope::RotationArgs* second,
           const rope::TableArgs& tables, rope::RotationMode mode, const Device& device,
           Observer* observer, LaunchRecord* record, const LaunchOptions& options) {
  install_hooks();
  rope_shim::hooks().only_blocks = options.only_blocks;
  rope_shim::hooks().num_only_blocks = options.num_only_blocks;
  g_observer = observer;
  g_record = record;
  g_device = device;
  if (record != nullptr) {
    *record = LaunchRecord{};
  }
  rope_shim::state().device = device.ordinal;
  int status = 0;
  // The storage type of each dtype, as in rope_cuda.cpp.
  switch (storage) {
    case Storage::kDouble:
      status = rotate_typed<double>(first, second, tables, mode, options.stream);
      break;
    case Storage::kFloat:
      status = rotate_typed<float>(first, second, tables, mode, options.stream);
      break;
    case Storage::kHalf:
      status = rotate_typed<__half>(first, second, tables, mode, options.stream);
      break;
    case Storage::kBFloat16:
      status = rotate_typed<__nv_bfloat16>(first, second, tables, mode, options.stream);
      break;
  }
  g_observer = nullptr;
  g_record = nullptr;
  rope_shim::hooks().only_blocks = nullptr;
  rope_shim::hooks().num_only_blocks = 0;
  return status;
}

namespace {
template <typename scalar_t>
int streams_typed(const rope::StreamArgs& args, const rope::TableArgs& tables, const void* stream,
                  bool* vector_streams) {
  if (vector_streams != nullptr) {
    const auto plan = rope::cuda::streams::plan(args, tables, sizeof(scalar_t));
    for (int32_t i = 0; i < args.num_streams; ++i) {
      vector_streams[i] = plan.plan[i].vector;
    }
  }
  return static_cast<int>(rope::cuda::run_row_streams<scalar_t>(
      args, tables, reinterpret_cast<cudaStream_t>(const_cast<void*>(stream))));
}
}  // namespace

int streams_launch(Storage storage, const rope::StreamArgs& args, const rope::TableArgs& tables,
                   const Device& device, Observer* observer, GridLaunchRecord* record,
                   const LaunchOptions& options, bool* vector_streams) {
  install_hooks();
  rope_shim::hooks().only_blocks = options.only_blocks;
  rope_shim::hooks().num_only_blocks = options.num_only_blocks;
  GridLaunchRecord scratch;
  g_grid_record = record != nullptr ? record : &scratch;
  *g_grid_record = GridLaunchRecord{};
  g_observer = observer;
  g_record = nullptr;
  g_device = device;
  rope_shim::state().device = device.ordinal;
  int status = 0;
  switch (storage) {
    case Storage::kDouble:
      status = streams_typed<double>(args, tables, options.stream, vector_streams);
      break;
    case Storage::kFloat:
      status = streams_typed<float>(args, tables, options.stream, vector_streams);
      break;
    case Storage::kHalf:
      status = streams_typed<__half>(args, tables, options.stream, vector_streams);
      break;
    case Storage::kBFloat16:
      status = streams_typed<__nv_bfloat16>(args, tables, options.stream, vector_streams);
      break;
  }
  g_observer = nullptr;
  g_grid_record = nullptr;
  rope_shim::hooks().only_blocks = nullptr;
  rope_shim::hooks().num_only_blocks = 0;
  return status;
}

int64_t occupancy_queries() { return rope_shim::state().occupancy_queries; }

void set_reverse_order(bool reverse) { rope_shim::state().reverse_order = reverse; }

void set_host_memory(const HostRange* ranges, size_t count) {
  rope_shim::HostMemory& m = rope_shim::host_memory();
  m.clear();
  for (size_t i = 0; i < count; ++i) {
    m.add(ranges[i].begin, ranges[i].bytes);
  }
  g_host_pointers = 0;
  g_first_host_pointer = nullptr;
}

int64_t host_pointers_seen(const void** first) {
  if (first != nullptr) {
    *first = g_first_host_pointer;
  }
  return g_host_pointers;
}

uint16_t float_to_half_bits(float f) { return __float2half_rn(f).bits; }
float half_bits_to_float(uint16_t bits) { return __half2float(__half{bits}); }
uint16_t float_to_bfloat16_bits(float f) { return __float2bfloat16_rn(f).bits; }
float bfloat16_bits_to_float(uint16_t bits) { return __bfloat162float(__nv_bfloat16{bits}); }

}  // namespace rope_host
