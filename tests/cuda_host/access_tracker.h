// SPDX-License-Identifier: BSD-3-Clause
// Per-launch bookkeeping of every global access the host-run kernel makes (host_kernel.h's
// Observer): which thread read and wrote which element. After the launch it says whether
//   - every element of the output view was written by exactly one thread, and nothing else was;
//   - every x load stayed inside the input view, every __ldg inside the tables or positions;
//   - no element written in place was read by another thread (a race the serial launch hides);
//   - the device asserts fired exactly when a position was out of range.
// The views come from the kernel arguments (RotationArgs, TableArgs) that prepare.cpp built, so
// this checks the kernel and its launch planning; the driver checks the arguments themselves by
// comparing values and guard bands.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "host_kernel.h"
#include "kernel_args.h"

namespace rope_host {

class AccessTracker final : public Observer {
 public:
  // `storage_bytes`: element size of x / out; `table_bytes`: of cos / sin.
  AccessTracker(const rope::RotationArgs& first, const rope::RotationArgs* second,
                const rope::TableArgs& tables, int storage_bytes, int table_bytes);

  void load(const void* p, size_t bytes, int64_t thread) override;
  void store(const void* p, size_t bytes, int64_t thread) override;
  void ldg(const void* p, size_t bytes, int64_t thread) override;
  void device_assert(const char* cond, int64_t thread) override;

  // Admits `bytes` more bytes from p for __ldg (the RMSNorm weights of rms_norm_apply_qk).
  void allow_ldg(const void* p, int64_t bytes);

  // Problems found, empty when the launch was clean. With `positions_in_range` false the write
  // counts are not checked (rows at a bad position are legitimately left unwritten) but every
  // other rule is, and at least one assert must have fired.
  std::vector<std::string> finish(bool positions_in_range) const;

  int64_t asserts() const { return asserts_; }

 private:
  struct Cell {
    bool readable = false;  // inside an input view
    int8_t expected = -1;   // writes expected: -1 not in an output view, else 0 or 1
    int32_t writes = 0;
    int64_t writer = -1;
    int64_t reader = -1;
    bool many_readers = false;
  };

  void add_tensor(const rope::RotationArgs& a);
  Cell* cell(const void* p);
  void note(std::string problem);

  int storage_bytes_;
  int32_t num_axes_ = 0;  // multi-axis positions: every axis of a row's positions is readable
  std::unordered_map<uintptr_t, Cell> cells_;  // x / out elements, by address
  std::unordered_set<uintptr_t> ldg_ok_;       // 4-byte units of tables and positions
  std::vector<std::string> problems_;
  int64_t asserts_ = 0;
};

}  // namespace rope_host
