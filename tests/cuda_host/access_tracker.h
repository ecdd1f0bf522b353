// SPDX-License-Identifier: BSD-3-Clause
// Per-launch bookkeeping of every global access the host-run kernel makes (host_kernel.h's
// Observer): which thread read and wrote which element. After the launch it says whether
//   - every element of the output view was written by exactly one thread, and nothing else was;
//   - every x load stayed inside the input view, every __ldg inside the tables or positions;
//   - no element written in place was read by another thread (a race the host launch hides);
//   - the device asserts fired exactly when a position was out of range;
//   - with a position out of range (any axis of a multi-axis one), nothing of the rotated part
//     of its rows was written, and every other row was written as usual.
// Positions may be read (__ldg) at every axis of every row's position, nowhere else.
// The views come from the kernel arguments (RotationArgs, TableArgs) that common_prepare.cpp built,
// so this checks the kernel and its launch planning; the driver checks the arguments themselves by
// comparing values and guard bands.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common_kernel_args.h"
#include "host_kernel.h"

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

  // Problems found, empty when the launch was clean. With `positions_in_range` false, rows at a
  // bad position must have no rotated feature written (their tail may be copied or not: copy
  // lanes of a rotating row do not read the position), every other row is held to the usual
  // counts, and at least one assert must have fired.
  std::vector<std::string> finish(bool positions_in_range) const;

  int64_t asserts() const { return asserts_; }

 private:
  struct Cell {
    bool readable = false;     // inside an input view
    int8_t expected = -1;      // writes expected: -1 not in an output view, else 0 or 1
    bool bad_rotated = false;  // rotated feature of a row whose position is out of range: unwritten
    bool bad_tail = false;     // tail feature of such a row: written at most `expected` times
    int32_t writes = 0;
    int64_t writer = -1;
    int64_t reader = -1;
    bool many_readers = false;
  };

  void add_tensor(const rope::RotationArgs& a, const rope::TableArgs& tables);
  Cell* cell(const void* p);
  void note(std::string problem);

  int storage_bytes_;
  std::unordered_map<uintptr_t, Cell> cells_;  // x / out elements, by address
  std::unordered_set<uintptr_t> ldg_ok_;       // 4-byte units of tables and positions
  std::vector<std::string> problems_;
  int64_t asserts_ = 0;
};

}  // namespace rope_host
