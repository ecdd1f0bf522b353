// SPDX-License-Identifier: BSD-3-Clause
// The CUDA launch plan (csrc/cuda/rope_launch_plan.h), which is plain C++: paths per tensor and per
// part, lanes, rows per thread, grid and the q/k block split, for the benchmark shapes on a
// 132-SM GPU and for the alignment cases. Expected numbers are worked out by hand in comments.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "common_prepare.h"
#include "cuda/rope_launch_plan.h"

namespace {

using rope::RotationArgs;
using rope::RotationMode;
using rope::TableArgs;
using rope::cuda::Access;
using rope::cuda::DeviceShape;
using rope::cuda::ElementSizes;
using rope::cuda::LaunchPlan;
using rope::cuda::plan_launch;
using rope::cuda::plan_paths;
using rope::cuda::TensorPaths;
using rope::cuda::wants_vector_kernel;
using V = std::vector<int64_t>;

constexpr ElementSizes kBf16{2, 4};  // bfloat16 storage, float32 tables
constexpr ElementSizes kF16{2, 4};
constexpr ElementSizes kF32{4, 4};
constexpr ElementSizes kF64{8, 8};

// Plans read only addresses (for alignment), never memory: any well-aligned number will do.
void* address(uintptr_t a) { return reinterpret_cast<void*>(a); }
constexpr uintptr_t kBase = uintptr_t{1} << 24;

// A tensor of row dims `rows` (x.shape[:-1]) and row strides `strides`, written out of place into
// a contiguous output, with positions strides `pos` (0 where they broadcast).
RotationArgs tensor(const V& rows, const V& strides, const V& pos, int64_t head_dim,
                    int64_t rotary_dim, uintptr_t in = kBase, bool in_place = false) {
  V out(rows.size());
  int64_t step = head_dim;
  for (size_t i = rows.size(); i-- > 0;) {
    out[i] = step;
    step *= rows[i];
  }
  RotationArgs a;
  a.in = address(in);
  a.out = in_place ? address(in) : address(kBase << 4);
  a.positions = address(kBase << 8);
  a.geometry = rope::detail::make_row_geometry(rows, strides, in_place ? strides : out, pos);
  a.head_dim = head_dim;
  a.rotary_dim = rotary_dim;
  a.copy_tail = !in_place;
  return a;
}

// (B, S, H, D) contiguous with positions (S, 1): the benchmark's prefill layout.
RotationArgs bshd(int64_t b, int64_t s, int64_t h, int64_t d, uintptr_t in = kBase) {
  return tensor({b, s, h}, {s * h * d, h * d, d}, {0, 1, 0}, d, d, in);
}

TableArgs tables(int64_t half, int64_t max_seq_len = 4096) {
  TableArgs t;
  t.cos = address(kBase << 12);
  t.sin = address(kBase << 13);
  t.max_seq_len = max_seq_len;
  t.table_stride = half;
  return t;
}

LaunchPlan plan(const RotationArgs& first, const RotationArgs* second, ElementSizes sizes,
                bool interleaved, DeviceShape device, const TableArgs* t = nullptr) {
  const TableArgs tb = t != nullptr ? *t : tables(first.rotary_dim / 2);
  const bool vector = wants_vector_kernel(first, second, sizes, interleaved);
  return plan_launch(first, second, tb, RotationMode{interleaved, false}, sizes, vector, device);
}

// ---- the benchmark shapes on 132 SMs ---------------------------------------------------------

TEST(LaunchPlan, PrefillBf16On132Sms) {
  // (4, 2048, 32, 128) bf16, interleaved. 16-byte lanes hold 8 features = 4 planes: 16 lanes a row.
  // Shared rows: heads (inner, 32) and batch (outer, 4) = 128; tokens: 2048 positions.
  // 3 resident blocks: a wave is 132 * 3 * 256 = 101376 threads; 262144 rows * 16 lanes =
  // 4194304 lane-rows >= 8 * wave, so 8 rows per thread: 16 row groups.
  const RotationArgs x = bshd(4, 2048, 32, 128);
  const LaunchPlan p = plan(x, nullptr, kBf16, true, {132, 3});
  const auto& t = p.params.tensor[0];
  EXPECT_TRUE(p.vector_kernel);
  EXPECT_EQ(t.rot_access, Access::kVector);
  EXPECT_EQ(t.rot_lanes, 16);
  EXPECT_EQ(t.lanes, 16);
  EXPECT_EQ(t.vec_copy_lanes + t.scalar_copy_lanes, 0);
  EXPECT_EQ(t.shared_rows, 128);
  EXPECT_EQ(t.shared_inner, 32);
  EXPECT_EQ(t.num_tokens, 2048);
  EXPECT_EQ(t.token_ndim, 1);
  EXPECT_EQ(t.rows_per_thread, 8);
  EXPECT_EQ(t.num_threads, 2048 * 16 * 16);
  EXPECT_EQ(p.params.first_blocks, 2048);
  EXPECT_EQ(p.blocks, 2048);
  EXPECT_TRUE(p.params.tables.vector_loads);  // 4 planes of float32 cos: one 16-byte load
}

TEST(LaunchPlan, PrefillGqaQkOn132SmsSplitsBlocksBetweenQAndK) {
  // q (4, 2048, 32, 128), k (4, 2048, 8, 128): lane-rows (262144 + 65536) * 16 > 8 waves of
  // 101376, so 8 rows per thread. q: 128 shared rows -> 16 groups, 2048 * 16 * 16 threads =
  // 2048 blocks; k: 32 shared rows -> 4 groups, 2048 * 16 * 4 threads = 512 blocks after them.
  const RotationArgs q = bshd(4, 2048, 32, 128);
  const RotationArgs k = bshd(4, 2048, 8, 128, kBase << 2);
  const LaunchPlan p = plan(q, &k, kBf16, true, {132, 3});
  EXPECT_EQ(p.params.tensor[0].num_threads, 2048 * 16 * 16);
  EXPECT_EQ(p.params.tensor[1].num_threads, 2048 * 16 * 4);
  EXPECT_EQ(p.params.tensor[1].rows_per_thread, 8);
  EXPECT_EQ(p.params.first_blocks, 2048);
  EXPECT_EQ(p.blocks, 2048 + 512);
}

TEST(LaunchPlan, DecodeQkOn132Sms) {
  // q (64, 1, 32, 128), k (64, 1, 8, 128), positions (64, 1, 1): rows (64 tokens) x (heads,
  // shared). 40960 lane-rows < 2 waves: one row per thread. q: 64 * 16 * 32 = 32768 threads
  // (128 blocks), k: 64 * 16 * 8 = 8192 (32 blocks).
  const RotationArgs q = tensor({64, 1, 32}, {4096, 4096, 128}, {1, 1, 0}, 128, 128);
  const RotationArgs k = tensor({64, 1, 8}, {1024, 1024, 128}, {1, 1, 0}, 128, 128, kBase << 2);
  const LaunchPlan p = plan(q, &k, kBf16, true, {132, 3});
  EXPECT_EQ(p.params.tensor[0].rows_per_thread, 1);
  EXPECT_EQ(p.params.tensor[0].num_tokens, 64);
  EXPECT_EQ(p.params.tensor[0].shared_rows, 32);
  EXPECT_EQ(p.params.tensor[0].num_threads, 32768);
  EXPECT_EQ(p.params.tensor[1].num_threads, 8192);
  EXPECT_EQ(p.params.first_blocks, 128);
  EXPECT_EQ(p.blocks, 160);
}

TEST(LaunchPlan, LongContextPrefillHalfSplitOn132Sms) {
  // (1, 32768, 32, 128) bf16, half split: a lane takes 8 planes (16 bytes from each half), so 8
  // lanes a row. 2 resident blocks (half split needs more registers): wave 67584; 1048576 rows * 8
  // lanes > 8 waves -> 8 rows per thread; 32 heads -> 4 groups: 32768 * 8 * 4 threads.
  const RotationArgs x = bshd(1, 32768, 32, 128);
  const LaunchPlan p = plan(x, nullptr, kBf16, false, {132, 2});
  EXPECT_EQ(p.params.tensor[0].rot_access, Access::kVector);
  EXPECT_EQ(p.params.tensor[0].rot_lanes, 8);
  EXPECT_EQ(p.params.tensor[0].rows_per_thread, 8);
  EXPECT_EQ(p.params.tensor[0].num_threads, 32768 * 8 * 4);
  EXPECT_EQ(p.blocks, 32768 * 8 * 4 / 256);
}

// ---- occupancy: the resident count sizes the wave
// ------------------------------------------------

TEST(LaunchPlan, FewerResidentBlocksGiveMoreRowsPerThread) {
  // (1, 512, 32, 128) bf16 interleaved: 16384 rows * 16 lanes = 262144 lane-rows. With 3
  // resident blocks the wave is 101376 and 2 waves fit: 2 rows per thread. Were all 2048
  // threads of an SM resident (8 blocks), the wave would be 270336: 1 row per thread.
  const RotationArgs x = bshd(1, 512, 32, 128);
  EXPECT_EQ(plan(x, nullptr, kBf16, true, {132, 3}).params.tensor[0].rows_per_thread, 2);
  EXPECT_EQ(plan(x, nullptr, kBf16, true, {132, 8}).params.tensor[0].rows_per_thread, 1);
  // A resident count of 0 (the query found no room for a block) counts as 1: wave 33792, 4 rows.
  EXPECT_EQ(plan(x, nullptr, kBf16, true, {132, 0}).params.tensor[0].rows_per_thread, 4);
}

// ---- paths per tensor and per part
// ---------------------------------------------------------------

TEST(LaunchPlan, MisalignedKKeepsQOnTheVectorPath) {
  // k starts 8 bytes into a 16-byte vector (a slice at an offset of 4 elements): only k leaves
  // the vector path, for the paired one (4-byte accesses, one (a, b) plane each: 64 lanes).
  const RotationArgs q = bshd(2, 16, 8, 128);
  const RotationArgs k = bshd(2, 16, 2, 128, kBase + 8);
  const LaunchPlan p = plan(q, &k, kBf16, true, {132, 3});
  EXPECT_TRUE(p.vector_kernel);
  EXPECT_EQ(p.params.tensor[0].rot_access, Access::kVector);
  EXPECT_EQ(p.params.tensor[0].rot_lanes, 16);
  EXPECT_EQ(p.params.tensor[1].rot_access, Access::kPair);
  EXPECT_EQ(p.params.tensor[1].rot_lanes, 64);
  EXPECT_EQ(p.params.tensor[1].vec_copy_lanes, 0);
}

TEST(LaunchPlan, KernelVariantAndPathsFollowQAndKIndependently) {
  // Each of q and k takes its own access width from its own alignment: 16 bytes (+0), 4 bytes
  // (+4 or +8 bytes: even element offsets) or 2 bytes (+2: an odd element offset), in all nine
  // combinations and both layouts. The vector kernel is chosen when *either* rotates 16 bytes at
  // a time; the paired path exists in both variants, so two paired tensors stay on the
  // scalar-only kernel and stay paired there. bf16, head_dim 128, full rotary: a lane has
  // 16 vector lanes interleaved (4 planes), 8 half split (8 planes); 64 paired lanes
  // interleaved (1 plane), 32 half split (2 planes: two a's and the two b's); 64 scalar lanes.
  struct Alignment {
    uintptr_t offset;
    Access access;
  };
  const Alignment alignments[] = {{0, Access::kVector},
                                  {4, Access::kPair},
                                  {8, Access::kPair},
                                  {2, Access::kScalar},
                                  {6, Access::kScalar}};
  for (const bool interleaved : {true, false}) {
    SCOPED_TRACE(interleaved ? "interleaved" : "half split");
    const auto lanes = [&](Access a) -> int64_t {
      return a == Access::kVector ? (interleaved ? 16 : 8)
             : a == Access::kPair ? (interleaved ? 64 : 32)
                                  : 64;
    };
    for (const Alignment& qa : alignments) {
      for (const Alignment& ka : alignments) {
        SCOPED_TRACE("q +" + std::to_string(qa.offset) + " bytes, k +" + std::to_string(ka.offset) +
                     " bytes");
        const RotationArgs q = bshd(2, 16, 8, 128, kBase + qa.offset);
        const RotationArgs k = bshd(2, 16, 2, 128, (kBase << 2) + ka.offset);
        const LaunchPlan p = plan(q, &k, kBf16, interleaved, {132, 3});
        EXPECT_EQ(p.vector_kernel, qa.access == Access::kVector || ka.access == Access::kVector);
        EXPECT_EQ(p.params.tensor[0].rot_access, qa.access);
        EXPECT_EQ(p.params.tensor[0].rot_lanes, lanes(qa.access));
        EXPECT_EQ(p.params.tensor[1].rot_access, ka.access);
        EXPECT_EQ(p.params.tensor[1].rot_lanes, lanes(ka.access));
      }
    }
  }
}

TEST(LaunchPlan, PairedPathNeedsBothPointersAndEveryStrideEven) {
  // bf16 interleaved, rotary 64 of head_dim 100, rows 100 apart (200 bytes: 4-byte aligned,
  // not 16): paired. The same with an output pointer 2 bytes off, or a row stride of 101 (odd:
  // every other row 2-byte aligned only), is scalar throughout.
  const RotationArgs even = tensor({6}, {100}, {1}, 100, 64);
  EXPECT_EQ(plan_paths(even, kBf16.storage, true, true).rot_access, Access::kPair);
  RotationArgs out_off = even;
  out_off.out = address((kBase << 4) + 2);
  const TensorPaths o = plan_paths(out_off, kBf16.storage, true, true);
  EXPECT_EQ(o.rot_access, Access::kScalar);
  EXPECT_EQ(o.pair_copy_lanes, 0);
  EXPECT_EQ(o.scalar_copy_lanes, 36);
  const RotationArgs odd = tensor({6}, {101}, {1}, 100, 64);
  const TensorPaths d = plan_paths(odd, kBf16.storage, true, true);
  EXPECT_EQ(d.rot_access, Access::kScalar);
  EXPECT_EQ(d.rot_lanes, 32);
  EXPECT_EQ(d.pair_copy_lanes, 0);
  EXPECT_EQ(d.scalar_copy_lanes, 36);
  // An input 4 bytes into a vector, written into an aligned output: paired (both are 4-byte
  // aligned, not both 16).
  const RotationArgs in_off = tensor({6}, {104}, {1}, 100, 64, kBase + 4);
  EXPECT_EQ(plan_paths(in_off, kBf16.storage, true, true).rot_access, Access::kPair);
}

TEST(LaunchPlan, HalfSplitPairsNeedAnEvenHalf) {
  // On 4-byte aligned bf16 rows (an offset of 2 elements), half split: rotary 36 has half 18, so
  // the b's start 36 bytes after the a's, 4-byte aligned: 9 paired lanes of two planes. Rotary
  // 34 has half 17: the b's are 2-byte aligned only, 17 scalar lanes. Interleaved, rotary 34 is
  // paired (17 planes, each one 4-byte access). The tail is paired either way: it starts at an
  // even feature of a 4-byte aligned row.
  const RotationArgs r36 = tensor({5}, {40}, {1}, 40, 36, kBase + 4);
  const TensorPaths hs36 = plan_paths(r36, kF16.storage, false, true);
  EXPECT_EQ(hs36.rot_access, Access::kPair);
  EXPECT_EQ(hs36.rot_lanes, 9);
  EXPECT_EQ(hs36.pair_copy_lanes, 2);
  EXPECT_EQ(hs36.scalar_copy_lanes, 0);
  const RotationArgs r34 = tensor({5}, {40}, {1}, 40, 34, kBase + 4);
  const TensorPaths hs34 = plan_paths(r34, kF16.storage, false, true);
  EXPECT_EQ(hs34.rot_access, Access::kScalar);
  EXPECT_EQ(hs34.rot_lanes, 17);
  EXPECT_EQ(hs34.pair_copy_lanes, 3);
  const TensorPaths il34 = plan_paths(r34, kF16.storage, true, true);
  EXPECT_EQ(il34.rot_access, Access::kPair);
  EXPECT_EQ(il34.rot_lanes, 17);
  EXPECT_EQ(il34.pair_copy_lanes, 3);
  EXPECT_EQ(il34.lanes, 20);
}

TEST(LaunchPlan, TailTakesVectorThenPairedThenScalarLanes) {
  // One bf16 row (no stride is stepped) of 75 features, rotary 32 interleaved.
  // Aligned: rotation 4 vector lanes; tail [32, 75) = 43: 5 vectors (40), then 1 pair, 1 single.
  const RotationArgs aligned = tensor({1}, {75}, {1}, 75, 32);
  const TensorPaths a = plan_paths(aligned, kBf16.storage, true, true);
  EXPECT_EQ(a.rot_access, Access::kVector);
  EXPECT_EQ(a.rot_lanes, 4);
  EXPECT_EQ(a.vec_copy_lanes, 5);
  EXPECT_EQ(a.pair_copy_lanes, 1);
  EXPECT_EQ(a.scalar_copy_lanes, 1);
  EXPECT_EQ(a.lanes, 11);
  // 4 bytes off: rotation 16 paired lanes; tail 21 pairs and 1 single.
  const RotationArgs four = tensor({1}, {75}, {1}, 75, 32, kBase + 4);
  const TensorPaths f = plan_paths(four, kBf16.storage, true, true);
  EXPECT_EQ(f.rot_access, Access::kPair);
  EXPECT_EQ(f.rot_lanes, 16);
  EXPECT_EQ(f.vec_copy_lanes, 0);
  EXPECT_EQ(f.pair_copy_lanes, 21);
  EXPECT_EQ(f.scalar_copy_lanes, 1);
  // 2 bytes off: everything one element at a time.
  const RotationArgs two = tensor({1}, {75}, {1}, 75, 32, kBase + 2);
  const TensorPaths t = plan_paths(two, kBf16.storage, true, true);
  EXPECT_EQ(t.rot_access, Access::kScalar);
  EXPECT_EQ(t.rot_lanes, 16);
  EXPECT_EQ(t.vec_copy_lanes + t.pair_copy_lanes, 0);
  EXPECT_EQ(t.scalar_copy_lanes, 43);
}

TEST(LaunchPlan, OnlySixteenBitStorageIsPaired) {
  // 4 bytes off a vector: a float row is 4-byte aligned but one float per 4 bytes is no pair, a
  // double row 8-byte aligned; both are scalar. fp16 is paired like bf16.
  const RotationArgs x = tensor({3}, {66}, {1}, 66, 64, kBase + 8);
  for (const ElementSizes sizes : {kF32, kF64}) {
    const TensorPaths paths = plan_paths(x, sizes.storage, true, true);
    EXPECT_EQ(paths.rot_access, Access::kScalar);
    EXPECT_EQ(paths.pair_copy_lanes, 0);
    EXPECT_EQ(paths.scalar_copy_lanes, 2);
  }
  const TensorPaths h = plan_paths(x, kF16.storage, false, true);
  EXPECT_EQ(h.rot_access, Access::kPair);
  EXPECT_EQ(h.rot_lanes, 16);
  EXPECT_EQ(h.pair_copy_lanes, 1);
}

TEST(LaunchPlan, NeoxRotary96WithTail24IsVectorThroughout) {
  // fp16 half split, head_dim 120, rotary_dim 96: half 48 = 6 vectors of 8 planes; the tail
  // 24 starts at 96 (16-byte boundary): 3 vector copy lanes.
  const RotationArgs x = tensor({4, 7}, {7 * 120, 120}, {0, 1}, 120, 96);
  const TensorPaths paths = plan_paths(x, kF16.storage, /*interleaved=*/false, true);
  EXPECT_EQ(paths.rot_access, Access::kVector);
  EXPECT_EQ(paths.rot_lanes, 6);
  EXPECT_EQ(paths.vec_copy_lanes, 3);
  EXPECT_EQ(paths.scalar_copy_lanes, 0);
  EXPECT_EQ(paths.lanes, 9);
}

TEST(LaunchPlan, OddTailDoesNotPullTheRotationOffTheVectorPath) {
  // bf16, head_dim 100, rotary 64 interleaved. A single row (no row stride is ever stepped): the
  // rotation is 8 vector lanes; the tail 36 = 4 vectors + 2 pairs.
  const RotationArgs row = tensor({1}, {100}, {1}, 100, 64);
  const TensorPaths one = plan_paths(row, kBf16.storage, true, true);
  EXPECT_EQ(one.rot_access, Access::kVector);
  EXPECT_EQ(one.rot_lanes, 8);
  EXPECT_EQ(one.vec_copy_lanes, 4);
  EXPECT_EQ(one.pair_copy_lanes, 2);
  EXPECT_EQ(one.scalar_copy_lanes, 0);
  EXPECT_EQ(one.lanes, 14);
  // In place, rows 104 apart (a slice of a padded buffer): the tail is not touched, the rotation
  // stays vector.
  const RotationArgs padded = tensor({3, 5}, {5 * 104, 104}, {0, 1}, 100, 64, kBase, true);
  const TensorPaths in_place = plan_paths(padded, kBf16.storage, true, true);
  EXPECT_EQ(in_place.rot_access, Access::kVector);
  EXPECT_EQ(in_place.lanes, 8);
}

TEST(LaunchPlan, GptNeoxPartialRotaryKeepsTheTailOnTheVectorPath) {
  // GPT-NeoX-20B: head_dim 96, rotary_pct 0.25 -> rotary 24, half split, bf16. half = 12 is not
  // a whole vector of 8, so the rotation is paired: 6 lanes of two planes; the tail [24, 96)
  // starts 48 bytes in and is 9 vector lanes. Before per-part paths, the whole row went scalar.
  const RotationArgs x = tensor({2, 16, 6}, {16 * 6 * 96, 6 * 96, 96}, {0, 1, 0}, 96, 24);
  const TensorPaths paths = plan_paths(x, kBf16.storage, false, true);
  EXPECT_EQ(paths.rot_access, Access::kPair);
  EXPECT_EQ(paths.rot_lanes, 6);
  EXPECT_EQ(paths.vec_copy_lanes, 9);
  EXPECT_EQ(paths.scalar_copy_lanes, 0);
}

TEST(LaunchPlan, UnalignedHalfKeepsTheTailOnTheVectorPath) {
  // bf16 half split, rotary 72: the b's start 36 elements (72 bytes) after the a's, so the
  // rotation is not 16-byte but paired (18 lanes of two planes), and the tail [72, 136) starts
  // 144 bytes in: 8 vector copy lanes. No 16-byte rotation: the scalar-only kernel.
  const RotationArgs x = tensor({6}, {136}, {1}, 136, 72);
  const TensorPaths paths = plan_paths(x, kBf16.storage, false, true);
  EXPECT_EQ(paths.rot_access, Access::kPair);
  EXPECT_EQ(paths.rot_lanes, 18);
  EXPECT_EQ(paths.vec_copy_lanes, 8);
  EXPECT_EQ(paths.scalar_copy_lanes, 0);
  EXPECT_FALSE(wants_vector_kernel(x, nullptr, kBf16, false));
}

TEST(LaunchPlan, RowsFourByteAlignedArePairedThroughout) {
  // Contiguous bf16 rows of 100 elements: every other row starts 8 bytes off a 16-byte boundary,
  // but every row is 4-byte aligned: 32 paired rotating lanes (one plane each), and the tail 36
  // is 18 paired lanes, none of them vector.
  const RotationArgs x = tensor({6}, {100}, {1}, 100, 64);
  const TensorPaths paths = plan_paths(x, kBf16.storage, true, true);
  EXPECT_EQ(paths.rot_access, Access::kPair);
  EXPECT_EQ(paths.rot_lanes, 32);
  EXPECT_EQ(paths.vec_copy_lanes, 0);
  EXPECT_EQ(paths.pair_copy_lanes, 18);
  EXPECT_EQ(paths.scalar_copy_lanes, 0);
  EXPECT_EQ(paths.lanes, 50);
  EXPECT_FALSE(wants_vector_kernel(x, nullptr, kBf16, true));
}

TEST(LaunchPlan, ScalarKernelNeverPlansVectorRotation) {
  // On the scalar-only kernel aligned rows rotate one element at a time (fp32), or paired
  // (bf16: the paired path is in both variants); the tail keeps its vector lanes.
  const RotationArgs x = bshd(2, 8, 4, 64);
  const LaunchPlan p =
      plan_launch(x, nullptr, tables(32), RotationMode{true, false}, kF32, false, {132, 3});
  EXPECT_FALSE(p.vector_kernel);
  EXPECT_EQ(p.params.tensor[0].rot_access, Access::kScalar);
  EXPECT_EQ(p.params.tensor[0].rot_lanes, 32);
  const RotationArgs y = tensor({2, 8}, {8 * 80, 80}, {0, 1}, 80, 64);
  const LaunchPlan b =
      plan_launch(y, nullptr, tables(32), RotationMode{false, false}, kBf16, false, {132, 3});
  EXPECT_EQ(b.params.tensor[0].rot_access, Access::kPair);
  EXPECT_EQ(b.params.tensor[0].rot_lanes, 16);
  EXPECT_EQ(b.params.tensor[0].vec_copy_lanes, 2);
}

TEST(LaunchPlan, DoubleStorageMovesOnePairPerVector) {
  // float64: 16 bytes are one (a, b) pair interleaved, 2 planes' a's half split. A one-plane
  // lane has no table vector to load.
  const RotationArgs x = bshd(1, 4, 2, 64);
  const TensorPaths il = plan_paths(x, kF64.storage, true, true);
  EXPECT_EQ(il.rot_access, Access::kVector);
  EXPECT_EQ(il.rot_lanes, 32);
  const TensorPaths hs = plan_paths(x, kF64.storage, false, true);
  EXPECT_EQ(hs.rot_lanes, 16);
  EXPECT_FALSE(plan(x, nullptr, kF64, true, {132, 3}).params.tables.vector_loads);
  EXPECT_TRUE(plan(x, nullptr, kF64, false, {132, 3}).params.tables.vector_loads);
}

TEST(LaunchPlan, TableVectorLoadsNeedAlignedRows) {
  const RotationArgs x = bshd(1, 4, 2, 64);
  TableArgs t = tables(32);
  EXPECT_TRUE(plan(x, nullptr, kBf16, true, {132, 3}, &t).params.tables.vector_loads);
  t.table_stride = 34;  // rows padded by 2 floats: row 1 starts 8 bytes off 16
  EXPECT_FALSE(plan(x, nullptr, kBf16, true, {132, 3}, &t).params.tables.vector_loads);
  t.table_stride = 32;
  t.sin = address((kBase << 13) + 4);
  EXPECT_FALSE(plan(x, nullptr, kBf16, true, {132, 3}, &t).params.tables.vector_loads);
}

// ---- multi-axis positions (M-RoPE) ------------------------------------------------------------

TEST(LaunchPlan, MultiAxisPositionsKeepTheOneAxisPlanAndCarryTheAxes) {
  // Qwen2-VL prefill: (S, H, D) bf16 with positions (S, 3) built as (3, S) and moved to (S, 3),
  // so the axis stride is S. The axes change which table row each plane reads, not the columns:
  // lanes, paths, the walk and the table vector loads are those of one-axis positions; the plan
  // only hands the AxisMap and the axis stride to the kernel.
  const int64_t s = 1024;
  RotationArgs x = tensor({s, 16}, {16 * 128, 128}, {1, 0}, 128, 128);
  const LaunchPlan one_axis = plan(x, nullptr, kBf16, true, {132, 3});
  x.axis_stride = s;
  TableArgs t = tables(64);
  t.axes.num_axes = 3;
  t.axes.sections[0] = 16;
  t.axes.sections[1] = 24;
  t.axes.sections[2] = 24;
  const LaunchPlan p = plan(x, nullptr, kBf16, true, {132, 3}, &t);
  const auto& m = p.params.tables.axes;
  EXPECT_EQ(m.num_axes, 3);
  EXPECT_FALSE(m.interleaved);
  EXPECT_EQ(m.sections[0], 16);
  EXPECT_EQ(m.sections[1], 24);
  EXPECT_EQ(m.sections[2], 24);
  EXPECT_EQ(p.params.tensor[0].axis_stride, s);
  EXPECT_EQ(one_axis.params.tables.axes.num_axes, 0);
  EXPECT_EQ(one_axis.params.tensor[0].axis_stride, 0);
  // Everything else as for one axis.
  const auto& a = p.params.tensor[0];
  const auto& b = one_axis.params.tensor[0];
  EXPECT_EQ(a.rot_access, Access::kVector);
  EXPECT_EQ(a.rot_access, b.rot_access);
  EXPECT_EQ(a.rot_lanes, b.rot_lanes);
  EXPECT_EQ(a.lanes, b.lanes);
  EXPECT_EQ(a.rows_per_thread, b.rows_per_thread);
  EXPECT_EQ(a.num_threads, b.num_threads);
  EXPECT_EQ(p.blocks, one_axis.blocks);
  EXPECT_TRUE(p.params.tables.vector_loads);
  EXPECT_EQ(p.params.tables.vector_loads, one_axis.params.tables.vector_loads);

  // apply_qk: both tensors carry their axis stride (k's positions are q's).
  RotationArgs k = tensor({s, 2}, {2 * 128, 128}, {1, 0}, 128, 128, kBase << 2);
  k.axis_stride = s;
  const LaunchPlan qk = plan(x, &k, kBf16, true, {132, 3}, &t);
  EXPECT_EQ(qk.params.tensor[0].axis_stride, s);
  EXPECT_EQ(qk.params.tensor[1].axis_stride, s);
  EXPECT_EQ(qk.params.tables.axes.num_axes, 3);
}

// ---- rotary_dim 0: positions are still range-checked
// ---------------------------------------------

TEST(LaunchPlan, NoRotationStillVisitsEveryRow) {
  // Out of place: the copy lanes (fp32: 4 elements each) check the position. In place there is
  // nothing to write, and one lane a row only checks it.
  const RotationArgs copy = tensor({5}, {16}, {1}, 16, 0);
  const TensorPaths c = plan_paths(copy, kF32.storage, true, true);
  EXPECT_EQ(c.rot_lanes, 0);
  EXPECT_EQ(c.vec_copy_lanes, 4);
  EXPECT_EQ(c.lanes, 4);
  const RotationArgs in_place = tensor({5}, {16}, {1}, 16, 0, kBase, true);
  const LaunchPlan p = plan(in_place, nullptr, kF32, true, {132, 3});
  EXPECT_EQ(p.params.tensor[0].lanes, 1);
  EXPECT_EQ(p.params.tensor[0].num_threads, 5);
  EXPECT_EQ(p.blocks, 1);
}

TEST(LaunchPlan, EmptyInputLaunchesNothing) {
  const RotationArgs x = tensor({0, 4}, {512, 128}, {0, 1}, 128, 128);
  EXPECT_EQ(plan(x, nullptr, kF32, true, {132, 3}).blocks, 0);
}

TEST(LaunchPlan, RowGroupsAreEven) {
  // 12 heads at up to 8 rows per thread: 6 + 6, not 8 + 4. One SM, one block: a tiny wave.
  const RotationArgs x = tensor({64, 12}, {12 * 64, 64}, {1, 0}, 64, 64);
  const LaunchPlan p = plan(x, nullptr, kF32, true, {1, 1});
  EXPECT_EQ(p.params.tensor[0].rows_per_thread, 6);
  EXPECT_EQ(p.params.tensor[0].num_threads, 64 * 16 * 2);  // 16 lanes of 2 planes
}

// ---- invariants over SM counts and occupancies
// ---------------------------------------------------

struct Shape {
  const char* name;
  RotationArgs q;
  bool has_k;
  RotationArgs k;
};

class LaunchPlanInvariants : public ::testing::TestWithParam<int> {};

TEST_P(LaunchPlanInvariants, GridCoversEveryThreadOnce) {
  const Shape shapes[] = {
      {"prefill", bshd(4, 256, 32, 128), false, {}},
      {"gqa", bshd(2, 64, 32, 128), true, bshd(2, 64, 8, 128, kBase << 2)},
      {"decode", tensor({64, 32}, {4096, 128}, {1, 0}, 128, 128), true,
       tensor({64, 8}, {1024, 128}, {1, 0}, 128, 128, kBase << 2)},
      {"partial", tensor({3, 40, 12}, {40 * 12 * 80, 12 * 80, 80}, {0, 1, 0}, 80, 32), false, {}},
  };
  const int resident = GetParam();
  for (const Shape& s : shapes) {
    int64_t previous_rows = rope::cuda::kMaxRowsPerThread;
    for (int sms = 1; sms <= 132; ++sms) {
      SCOPED_TRACE(std::string(s.name) + " at " + std::to_string(sms) + " SMs");
      const LaunchPlan p = plan(s.q, s.has_k ? &s.k : nullptr, kBf16, true, {sms, resident});
      const auto& q = p.params.tensor[0];
      const auto& k = p.params.tensor[1];
      const auto groups = [](const rope::cuda::TensorPlan& t) {
        return (t.shared_rows + t.rows_per_thread - 1) / t.rows_per_thread;
      };
      EXPECT_EQ(q.num_threads, q.num_tokens * q.lanes * groups(q));
      EXPECT_EQ(q.num_tokens * q.shared_rows, s.q.geometry.num_rows);
      EXPECT_LE(q.rows_per_thread, rope::cuda::kMaxRowsPerThread);
      EXPECT_LT((groups(q) - 1) * q.rows_per_thread, q.shared_rows);  // no empty group
      EXPECT_GE(p.params.first_blocks * rope::cuda::kBlockThreads, q.num_threads);
      EXPECT_LT((p.params.first_blocks - 1) * rope::cuda::kBlockThreads, q.num_threads);
      if (s.has_k) {
        EXPECT_EQ(k.num_threads, k.num_tokens * k.lanes * groups(k));
        EXPECT_EQ(k.num_tokens * k.shared_rows, s.k.geometry.num_rows);
        EXPECT_EQ(p.blocks - p.params.first_blocks,
                  (k.num_threads + rope::cuda::kBlockThreads - 1) / rope::cuda::kBlockThreads);
      } else {
        EXPECT_EQ(p.blocks, p.params.first_blocks);
      }
      // More SMs never ask a thread for more rows.
      EXPECT_LE(q.rows_per_thread, previous_rows);
      previous_rows = q.rows_per_thread;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(ResidentBlocks, LaunchPlanInvariants, ::testing::Values(1, 2, 3, 8));

}  // namespace
