// SPDX-License-Identifier: BSD-3-Clause
// The host run's model of cooperating threads (shim/rope_host_fibers.h), checked on its own:
// small kernels that use each collective correctly, against references written here from the
// CUDA programming guide's definitions, and planted mistakes, each of which must be refused with
// its reason (or, for a missing barrier, give a wrong result) in both launch orders. Torch-free;
// ctest cuda_host_cooperation.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

int g_failures = 0;
std::string g_error;  // the last refusal the launch reported

void on_error(void*, const char* what, int64_t) { g_error = what; }

void check(bool ok, const std::string& what) {
  if (!ok) {
    ++g_failures;
    std::fprintf(stderr, "FAIL: %s\n", what.c_str());
  }
}

// ---- kernels that cooperate correctly ----------------------------------------------------------

// A butterfly sum over groups of `width` lanes, then every shuffle flavour's raw result.
__global__ void butterfly(float* sum, int* up, int* down, int* idx, int* xr, int width) {
  const int t = static_cast<int>(threadIdx.x);
  float v = static_cast<float>(t) * 0.5f + 1.0f / static_cast<float>(t + 3);
  for (int step = width / 2; step >= 1; step /= 2) {
    v += __shfl_xor_sync(0xffffffffu, v, step, width);
  }
  sum[t] = v;
  up[t] = __shfl_up_sync(0xffffffffu, t * 10, 3, width);
  down[t] = __shfl_down_sync(0xffffffffu, t * 10, 3, width);
  idx[t] = __shfl_sync(0xffffffffu, t * 10, 5, width);
  xr[t] = __shfl_xor_sync(0xffffffffu, t * 10, width, 32);  // reaches the next group of `width`
}

// A shuffle returns what the partner held at the collective, not later.
__global__ void snapshot(int* first, int* second) {
  const int t = static_cast<int>(threadIdx.x);
  int v = t;
  first[t] = __shfl_xor_sync(0xffffffffu, v, 1);
  v = 1000 + t;
  second[t] = __shfl_xor_sync(0xffffffffu, v, 1);
}

// Two half-warps with their own masks, one of them returning early as a whole.
__global__ void half_warps(int* out, int skip_upper) {
  const int t = static_cast<int>(threadIdx.x);
  const unsigned mask = 0xffffu << (t & 16);
  if (skip_upper && (t & 16)) {
    return;
  }
  int v = t;
  for (int step = 8; step >= 1; step /= 2) {
    v += __shfl_xor_sync(mask, v, step, 16);
  }
  __syncwarp(mask);
  out[t] = v;
}

__global__ void votes(unsigned* ballot, int* any, int* all) {
  const int t = static_cast<int>(threadIdx.x);
  ballot[t] = __ballot_sync(0xffffffffu, t % 3 == 0);
  any[t] = __any_sync(0xffffffffu, t == 7);
  all[t] = __all_sync(0xffffffffu, t < 40);
}

// A block sum through shared memory, barriers between the steps.
__global__ void block_sum(float* out, int* counts, int use_barrier) {
  ROPE_BLOCK_SHARED(float, partial, 256);
  const int t = static_cast<int>(threadIdx.x);
  const int n = static_cast<int>(blockDim.x);
  partial[t] = static_cast<float>(t + 1 + 1000 * static_cast<int>(blockIdx.x));
  if (use_barrier) {
    __syncthreads();
  }
  for (int step = n / 2; step >= 1; step /= 2) {
    if (t < step) {
      partial[t] += partial[t + step];
    }
    if (use_barrier) {
      __syncthreads();
    }
  }
  out[blockIdx.x * n + t] = partial[0];
  counts[blockIdx.x * 3 * n + 3 * t] = __syncthreads_count(t % 4 == 0);
  counts[blockIdx.x * 3 * n + 3 * t + 1] = __syncthreads_and(t < n);
  counts[blockIdx.x * 3 * n + 3 * t + 2] = __syncthreads_or(t == n - 1);
}

// ---- planted mistakes --------------------------------------------------------------------------

// 0: a lane left out of the mask; 1: a lane in the mask has exited; 2: divergence (two call
// sites); 3: a shuffle reading outside its mask; 4: a width that is no power of two; 5: a barrier
// some threads skip by returning; 6: barriers at two call sites; 7: a deadlock (a warp collective
// against a barrier); 8: a mask naming a lane the block does not have (a 48-thread block).
__global__ void planted(int* out, int which) {
  const int t = static_cast<int>(threadIdx.x);
  int v = t;
  switch (which) {
    case 0:
      v = __shfl_xor_sync(0x7fffffffu, v, 1);
      break;
    case 1:
      if (t == 31) {
        return;
      }
      v = __shfl_xor_sync(0xffffffffu, v, 2);
      break;
    case 2:
      if (t % 2 == 0) {
        v = __shfl_xor_sync(0xffffffffu, v, 1);
      } else {
        v = __shfl_xor_sync(0xffffffffu, v, 1);
      }
      break;
    case 3:
      v = __shfl_xor_sync(0xffffu << (t & 16), v, 16);
      break;
    case 4:
      v = __shfl_xor_sync(0xffffffffu, v, 1, 12);
      break;
    case 5:
      if (t >= 64) {
        return;
      }
      __syncthreads();
      break;
    case 6:
      if (t < 64) {
        __syncthreads();
      } else {
        __syncthreads();
      }
      break;
    case 7:
      if (t == 0) {
        v = __shfl_xor_sync(0x3u, v, 1);
      } else {
        __syncthreads();
      }
      break;
    case 8:
      v = __shfl_xor_sync(0xffffffffu, v, 1);
      break;
    default:
      break;
  }
  out[t] = v;
}

// ---- the checks
// ----------------------------------------------------------------------------------

template <typename... P>
cudaError_t launch(void (*kernel)(P...), unsigned blocks, unsigned threads, P... args) {
  void* argv[] = {&args...};
  g_error.clear();
  return cudaLaunchKernel(kernel, dim3(blocks), dim3(threads), argv, 0, nullptr);
}

// The lane a shuffle reads, from the programming guide ("Warp Shuffle Functions"): width-wide
// groups; up/down stay inside the caller's group (else its own value); xor may read an earlier
// group but not a later one.
int ref_up(int lane, int d, int w) { return lane % w >= d ? lane - d : lane; }
int ref_down(int lane, int d, int w) { return lane % w + d < w ? lane + d : lane; }
int ref_idx(int lane, int src, int w) { return lane / w * w + src % w; }
int ref_xor(int lane, int m, int w) { return (lane ^ m) / w > lane / w ? lane : lane ^ m; }

void check_shuffles(bool reverse) {
  const char* order = reverse ? " (reverse order)" : "";
  for (int width : {1, 2, 4, 8, 16, 32}) {
    const int n = 64;
    std::vector<float> sum(n);
    std::vector<int> up(n), down(n), idx(n), xr(n);
    const cudaError_t e =
        launch(butterfly, 1, n, sum.data(), up.data(), down.data(), idx.data(), xr.data(), width);
    check(e == cudaSuccess, "butterfly launch" + std::string(order) + ": " + g_error);
    for (int t = 0; t < n; ++t) {
      // The butterfly's tree, written out: the value after the step with offset s is
      // v(l) + v(l ^ s), in this order of the operands.
      std::vector<float> v(n);
      for (int l = 0; l < n; ++l) {
        v[l] = static_cast<float>(l) * 0.5f + 1.0f / static_cast<float>(l + 3);
      }
      for (int step = width / 2; step >= 1; step /= 2) {
        std::vector<float> next(n);
        for (int l = 0; l < n; ++l) {
          next[l] = v[l] + v[l ^ step];
        }
        v = next;
      }
      const int lane = t % 32;
      const int warp = t / 32 * 32;
      check(std::memcmp(&sum[t], &v[t], sizeof(float)) == 0,
            "butterfly sum, width " + std::to_string(width) + order);
      check(up[t] == 10 * (warp + ref_up(lane, 3, width)), "shfl_up" + std::string(order));
      check(down[t] == 10 * (warp + ref_down(lane, 3, width)), "shfl_down" + std::string(order));
      check(idx[t] == 10 * (warp + ref_idx(lane, 5, width)), "shfl" + std::string(order));
      check(xr[t] == 10 * (warp + ref_xor(lane, width, 32)),
            "shfl_xor, lane mask " + std::to_string(width) + order);
    }
  }
  std::vector<int> first(32), second(32);
  check(launch(snapshot, 1, 32, first.data(), second.data()) == cudaSuccess, "snapshot launch");
  for (int t = 0; t < 32; ++t) {
    check(first[t] == (t ^ 1) && second[t] == 1000 + (t ^ 1),
          "a shuffle returns the partner's value at the collective" + std::string(order));
  }
  for (int skip : {0, 1}) {
    std::vector<int> out(64, -7);
    check(launch(half_warps, 1, 64, out.data(), skip) == cudaSuccess,
          "half warps launch: " + g_error);
    for (int t = 0; t < 64; ++t) {
      const int base = t / 16 * 16;
      const int expect = skip && (t & 16) ? -7 : 16 * base + 120;
      check(out[t] == expect, "half-warp sums" + std::string(order));
    }
  }
  std::vector<unsigned> ballot(64);
  std::vector<int> any(64), all(64);
  check(launch(votes, 1, 64, ballot.data(), any.data(), all.data()) == cudaSuccess, "votes");
  for (int t = 0; t < 64; ++t) {
    unsigned b = 0;
    for (int l = 0; l < 32; ++l) {
      b |= static_cast<unsigned>((t / 32 * 32 + l) % 3 == 0) << l;
    }
    check(ballot[t] == b, "ballot" + std::string(order));
    check(any[t] == (t < 32), "any" + std::string(order));
    check(all[t] == (t < 32), "all" + std::string(order));
  }
}

void check_barriers(bool reverse) {
  const char* order = reverse ? " (reverse order)" : "";
  const int n = 256;
  const int blocks = 3;
  std::vector<float> out(blocks * n);
  std::vector<int> counts(blocks * 3 * n);
  check(launch(block_sum, blocks, n, out.data(), counts.data(), 1) == cudaSuccess,
        "block sum: " + g_error);
  for (int b = 0; b < blocks; ++b) {
    // The tree of the kernel: partial[t] += partial[t + step] for step = n/2 .. 1.
    std::vector<float> p(n);
    for (int t = 0; t < n; ++t) {
      p[t] = static_cast<float>(t + 1 + 1000 * b);
    }
    for (int step = n / 2; step >= 1; step /= 2) {
      for (int t = 0; t < step; ++t) {
        p[t] += p[t + step];
      }
    }
    for (int t = 0; t < n; ++t) {
      check(out[b * n + t] == p[0], "block sum" + std::string(order));
      check(counts[b * 3 * n + 3 * t] == n / 4, "__syncthreads_count" + std::string(order));
      check(counts[b * 3 * n + 3 * t + 1] == 1, "__syncthreads_and" + std::string(order));
      check(counts[b * 3 * n + 3 * t + 2] == 1, "__syncthreads_or" + std::string(order));
    }
  }
}

// A missing barrier: the same kernel with its barriers planted out gives a wrong sum (a thread
// reads a slot before its writer has run, i.e. the 0xff poison, or a partial sum not yet added).
void check_missing_barrier(bool reverse) {
  const int n = 256;
  std::vector<float> out(n);
  std::vector<int> counts(3 * n);
  check(launch(block_sum, 1, n, out.data(), counts.data(), 0) == cudaSuccess, "no-barrier launch");
  float expect = 0;
  for (int t = 0; t < n; ++t) {
    expect += static_cast<float>(t + 1);
  }
  int wrong = 0;
  for (int t = 0; t < n; ++t) {
    wrong += !(out[t] == expect);
  }
  check(wrong > 0,
        std::string("a missing barrier gives a wrong sum") + (reverse ? " (reverse order)" : ""));
}

void check_planted(bool reverse) {
  struct Plant {
    int which;
    unsigned threads;
    const char* expect;  // in the refusal
  };
  const Plant plants[] = {
      {0, 32, "leaves the caller out"},         {1, 32, "which has exited"},
      {2, 32, "divergence in warp 0"},          {3, 32, "which is not in the mask"},
      {4, 32, "is not a power of two"},         {5, 128, "has exited without reaching it"},
      {6, 128, "divergence in the block"},      {7, 64, "deadlock"},
      {8, 48, "which the block does not have"},
  };
  for (const Plant& p : plants) {
    std::vector<int> out(p.threads, -1);
    const cudaError_t e = launch(planted, 2, p.threads, out.data(), p.which);
    const std::string what =
        "planted mistake " + std::to_string(p.which) + (reverse ? " (reverse order)" : "") + ": ";
    check(e == cudaErrorLaunchFailure, what + "the launch did not fail");
    check(g_error.find(p.expect) != std::string::npos,
          what + "expected \"" + p.expect + "\", got \"" + g_error + "\"");
  }
}

}  // namespace

int main() {
  rope_shim::hooks().on_collective_error = on_error;
  for (bool reverse : {false, true}) {
    rope_shim::state().reverse_order = reverse;
    check_shuffles(reverse);
    check_barriers(reverse);
    check_missing_barrier(reverse);
    check_planted(reverse);
  }
  if (g_failures != 0) {
    std::fprintf(stderr, "cuda_host_cooperation: %d checks failed\n", g_failures);
    return 1;
  }
  std::printf(
      "cuda_host_cooperation: every collective as specified, every planted mistake "
      "refused\n");
  return 0;
}
