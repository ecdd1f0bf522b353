// SPDX-License-Identifier: BSD-3-Clause
// Every byte one launch stores, and the thread that stored it. The KV-cache and row-stream kernels
// give every output element one thread, so a byte stored twice, by one thread or two, is a bug:
// on a GPU two stores race and the last to land wins, which the serial run's order can hide (the
// host runs also alternate that order: see the shim's State::reverse_order). Torch-free, for the
// torch-free run (stream_host.cpp) and the glue's (host_backend.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <unordered_map>

namespace rope_host {

class StoreLedger {
 public:
  void clear() {
    writer_.clear();
    double_stores_ = 0;
    first_.clear();
  }
  void note(const void* p, size_t bytes, int64_t thread) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    for (size_t i = 0; i < bytes; ++i) {
      const auto [it, fresh] = writer_.emplace(a + i, thread);
      if (!fresh && double_stores_++ == 0) {
        std::ostringstream m;
        m << "threads " << it->second << " and " << thread << " both store byte "
          << reinterpret_cast<const void*>(a + i);
        first_ = m.str();
      }
    }
  }
  // The bytes stored more than once since clear(), and a description of the first.
  int64_t double_stores() const { return double_stores_; }
  const std::string& first() const { return first_; }

 private:
  std::unordered_map<uintptr_t, int64_t> writer_;
  int64_t double_stores_ = 0;
  std::string first_;
};

}  // namespace rope_host
