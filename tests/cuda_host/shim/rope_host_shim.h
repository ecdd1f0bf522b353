// SPDX-License-Identifier: BSD-3-Clause
// The CUDA built-ins the kernel headers use, as host C++: enough to compile csrc/cuda/*.cuh
// unchanged with g++ or clang++ and run them on the CPU.
//
// The launch (cudaLaunchKernel below) runs the blocks of the grid one after another, and the
// threads of a block as cooperative fibers (rope_host_fibers.h): a thread runs until it reaches a
// collective (a warp shuffle or vote, __syncwarp, __syncthreads) or returns, and the collective
// completes when all of its participants have arrived. So kernels may use shuffles, votes,
// barriers and block shared memory (ROPE_BLOCK_SHARED, common_device.cuh), and the host run checks
// their masks, their convergence and their barriers (tests/cuda_host/cooperation_host.cpp plants
// each mistake). What the launch cannot model faithfully stays refused at compile time: the end of
// this file poisons the raw __shared__ qualifier (block shared memory goes through
// ROPE_BLOCK_SHARED, which the host run fills with poison per block), atomics, fences,
// __activemask and the match / reduce intrinsics, so the host build stops with "attempt to use
// poisoned" the day a kernel starts using one (tests/cuda_host/refuse.cpp checks that it does).
//
// Included through the shim's cuda_runtime.h / cuda_fp16.h / cuda_bf16.h, which take the place of
// the toolkit's headers on the include path of the host build only.
//
// Device branches: code that is written twice, `#if defined(__CUDA_ARCH__)` for the GPU and
// `#else` for the host (csrc/common_exact_angle.h: __umul64hi, __ldg of its constant tables,
// __fmul_rn, ...), tests ROPE_DEVICE_BRANCHES instead, which this shim defines. The host run then
// compiles and runs the branch the GPU runs, over the intrinsics below; a test that includes the
// header without the shim compiles the other branch, and the two are compared bit for bit
// (tests/cuda_host/exact_angle_host.cpp).
#pragma once

#define ROPE_HOST_RUNS_DEVICE_BRANCHES 1
// The device branches compile to other code than the host branches of the same inline functions,
// so the host run's copies live in a namespace of their own: the driver and librope (host
// branches) link into the same program, where two definitions of one inline function would
// violate the one-definition rule and the linker would keep one of them for both callers (a bug
// planted in one branch could then reach, or miss, the other side of a comparison).
#define exact_angle exact_angle_device_branches

#include <math.h>

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#include "rope_host_fibers.h"

// ---- qualifiers ---------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __grid_constant__

// ---- runtime types ------------------------------------------------------------------------------
// Values as in the CUDA runtime's driver_types.h, so a status printed by the host run reads the
// same.
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevice = 101,
  cudaErrorLaunchFailure = 719,  // a collective the host run refused (rope_host_fibers.h)
};
struct CUstream_st;
using cudaStream_t = CUstream_st*;

struct uint3 {
  unsigned int x, y, z;
};
struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
      : x(vx), y(vy), z(vz) {}
};
// Vector types with the alignment the device gives them, so a misaligned access is caught here
// (UBSan's alignment check, and __ldg's own check) as it would fault on the GPU.
struct alignas(8) float2 {
  float x, y;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(16) double2 {
  double x, y;
};
struct alignas(16) uint4 {
  unsigned int x, y, z, w;
};

namespace rope_shim {

// What the host run wants to see of the launch. The host build of the kernel (host_kernel.cpp)
// installs one; every hook is optional.
struct Hooks {
  // Before the first thread of a launch runs: the kernel, the grid, the kernel's arguments and
  // the stream it was launched on.
  void (*on_launch)(void* ctx, const void* kernel, dim3 grid, dim3 block, void** args,
                    cudaStream_t stream) = nullptr;
  // Every global load and store of x / out (ROPE_TRACE_*), and every __ldg (tables, positions).
  void (*on_load)(void* ctx, const void* p, size_t bytes, int64_t thread) = nullptr;
  void (*on_store)(void* ctx, const void* p, size_t bytes, int64_t thread) = nullptr;
  void (*on_ldg)(void* ctx, const void* p, size_t bytes, int64_t thread) = nullptr;
  // A device assert that failed (the kernel then carries on, as with NDEBUG on the GPU).
  void (*on_assert)(void* ctx, const char* cond, const char* file, int line,
                    int64_t thread) = nullptr;
  // cudaOccupancyMaxActiveBlocksPerMultiprocessor's answer for a kernel on a device.
  int (*resident_blocks)(void* ctx, int device, const void* kernel, int block_threads) = nullptr;
  // A kernel parameter holds an address inside host memory (see HostMemory below): the word's
  // offset in the parameter block and the address. The launch still runs (the access checks then
  // see what the kernel does with it).
  void (*on_host_pointer)(void* ctx, size_t offset, const void* p) = nullptr;
  // A sampled launch: when not null, only these linear block indices (block-major, as
  // thread_id() numbers them) run, in the order given; indices past the grid are ignored. The
  // launch itself (limits, arguments, on_launch) is checked in full. This lets the host run
  // launch grids of millions of blocks (>= 65536, or past 2^31 threads) at the cost of a few.
  const int64_t* only_blocks = nullptr;
  size_t num_only_blocks = 0;
  // A collective the fibers refused (a mask, divergence, a barrier; rope_host_fibers.h): the
  // block is abandoned, no further block runs and the launch returns cudaErrorLaunchFailure. Not
  // set: the process stops with the reason.
  void (*on_collective_error)(void* ctx, const char* what, int64_t block) = nullptr;
  void* ctx = nullptr;
};

inline Hooks& hooks() {
  static Hooks h;
  return h;
}

// The simulated device state: current device ordinal, and the grid position of the running
// thread. One launch at a time, on the calling host thread.
struct State {
  int device = 0;
  uint3 block_idx{0, 0, 0};
  uint3 thread_idx{0, 0, 0};
  dim3 grid_dim;
  dim3 block_dim;
  int64_t occupancy_queries = 0;
  // The order the launch runs the grid in: blocks, and the threads of a block, in
  // increasing (false) or decreasing (true) linear index. A GPU runs them in no fixed order, so
  // the host runs use both: a kernel whose threads write one element twice, or read what another
  // thread writes, gives a different result in one of the two orders.
  bool reverse_order = false;
};
inline State& state() {
  static State s;
  return s;
}

// What the simulated runtime knows to be host memory: the address ranges of the tensors a case
// keeps on the CPU (packed sequences given on the host, which the glue must copy to the device
// before a launch). Every launch scans its parameter block for 8-byte words inside one of them and
// reports each (Hooks::on_host_pointer): a real GPU would read garbage or fault there.
struct HostMemory {
  static constexpr int kMaxRanges = 16;
  uintptr_t begin[kMaxRanges] = {};
  uintptr_t end[kMaxRanges] = {};
  int count = 0;
  void add(const void* p, size_t bytes) {
    if (p == nullptr || bytes == 0) {
      return;
    }
    if (count == kMaxRanges) {
      std::fprintf(stderr, "cuda host shim: more than %d host ranges\n", kMaxRanges);
      std::abort();
    }
    begin[count] = reinterpret_cast<uintptr_t>(p);
    end[count] = begin[count] + bytes;
    ++count;
  }
  void clear() { count = 0; }
  bool contains(uintptr_t a) const {
    for (int i = 0; i < count; ++i) {
      if (a >= begin[i] && a < end[i]) {
        return true;
      }
    }
    return false;
  }
};
inline HostMemory& host_memory() {
  static HostMemory m;
  return m;
}

// Linear id of the running thread within the grid: block-major, as blocks are numbered.
inline int64_t thread_id() {
  const State& s = state();
  const int64_t block =
      (static_cast<int64_t>(s.block_idx.z) * s.grid_dim.y + s.block_idx.y) * s.grid_dim.x +
      s.block_idx.x;
  const int64_t threads = static_cast<int64_t>(s.block_dim.x) * s.block_dim.y * s.block_dim.z;
  const int64_t thread =
      (static_cast<int64_t>(s.thread_idx.z) * s.block_dim.y + s.thread_idx.y) * s.block_dim.x +
      s.thread_idx.x;
  return block * threads + thread;
}

// The running fiber's threadIdx, from its linear index in the block (rope_host_fibers.h).
namespace coop {
inline void set_thread_index(int linear) {
  State& s = state();
  const int64_t nx = s.block_dim.x;
  const int64_t ny = s.block_dim.y;
  s.thread_idx = {static_cast<unsigned int>(linear % nx),
                  static_cast<unsigned int>(linear / nx % ny),
                  static_cast<unsigned int>(linear / (nx * ny))};
}
}  // namespace coop

[[noreturn]] inline void fail(const char* what, const void* p) {
  std::fprintf(stderr, "cuda host shim: %s (address %p, thread %lld)\n", what, p,
               static_cast<long long>(thread_id()));
  std::abort();
}

}  // namespace rope_shim

// ---- built-in variables
// --------------------------------------------------------------------------- References into the
// simulated state, so `blockIdx.x` reads as on the device.
#define blockIdx (::rope_shim::state().block_idx)
#define threadIdx (::rope_shim::state().thread_idx)
#define gridDim (::rope_shim::state().grid_dim)
#define blockDim (::rope_shim::state().block_dim)

// ---- read-only loads
// ------------------------------------------------------------------------------
// __ldg reads through the non-coherent cache: on the device it must be naturally aligned.
template <typename T>
inline T __ldg(const T* p) {
  static_assert(std::is_trivially_copyable_v<T>, "__ldg of a non-trivial type");
  if (reinterpret_cast<uintptr_t>(p) % alignof(T) != 0) {
    rope_shim::fail("misaligned __ldg", p);
  }
  const rope_shim::Hooks& h = rope_shim::hooks();
  if (h.on_ldg != nullptr) {
    h.on_ldg(h.ctx, p, sizeof(T), rope_shim::thread_id());
  }
  return *p;
}

// ---- the intrinsics of device branches (ROPE_DEVICE_BRANCHES) ----------------------------------
// What the GPU computes, in host C++: the high word of a 64-bit product, bit casts, and arithmetic
// rounded once to nearest even (the _rn intrinsics are never contracted into a multiply-add by
// nvcc; the host build has -ffp-contract=off, so a * b and a + b round once here too).
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  return static_cast<unsigned long long>((static_cast<unsigned __int128>(a) * b) >> 64);
}
inline long long __double_as_longlong(double x) {
  long long bits = 0;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
}
inline double __longlong_as_double(long long bits) {
  double x = 0;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }

// ---- cache-hinted stores
// --------------------------------------------------------------------------- st.global.wb.v4.u32:
// one 16-byte store with the default (write-back) caching.
inline void __stwb(uint4* p, uint4 v) {
  if (reinterpret_cast<uintptr_t>(p) % alignof(uint4) != 0) {
    rope_shim::fail("misaligned __stwb", p);
  }
  *p = v;
}
// st.global.wb.u32: one 4-byte store (the paired path's two 16-bit elements); on the device it
// must be 4-byte aligned.
inline void __stwb(unsigned int* p, unsigned int v) {
  if (reinterpret_cast<uintptr_t>(p) % alignof(unsigned int) != 0) {
    rope_shim::fail("misaligned 4-byte __stwb", p);
  }
  *p = v;
}

// ---- runtime API
// ----------------------------------------------------------------------------------
inline cudaError_t cudaGetDevice(int* device) {
  *device = rope_shim::state().device;
  return cudaSuccess;
}

template <typename Kernel>
inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, Kernel kernel,
                                                                 int block_threads,
                                                                 size_t dynamic_smem) {
  if (dynamic_smem != 0) {
    return cudaErrorInvalidValue;  // no shared memory in a host-run kernel
  }
  rope_shim::State& s = rope_shim::state();
  ++s.occupancy_queries;
  const rope_shim::Hooks& h = rope_shim::hooks();
  *blocks =
      h.resident_blocks != nullptr
          ? h.resident_blocks(h.ctx, s.device, reinterpret_cast<const void*>(kernel), block_threads)
          : 1;
  return cudaSuccess;
}

namespace rope_shim {
// Runs every thread of block (bx, by, bz) as a fiber, in the state's order (rope_host_fibers.h).
// Returns false when the block's collectives were refused (after reporting it).
template <typename... P, size_t... I>
bool run_block(void (*kernel)(P...), void** args, uint3 block, std::index_sequence<I...>) {
  State& s = state();
  const int64_t n = static_cast<int64_t>(s.block_dim.x) * s.block_dim.y * s.block_dim.z;
  s.block_idx = block;
  struct Call {
    void (*kernel)(P...);
    void** args;
  };
  Call call{kernel, args};
  // Each thread gets its own copy of the arguments (on its fiber's stack), as each device thread
  // reads the parameter block independently: no thread can pass anything to another through it.
  const auto body = [](void* ctx) {
    const Call* c = static_cast<const Call*>(ctx);
    c->kernel(*static_cast<std::decay_t<P>*>(c->args[I])...);
  };
  const std::string error = coop::run_block(static_cast<int>(n), s.reverse_order, body, &call);
  if (error.empty()) {
    return true;
  }
  const int64_t linear =
      (static_cast<int64_t>(block.z) * s.grid_dim.y + block.y) * s.grid_dim.x + block.x;
  const Hooks& h = hooks();
  if (h.on_collective_error != nullptr) {
    h.on_collective_error(h.ctx, error.c_str(), linear);
    return false;
  }
  std::fprintf(stderr, "cuda host shim: block %lld: %s\n", static_cast<long long>(linear),
               error.c_str());
  std::abort();
}

// Reports every 8-byte word of a parameter that holds an address inside host memory.
inline void scan_for_host_pointers(const void* param, size_t bytes, size_t base_offset) {
  const HostMemory& m = host_memory();
  const Hooks& h = hooks();
  if (m.count == 0 || h.on_host_pointer == nullptr) {
    return;
  }
  for (size_t off = 0; off + sizeof(uintptr_t) <= bytes; off += sizeof(uintptr_t)) {
    uintptr_t word = 0;
    std::memcpy(&word, static_cast<const char*>(param) + off, sizeof word);
    if (m.contains(word)) {
      h.on_host_pointer(h.ctx, base_offset + off, reinterpret_cast<const void*>(word));
    }
  }
}

// Runs the grid (or the sampled blocks of Hooks::only_blocks); false at the first refused block.
template <typename... P, size_t... I>
bool run_grid(void (*kernel)(P...), void** args, std::index_sequence<I...> seq) {
  State& s = state();
  const Hooks& h = hooks();
  const int64_t gx = s.grid_dim.x;
  const int64_t gy = s.grid_dim.y;
  const int64_t total = gx * gy * s.grid_dim.z;
  const auto at = [&](int64_t b) {
    return uint3{static_cast<unsigned int>(b % gx), static_cast<unsigned int>(b / gx % gy),
                 static_cast<unsigned int>(b / (gx * gy))};
  };
  if (h.only_blocks != nullptr) {
    for (size_t n = 0; n < h.num_only_blocks; ++n) {
      const size_t i = s.reverse_order ? h.num_only_blocks - 1 - n : n;
      const int64_t b = h.only_blocks[i];
      if (b >= 0 && b < total && !run_block(kernel, args, at(b), seq)) {
        return false;
      }
    }
    return true;
  }
  for (int64_t i = 0; i < total; ++i) {
    const int64_t b = s.reverse_order ? total - 1 - i : i;
    if (!run_block(kernel, args, at(b), seq)) {
      return false;
    }
  }
  return true;
}
}  // namespace rope_shim

// The typed overload of the runtime (cuda_runtime.h's template cudaLaunchKernel): runs the grid
// serially with the launch limits of sm_80 / sm_90.
template <typename... P>
inline cudaError_t cudaLaunchKernel(void (*kernel)(P...), dim3 grid, dim3 block, void** args,
                                    size_t shared_mem = 0, cudaStream_t stream = nullptr) {
  if (shared_mem != 0) {
    return cudaErrorInvalidValue;  // dynamic shared memory: not modelled (ROPE_BLOCK_SHARED is)
  }
  const unsigned long long threads = 1ull * block.x * block.y * block.z;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || threads == 0 || threads > 1024 || block.z > 64 ||
      grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535) {
    return cudaErrorInvalidConfiguration;
  }
  rope_shim::State& s = rope_shim::state();
  s.grid_dim = grid;
  s.block_dim = block;
  const rope_shim::Hooks& h = rope_shim::hooks();
  if (h.on_launch != nullptr) {
    h.on_launch(h.ctx, reinterpret_cast<const void*>(kernel), grid, block, args, stream);
  }
  {
    const std::array<size_t, sizeof...(P)> sizes{sizeof(std::decay_t<P>)...};
    size_t offset = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      rope_shim::scan_for_host_pointers(args[i], sizes[i], offset);
      offset += sizes[i];
    }
  }
  return rope_shim::run_grid(kernel, args, std::index_sequence_for<P...>{})
             ? cudaSuccess
             : cudaErrorLaunchFailure;
}

// ---- collectives (rope_host_fibers.h) ----------------------------------------------------------
// Macros, so that each call carries its call site: lanes of one mask at different sites are
// divergent, which the fibers report.
namespace rope_shim {
namespace coop {
template <typename T>
inline T shfl_at(const char* file, int line, unsigned mask, T var, int src, int width = 32) {
  return shuffle(Kind::kShfl, mask, var, src, width, file, line);
}
template <typename T>
inline T shfl_up_at(const char* file, int line, unsigned mask, T var, unsigned delta,
                    int width = 32) {
  return shuffle(Kind::kShflUp, mask, var, static_cast<int>(delta), width, file, line);
}
template <typename T>
inline T shfl_down_at(const char* file, int line, unsigned mask, T var, unsigned delta,
                      int width = 32) {
  return shuffle(Kind::kShflDown, mask, var, static_cast<int>(delta), width, file, line);
}
template <typename T>
inline T shfl_xor_at(const char* file, int line, unsigned mask, T var, int lane_mask,
                     int width = 32) {
  return shuffle(Kind::kShflXor, mask, var, lane_mask, width, file, line);
}
inline void syncwarp_at(const char* file, int line, unsigned mask = 0xffffffffu) {
  vote(Kind::kSyncWarp, mask, 0, file, line);
}
}  // namespace coop
}  // namespace rope_shim

#define __shfl_sync(...) ::rope_shim::coop::shfl_at(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_up_sync(...) ::rope_shim::coop::shfl_up_at(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_down_sync(...) ::rope_shim::coop::shfl_down_at(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_xor_sync(...) ::rope_shim::coop::shfl_xor_at(__FILE__, __LINE__, __VA_ARGS__)
#define __syncwarp(...) ::rope_shim::coop::syncwarp_at(__FILE__, __LINE__, ##__VA_ARGS__)
#define __ballot_sync(mask, pred) \
  ::rope_shim::coop::vote(::rope_shim::coop::Kind::kBallot, (mask), (pred), __FILE__, __LINE__)
#define __any_sync(mask, pred) \
  (::rope_shim::coop::vote(::rope_shim::coop::Kind::kAny, (mask), (pred), __FILE__, __LINE__) != 0)
#define __all_sync(mask, pred) \
  (::rope_shim::coop::vote(::rope_shim::coop::Kind::kAll, (mask), (pred), __FILE__, __LINE__) != 0)
#define __syncthreads() \
  ((void)::rope_shim::coop::barrier(::rope_shim::coop::Kind::kSyncThreads, 0, __FILE__, __LINE__))
#define __syncthreads_count(pred)                                                                 \
  static_cast<int>(::rope_shim::coop::barrier(::rope_shim::coop::Kind::kSyncThreadsCount, (pred), \
                                              __FILE__, __LINE__))
#define __syncthreads_and(pred)                                                                 \
  static_cast<int>(::rope_shim::coop::barrier(::rope_shim::coop::Kind::kSyncThreadsAnd, (pred), \
                                              __FILE__, __LINE__))
#define __syncthreads_or(pred)                                                                 \
  static_cast<int>(::rope_shim::coop::barrier(::rope_shim::coop::Kind::kSyncThreadsOr, (pred), \
                                              __FILE__, __LINE__))

// Block shared memory: `T name[count]` shared by the threads of a block (on the device,
// `__shared__ T name[count]`; common_device.cuh). Here, storage of the running block, filled with
// 0xff bytes when the block's first thread reaches the declaration.
#define ROPE_BLOCK_SHARED(T, name, count)                                            \
  static ::rope_shim::coop::SharedDecl rope_shared_decl_##name(sizeof(T) * (count)); \
  T* const name = static_cast<T*>(::rope_shim::coop::shared_storage(rope_shared_decl_##name))

// ---- what the launch cannot model: refused at compile time --------------------------------------
// The raw __shared__ qualifier (a local variable here, one per thread: use ROPE_BLOCK_SHARED),
// fences, __activemask (convergence the fibers do not model), match and reduce intrinsics and
// atomics.
#pragma GCC poison __shared__ __threadfence __threadfence_block __threadfence_system
#pragma GCC poison __shfl __shfl_up __shfl_down __shfl_xor __uni_sync __activemask
#pragma GCC poison __match_any_sync __match_all_sync __reduce_add_sync __reduce_min_sync
#pragma GCC poison __reduce_max_sync __reduce_and_sync __reduce_or_sync __reduce_xor_sync
#pragma GCC poison atomicAdd atomicSub atomicExch atomicMin atomicMax atomicInc atomicDec
