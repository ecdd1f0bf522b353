// SPDX-License-Identifier: BSD-3-Clause
// The threads of one block as cooperative fibers, so that the host run can execute kernels whose
// threads talk to each other: warp shuffles, votes and __syncwarp (with their masks), block
// barriers (__syncthreads) and block shared memory (ROPE_BLOCK_SHARED).
//
// Model. Every thread of the block is a fiber on its own stack. The scheduler runs the fibers in
// the launch's order (increasing or decreasing linear index, State::reverse_order); a fiber runs
// until it reaches a collective or returns. When every fiber is either finished or waiting, the
// scheduler completes the collectives whose participants have all arrived, hands each
// participant its result (a shuffle returns the value its source lane held *at the collective*)
// and runs the released fibers again. That is one of the schedules a GPU may produce, and the
// only places where the threads' interleaving is visible to a correct kernel are the collectives
// themselves.
//
// What it refuses (the launch fails with the reason, rope_shim::Hooks::on_collective_error, or
// the process stops with it):
//   - a lane that calls a warp collective without its own bit in the mask;
//   - a mask naming a lane that does not exist or has exited;
//   - lanes of one mask waiting at different collectives (another kind, call site, mask or
//     width): divergence, reported with both sites instead of hanging;
//   - a shuffle that reads a lane outside its mask (its value is undefined on the GPU);
//   - a width that is not a power of two in [1, 32];
//   - __syncthreads that some thread of the block reaches at another call site, or never reaches
//     because it returned (undefined behaviour in the CUDA programming guide).
// A missing barrier shows as a wrong result: block shared memory starts each block filled with
// 0xff bytes (NaN as a float, -1 as an integer), so a thread that reads a slot another thread has
// not yet written (in the schedule above: a later thread, or an earlier one in the reverse order,
// which the host runs alternate with) reads the poison.
//
// Stacks: mmap'ed with a guard page below, reused across blocks. Switched by a few instructions
// that save the callee-saved registers and swap the stack pointer (x86-64; ucontext elsewhere,
// whose swapcontext costs two system calls per switch), with the sanitizer's fiber annotations so
// that ASan follows the switches. A fiber costs about as much as the thread's work in the host
// run's kernels, so every kernel runs this way, cooperating or not.
#pragma once

#include <sys/mman.h>
#if !defined(__x86_64__)
#include <ucontext.h>
#endif
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define ROPE_FIBERS_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ROPE_FIBERS_ASAN 1
#endif
#endif
#if defined(ROPE_FIBERS_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

namespace rope_shim {
namespace coop {

constexpr int kWarpSize = 32;
constexpr size_t kStackBytes = 256 * 1024;

enum class Kind : uint8_t {
  kShfl,
  kShflUp,
  kShflDown,
  kShflXor,
  kSyncWarp,
  kBallot,
  kAny,
  kAll,
  kSyncThreads,
  kSyncThreadsCount,
  kSyncThreadsAnd,
  kSyncThreadsOr,
};

inline const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kShfl:
      return "__shfl_sync";
    case Kind::kShflUp:
      return "__shfl_up_sync";
    case Kind::kShflDown:
      return "__shfl_down_sync";
    case Kind::kShflXor:
      return "__shfl_xor_sync";
    case Kind::kSyncWarp:
      return "__syncwarp";
    case Kind::kBallot:
      return "__ballot_sync";
    case Kind::kAny:
      return "__any_sync";
    case Kind::kAll:
      return "__all_sync";
    case Kind::kSyncThreads:
      return "__syncthreads";
    case Kind::kSyncThreadsCount:
      return "__syncthreads_count";
    case Kind::kSyncThreadsAnd:
      return "__syncthreads_and";
    case Kind::kSyncThreadsOr:
      return "__syncthreads_or";
  }
  return "?";
}

inline bool is_block_barrier(Kind k) {
  return k == Kind::kSyncThreads || k == Kind::kSyncThreadsCount || k == Kind::kSyncThreadsAnd ||
         k == Kind::kSyncThreadsOr;
}
inline bool is_shuffle(Kind k) {
  return k == Kind::kShfl || k == Kind::kShflUp || k == Kind::kShflDown || k == Kind::kShflXor;
}

// What one thread brought to the collective it waits at, and what it gets back.
struct Arrival {
  Kind kind = Kind::kSyncThreads;
  const char* file = "";
  int line = 0;
  unsigned mask = 0;
  int operand = 0;  // source lane, delta or lane mask of a shuffle
  int width = kWarpSize;
  int predicate = 0;  // votes and the counting barriers
  size_t bytes = 0;   // a shuffle's value
  unsigned char value[16] = {};
  unsigned char result[16] = {};
  unsigned result_word = 0;  // ballot mask, vote, barrier count
};

// A saved execution context: the stack pointer of a switched-out fiber (x86-64), or ucontext.
#if defined(__x86_64__)
struct Context {
  void* sp = nullptr;
};
#else
struct Context {
  ucontext_t uc;
};
#endif

struct Fiber {
  enum class Run : uint8_t { kReady, kWaiting, kDone };
  Context context;
  char* stack = nullptr;  // usable region (above the guard page)
  Run run = Run::kReady;
  bool started = false;
  Arrival at;
  void* fake_stack = nullptr;  // ASan's fake stack of the fiber while it is switched out
};

// One block's run. One at a time, on the calling host thread.
struct Scheduler {
  std::vector<Fiber> fibers;
  std::vector<char*> stack_pool;  // every stack ever mapped, reused
  Context main_context;
  const void* main_bottom = nullptr;  // the scheduler's stack, for the sanitizer
  size_t main_size = 0;
  int current = -1;  // the running fiber (linear thread index in the block)
  int block_threads = 0;
  void (*body)(void*) = nullptr;  // runs one thread of the kernel (state().thread_idx is set)
  void* body_ctx = nullptr;
  std::string error;          // the first refusal of the block
  std::vector<void*> shared;  // block shared memory of this block (ROPE_BLOCK_SHARED)
  bool abandoned = false;     // the last block was refused and its fibers left mid-way
};

inline Scheduler& scheduler() {
  static Scheduler s;
  return s;
}

// Whether a launch is running inside fibers right now (the collectives need one).
inline bool in_fiber() { return scheduler().current >= 0; }

inline char* map_stack() {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* p = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    std::fprintf(stderr, "cuda host shim: cannot map a fiber stack\n");
    std::abort();
  }
  mprotect(p, page, PROT_NONE);  // guard: a stack overflow faults instead of corrupting
  return static_cast<char*>(p) + page;
}

// ---- switching ----------------------------------------------------------------------------------

#if defined(__x86_64__)
// rope_fiber_switch(save, load): saves the callee-saved registers on the current stack, stores
// the stack pointer in *save, loads `load` and restores what that stack saved. Weak, since every
// translation unit of the host run that includes the shim emits it.
extern "C" void rope_fiber_switch(void** save, void* load);
__asm__(
    ".text\n"
    ".weak rope_fiber_switch\n"
    ".type rope_fiber_switch,@function\n"
    "rope_fiber_switch:\n"
    "  pushq %rbp\n"
    "  pushq %rbx\n"
    "  pushq %r12\n"
    "  pushq %r13\n"
    "  pushq %r14\n"
    "  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n"
    "  popq %r14\n"
    "  popq %r13\n"
    "  popq %r12\n"
    "  popq %rbx\n"
    "  popq %rbp\n"
    "  ret\n"
    ".size rope_fiber_switch,.-rope_fiber_switch\n");

inline void swap_context(Context& save, Context& load) { rope_fiber_switch(&save.sp, load.sp); }

// A fresh context that starts in entry() on the stack [stack, stack + bytes): the six registers
// rope_fiber_switch pops (zero), then entry's address for its ret, then a null return address,
// so that entry starts with the stack aligned as after a call.
inline void make_context(Context& c, char* stack, size_t bytes, void (*entry)()) {
  auto* top = reinterpret_cast<uintptr_t*>(reinterpret_cast<uintptr_t>(stack + bytes) &
                                           ~static_cast<uintptr_t>(15));
  top[-1] = 0;
  top[-2] = reinterpret_cast<uintptr_t>(entry);
  for (int r = 3; r <= 8; ++r) {
    top[-r] = 0;
  }
  c.sp = top - 8;
}
#else
inline void swap_context(Context& save, Context& load) { swapcontext(&save.uc, &load.uc); }
inline void make_context(Context& c, char* stack, size_t bytes, void (*entry)()) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = bytes;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
}
#endif

inline void switch_to_fiber(Scheduler& s, int i) {
  Fiber& f = s.fibers[static_cast<size_t>(i)];
  s.current = i;
#if defined(ROPE_FIBERS_ASAN)
  void* main_fake = nullptr;
  __sanitizer_start_switch_fiber(&main_fake, f.stack, kStackBytes);
#endif
  swap_context(s.main_context, f.context);
#if defined(ROPE_FIBERS_ASAN)
  __sanitizer_finish_switch_fiber(main_fake, nullptr, nullptr);
#endif
  s.current = -1;
}

// From the running fiber back to the scheduler; returns when the scheduler resumes it.
inline void yield_to_scheduler(Scheduler& s, bool finished) {
  Fiber& f = s.fibers[static_cast<size_t>(s.current)];
#if defined(ROPE_FIBERS_ASAN)
  __sanitizer_start_switch_fiber(finished ? nullptr : &f.fake_stack, s.main_bottom, s.main_size);
#endif
  swap_context(f.context, s.main_context);
#if defined(ROPE_FIBERS_ASAN)
  __sanitizer_finish_switch_fiber(f.fake_stack, &s.main_bottom, &s.main_size);
#else
  (void)finished;
#endif
}

inline void set_thread_index(int linear);  // defined by the shim (rope_host_shim.h)

inline void fiber_entry() {
  Scheduler& s = scheduler();
#if defined(ROPE_FIBERS_ASAN)
  __sanitizer_finish_switch_fiber(nullptr, &s.main_bottom, &s.main_size);
#endif
  set_thread_index(s.current);
  s.body(s.body_ctx);
  s.fibers[static_cast<size_t>(s.current)].run = Fiber::Run::kDone;
  yield_to_scheduler(s, true);
  std::abort();  // a finished fiber is never resumed
}

// ---- refusals -----------------------------------------------------------------------------------

inline std::string hex(unsigned mask) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%08x", mask);
  return b;
}

inline std::string site(const Arrival& a) {
  return std::string(kind_name(a.kind)) + " at " + a.file + ":" + std::to_string(a.line);
}

// The first refusal of the block; the block's remaining work is abandoned.
inline void refuse(Scheduler& s, const std::string& what) {
  if (s.error.empty()) {
    s.error = what;
  }
}

// ---- completing collectives --------------------------------------------------------------------

inline bool same_collective(const Arrival& a, const Arrival& b) {
  return a.kind == b.kind && a.line == b.line && std::strcmp(a.file, b.file) == 0 &&
         a.mask == b.mask && a.width == b.width;
}

// The lane a shuffle of `lane` reads, or `lane` itself where CUDA returns the caller's own value.
inline int shuffle_source(const Arrival& a, int lane) {
  const int w = a.width;
  const int base = lane & ~(w - 1);
  switch (a.kind) {
    case Kind::kShfl:
      return base + (a.operand & (w - 1));
    case Kind::kShflUp:
      return (lane - base) >= a.operand ? lane - a.operand : lane;
    case Kind::kShflDown:
      return (lane - base) + a.operand < w ? lane + a.operand : lane;
    case Kind::kShflXor: {
      const int src = lane ^ a.operand;
      return src >= base + w ? lane : src;  // later groups are out of reach
    }
    default:
      return lane;
  }
}

// Completes the warp collective that lane `first` of warp `warp` waits at, if every lane of its
// mask has arrived at the same one. Returns true when it completed (or was refused).
inline bool complete_warp_collective(Scheduler& s, int warp, int first) {
  const Arrival& a = s.fibers[static_cast<size_t>(warp * kWarpSize + first)].at;
  for (int l = 0; l < kWarpSize; ++l) {
    if (!(a.mask >> l & 1u)) {
      continue;
    }
    const int t = warp * kWarpSize + l;
    if (t >= s.block_threads) {
      refuse(s, site(a) + ": the mask names lane " + std::to_string(l) + " of warp " +
                    std::to_string(warp) + ", which the block does not have");
      return true;
    }
    const Fiber& f = s.fibers[static_cast<size_t>(t)];
    if (f.run == Fiber::Run::kDone) {
      refuse(s, site(a) + ": the mask names lane " + std::to_string(l) + " of warp " +
                    std::to_string(warp) + ", which has exited");
      return true;
    }
    if (f.run != Fiber::Run::kWaiting) {
      return false;
    }
    if (is_block_barrier(f.at.kind)) {
      return false;  // may be released by the barrier first; a deadlock is diagnosed later
    }
    if (!same_collective(a, f.at)) {
      refuse(s, "divergence in warp " + std::to_string(warp) + ": lane " + std::to_string(first) +
                    " waits at " + site(a) + " (mask " + hex(a.mask) + "), lane " +
                    std::to_string(l) + " at " + site(f.at) + " (mask " + hex(f.at.mask) + ")");
      return true;
    }
  }
  unsigned ballot = 0;
  int count = 0;
  for (int l = 0; l < kWarpSize; ++l) {
    if (a.mask >> l & 1u) {
      const Arrival& p = s.fibers[static_cast<size_t>(warp * kWarpSize + l)].at;
      if (p.predicate != 0) {
        ballot |= 1u << l;
        ++count;
      }
    }
  }
  const int members = __builtin_popcount(a.mask);
  for (int l = 0; l < kWarpSize; ++l) {
    if (!(a.mask >> l & 1u)) {
      continue;
    }
    Fiber& f = s.fibers[static_cast<size_t>(warp * kWarpSize + l)];
    Arrival& p = f.at;
    if (is_shuffle(a.kind)) {
      const int src = shuffle_source(p, l);
      if (!(a.mask >> src & 1u)) {
        refuse(s, site(p) + ": lane " + std::to_string(l) + " of warp " + std::to_string(warp) +
                      " reads lane " + std::to_string(src) + ", which is not in the mask");
        return true;
      }
      const Arrival& from = s.fibers[static_cast<size_t>(warp * kWarpSize + src)].at;
      std::memcpy(p.result, from.value, p.bytes);
    } else if (a.kind == Kind::kBallot) {
      p.result_word = ballot;
    } else if (a.kind == Kind::kAny) {
      p.result_word = count > 0;
    } else if (a.kind == Kind::kAll) {
      p.result_word = count == members;
    }
    f.run = Fiber::Run::kReady;
  }
  return true;
}

// Completes a block barrier when every thread waits at one. Returns true when it completed (or
// was refused).
inline bool complete_block_barrier(Scheduler& s) {
  int first = -1;
  for (int t = 0; t < s.block_threads; ++t) {
    const Fiber& f = s.fibers[static_cast<size_t>(t)];
    if (f.run == Fiber::Run::kWaiting && is_block_barrier(f.at.kind)) {
      first = t;
      break;
    }
  }
  if (first < 0) {
    return false;
  }
  const Arrival& a = s.fibers[static_cast<size_t>(first)].at;
  int count = 0;
  for (int t = 0; t < s.block_threads; ++t) {
    const Fiber& f = s.fibers[static_cast<size_t>(t)];
    if (f.run == Fiber::Run::kDone) {
      refuse(s, site(a) + ": thread " + std::to_string(t) +
                    " of the block has exited without reaching it (thread " +
                    std::to_string(first) + " waits there)");
      return true;
    }
    if (!is_block_barrier(f.at.kind)) {
      return false;  // a warp collective first (or a deadlock, diagnosed by the caller)
    }
    if (f.at.kind != a.kind || f.at.line != a.line || std::strcmp(f.at.file, a.file) != 0) {
      refuse(s, "divergence in the block: thread " + std::to_string(first) + " waits at " +
                    site(a) + ", thread " + std::to_string(t) + " at " + site(f.at));
      return true;
    }
    count += f.at.predicate != 0;
  }
  for (int t = 0; t < s.block_threads; ++t) {
    Fiber& f = s.fibers[static_cast<size_t>(t)];
    f.at.result_word = a.kind == Kind::kSyncThreadsCount ? static_cast<unsigned>(count)
                       : a.kind == Kind::kSyncThreadsAnd ? count == s.block_threads
                       : a.kind == Kind::kSyncThreadsOr  ? count > 0
                                                         : 0u;
    f.run = Fiber::Run::kReady;
  }
  return true;
}

// Nothing can run and nothing completes: name what waits where.
inline void diagnose_deadlock(Scheduler& s) {
  std::string what = "deadlock:";
  int named = 0;
  for (int t = 0; t < s.block_threads && named < 4; ++t) {
    const Fiber& f = s.fibers[static_cast<size_t>(t)];
    if (f.run == Fiber::Run::kWaiting) {
      what += " thread " + std::to_string(t) + " waits at " + site(f.at) + ";";
      ++named;
    }
  }
  refuse(s, what + " its partners wait elsewhere");
}

// Counts the blocks run, so that block shared memory is fresh in each.
inline int& block_serial() {
  static int n = 0;
  return n;
}

// Runs the block's `threads` fibers to completion (or to the first refusal, returned; empty when
// the block ran through). `reverse`: the fibers run in decreasing index order.
inline std::string run_block(int threads, bool reverse, void (*body)(void*), void* ctx) {
  Scheduler& s = scheduler();
  ++block_serial();
  s.block_threads = threads;
  s.body = body;
  s.body_ctx = ctx;
  s.error.clear();
  s.fibers.resize(static_cast<size_t>(threads));
  while (s.stack_pool.size() < static_cast<size_t>(threads)) {
    s.stack_pool.push_back(map_stack());
  }
  for (int t = 0; t < threads; ++t) {
    Fiber& f = s.fibers[static_cast<size_t>(t)];
    f = Fiber{};
    f.stack = s.stack_pool[static_cast<size_t>(t)];
#if defined(ROPE_FIBERS_ASAN)
    // A fiber's frames unpoison their redzones as they return; an abandoned fiber (a refused
    // block) leaves them poisoned, so its stack is cleaned in full before reuse.
    if (s.abandoned) {
      ASAN_UNPOISON_MEMORY_REGION(f.stack, kStackBytes);
    }
#endif
    make_context(f.context, f.stack, kStackBytes, fiber_entry);
  }
  for (;;) {
    bool any_waiting = false;
    for (int n = 0; n < threads && s.error.empty(); ++n) {
      const int t = reverse ? threads - 1 - n : n;
      if (s.fibers[static_cast<size_t>(t)].run == Fiber::Run::kReady) {
        switch_to_fiber(s, t);
      }
    }
    if (!s.error.empty()) {
      break;
    }
    // Complete what can be completed: warp collectives first (lane order), then the barrier.
    bool progressed = false;
    for (int t = 0; t < threads && s.error.empty(); ++t) {
      const Fiber& f = s.fibers[static_cast<size_t>(t)];
      if (f.run != Fiber::Run::kWaiting) {
        continue;
      }
      any_waiting = true;
      if (!is_block_barrier(f.at.kind)) {
        progressed |= complete_warp_collective(s, t / kWarpSize, t % kWarpSize);
      }
    }
    if (!s.error.empty() || !any_waiting) {
      break;
    }
    if (!progressed) {
      progressed = complete_block_barrier(s);
    }
    if (!s.error.empty()) {
      break;
    }
    if (!progressed) {
      diagnose_deadlock(s);
      break;
    }
  }
  for (void* p : s.shared) {
    std::free(p);
  }
  s.shared.clear();
  s.abandoned = !s.error.empty();
  return s.error;
}

// ---- the collectives, as a thread calls them ----------------------------------------------------

// Waits at a collective; returns the thread's arrival record with its result filled in.
inline Arrival& arrive(const Arrival& a) {
  Scheduler& s = scheduler();
  if (s.current < 0) {
    std::fprintf(stderr, "cuda host shim: %s outside a kernel launch\n", kind_name(a.kind));
    std::abort();
  }
  Fiber& f = s.fibers[static_cast<size_t>(s.current)];
  f.at = a;
  const int lane = s.current % kWarpSize;
  if (!is_block_barrier(a.kind)) {
    if (!(a.mask >> lane & 1u)) {
      refuse(s, site(a) + ": lane " + std::to_string(lane) + " of warp " +
                    std::to_string(s.current / kWarpSize) + " calls it with mask " + hex(a.mask) +
                    ", which leaves the caller out");
    }
    if (a.width < 1 || a.width > kWarpSize || (a.width & (a.width - 1)) != 0) {
      refuse(s, site(a) + ": width " + std::to_string(a.width) + " is not a power of two <= 32");
    }
  }
  f.run = Fiber::Run::kWaiting;
  const int me = s.current;
  yield_to_scheduler(s, false);
  set_thread_index(me);
  return s.fibers[static_cast<size_t>(me)].at;
}

template <typename T>
inline T shuffle(Kind kind, unsigned mask, T var, int operand, int width, const char* file,
                 int line) {
  static_assert(sizeof(T) <= 16 && std::is_trivially_copyable_v<T>, "shuffle of this type");
  Arrival a;
  a.kind = kind;
  a.file = file;
  a.line = line;
  a.mask = mask;
  a.operand = operand;
  a.width = width;
  a.bytes = sizeof(T);
  std::memcpy(a.value, &var, sizeof(T));
  const Arrival& r = arrive(a);
  T out;
  std::memcpy(&out, r.result, sizeof(T));
  return out;
}

inline unsigned vote(Kind kind, unsigned mask, int predicate, const char* file, int line) {
  Arrival a;
  a.kind = kind;
  a.file = file;
  a.line = line;
  a.mask = mask;
  a.predicate = predicate != 0;
  return arrive(a).result_word;
}

inline unsigned barrier(Kind kind, int predicate, const char* file, int line) {
  Arrival a;
  a.kind = kind;
  a.file = file;
  a.line = line;
  a.predicate = predicate != 0;
  return arrive(a).result_word;
}

// ---- block shared memory ------------------------------------------------------------------------

// One ROPE_BLOCK_SHARED declaration: its storage for the running block, allocated (and filled
// with 0xff) by the first thread of the block that reaches it.
struct SharedDecl {
  size_t bytes;
  int block_serial = -1;
  void* data = nullptr;
  explicit SharedDecl(size_t b) : bytes(b) {}
};

inline void* shared_storage(SharedDecl& d) {
  Scheduler& s = scheduler();
  if (s.current < 0) {
    std::fprintf(stderr, "cuda host shim: block shared memory outside a kernel launch\n");
    std::abort();
  }
  if (d.block_serial != block_serial()) {
    d.block_serial = block_serial();
    d.data = std::aligned_alloc(16, (d.bytes + 15) / 16 * 16);
    std::memset(d.data, 0xff, d.bytes);
    s.shared.push_back(d.data);
  }
  return d.data;
}

}  // namespace coop
}  // namespace rope_shim
