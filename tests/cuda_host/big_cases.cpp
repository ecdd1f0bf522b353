// SPDX-License-Identifier: BSD-3-Clause
#include "big_cases.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <sys/mman.h>
#include <torch_rope/ops.h>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <unordered_map>

#include "host_backend.h"

namespace rope_host {
namespace {

constexpr int64_t kBlockThreads = rope::cuda::kBlockThreads;

// One reservation of address space; a page is backed only once touched (reads of untouched pages
// see zeros). Nothing of it counts against memory until written.
class Sparse {
 public:
  explicit Sparse(size_t bytes) : bytes_(bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    base_ = p == MAP_FAILED ? nullptr : static_cast<char*>(p);
  }
  ~Sparse() {
    if (base_ != nullptr) {
      munmap(base_, bytes_);
    }
  }
  Sparse(const Sparse&) = delete;
  Sparse& operator=(const Sparse&) = delete;
  char* base() const { return base_; }
  // A tensor over [offset, ...) of the reservation; it does not own the memory.
  at::Tensor tensor(size_t offset, at::IntArrayRef sizes, at::ScalarType dtype) const {
    return at::from_blob(base_ + offset, sizes, at::TensorOptions().dtype(dtype));
  }

 private:
  char* base_ = nullptr;
  size_t bytes_;
};

std::string reserve_failure(size_t bytes) {
  return "could not reserve " + std::to_string(bytes >> 30) +
         " GiB of address space (mmap MAP_NORESERVE); the check did not run";
}

struct Tables {
  at::Tensor cos;
  at::Tensor sin;
};

Tables tables(at::Generator& gen, int64_t max_seq_len, int64_t half) {
  const at::Tensor angles =
      (at::rand({max_seq_len, half}, gen, at::TensorOptions().dtype(at::kDouble)) - 0.5) * 6.3;
  return {angles.cos().to(at::kFloat), angles.sin().to(at::kFloat)};
}

at::Tensor randn(at::Generator& gen, at::IntArrayRef sizes, at::ScalarType dtype) {
  return at::randn(sizes, gen, at::TensorOptions().dtype(at::kDouble)).to(dtype);
}

// ---- element offsets past 2^31 and 2^32 ---------------------------------------------------------

// A bf16 KV cache (B, S_max, H, D) = (3, 2^23 + 1, 4, 64): 2^31 + 256 elements per batch entry, so
// the rows of batch 1 start past 2^31 elements and those of batch 2 past 2^32 (12 GiB in all). It
// sits 2^32 elements (8 GiB) into the reservation, so an offset truncated to 32 bits lands in
// mapped memory outside every view, where the access tracker names it, rather than crashing.
constexpr int64_t kCacheB = 3;
constexpr int64_t kCacheS = (int64_t{1} << 23) + 1;
constexpr int64_t kCacheH = 4;
constexpr int64_t kCacheD = 64;
constexpr int64_t kCacheGuard = int64_t{1} << 32;  // elements before the cache
static_assert(2 * kCacheS * kCacheH * kCacheD > (int64_t{1} << 32), "batch 2 is past 2^32");

std::vector<BigCaseResult> big_offset_cases(const CpuVectorPath& cpu_path, Tally& tally) {
  std::vector<BigCaseResult> results;
  const size_t bytes = static_cast<size_t>(kCacheGuard + kCacheB * kCacheS * kCacheH * kCacheD) * 2;
  Sparse mem(bytes);
  if (mem.base() == nullptr) {
    results.push_back({"offsets past 2^31", {reserve_failure(bytes)}, {}});
    return results;
  }
  const at::Tensor cache =
      mem.tensor(kCacheGuard * 2, {kCacheB, kCacheS, kCacheH, kCacheD}, at::kBFloat16);
  at::Generator gen = at::detail::createCPUGenerator(31);
  const int64_t max_seq_len = 40;
  const Tables t = tables(gen, max_seq_len, kCacheD / 2);
  // The last two sequence slots: the highest offsets of each batch entry.
  const at::Tensor slots = cache.narrow(1, kCacheS - 2, 2);  // (3, 2, 4, 64)
  const at::Tensor pos_token =
      at::randint(0, max_seq_len, {kCacheB, 2, 1}, gen, at::TensorOptions().dtype(at::kLong));
  const at::Tensor pos_shared =
      at::randint(0, max_seq_len, {2, 1}, gen, at::TensorOptions().dtype(at::kLong));

  const auto run = [&](const std::string& name, auto&& body) {
    BigCaseResult r{name, {}, {}};
    CaseContext ctx;
    ctx.device = Device{5, 132};
    ctx.start_device = 0;
    for (const at::Tensor& a : {cache, t.cos, t.sin, pos_token, pos_shared}) {
      ctx.place(a);
    }
    try {
      body(ctx, r.problems);
    } catch (const c10::Error& e) {
      r.problems.push_back(std::string("raised: ") + e.what_without_backtrace());
    }
    r.problems.insert(r.problems.end(), ctx.problems.begin(), ctx.problems.end());
    for (const LaunchRecord& l : ctx.launches) {
      r.launches.emplace_back(l.device, l.kernel);
    }
    if (ctx.launches.size() != 1) {
      r.problems.push_back("expected one launch, got " + std::to_string(ctx.launches.size()));
    }
    results.push_back(std::move(r));
  };

  // out= into the cache, positions per batch entry: the batch dim is a token dim (its 2^31 + 256
  // stride goes through the token unravel). Both layouts.
  for (const bool interleaved : {true, false}) {
    run(std::string("out= into a 12 GiB cache, batch as a token dim, ") +
            (interleaved ? "interleaved" : "half split"),
        [&](CaseContext& ctx, std::vector<std::string>& problems) {
          const at::Tensor x = randn(gen, {kCacheB, 2, kCacheH, kCacheD}, at::kBFloat16);
          ctx.place(x);
          host_apply_out(ctx, x, t.cos, t.sin, pos_token, interleaved, false, slots);
          const at::Tensor cpu = rope::apply(x, t.cos, t.sin, pos_token, interleaved, false);
          compare_rotation("out", slots, cpu, x, t.cos, t.sin, pos_token, interleaved, false,
                           cpu_path, tally, problems);
        });
  }
  // out= with positions shared by the batch: batch is the outer shared dim (the row walker).
  run("out= into a 12 GiB cache, batch as the outer shared dim",
      [&](CaseContext& ctx, std::vector<std::string>& problems) {
        const at::Tensor x = randn(gen, {kCacheB, 2, kCacheH, kCacheD}, at::kBFloat16);
        ctx.place(x);
        host_apply_out(ctx, x, t.cos, t.sin, pos_shared, true, true, slots);
        const at::Tensor cpu = rope::apply(x, t.cos, t.sin, pos_shared, true, true);
        compare_rotation("out", slots, cpu, x, t.cos, t.sin, pos_shared, true, true, cpu_path,
                         tally, problems);
      });
  // One head of each entry, (3, 2, 64), positions (2,): the 2^31 + 256 stride is the inner
  // shared dim.
  run("out= into a 12 GiB cache, batch as the inner shared dim",
      [&](CaseContext& ctx, std::vector<std::string>& problems) {
        const at::Tensor view = slots.select(2, 1);
        const at::Tensor pos = pos_shared.reshape({2});
        const at::Tensor x = randn(gen, {kCacheB, 2, kCacheD}, at::kBFloat16);
        ctx.place(x);
        host_apply_out(ctx, x, t.cos, t.sin, pos, false, false, view);
        const at::Tensor cpu = rope::apply(x, t.cos, t.sin, pos, false, false);
        compare_rotation("out", view, cpu, x, t.cos, t.sin, pos, false, false, cpu_path, tally,
                         problems);
      });
  // In place in the cache: reads and writes at the large offsets.
  run("apply_ in a 12 GiB cache", [&](CaseContext& ctx, std::vector<std::string>& problems) {
    slots.copy_(randn(gen, {kCacheB, 2, kCacheH, kCacheD}, at::kBFloat16));
    const at::Tensor before = slots.clone();
    host_apply_(ctx, slots, t.cos, t.sin, pos_token, false, false);
    const at::Tensor cpu = rope::apply(before, t.cos, t.sin, pos_token, false, false);
    compare_rotation("x", slots, cpu, before, t.cos, t.sin, pos_token, false, false, cpu_path,
                     tally, problems);
  });
  // apply_qk with k read from the cache (GQA: q has more heads).
  run("apply_qk with k in a 12 GiB cache",
      [&](CaseContext& ctx, std::vector<std::string>& problems) {
        slots.copy_(randn(gen, {kCacheB, 2, kCacheH, kCacheD}, at::kBFloat16));
        const at::Tensor q = randn(gen, {kCacheB, 2, 2 * kCacheH, kCacheD}, at::kBFloat16);
        ctx.place(q);
        const auto [qo, ko] = host_apply_qk(ctx, q, slots, t.cos, t.sin, pos_token, true, false);
        const auto [qc, kc] = rope::apply_qk(q, slots, t.cos, t.sin, pos_token, true, false);
        compare_rotation("q", qo, qc, q, t.cos, t.sin, pos_token, true, false, cpu_path, tally,
                         problems);
        compare_rotation("k", ko, kc, slots, t.cos, t.sin, pos_token, true, false, cpu_path, tally,
                         problems);
      });
  return results;
}

// ---- grids of 65,536 blocks and of more than 2^31 threads, run on a sample of blocks ----------

// Every store and device assert of the sampled blocks.
class SampleObserver final : public Observer {
 public:
  explicit SampleObserver(int64_t element_bytes) : element_bytes_(element_bytes) {}
  void load(const void*, size_t, int64_t) override {}
  void ldg(const void*, size_t, int64_t) override {}
  void store(const void* p, size_t bytes, int64_t thread) override {
    for (size_t off = 0; off < bytes; off += element_bytes_) {
      Store& s = stores[reinterpret_cast<uintptr_t>(p) + off];
      ++s.writes;
      s.thread = thread;
    }
  }
  void device_assert(const char*, int64_t) override { ++asserts; }

  struct Store {
    int writes = 0;
    int64_t thread = -1;
  };
  std::unordered_map<uintptr_t, Store> stores;
  int64_t asserts = 0;

 private:
  size_t element_bytes_;
};

// An in-place call on x (contiguous rows of `head_dim` in sparse memory) whose rows are (token,
// shared outer, shared inner) with the given element strides; positions broadcast over the shared
// dims. Launches once without running a block to learn the plan, fills the rows the sampled
// blocks own with random values, runs the sampled blocks, and checks:
//   - the grid has `want_blocks` blocks, all in gridDim.x, as many as the plan's threads need;
//   - each thread of a sampled block wrote only the rows that the documented decomposition
//     w = (row_group * num_tokens + token) * lanes + lane gives it, at least one element of each,
//     and no element was written twice;
//   - the rows whose every lane ran hold what the CPU backend computes.
struct GridCase {
  std::string name;
  at::Tensor x;                // in sparse memory
  at::Tensor positions;        // broadcast over the shared dims
  at::Tensor token_positions;  // one position per token (the same values), to fill rows from
  int64_t token_stride;
  int64_t outer_stride;
  int64_t inner_stride;
  int64_t head_dim;
  Device device;
  int64_t want_blocks;
  std::vector<int64_t> sample;
  bool interleaved;
};

void run_grid_case(const GridCase& g, at::Generator& gen, const Tables& t,
                   const CpuVectorPath& cpu_path, Tally& tally, BigCaseResult& result) {
  std::vector<std::string>& problems = result.problems;
  const auto base = reinterpret_cast<uintptr_t>(g.x.data_ptr());
  const int64_t elem = static_cast<int64_t>(g.x.element_size());
  CaseContext ctx;
  ctx.device = g.device;
  ctx.start_device = 1;
  for (const at::Tensor& a : {g.x, t.cos, t.sin, g.positions}) {
    ctx.place(a);
  }
  SampleObserver dry_observer(elem);
  ctx.observer = &dry_observer;
  static const int64_t kNone = -1;
  ctx.sample.only_blocks = &kNone;  // launch, but run no block
  ctx.sample.num_only_blocks = 0;
  host_apply_(ctx, g.x, t.cos, t.sin, g.positions, g.interleaved, false);
  if (ctx.launches.size() != 1 || !ctx.launches[0].launched) {
    problems.insert(problems.end(), ctx.problems.begin(), ctx.problems.end());
    problems.push_back("no launch");
    return;
  }
  const LaunchRecord plan = ctx.launches[0];
  const rope::cuda::TensorPlan& p = plan.params.tensor[0];
  const int64_t blocks = plan.grid[0] * plan.grid[1] * plan.grid[2];
  const int64_t needed = (p.num_threads + kBlockThreads - 1) / kBlockThreads;
  if (plan.grid[1] != 1 || plan.grid[2] != 1 || blocks != needed || blocks != g.want_blocks) {
    std::ostringstream m;
    m << "grid (" << plan.grid[0] << ", " << plan.grid[1] << ", " << plan.grid[2] << "), " << blocks
      << " blocks; the plan's " << p.num_threads << " threads need " << needed
      << " in grid.x, this case " << g.want_blocks;
    problems.push_back(m.str());
  }

  // The rows (element offset of feature 0) each sampled thread owns.
  std::map<int64_t, std::vector<int64_t>> rows_of;
  std::map<int64_t, int64_t> lanes_run;  // row -> threads that own it
  std::map<int64_t, int64_t> token_of;   // row -> its token
  for (const int64_t b : g.sample) {
    for (int64_t i = 0; i < kBlockThreads; ++i) {
      const int64_t w = b * kBlockThreads + i;
      if (b >= blocks || w >= p.num_threads) {
        continue;
      }
      const int64_t rest = w / p.lanes;
      const int64_t token = rest % p.num_tokens;
      const int64_t group = rest / p.num_tokens;
      std::vector<int64_t>& rows = rows_of[w];
      for (int64_t j = group * p.rows_per_thread;
           j < std::min((group + 1) * p.rows_per_thread, p.shared_rows); ++j) {
        const int64_t row = token * g.token_stride + j / p.shared_inner * g.outer_stride +
                            j % p.shared_inner * g.inner_stride;
        rows.push_back(row);
        ++lanes_run[row];
        token_of[row] = token;
      }
    }
  }
  // Random values in those rows (the rest of x stays zero, never backed).
  at::Tensor flat = at::from_blob(g.x.data_ptr(), {g.x.numel()}, g.x.options());
  std::map<int64_t, at::Tensor> before;
  for (const auto& [row, n] : lanes_run) {
    at::Tensor r = flat.narrow(0, row, g.head_dim);
    r.copy_(randn(gen, {g.head_dim}, g.x.scalar_type()));
    before[row] = r.clone();
  }

  SampleObserver observer(elem);
  ctx.observer = &observer;
  ctx.sample.only_blocks = g.sample.data();
  ctx.sample.num_only_blocks = g.sample.size();
  host_apply_(ctx, g.x, t.cos, t.sin, g.positions, g.interleaved, false);
  problems.insert(problems.end(), ctx.problems.begin(), ctx.problems.end());
  for (const LaunchRecord& l : ctx.launches) {
    result.launches.emplace_back(l.device, l.kernel);
  }
  if (observer.asserts > 0) {
    problems.push_back(std::to_string(observer.asserts) + " device asserts fired");
  }

  // Every store inside a row of the storing thread, once.
  std::map<std::pair<int64_t, int64_t>, int64_t> written;  // (thread, row) -> elements
  int64_t reported = 0;
  const auto note = [&](const std::string& m) {
    if (reported++ < 4) {
      problems.push_back(m);
    }
  };
  for (const auto& [addr, s] : observer.stores) {
    const int64_t off = static_cast<int64_t>(addr - base) / elem;
    const int64_t row = off - off % g.head_dim;
    const auto it = rows_of.find(s.thread);
    if (addr < base || it == rows_of.end() ||
        std::find(it->second.begin(), it->second.end(), row) == it->second.end()) {
      std::ostringstream m;
      m << "thread " << s.thread << " (block " << s.thread / kBlockThreads << ") stores to element "
        << off << ", not in a row it owns";
      note(m.str());
      continue;
    }
    if (s.writes != 1) {
      note("element " + std::to_string(off) + " written " + std::to_string(s.writes) + " times");
    }
    ++written[{s.thread, row}];
  }
  for (const auto& [w, rows] : rows_of) {
    for (const int64_t row : rows) {
      if (written.count({w, row}) == 0) {
        std::ostringstream m;
        m << "thread " << w << " (block " << w / kBlockThreads << ") wrote nothing of row "
          << row / g.head_dim;
        note(m.str());
      }
    }
  }

  // Values of the rows whose every lane ran, against the CPU backend.
  std::vector<at::Tensor> xs;
  std::vector<at::Tensor> gots;
  std::vector<int64_t> pos;
  const at::Tensor token_pos = g.token_positions.to(at::kLong).contiguous();
  for (const auto& [row, n] : lanes_run) {
    if (n != p.lanes) {
      continue;
    }
    xs.push_back(before[row]);
    gots.push_back(flat.narrow(0, row, g.head_dim).clone());
    pos.push_back(token_pos.const_data_ptr<int64_t>()[token_of[row]]);
  }
  if (xs.empty()) {
    problems.push_back("no sampled row had all its lanes run: the sample checks no value");
    return;
  }
  const at::Tensor x_rows = at::stack(xs);
  const at::Tensor got_rows = at::stack(gots);
  const at::Tensor p_rows = at::tensor(pos, at::TensorOptions().dtype(at::kLong));
  const at::Tensor cpu = rope::apply(x_rows, t.cos, t.sin, p_rows, g.interleaved, false);
  compare_rotation("sampled rows", got_rows, cpu, x_rows, t.cos, t.sin, p_rows, g.interleaved,
                   false, cpu_path, tally, problems);
}

std::vector<BigCaseResult> big_grid_cases(const CpuVectorPath& cpu_path, Tally& tally) {
  std::vector<BigCaseResult> results;
  at::Generator gen = at::detail::createCPUGenerator(65536);
  const int64_t max_seq_len = 64;
  {
    // (16, 8192, 64, 128) bf16 prefill, positions (8192, 1): 16 lanes a row, 8 rows a thread
    // (B * H = 1024 shared rows in 128 groups), 8192 tokens: 2^24 threads, exactly 65,536
    // blocks. The sample is the first two and the last two, 65534 and 65535.
    BigCaseResult r{"prefill (16, 8192, 64, 128) bf16 in place: 65,536 blocks", {}, {}};
    const int64_t B = 16, S = 8192, H = 64, D = 128;
    const size_t bytes = static_cast<size_t>(B * S * H * D) * 2;
    Sparse mem(bytes);
    if (mem.base() == nullptr) {
      r.problems.push_back(reserve_failure(bytes));
    } else {
      const Tables t = tables(gen, max_seq_len, D / 2);
      const at::Tensor pos =
          at::randint(0, max_seq_len, {S, 1}, gen, at::TensorOptions().dtype(at::kLong));
      GridCase g{r.name,
                 mem.tensor(0, {B, S, H, D}, at::kBFloat16),
                 pos,
                 pos.reshape({S}),
                 H * D,
                 S * H * D,
                 D,
                 D,
                 Device{3, 132},
                 65536,
                 {0, 1, 65534, 65535},
                 true};
      try {
        run_grid_case(g, gen, t, cpu_path, tally, r);
      } catch (const c10::Error& e) {
        r.problems.push_back(std::string("raised: ") + e.what_without_backtrace());
      }
    }
    results.push_back(std::move(r));
  }
  {
    // More than 2^31 threads: fp16 (S, 128, 2), rotary_dim 2, S = 2^24 + 2^17, positions (S, 1):
    // one lane a row, 2^31 + 2^24 rows. The simulated GPU has 2^24 SMs, so that the plan keeps one
    // row per thread (a real GPU would give 8 and need 2^34 rows for the same thread count):
    // 2^31 + 2^24 threads in 2^23 + 2^16 blocks. Thread 2^31 is the first of block 2^23.
    BigCaseResult r{"2^31 + 2^24 threads, fp16 rows of 2, in place: 8,454,144 blocks", {}, {}};
    const int64_t S = (int64_t{1} << 24) + (int64_t{1} << 17), H = 128, D = 2;
    const size_t x_bytes = static_cast<size_t>(S * H * D) * 2;
    const size_t bytes = x_bytes + static_cast<size_t>(S) * 4;
    Sparse mem(bytes);
    if (mem.base() == nullptr) {
      r.problems.push_back(reserve_failure(bytes));
    } else {
      const Tables t = tables(gen, max_seq_len, D / 2);
      // int32 positions in sparse memory: zeros (in range) except the sampled tokens', set below.
      const at::Tensor pos = mem.tensor(x_bytes, {S, 1}, at::kInt);
      const int64_t blocks = (S * H + kBlockThreads - 1) / kBlockThreads;
      const std::vector<int64_t> sample{
          0, 65535, 65536, (int64_t{1} << 23) - 1, int64_t{1} << 23, blocks - 1};
      for (const int64_t b : sample) {
        for (int64_t w = b * kBlockThreads; w < (b + 1) * kBlockThreads; ++w) {
          // token = w % S with one lane and one row per thread (checked by run_grid_case).
          pos.data_ptr<int32_t>()[w % S] = static_cast<int32_t>((w * 7919) % max_seq_len);
        }
      }
      GridCase g{r.name,
                 mem.tensor(0, {S, H, D}, at::kHalf),
                 pos,
                 pos.reshape({S}),
                 H * D,
                 0,
                 D,
                 D,
                 Device{2, 1 << 24},
                 blocks,
                 sample,
                 true};
      try {
        run_grid_case(g, gen, t, cpu_path, tally, r);
      } catch (const c10::Error& e) {
        r.problems.push_back(std::string("raised: ") + e.what_without_backtrace());
      }
    }
    results.push_back(std::move(r));
  }
  return results;
}

// ---- the row streams past 2^32 threads, 2^32 source elements and 2^32 cache elements ---------

// The bytes of a float8 tensor as uint8 (a view).
at::Tensor bytes_of(const at::Tensor& t) { return t.view(at::kByte); }

// rope.apply_qk_fp8 into given outputs (the row streams' kernel, common_stream_kernel.cuh): q
// (T, 4096, 2) bf16 with T = 2^20 + 1, one thread per (token, head) row (a rotary run of one plane
// is one lane), so q's stream has 2^32 + 4096 threads and k's (T, 1, 2) follows it: the last blocks
// hold threads >= 2^32, and q's rows there start past 2^33 elements. q (16 GiB) and q_out (8 GiB,
// float8) live in sparse memory; the grid is launched in full and run on a sample of blocks: those
// of threads 2^31 - 1, 2^31, 2^32 - 1, 2^32, q's last and the grid's last. Checks the grid, that
// every store of a sampled thread lands in its own row of q_out or k_out (once per byte), and that
// those rows hold the CPU backend's bytes for the same rows.
BigCaseResult big_stream_threads_case() {
  BigCaseResult r{
      "apply_qk_fp8 row streams with 2^32 + 2^20 + 4097 threads, q rows past 2^33 "
      "elements",
      {},
      {}};
  constexpr int64_t T = (int64_t{1} << 20) + 1;
  constexpr int64_t H = 4096;
  constexpr int64_t kThreads = 256;  // common_stream_kernel.cuh's block
  const int64_t q_threads = T * H;
  const int64_t total = q_threads + T;
  static_assert(T * H > (int64_t{1} << 32), "q's stream alone must pass 2^32 threads");
  const int64_t blocks = (total + kThreads - 1) / kThreads;
  const size_t q_bytes = static_cast<size_t>(T * H * 2) * 2;
  const size_t out_bytes = static_cast<size_t>(T * H * 2);
  // q sits 4 GiB into the reservation: an element offset truncated to 32 bits (down to -2^31
  // elements of 2 bytes) still lands in mapped memory, where the checks name it, not a crash.
  const size_t headroom = size_t{1} << 32;
  Sparse mem(headroom + q_bytes + out_bytes);
  if (mem.base() == nullptr) {
    r.problems.push_back(reserve_failure(headroom + q_bytes + out_bytes));
    return r;
  }
  at::Generator gen = at::detail::createCPUGenerator(20);
  const at::Tensor q = mem.tensor(headroom, {T, H, 2}, at::kBFloat16);
  const at::Tensor q_out = mem.tensor(headroom + q_bytes, {T, H, 2}, at::kFloat8_e4m3fn);
  const at::Tensor k = randn(gen, {T, 1, 2}, at::kBFloat16);
  const at::Tensor k_out = at::zeros({T, 1, 2}, at::TensorOptions().dtype(at::kFloat8_e4m3fn));
  const Tables t = tables(gen, 8, 1);
  const at::Tensor positions = at::randint(0, 8, {T, 1}, gen, at::TensorOptions().dtype(at::kLong));

  const int64_t w31 = int64_t{1} << 31;
  const int64_t w32 = int64_t{1} << 32;
  const std::vector<int64_t> sample{(w31 - 1) / kThreads,       w31 / kThreads,
                                    (w32 - 1) / kThreads,       w32 / kThreads,
                                    (q_threads - 1) / kThreads, blocks - 1};
  // The q rows the sampled threads own (row w of q is thread w), filled with random values.
  std::vector<int64_t> q_rows;
  for (const int64_t b : sample) {
    for (int64_t w = b * kThreads; w < (b + 1) * kThreads && w < q_threads; ++w) {
      q_rows.push_back(w);
    }
  }
  std::sort(q_rows.begin(), q_rows.end());
  q_rows.erase(std::unique(q_rows.begin(), q_rows.end()), q_rows.end());
  const at::Tensor q_flat = at::from_blob(q.data_ptr(), {T * H, 2}, q.options());
  const at::Tensor q_row_index = at::tensor(q_rows, at::kLong);
  const at::Tensor q_values = randn(gen, {static_cast<int64_t>(q_rows.size()), 2}, at::kBFloat16);
  q_flat.index_copy_(0, q_row_index, q_values);

  CaseContext ctx;
  ctx.device = Device{3, 132};
  ctx.start_device = 1;
  for (const at::Tensor& a : {q, q_out, k, k_out, t.cos, t.sin, positions}) {
    ctx.place(a);
  }
  SampleObserver observer(1);
  ctx.observer = &observer;
  ctx.sample.only_blocks = sample.data();
  ctx.sample.num_only_blocks = sample.size();
  try {
    host_apply_qk_fp8_out(ctx, q, k, t.cos, t.sin, positions, std::nullopt, std::nullopt,
                          std::nullopt, std::nullopt, true, false, std::nullopt, false, q_out,
                          k_out, std::nullopt, std::nullopt);
  } catch (const c10::Error& e) {
    r.problems.push_back(std::string("raised: ") + e.what_without_backtrace());
    return r;
  }
  r.problems.insert(r.problems.end(), ctx.problems.begin(), ctx.problems.end());
  if (ctx.grid_launches.size() != 1 || !ctx.grid_launches[0].launched) {
    r.problems.push_back("expected one launch");
    return r;
  }
  const GridLaunchRecord& g = ctx.grid_launches[0];
  if (g.blocks != blocks || g.grid[1] != 1 || g.grid[2] != 1 || g.block_threads != kThreads) {
    std::ostringstream m;
    m << "grid (" << g.grid[0] << ", " << g.grid[1] << ", " << g.grid[2] << ") of "
      << g.block_threads << " threads; " << total << " threads need " << blocks
      << " blocks in grid.x";
    r.problems.push_back(m.str());
  }
  if (observer.asserts > 0) {
    r.problems.push_back(std::to_string(observer.asserts) + " device asserts fired");
  }
  // Every store of a sampled thread is a byte of its own row: q_out row w, or k_out row w - T H.
  const auto q_out_base = reinterpret_cast<uintptr_t>(q_out.data_ptr());
  const auto k_out_base = reinterpret_cast<uintptr_t>(k_out.data_ptr());
  int64_t reported = 0;
  for (const auto& [addr, st] : observer.stores) {
    const bool in_q = addr >= q_out_base && addr < q_out_base + out_bytes;
    const bool in_k = addr >= k_out_base && addr < k_out_base + static_cast<uintptr_t>(T * 2);
    const int64_t row = in_q   ? static_cast<int64_t>(addr - q_out_base) / 2
                        : in_k ? q_threads + static_cast<int64_t>(addr - k_out_base) / 2
                               : -1;
    if ((row != st.thread || st.writes != 1) && reported++ < 4) {
      std::ostringstream m;
      m << "thread " << st.thread << " (block " << st.thread / kThreads << ") stored " << st.writes
        << " time(s) to "
        << (row >= 0 ? "the row of thread " + std::to_string(row)
                     : std::string("an address outside q_out and k_out"));
      r.problems.push_back(m.str());
    }
  }
  // The sampled rows hold the CPU backend's bytes for the same rows and positions.
  const at::Tensor row_positions =
      positions.view({-1}).index_select(0, at::div(q_row_index, H, "floor"));
  const auto [cpu_q, cpu_k, unused_q_nope, unused_k_nope] =
      rope::apply_qk_fp8(q_values.view({-1, 1, 2}), q_values.view({-1, 1, 2}), t.cos, t.sin,
                         row_positions.view({-1, 1}), std::nullopt, std::nullopt, std::nullopt,
                         std::nullopt, at::kFloat8_e4m3fn);
  (void)unused_q_nope;
  (void)unused_k_nope;
  const at::Tensor got_q = bytes_of(at::from_blob(q_out.data_ptr(), {T * H, 2}, q_out.options()))
                               .index_select(0, q_row_index);
  if (!at::equal(got_q, bytes_of(cpu_q).view({-1, 2}))) {
    r.problems.push_back(
        "the sampled q_out rows (past 2^32 threads and 2^33 elements among "
        "them) differ from the CPU backend's");
  }
  // k's sampled threads: the last block's, rows w - T H of k.
  const auto [cpu_q2, cpu_k2, unused_q_nope2, unused_k_nope2] =
      rope::apply_qk_fp8(k, k, t.cos, t.sin, positions, std::nullopt, std::nullopt, std::nullopt,
                         std::nullopt, at::kFloat8_e4m3fn);
  (void)cpu_q2;
  (void)unused_q_nope2;
  (void)unused_k_nope2;
  const int64_t k_first = (blocks - 1) * kThreads - q_threads;
  const int64_t k_count = T - k_first;
  if (k_first < 0 || !at::equal(bytes_of(k_out).narrow(0, k_first, k_count),
                                bytes_of(cpu_k2).narrow(0, k_first, k_count))) {
    r.problems.push_back("k_out's rows of the last block differ from the CPU backend's");
  }
  return r;
}

// rope.rms_norm_apply_qk_cache into a float8 cache of 2^28 + 8 slots of one head of 16 features:
// 2^32 + 128 elements (4 GiB, sparse), slots 2^28 + 7 (the last row, past 2^32 elements), 2^27
// (row 2^31 elements), 2^26 + 3 and 5. An element offset of a cache row held in 32 bits wraps onto
// another row. Runs the whole (small) grid. Checks that every store into the cache lands in the
// row of its token's slot, once per byte, and that those rows hold the CPU backend's bytes (the
// same call into a cache of 4 slots).
BigCaseResult big_stream_cache_case() {
  BigCaseResult r{"rms_norm_apply_qk_cache into a float8 cache of 2^32 + 128 elements", {}, {}};
  constexpr int64_t S = (int64_t{1} << 28) + 8;
  constexpr int64_t D = 16;
  static_assert(S * D > (int64_t{1} << 32), "the cache must pass 2^32 elements");
  const size_t cache_bytes = static_cast<size_t>(S * D);
  // The cache sits 4 GiB into the reservation, as q above: a truncated offset stays mapped.
  const size_t headroom = size_t{1} << 32;
  Sparse mem(headroom + cache_bytes);
  if (mem.base() == nullptr) {
    r.problems.push_back(reserve_failure(headroom + cache_bytes));
    return r;
  }
  at::Generator gen = at::detail::createCPUGenerator(28);
  const at::Tensor k_cache = mem.tensor(headroom, {S, 1, D}, at::kFloat8_e4m3fn);
  const std::vector<int64_t> slot_values{S - 1, int64_t{1} << 27, (int64_t{1} << 26) + 3, 5};
  const int64_t T = static_cast<int64_t>(slot_values.size());
  const at::Tensor slots = at::tensor(slot_values, at::kLong);
  const at::Tensor q = randn(gen, {T, 2, D}, at::kBFloat16);
  const at::Tensor k = randn(gen, {T, 1, D}, at::kBFloat16);
  const at::Tensor q_weight = at::rand({D}, gen, at::TensorOptions().dtype(at::kFloat)) + 0.5;
  const at::Tensor k_weight = at::rand({D}, gen, at::TensorOptions().dtype(at::kFloat)) + 0.5;
  const Tables t = tables(gen, 8, D / 2);
  const at::Tensor positions = at::randint(0, 8, {T, 1}, gen, at::TensorOptions().dtype(at::kLong));
  const at::Tensor k_scale = at::full({1}, 0.25, at::TensorOptions().dtype(at::kFloat));

  CaseContext ctx;
  ctx.device = Device{5, 114};
  ctx.start_device = 0;
  for (const at::Tensor& a :
       {q, k, q_weight, k_weight, t.cos, t.sin, positions, slots, k_cache, k_scale}) {
    ctx.place(a);
  }
  SampleObserver observer(1);
  ctx.observer = &observer;
  at::Tensor host_q;
  try {
    host_q = host_rms_norm_apply_qk_cache(ctx, q, k, std::nullopt, q_weight, k_weight, t.cos, t.sin,
                                          positions, k_cache, std::nullopt, slots, 1e-6, 0.0, true,
                                          k_scale, std::nullopt, std::nullopt, std::nullopt,
                                          std::nullopt, false);
  } catch (const c10::Error& e) {
    r.problems.push_back(std::string("raised: ") + e.what_without_backtrace());
    return r;
  }
  r.problems.insert(r.problems.end(), ctx.problems.begin(), ctx.problems.end());
  if (observer.asserts > 0) {
    r.problems.push_back(std::to_string(observer.asserts) + " device asserts fired");
  }
  const auto cache_base = reinterpret_cast<uintptr_t>(k_cache.data_ptr());
  std::set<uintptr_t> rows;
  for (const int64_t slot : slot_values) {
    rows.insert(cache_base + static_cast<uintptr_t>(slot * D));
  }
  int64_t reported = 0;
  int64_t cache_stores = 0;
  for (const auto& [addr, st] : observer.stores) {
    if (addr < cache_base || addr >= cache_base + cache_bytes) {
      continue;  // q's output
    }
    ++cache_stores;
    const uintptr_t row = cache_base + (addr - cache_base) / D * D;
    if ((rows.count(row) == 0 || st.writes != 1) && reported++ < 4) {
      std::ostringstream m;
      m << "thread " << st.thread << " stored " << st.writes << " time(s) to cache element "
        << (addr - cache_base) << ", in no row of a slot of the call";
      r.problems.push_back(m.str());
    }
  }
  if (cache_stores != T * D) {
    r.problems.push_back(std::to_string(cache_stores) + " cache bytes stored, expected " +
                         std::to_string(T * D));
  }
  at::Tensor small_cache = at::zeros({T, 1, D}, at::TensorOptions().dtype(at::kFloat8_e4m3fn));
  const at::Tensor cpu_q = rope::rms_norm_apply_qk_cache(
      q, k, std::nullopt, q_weight, k_weight, t.cos, t.sin, positions, small_cache, std::nullopt,
      at::arange(T, at::TensorOptions().dtype(at::kLong)), 1e-6, 0.0, true, k_scale);
  const at::Tensor got = bytes_of(k_cache).index_select(0, slots);
  if (!at::equal(got, bytes_of(small_cache))) {
    r.problems.push_back(
        "the cache rows of the slots (past 2^32 elements among them) differ from "
        "the CPU backend's");
  }
  if (!at::equal(host_q.view(at::kShort), cpu_q.view(at::kShort))) {
    r.problems.push_back("q's output differs from the CPU backend's");
  }
  return r;
}

}  // namespace

std::vector<BigCaseResult> run_big_cases(const CpuVectorPath& cpu_path, Tally& tally) {
  std::vector<BigCaseResult> all = big_offset_cases(cpu_path, tally);
  for (BigCaseResult& r : big_grid_cases(cpu_path, tally)) {
    all.push_back(std::move(r));
  }
  all.push_back(big_stream_threads_case());
  all.push_back(big_stream_cache_case());
  return all;
}

}  // namespace rope_host
