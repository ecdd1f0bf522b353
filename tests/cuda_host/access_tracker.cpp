// SPDX-License-Identifier: BSD-3-Clause
#include "access_tracker.h"

#include <sstream>

namespace rope_host {
namespace {

constexpr size_t kMaxProblems = 8;

// Calls fn(in_off, out_off, pos_off) for every row of `g`, in row-major order.
template <typename Fn>
void for_each_row(const rope::RowGeometry& g, Fn fn) {
  if (g.num_rows == 0) {
    return;
  }
  int64_t index[rope::kMaxRowDims] = {};
  for (int64_t row = 0; row < g.num_rows; ++row) {
    int64_t in = 0;
    int64_t out = 0;
    int64_t pos = 0;
    for (int32_t d = 0; d < g.ndim; ++d) {
      in += index[d] * g.in_strides[d];
      out += index[d] * g.out_strides[d];
      pos += index[d] * g.pos_strides[d];
    }
    fn(in, out, pos);
    for (int32_t d = g.ndim - 1; d >= 0; --d) {
      if (++index[d] < g.row_sizes[d]) {
        break;
      }
      index[d] = 0;
    }
  }
}

uintptr_t address(const void* base, int64_t element, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(base) + static_cast<uintptr_t>(element * bytes);
}

}  // namespace

AccessTracker::AccessTracker(const rope::RotationArgs& first, const rope::RotationArgs* second,
                             const rope::TableArgs& tables, int storage_bytes, int table_bytes)
    : storage_bytes_(storage_bytes) {
  add_tensor(first, tables);
  if (second != nullptr) {
    add_tensor(*second, tables);
  }
  const int64_t half = first.rotary_dim / 2;
  if (tables.from_frequencies()) {
    // The frequency form reads each plane's frequency (through its stride), and no table.
    for (int64_t k = 0; k < half; ++k) {
      const uintptr_t a = address(tables.frequencies.freqs, k * tables.frequencies.freq_stride, 8);
      ldg_ok_.insert(a);
      ldg_ok_.insert(a + 4);
    }
    return;
  }
  for (int64_t row = 0; row < tables.max_seq_len; ++row) {
    for (int64_t col = 0; col < half; ++col) {
      for (const void* table : {tables.cos, tables.sin}) {
        const uintptr_t a = address(table, row * tables.table_stride + col, table_bytes);
        for (int u = 0; u < table_bytes; u += 4) {
          ldg_ok_.insert(a + u);
        }
      }
    }
  }
}

namespace {

// Element i of an int32 / int64 index tensor.
int64_t index_at(const void* p, bool is64, int64_t i) {
  return is64 ? static_cast<const int64_t*>(p)[i]
              : static_cast<int64_t>(static_cast<const int32_t*>(p)[i]);
}

// The position of token t of packed sequences, or false when the packing does not give it one
// (the checks the kernel asserts: the boundaries' ends, and the token's own sequence). Written
// here with a linear scan for the sequence (the kernel searches), for the tracker's view of which
// rows must stay unwritten.
bool packed_reference(const rope::PackedSequenceArgs& s, int64_t t, int64_t& pos) {
  if (s.num_seqs < 1) {
    return false;  // cu_seqlens = [0]: no token has a sequence
  }
  const auto cu = [&](int64_t i) { return index_at(s.cu_seqlens, s.cu_seqlens_are_int64, i); };
  const int64_t cp = s.cp_size;
  int64_t i = 0;
  for (int64_t m = 1; m < s.num_seqs; ++m) {
    if (cu(m) / cp <= t) {
      i = m;
    }
  }
  const int64_t length = cu(i + 1) - cu(i);
  const int64_t j = t - cu(i) / cp;
  const int64_t offset =
      s.seq_offsets == nullptr ? 0 : index_at(s.seq_offsets, s.seq_offsets_are_int64, i);
  if (cu(0) != 0 || cu(s.num_seqs) != s.num_tokens * cp || length < 0 || cu(i) % cp != 0 ||
      (cp > 1 && length % (2 * cp) != 0) || j < 0 || j >= length / cp || offset < 0) {
    return false;
  }
  const int64_t c = length / (2 * cp);
  const int64_t relative = cp == 1 ? j
                           : j < c ? s.cp_rank * c + j
                                   : (2 * cp - 1 - s.cp_rank) * c + j - c;
  // A position past int64 is refused too.
  return !__builtin_add_overflow(offset, relative, &pos);
}

}  // namespace

void AccessTracker::add_tensor(const rope::RotationArgs& a, const rope::TableArgs& tables) {
  const int64_t pos_bytes = a.positions_are_int64 ? 8 : 4;
  // One-axis positions are one axis here; a multi-axis row reads axis j at pos + j * axis_stride.
  const int64_t num_axes = tables.axes.num_axes > 0 ? tables.axes.num_axes : 1;
  const bool packed = a.position_kind == rope::PositionKind::kPacked;
  if (packed) {
    // The whole of cu_seqlens and seq_offsets may be read (the search), and nothing else.
    const rope::PackedSequenceArgs& s = a.packed;
    for (int64_t i = 0; i <= s.num_seqs; ++i) {
      const uintptr_t p = address(s.cu_seqlens, i, s.cu_seqlens_are_int64 ? 8 : 4);
      for (int64_t u = 0; u < (s.cu_seqlens_are_int64 ? 8 : 4); u += 4) {
        ldg_ok_.insert(p + u);
      }
      if (s.seq_offsets != nullptr && i < s.num_seqs) {
        const uintptr_t q = address(s.seq_offsets, i, s.seq_offsets_are_int64 ? 8 : 4);
        for (int64_t u = 0; u < (s.seq_offsets_are_int64 ? 8 : 4); u += 4) {
          ldg_ok_.insert(q + u);
        }
      }
    }
  }
  for_each_row(a.geometry, [&](int64_t in, int64_t out, int64_t pos) {
    bool bad_row = false;
    if (packed) {
      int64_t position = 0;
      bad_row = !packed_reference(a.packed, pos, position) ||
                (!tables.from_frequencies() && position >= tables.max_seq_len);
    }
    for (int64_t axis = 0; axis < (packed ? 0 : num_axes); ++axis) {
      const int64_t at = pos + axis * a.axis_stride;
      const uintptr_t p = address(a.positions, at, pos_bytes);
      for (int64_t u = 0; u < pos_bytes; u += 4) {
        ldg_ok_.insert(p + u);
      }
      const int64_t value = a.positions_are_int64 ? static_cast<const int64_t*>(a.positions)[at]
                                                  : static_cast<const int32_t*>(a.positions)[at];
      bad_row = bad_row || value < 0 || (!tables.from_frequencies() && value >= tables.max_seq_len);
    }
    for (int64_t f = 0; f < a.head_dim; ++f) {
      cells_[address(a.in, in + f, storage_bytes_)].readable = true;
    }
    for (int64_t f = 0; f < a.head_dim; ++f) {
      const bool written = f < a.rotary_dim || a.copy_tail;
      Cell& c = cells_[address(a.out, out + f, storage_bytes_)];
      if (c.expected == 1 && written) {
        note("the output view overlaps itself (prepare gave two rows one address)");
      }
      if (c.expected < 1) {
        c.expected = written ? 1 : 0;
      }
      c.bad_rotated = c.bad_rotated || (bad_row && f < a.rotary_dim);
      c.bad_tail = c.bad_tail || (bad_row && f >= a.rotary_dim);
    }
  });
}

AccessTracker::Cell* AccessTracker::cell(const void* p) {
  const auto it = cells_.find(reinterpret_cast<uintptr_t>(p));
  return it == cells_.end() ? nullptr : &it->second;
}

void AccessTracker::note(std::string problem) {
  if (problems_.size() < kMaxProblems) {
    problems_.push_back(std::move(problem));
  }
}

void AccessTracker::load(const void* p, size_t bytes, int64_t thread) {
  for (size_t off = 0; off < bytes; off += storage_bytes_) {
    const void* e = static_cast<const char*>(p) + off;
    Cell* c = cell(e);
    if (c == nullptr || !c->readable) {
      std::ostringstream m;
      m << "thread " << thread << " loads " << e << ", outside the input view";
      note(m.str());
      continue;
    }
    if (c->reader < 0) {
      c->reader = thread;
    } else if (c->reader != thread) {
      c->many_readers = true;
    }
  }
}

void AccessTracker::store(const void* p, size_t bytes, int64_t thread) {
  for (size_t off = 0; off < bytes; off += storage_bytes_) {
    const void* e = static_cast<const char*>(p) + off;
    Cell* c = cell(e);
    if (c == nullptr || c->expected < 0) {
      std::ostringstream m;
      m << "thread " << thread << " stores to " << e << ", outside the output view";
      note(m.str());
      continue;
    }
    if (++c->writes > 1 && c->writer != thread) {
      std::ostringstream m;
      m << "threads " << c->writer << " and " << thread << " both store to " << e;
      note(m.str());
    }
    c->writer = thread;
  }
}

void AccessTracker::ldg(const void* p, size_t bytes, int64_t thread) {
  for (size_t off = 0; off < bytes; off += 4) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p) + off;
    if (ldg_ok_.count(a) == 0) {
      std::ostringstream m;
      m << "thread " << thread << " reads " << reinterpret_cast<const void*>(a)
        << " through __ldg, outside the tables and positions";
      note(m.str());
      return;
    }
  }
}

void AccessTracker::allow_ldg(const void* p, int64_t bytes) {
  for (int64_t u = 0; u < bytes; u += 4) {
    ldg_ok_.insert(reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(u));
  }
}

void AccessTracker::device_assert(const char* cond, int64_t thread) { ++asserts_; }

std::vector<std::string> AccessTracker::finish(bool positions_in_range) const {
  std::vector<std::string> problems = problems_;
  int64_t wrong_counts = 0;
  int64_t bad_writes = 0;
  int64_t races = 0;
  std::ostringstream first;
  std::ostringstream first_bad;
  for (const auto& [addr, c] : cells_) {
    if (c.expected >= 0 && c.bad_rotated && c.writes != 0) {
      if (bad_writes++ == 0) {
        first_bad << "element " << reinterpret_cast<const void*>(addr) << " written " << c.writes
                  << " times";
      }
    } else if (c.expected >= 0 && !c.bad_rotated &&
               (c.bad_tail ? c.writes > c.expected : c.writes != c.expected)) {
      if (wrong_counts++ == 0) {
        first << "element " << reinterpret_cast<const void*>(addr) << " written " << c.writes
              << " times, expected " << static_cast<int>(c.expected);
      }
    }
    if (c.writes > 0 && (c.many_readers || (c.reader >= 0 && c.reader != c.writer))) {
      ++races;
    }
  }
  if (wrong_counts > 0) {
    problems.push_back(std::to_string(wrong_counts) + " output elements not written exactly " +
                       "as expected; first: " + first.str());
  }
  if (bad_writes > 0) {
    problems.push_back(std::to_string(bad_writes) + " rotated output elements of rows at an " +
                       "out-of-range position were written; first: " + first_bad.str());
  }
  if (races > 0) {
    problems.push_back(std::to_string(races) +
                       " elements written in place by one thread and read by another");
  }
  if (positions_in_range && asserts_ > 0) {
    problems.push_back(std::to_string(asserts_) + " device asserts fired with every position " +
                       "in range");
  }
  if (!positions_in_range && asserts_ == 0) {
    problems.push_back("a position is out of range but no device assert fired");
  }
  return problems;
}

}  // namespace rope_host
