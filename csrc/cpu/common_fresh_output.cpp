// SPDX-License-Identifier: BSD-3-Clause
#include "common_fresh_output.h"

#include <ATen/EmptyTensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/util/accumulate.h>

#include <cstdint>
#include <cstring>
#include <iterator>
#include <mutex>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace rope::detail {
namespace {

#if defined(__linux__) && defined(MADV_HUGEPAGE)

constexpr uintptr_t kHugePage = uintptr_t{2} << 20;
constexpr uintptr_t kSmallPage = uintptr_t{4} << 10;

uintptr_t round_up(uintptr_t n, uintptr_t to) { return (n + to - 1) & ~(to - 1); }

// A mapping: its start and length.
struct Mapping {
  void* start;
  size_t length;
};

// Freed mappings, kept for the next output of the same length (a model's calls repeat their
// shapes): a kept mapping is already faulted in, as glibc's reused heap is for x.clone(), and in
// huge pages. Bounded by kKeptBytes and kKeptMappings; the oldest go first (munmap). The pages of
// a kept mapping stay resident, as glibc's untrimmed heap does.
class KeptMappings {
 public:
  static constexpr size_t kKeptBytes = size_t{256} << 20;
  static constexpr size_t kKeptMappings = 8;

  // The most recently kept mapping of exactly `length` bytes (its pages the likeliest still in
  // cache), taken out of the set, or nullptr.
  void* take(size_t length) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = kept_.rbegin(); it != kept_.rend(); ++it) {
      if (it->length == length) {
        void* start = it->start;
        held_ -= length;
        kept_.erase(std::next(it).base());
        return start;
      }
    }
    return nullptr;
  }

  // Keeps `m` for reuse; unmaps what no longer fits (outside the lock: munmap can take a while).
  void give(Mapping m) {
    std::vector<Mapping> dropped;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (m.length > kKeptBytes) {
        dropped.push_back(m);
      } else {
        kept_.push_back(m);
        held_ += m.length;
        while (held_ > kKeptBytes || kept_.size() > kKeptMappings) {
          dropped.push_back(kept_.front());
          held_ -= kept_.front().length;
          kept_.erase(kept_.begin());
        }
      }
    }
    for (const Mapping& d : dropped) {
      (void)munmap(d.start, d.length);
    }
  }

 private:
  std::mutex mutex_;
  std::vector<Mapping> kept_;  // oldest first
  size_t held_ = 0;
};

KeptMappings& kept_mappings() {
  static auto* kept = new KeptMappings();  // never destroyed: storages may outlive statics
  return *kept;
}

void release(void* ctx) {
  auto* mapping = static_cast<Mapping*>(ctx);
  kept_mappings().give(*mapping);
  delete mapping;
}

// Large blocks as mappings of their own; small ones (and a failed mapping) from torch's CPU
// allocator, so a storage resized below the threshold or on a machine that refuses still works.
class OwnPagesAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    if (nbytes < kOwnPagesBytes) {
      return c10::GetCPUAllocator()->allocate(nbytes);
    }
    const size_t length = round_up(nbytes, kSmallPage);
    if (void* kept = kept_mappings().take(length)) {
      return {kept, new Mapping{kept, length}, &release, c10::Device(c10::DeviceType::CPU)};
    }
    // One huge page more than needed, so that a 2 MiB-aligned start lies inside; the slack on
    // either side is unmapped at once.
    void* raw = mmap(nullptr, length + kHugePage, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) {
      return c10::GetCPUAllocator()->allocate(nbytes);
    }
    const auto base = reinterpret_cast<uintptr_t>(raw);
    const uintptr_t start = round_up(base, kHugePage);
    if (start > base) {
      (void)munmap(raw, start - base);
    }
    const uintptr_t end = start + length;
    const uintptr_t mapped_end = base + length + kHugePage;
    if (mapped_end > end) {
      (void)munmap(reinterpret_cast<void*>(end), mapped_end - end);
    }
    void* data = reinterpret_cast<void*>(start);
    // Advice only: where transparent huge pages are off, the pages are small and all else holds.
    (void)madvise(data, length, MADV_HUGEPAGE);
    populate_for_writing(data, length);
    return {data, new Mapping{data, length}, &release, c10::Device(c10::DeviceType::CPU)};
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

 private:
  // Every page is faulted in here, by this one thread, before the kernel's threads write: two
  // threads taking the first-touch huge-page faults of one output at once fell into 72-79 ms
  // phases on the 2-core VM where one thread was steady (benchmarks/fresh_output_probe.py). One
  // madvise(MADV_POPULATE_WRITE) where the kernel has it (Linux 5.14), else a write per page; the
  // storage is uninitialised, so the zero written changes nothing.
  static void populate_for_writing(void* data, size_t length) {
#if defined(MADV_POPULATE_WRITE)
    if (madvise(data, length, MADV_POPULATE_WRITE) == 0) {
      return;
    }
#endif
    const auto start = reinterpret_cast<uintptr_t>(data);
    for (uintptr_t page = start; page < start + length; page += kSmallPage) {
      *reinterpret_cast<volatile char*>(page) = 0;
    }
  }
};

c10::Allocator* own_pages_allocator() {
  // Never destroyed: storages it made may outlive static destruction.
  static auto* allocator = new OwnPagesAllocator();
  return allocator;
}

#endif

}  // namespace

at::Tensor empty_cpu_output(c10::IntArrayRef sizes, c10::ScalarType dtype) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  const auto nbytes = static_cast<size_t>(c10::multiply_integers(sizes)) * c10::elementSize(dtype);
  if (nbytes >= kOwnPagesBytes) {
    return at::detail::empty_generic(sizes, own_pages_allocator(),
                                     c10::DispatchKeySet(c10::DispatchKey::CPU), dtype,
                                     c10::MemoryFormat::Contiguous);
  }
#endif
  // The decode sizes (and every size elsewhere than Linux): no virtual call, no mapping.
  return at::detail::empty_cpu(sizes, dtype, /*pin_memory=*/false, c10::MemoryFormat::Contiguous);
}

}  // namespace rope::detail
