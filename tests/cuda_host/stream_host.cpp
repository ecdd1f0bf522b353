// SPDX-License-Identifier: BSD-3-Clause
// The host run of the row streams' CUDA kernel (csrc/cuda/common_stream_kernel.cuh: the kernel of
// rope.apply_qk_fp8, rope.rms_norm_apply_qk_cache and rope.mla_apply_cache): the real header
// compiled against the shims, its grid run block by block, threads as cooperative fibers (under
// ASan and UBSan: the norm's shuffles and their masks are checked), on
// random calls of 1 to 5 streams, against a reference written here from the definition
// (csrc/common_row_streams.h):
//   - rotation and RMSNorm in double from the inputs' and tables' values; a 16/32-bit result
//     within a few ulps of its type, float64 within 1e-13 relative;
//   - fp8 by fp8_codec.h (the formats' definitions, not c10's algorithm): a value that is only
//     copied (not rotated, not normalised) must be exactly the nearest code of value / scale (or
//     value * scale), computed in float as defined; a rotated or normalised one must lie between
//     the codes bracketing the exact value; beyond the largest finite value, exactly that value;
//   - a copied 16/32-bit value keeps its bits;
//   - every byte of every buffer outside the rows a call writes keeps its value (padding between
//     rows and heads, other slots, guard bytes), a negative slot writes nothing for its by-slot
//     targets, and a slot or position out of range trips the device assert and writes nothing
//     for the rows it concerns;
//   - dynamic fp8 scales (per row or per token, maybe powers of two): the scale the kernel wrote
//     within the rounding of the reference amax / max (a power of two at or above it, below
//     twice it), the values then checked as above against that scale, guards around the scales
//     kept;
//   - both the vector path (16-byte accesses) and the scalar path are taken (a coverage gate).
// Torch-free: built with tests/cuda_host/CMakeLists.txt's kernel flags. The mutation check builds
// it against mutated copies of the headers and requires a failure.
//
//   cuda_host_streams [--cases N] [--seed S] [--max-failures M]
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace {
int64_t g_asserts = 0;
void on_assert() { ++g_asserts; }
}  // namespace

#define ROPE_DEVICE_ASSERT(cond) ((cond) ? (void)0 : on_assert())
// Every store of a launch, for the one-store-per-byte check (store_ledger.h).
#include "store_ledger.h"
namespace {
rope_host::StoreLedger g_stores;
}  // namespace
#define ROPE_TRACE_STORE(ptr, bytes) g_stores.note((ptr), (bytes), ::rope_shim::thread_id())
#include "cuda/common_stream_kernel.cuh"
#include "fp8_codec.h"

namespace {

using rope::CacheFormat;
using rope::RowStream;
using rope::ScaleRule;
using rope::StreamArgs;
using rope::StreamTarget;
using rope::TableArgs;
namespace fp8 = rope_host::fp8;

enum class Storage { kDouble, kFloat, kHalf, kBFloat16 };
const char* storage_name(Storage s) {
  return s == Storage::kDouble  ? "double"
         : s == Storage::kFloat ? "float"
         : s == Storage::kHalf  ? "half"
                                : "bfloat16";
}
int64_t storage_bytes(Storage s) {
  return s == Storage::kDouble ? 8 : s == Storage::kFloat ? 4 : 2;
}

double load_value(const void* base, int64_t i, Storage s) {
  switch (s) {
    case Storage::kDouble:
      return static_cast<const double*>(base)[i];
    case Storage::kFloat:
      return static_cast<const float*>(base)[i];
    case Storage::kHalf:
      return __half2float(static_cast<const __half*>(base)[i]);
    default:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
  }
}

void store_value(void* base, int64_t i, double v, Storage s) {
  switch (s) {
    case Storage::kDouble:
      static_cast<double*>(base)[i] = v;
      break;
    case Storage::kFloat:
      static_cast<float*>(base)[i] = static_cast<float>(v);
      break;
    case Storage::kHalf:
      static_cast<__half*>(base)[i] = __float2half_rn(static_cast<float>(v));
      break;
    default:
      static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(static_cast<float>(v));
  }
}

int64_t pick(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

// A buffer of random bytes with 64 guard bytes before, 16-byte aligned or one element off.
struct Buffer {
  std::vector<unsigned char> bytes;
  std::vector<unsigned char> before;
  int64_t offset = 64;  // bytes before element 0
  void* at() { return bytes.data() + offset; }
  void make(std::mt19937_64& rng, int64_t elements, int64_t element_bytes, bool misaligned) {
    offset = 64 + (misaligned ? element_bytes : 0);
    bytes.assign(static_cast<size_t>(offset + elements * element_bytes + 64), 0);
    // The vector's storage is only 16-byte aligned by luck: align the guard start instead.
    for (auto& b : bytes) {
      b = static_cast<unsigned char>(pick(rng, 0, 255));
    }
  }
};

// A std::vector's data is aligned for max_align_t (16 on x86-64), so offset 64 is 16-aligned.

struct StreamCase {
  int64_t heads = 1, width = 0, rotary_dim = 0;
  bool norm = false;
  bool by_slot = false;
  bool paged = false;
  bool misaligned_src = false, misaligned_dst = false;
  CacheFormat format = CacheFormat::kSame;
  ScaleRule rule = ScaleRule::kDivide;
  float scale = 1;
  bool has_scale = true;
  // Dynamic scales (tensor fp8 targets): one per (token, head) row, or per token; written by the
  // kernel into `scales` (guard values around them must survive).
  bool dynamic = false;
  bool per_token = false;
  bool pow2 = false;
  std::vector<float> scales;
  int64_t scale_offset = 2;    // guard floats before scale 0
  std::vector<double> weight;  // norm: weight + offset as given to the kernel (math type values)
  Buffer src, dst;
  std::vector<unsigned char> weight_bytes;
  std::vector<unsigned char> written;  // per destination byte: may the call write it
};

struct Checker {
  int64_t failures = 0;
  int64_t max_failures = 10;
  std::string where;
  bool fail(const std::string& what) {
    if (failures < max_failures) {
      std::printf("FAILED %s\n    %s\n", where.c_str(), what.c_str());
    }
    ++failures;
    return false;
  }
};

std::map<std::string, int64_t> g_coverage;
void hit(const std::string& what, bool cond) { g_coverage[what] += cond ? 1 : 0; }

bool run_case(uint64_t seed, int64_t index, Checker& check) {
  std::mt19937_64 rng(seed * 1000003u + static_cast<uint64_t>(index) * 7919u + 5);
  const Storage storage = static_cast<Storage>(pick(rng, 0, 3));
  const int64_t es = storage_bytes(storage);
  const bool tables_double = pick(rng, 0, 3) == 0;
  const bool interleaved = pick(rng, 0, 1) == 1;
  // The inverse rotation from the case's index, not drawn: the cases' other draws stay as they
  // were.
  const bool inverse = index % 3 == 1;
  const int64_t T = pick(rng, 0, 5) == 0 ? 30 + pick(rng, 0, 20) : pick(rng, 0, 7);
  const int32_t num_streams = static_cast<int32_t>(pick(rng, 1, rope::kMaxStreams));
  const int64_t rotary_dims[] = {0, 16, 32, 64, 2, 6, 20, 48};
  const int64_t R = rotary_dims[pick(rng, 0, 7)];
  const int64_t max_seq_len = pick(rng, 1, 40);
  const bool multi_axis = R > 0 && pick(rng, 0, 3) == 0;
  const bool pos_int64 = pick(rng, 0, 1) == 1;
  const double eps = pick(rng, 0, 1) ? 1e-6 : 0.5;

  std::normal_distribution<double> normal(0.0, 1.0);
  auto random_value = [&]() {
    const int64_t kind = pick(rng, 0, 19);
    if (kind == 0) {
      return normal(rng) * 3000.0;  // saturates small scales
    }
    if (kind == 1) {
      return normal(rng) * 1e-6;  // fp8 subnormals
    }
    return normal(rng) * 4.0;
  };

  // Slots (shared by the by-slot streams): distinct, some negative; maybe one out of range.
  const int64_t block_size = pick(rng, 1, 4);
  const int64_t num_blocks =
      std::max<int64_t>(1, (T + pick(rng, 0, 5) + block_size - 1) / block_size);
  const int64_t num_slots = num_blocks * block_size;
  std::vector<int64_t> perm(static_cast<size_t>(num_slots));
  for (int64_t i = 0; i < num_slots; ++i) {
    perm[static_cast<size_t>(i)] = i;
  }
  std::shuffle(perm.begin(), perm.end(), rng);
  const int64_t slot_stride = pick(rng, 1, 2);
  std::vector<int64_t> slots(static_cast<size_t>(std::max<int64_t>(1, T * slot_stride)), 0);
  for (int64_t t = 0; t < T; ++t) {
    slots[static_cast<size_t>(t * slot_stride)] =
        pick(rng, 0, 4) == 0 ? -1 - pick(rng, 0, 2) : perm[static_cast<size_t>(t % num_slots)];
  }
  int64_t bad_slot_token = -1;
  if (T > 0 && pick(rng, 0, 9) == 0) {
    bad_slot_token = pick(rng, 0, T - 1);
    slots[static_cast<size_t>(bad_slot_token * slot_stride)] = num_slots + pick(rng, 0, 3);
  }

  // Streams.
  std::vector<StreamCase> cs(static_cast<size_t>(num_streams));
  StreamArgs a;
  a.num_tokens = T;
  a.num_streams = num_streams;
  a.interleaved = interleaved;
  a.inverse = inverse;
  a.eps = eps;
  a.slots = slots.data();
  a.slot_stride = slot_stride;
  const int64_t widths_extra[] = {0, 0, 16, 2, 6, 32};
  const float scales[] = {1.0f, 0.37f, 2.5f, 1e-4f, 0.0173f, 7.0f};
  std::vector<float> scale_values(static_cast<size_t>(num_streams));
  int64_t max_heads = 1;
  for (int32_t i = 0; i < num_streams; ++i) {
    StreamCase& c = cs[static_cast<size_t>(i)];
    RowStream& st = a.streams[i];
    c.heads = pick(rng, 1, 3);
    max_heads = std::max(max_heads, c.heads);
    const bool rotates = R > 0 && pick(rng, 0, 2) != 0;
    c.rotary_dim = rotates ? R : 0;
    c.width = c.rotary_dim + widths_extra[pick(rng, 0, 5)];
    if (!rotates && pick(rng, 0, 3) == 0) {
      c.width = pick(rng, 0, 40);
    }
    c.norm = c.width > 0 && pick(rng, 0, 3) == 0;
    c.by_slot = pick(rng, 0, 1) == 1;
    c.paged = c.by_slot && pick(rng, 0, 1) == 1;
    c.misaligned_src = pick(rng, 0, 4) == 0;
    c.misaligned_dst = pick(rng, 0, 4) == 0;
    c.format = static_cast<CacheFormat>(pick(rng, 0, 2));
    c.rule = pick(rng, 0, 1) ? ScaleRule::kMultiply : ScaleRule::kDivide;
    c.scale = scales[pick(rng, 0, 5)];
    c.has_scale = pick(rng, 0, 4) != 0;
    scale_values[static_cast<size_t>(i)] = c.scale;
    // Source: (T, heads, width), padded heads and tokens (strides multiples of 16 bytes or not).
    const bool pad16 = pick(rng, 0, 2) != 0;
    st.head_stride = c.width + (pad16 ? (pick(rng, 0, 1) * 16) : pick(rng, 0, 3));
    st.token_stride = c.heads * st.head_stride + (pad16 ? 16 * pick(rng, 0, 1) : pick(rng, 0, 5));
    st.heads = c.heads;
    st.width = c.width;
    st.rotary_dim = c.rotary_dim;
    const int64_t src_elems = std::max<int64_t>(1, T * st.token_stride + st.head_stride);
    c.src.make(rng, src_elems, es, c.misaligned_src);
    for (int64_t e = 0; e < src_elems; ++e) {
      store_value(c.src.at(), e, random_value(), storage);
    }
    st.src = c.src.at();
    // Positions strides: per token, or per (token, head) when the heads match max (set below).
    // Target.
    StreamTarget& tg = st.target;
    tg.format = c.format;
    tg.rule = c.rule;
    const int64_t tb = c.format == CacheFormat::kSame ? es : 1;
    const int64_t feature_offset = pick(rng, 0, 2) == 0 ? 16 * pick(rng, 1, 2) : 0;
    const int64_t row_width =
        feature_offset + c.width + (pad16 ? 16 * pick(rng, 0, 1) : pick(rng, 0, 3));
    tg.feature_offset = feature_offset;
    tg.head_stride = row_width;
    tg.by_slot = c.by_slot;
    int64_t dst_elems;
    if (c.by_slot) {
      tg.num_slots = num_slots;
      const int64_t row = c.heads * row_width + (pad16 ? 16 * pick(rng, 0, 1) : pick(rng, 0, 3));
      if (c.paged) {
        tg.block_size = block_size;
        tg.offset_stride = row;
        tg.block_stride = block_size * row + (pad16 ? 16 * pick(rng, 0, 1) : pick(rng, 0, 4));
      } else {
        tg.block_size = 1;
        tg.offset_stride = 0;
        tg.block_stride = row;
      }
      const int64_t blocks = c.paged ? num_blocks : num_slots;
      dst_elems = blocks * tg.block_stride + 16;
    } else {
      tg.token_stride = c.heads * row_width + (pad16 ? 16 * pick(rng, 0, 1) : pick(rng, 0, 3));
      dst_elems = T * tg.token_stride + 16;
    }
    c.dst.make(rng, dst_elems, tb, c.misaligned_dst);
    c.dst.before = c.dst.bytes;
    c.written.assign(c.dst.bytes.size(), 0);
    tg.data = c.dst.at();
    c.dynamic = !c.by_slot && c.format != CacheFormat::kSame && pick(rng, 0, 2) == 0;
    if (c.dynamic) {
      c.per_token = pick(rng, 0, 1) == 1 && !c.norm;  // per-token groups take no norm
      c.pow2 = pick(rng, 0, 1) == 1;
      c.rule = ScaleRule::kDivide;  // dynamic scales divide
      tg.rule = c.rule;
      // Scales (T, heads or 1) with a head stride of 1 or 2 and maybe a padded token stride.
      const int64_t head_stride = c.per_token ? 0 : pick(rng, 1, 2);
      const int64_t token_stride = (c.per_token ? 1 : c.heads * head_stride) + pick(rng, 0, 1);
      c.scales.assign(static_cast<size_t>(T * token_stride + 2 * c.scale_offset), -7.0f);
      tg.scales = c.scales.data() + c.scale_offset;
      tg.scale_token_stride = token_stride;
      tg.scale_head_stride = head_stride;
      tg.per_token = c.per_token;
      tg.pow2_scale = c.pow2;
    }
    // Norm weights (math type: double for double storage, else float).
    if (c.norm) {
      const bool acc_double = storage == Storage::kDouble;
      c.weight.resize(static_cast<size_t>(c.width));
      c.weight_bytes.assign(static_cast<size_t>(c.width) * (acc_double ? 8 : 4) + 16, 0);
      for (int64_t j = 0; j < c.width; ++j) {
        const double w = 0.5 + normal(rng) * 0.5;
        if (acc_double) {
          reinterpret_cast<double*>(c.weight_bytes.data())[j] = w;
          c.weight[static_cast<size_t>(j)] = w;
        } else {
          reinterpret_cast<float*>(c.weight_bytes.data())[j] = static_cast<float>(w);
          c.weight[static_cast<size_t>(j)] = static_cast<float>(w);
        }
      }
      st.weight = c.weight_bytes.data();
    }
    c.src.before = c.src.bytes;
  }
  // Scales: one float each, read by the kernel when the target is fp8 and has_scale.
  for (int32_t i = 0; i < num_streams; ++i) {
    StreamCase& c = cs[static_cast<size_t>(i)];
    a.streams[i].target.scale = c.format != CacheFormat::kSame && c.has_scale && !c.dynamic
                                    ? &scale_values[static_cast<size_t>(i)]
                                    : nullptr;
    if (a.streams[i].target.scale == nullptr) {
      c.scale = 1.0f;
    }
  }

  // Tables and positions.
  const int64_t half = R / 2;
  TableArgs tables;
  tables.tables_are_double = tables_double;
  tables.max_seq_len = max_seq_len;
  tables.table_stride = half + pick(rng, 0, 2);
  std::vector<double> cos_v(static_cast<size_t>(max_seq_len * tables.table_stride + 1), 0.0);
  std::vector<double> sin_v(cos_v.size(), 0.0);
  std::vector<float> cos_f(cos_v.size()), sin_f(cos_v.size());
  for (int64_t p = 0; p < max_seq_len; ++p) {
    for (int64_t k = 0; k < half; ++k) {
      const double angle = p * std::pow(10000.0, -2.0 * k / std::max<int64_t>(R, 1));
      const size_t at = static_cast<size_t>(p * tables.table_stride + k);
      cos_v[at] = tables_double ? std::cos(angle) : static_cast<float>(std::cos(angle));
      sin_v[at] = tables_double ? std::sin(angle) : static_cast<float>(std::sin(angle));
      cos_f[at] = static_cast<float>(cos_v[at]);
      sin_f[at] = static_cast<float>(sin_v[at]);
    }
  }
  tables.cos = tables_double ? static_cast<const void*>(cos_v.data()) : cos_f.data();
  tables.sin = tables_double ? static_cast<const void*>(sin_v.data()) : sin_f.data();
  int64_t num_axes = 0;
  if (multi_axis) {
    num_axes = pick(rng, 1, rope::kMaxAxes);
    tables.axes.num_axes = static_cast<int32_t>(num_axes);
    int64_t left = half;
    for (int64_t i = 0; i + 1 < num_axes; ++i) {
      tables.axes.sections[i] = pick(rng, 0, left);
      left -= tables.axes.sections[i];
    }
    tables.axes.sections[num_axes - 1] = left;
    tables.axes.interleaved = num_axes == 3 && pick(rng, 0, 1) == 1;
  }
  const bool per_head = pick(rng, 0, 2) == 0;
  const int64_t pos_cols = per_head ? max_heads : 1;
  const int64_t axes_n = std::max<int64_t>(num_axes, 1);
  // Layout: [t][h][a] with the axis innermost, or [a][t][h] (axis outermost).
  const bool axis_first = multi_axis && pick(rng, 0, 1) == 1;
  const int64_t pos_token_stride = axis_first ? pos_cols : pos_cols * axes_n;
  const int64_t pos_head_stride = per_head ? (axis_first ? 1 : axes_n) : 0;
  a.axis_stride = multi_axis ? (axis_first ? T * pos_cols : 1) : 0;
  std::vector<int64_t> pos(static_cast<size_t>(std::max<int64_t>(1, T * pos_cols * axes_n)));
  for (auto& p : pos) {
    p = pick(rng, 0, max_seq_len - 1);
  }
  int64_t bad_pos_at = -1;
  if (T > 0 && R > 0 && bad_slot_token < 0 && pick(rng, 0, 9) == 0) {
    bad_pos_at = pick(rng, 0, static_cast<int64_t>(pos.size()) - 1);
    pos[static_cast<size_t>(bad_pos_at)] = pick(rng, 0, 1) ? max_seq_len : -2;
  }
  std::vector<unsigned char> pos_bytes(pos.size() * (pos_int64 ? 8 : 4));
  for (size_t i = 0; i < pos.size(); ++i) {
    if (pos_int64) {
      reinterpret_cast<int64_t*>(pos_bytes.data())[i] = pos[i];
    } else {
      reinterpret_cast<int32_t*>(pos_bytes.data())[i] = static_cast<int32_t>(pos[i]);
    }
  }
  a.positions = pos_bytes.data();
  a.positions_are_int64 = pos_int64;
  for (int32_t i = 0; i < num_streams; ++i) {
    a.streams[i].pos_token_stride = pos_token_stride;
    a.streams[i].pos_head_stride = pos_head_stride;
  }

  // Description.
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "case %lld (seed %llu): %s tables=%s %s T=%lld R=%lld streams=%d axes=%lld%s "
                "pos=%s%s eps=%g slots/block=%lld",
                static_cast<long long>(index), static_cast<unsigned long long>(seed),
                storage_name(storage), tables_double ? "double" : "float",
                interleaved ? (inverse ? "interleaved inverse" : "interleaved")
                            : (inverse ? "half-split inverse" : "half-split"),
                static_cast<long long>(T), static_cast<long long>(R), num_streams,
                static_cast<long long>(num_axes), axis_first ? " (axis first)" : "",
                pos_int64 ? "int64" : "int32", per_head ? " per-head" : "", eps,
                static_cast<long long>(block_size));
  check.where = buf;
  for (int32_t i = 0; i < num_streams; ++i) {
    const StreamCase& c = cs[static_cast<size_t>(i)];
    std::snprintf(
        buf, sizeof(buf),
        "\n      stream %d: heads %lld width %lld rot %lld%s -> %s%s %s %s scale %g%s%s%s", i,
        static_cast<long long>(c.heads), static_cast<long long>(c.width),
        static_cast<long long>(c.rotary_dim), c.norm ? " norm" : "",
        c.by_slot ? (c.paged ? "paged cache" : "flat cache") : "tensor",
        a.streams[i].target.feature_offset ? " (feature offset)" : "",
        c.format == CacheFormat::kSame      ? "same"
        : c.format == CacheFormat::kFp8E4M3 ? "e4m3fn"
                                            : "e5m2",
        c.rule == ScaleRule::kMultiply ? "multiply" : "divide", c.scale,
        c.misaligned_src ? " src-misaligned" : "", c.misaligned_dst ? " dst-misaligned" : "",
        !c.dynamic    ? ""
        : c.per_token ? (c.pow2 ? " dynamic per-token pow2" : " dynamic per-token")
                      : (c.pow2 ? " dynamic per-row pow2" : " dynamic per-row"));
    check.where += buf;
  }

  // ---- run ----
  const auto plan = rope::cuda::streams::plan(a, tables, es);  // which streams take the vector path
  g_stores.clear();
  // Odd cases run the grid's blocks and threads in reverse order.
  rope_shim::state().reverse_order = index % 2 == 1;
  g_asserts = 0;
  cudaError_t status = cudaSuccess;
  switch (storage) {
    case Storage::kDouble:
      status = rope::cuda::run_row_streams<double>(a, tables, nullptr);
      break;
    case Storage::kFloat:
      status = rope::cuda::run_row_streams<float>(a, tables, nullptr);
      break;
    case Storage::kHalf:
      status = rope::cuda::run_row_streams<__half>(a, tables, nullptr);
      break;
    case Storage::kBFloat16:
      status = rope::cuda::run_row_streams<__nv_bfloat16>(a, tables, nullptr);
      break;
  }
  if (status != cudaSuccess) {
    return check.fail("launch failed with status " + std::to_string(status));
  }
  if (g_stores.double_stores() > 0) {
    return check.fail(std::to_string(g_stores.double_stores()) +
                      " bytes stored more than once; first: " + g_stores.first());
  }
  // Which rows read the planted value: a bad slot is read by every by_slot stream with rows; a
  // bad position only by a rotating row of its token (and head, for per-head positions) that
  // is not skipped as padding, through a plane of its axis (multi-axis: a section may be empty).
  int64_t bad_t = -1;
  int64_t bad_h = 0;
  int64_t bad_a = 0;
  if (bad_pos_at >= 0) {
    const int64_t cols = T * pos_cols;
    const int64_t rest = axis_first ? bad_pos_at % cols : bad_pos_at / axes_n;
    bad_a = axis_first ? bad_pos_at / cols : bad_pos_at % axes_n;
    bad_h = rest % pos_cols;
    bad_t = rest / pos_cols;
  }
  const bool bad_axis_read = num_axes == 0 || tables.axes.sections[bad_a] > 0;
  bool any_by_slot_rows = false;
  bool any_rotating_rows = false;
  for (int32_t i = 0; i < num_streams; ++i) {
    const StreamCase& c = cs[static_cast<size_t>(i)];
    any_by_slot_rows = any_by_slot_rows || (c.by_slot && c.width > 0 && c.heads > 0);
    if (bad_t >= 0 && c.rotary_dim > 0 && c.heads > (per_head ? bad_h : 0) && bad_axis_read) {
      const bool skipped = c.by_slot && slots[static_cast<size_t>(bad_t * slot_stride)] < 0;
      any_rotating_rows = any_rotating_rows || !skipped;
    }
  }
  const bool expect_assert =
      (bad_slot_token >= 0 && any_by_slot_rows) || (bad_pos_at >= 0 && any_rotating_rows);
  if (expect_assert && g_asserts == 0) {
    return check.fail("an out-of-range slot or position did not assert");
  }
  if (!expect_assert && bad_pos_at < 0 && bad_slot_token < 0 && g_asserts > 0) {
    return check.fail("a device assert fired on a valid call (" + std::to_string(g_asserts) + ")");
  }

  // ---- reference ----
  const double ulp = storage == Storage::kDouble  ? 1.2e-16
                     : storage == Storage::kFloat ? 6e-8
                     : storage == Storage::kHalf  ? 4.9e-4
                                                  : 3.9e-3;
  const double math_ulp = storage == Storage::kDouble ? 1.2e-16 : 6e-8;
  auto table = [&](const std::vector<double>& v, int64_t p, int64_t k) {
    return v[static_cast<size_t>(p * tables.table_stride + k)];
  };
  // The reference values of row (t, h) of stream i: x as read, y normalised and rotated in
  // double, bound the magnitudes its rounding errors scale with; false when a position of the row
  // is out of range (the row asserts and writes nothing).
  const auto row_reference = [&](int32_t i, int64_t t, int64_t h, std::vector<double>& x,
                                 std::vector<double>& y, std::vector<double>& bound) {
    StreamCase& c = cs[static_cast<size_t>(i)];
    const RowStream& st = a.streams[i];
    // Positions of the row (per axis) and whether all are in range.
    int64_t rows[rope::kMaxAxes] = {};
    bool in_range = true;
    if (c.rotary_dim > 0) {
      const int64_t off = t * pos_token_stride + h * pos_head_stride;
      for (int64_t ax = 0; ax < axes_n; ++ax) {
        const int64_t p = pos[static_cast<size_t>(off + ax * a.axis_stride)];
        in_range = in_range && p >= 0 && p < max_seq_len;
        rows[ax] = p;
      }
    }
    if (!in_range) {
      return false;
    }
    // x, norm, rotation in double.
    x.assign(static_cast<size_t>(c.width), 0.0);
    bound.assign(static_cast<size_t>(c.width), 0.0);
    for (int64_t j = 0; j < c.width; ++j) {
      x[j] = load_value(c.src.at(), t * st.token_stride + h * st.head_stride + j, storage);
    }
    y = x;
    double r = 1.0;
    if (c.norm) {
      double ss = 0;
      for (double v : x) {
        ss += v * v;
      }
      r = 1.0 / std::sqrt(ss / static_cast<double>(c.width) + eps);
      for (int64_t j = 0; j < c.width; ++j) {
        y[j] = x[j] * r * c.weight[static_cast<size_t>(j)];
      }
    }
    for (int64_t j = 0; j < c.width; ++j) {
      bound[j] = std::fabs(y[j]);
    }
    const std::vector<double> n = y;
    for (int64_t k = 0; k < c.rotary_dim / 2; ++k) {
      const int64_t ia = interleaved ? 2 * k : k;
      const int64_t ib = interleaved ? 2 * k + 1 : k + c.rotary_dim / 2;
      const int32_t axis = tables.axes.num_axes > 0 ? rope::axis_of_plane(tables.axes, k) : 0;
      const double co = table(cos_v, rows[axis], k);
      const double si = inverse ? -table(sin_v, rows[axis], k) : table(sin_v, rows[axis], k);
      y[ia] = n[ia] * co - n[ib] * si;
      y[ib] = n[ia] * si + n[ib] * co;
      bound[ia] = bound[ib] = std::fabs(n[ia]) + std::fabs(n[ib]);
    }
    return true;
  };
  for (int32_t i = 0; i < num_streams; ++i) {
    StreamCase& c = cs[static_cast<size_t>(i)];
    const RowStream& st = a.streams[i];
    const StreamTarget& tg = st.target;
    const int64_t tb = c.format == CacheFormat::kSame ? es : 1;
    const bool e4m3 = c.format == CacheFormat::kFp8E4M3;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t slot = slots[static_cast<size_t>(t * slot_stride)];
      if (c.by_slot && (slot < 0 || slot >= num_slots)) {
        continue;  // padding, or asserted: nothing written
      }
      for (int64_t h = 0; h < c.heads; ++h) {
        const int64_t row = c.by_slot ? rope::slot_row(tg, slot, h) : rope::token_row(tg, t, h);
        std::vector<double> x, y, bound;
        if (!row_reference(i, t, h, x, y, bound)) {
          continue;  // asserted: the row writes nothing
        }
        if (c.dynamic && c.per_token) {
          // A position out of range in any head of the token: the token's group writes nothing.
          bool all_in_range = true;
          for (int64_t hh = 0; hh < c.heads; ++hh) {
            std::vector<double> gx, gy, gb;
            all_in_range = all_in_range && row_reference(i, t, hh, gx, gy, gb);
          }
          if (!all_in_range) {
            continue;
          }
        }
        if (c.dynamic) {
          // The group's scale as the kernel wrote it, checked against the reference amax; the
          // features are then checked against that scale below.
          const float got_scale = c.scales[static_cast<size_t>(
              c.scale_offset + t * tg.scale_token_stride + h * tg.scale_head_stride)];
          if (h == 0 || !c.per_token) {
            double amax = 0, amax_err = 0;
            for (int64_t hh = c.per_token ? 0 : h; hh < (c.per_token ? c.heads : h + 1); ++hh) {
              std::vector<double> gx, gy, gb;
              row_reference(i, t, hh, gx, gy, gb);
              for (size_t j = 0; j < gy.size(); ++j) {
                if (std::fabs(gy[j]) > amax) {
                  amax = std::fabs(gy[j]);
                  amax_err = (c.norm ? 64.0 * c.width : 4.0) * math_ulp * gb[j] + 1e-6 * amax;
                }
              }
            }
            const double fmax = fp8::max_finite(e4m3);
            const double want = amax / fmax;
            const double tol = amax_err / fmax + 1e-300;
            bool ok;
            if (amax == 0) {
              ok = got_scale == 1.0f;
            } else if (c.pow2) {
              int e = 0;
              const double m = std::frexp(static_cast<double>(got_scale), &e);
              ok = m == 0.5 && got_scale >= want - tol && got_scale < 2 * (want + tol);
            } else {
              ok = std::fabs(got_scale - want) <= tol + 6e-8 * want;
            }
            if (!ok) {
              char m[300];
              std::snprintf(m, sizeof(m),
                            "stream %d token %lld head %lld: dynamic scale %.9g, want %.9g "
                            "(amax %.9g%s)",
                            i, static_cast<long long>(t), static_cast<long long>(h), got_scale,
                            want, amax, c.pow2 ? ", rounded up to a power of two" : "");
              return check.fail(m);
            }
          }
          c.scale = got_scale;
        }
        // Compare each feature.
        for (int64_t j = 0; j < c.width; ++j) {
          const int64_t e = row + j;
          std::fill_n(c.written.begin() + c.dst.offset + e * tb, tb, 1);
          const bool exact = !c.norm && j >= c.rotary_dim;  // a copied value
          char msg[400];
          if (c.format == CacheFormat::kSame) {
            const double got = load_value(c.dst.at(), e, storage);
            if (exact) {
              const int64_t s_off = t * st.token_stride + h * st.head_stride + j;
              if (std::memcmp(static_cast<unsigned char*>(c.dst.at()) + e * es,
                              static_cast<unsigned char*>(c.src.at()) + s_off * es, es) != 0) {
                std::snprintf(msg, sizeof(msg),
                              "stream %d token %lld head %lld feature %lld: copied %.9g as %.9g", i,
                              static_cast<long long>(t), static_cast<long long>(h),
                              static_cast<long long>(j), x[j], got);
                return check.fail(msg);
              }
              continue;
            }
            const double tol = 2 * ulp * std::fabs(y[j]) +
                               (c.norm ? 64 : 4) * math_ulp * bound[j] * (c.norm ? c.width : 1) +
                               (storage == Storage::kHalf ? 6e-8 : 1e-300);
            if (!(std::fabs(got - y[j]) <= tol) && !(std::isnan(got) && std::isnan(y[j]))) {
              std::snprintf(msg, sizeof(msg),
                            "stream %d token %lld head %lld feature %lld: got %.9g, want %.9g "
                            "(tolerance %.3g)",
                            i, static_cast<long long>(t), static_cast<long long>(h),
                            static_cast<long long>(j), got, y[j], tol);
              return check.fail(msg);
            }
            continue;
          }
          const uint8_t code = static_cast<unsigned char*>(c.dst.at())[e];
          const double got = fp8::value(code, e4m3);
          const double m = fp8::max_finite(e4m3);
          // The scaled value: exactly as defined for a copied value (one IEEE operation in the
          // math type; float64 math saturates in float64, then rounds to float), the exact real
          // number for a computed one.
          double scaled_exact;
          if (exact && storage == Storage::kDouble) {
            const double s = c.rule == ScaleRule::kMultiply ? y[j] * static_cast<double>(c.scale)
                                                            : y[j] / static_cast<double>(c.scale);
            scaled_exact = std::isnan(s) ? s : static_cast<float>(std::max(-m, std::min(m, s)));
          } else if (exact) {
            const float v = static_cast<float>(y[j]);
            scaled_exact = c.rule == ScaleRule::kMultiply ? v * c.scale : v / c.scale;
          } else {
            scaled_exact = c.rule == ScaleRule::kMultiply ? y[j] * c.scale : y[j] / c.scale;
          }
          if (std::isnan(scaled_exact)) {
            if (!std::isnan(got)) {
              std::snprintf(msg, sizeof(msg), "stream %d feature %lld: NaN stored as 0x%02x", i,
                            static_cast<long long>(j), code);
              return check.fail(msg);
            }
            continue;
          }
          const double clamped = std::max(-m, std::min(m, scaled_exact));
          if (exact || std::fabs(scaled_exact) >= m) {
            const uint8_t want = fp8::nearest_code(clamped, e4m3);
            if (code != want && !(exact == false && got == 0.0 && fp8::value(want, e4m3) == 0.0)) {
              std::snprintf(msg, sizeof(msg),
                            "stream %d token %lld head %lld feature %lld: %.9g %s %g stored as "
                            "0x%02x (%g), want 0x%02x (%g)",
                            i, static_cast<long long>(t), static_cast<long long>(h),
                            static_cast<long long>(j), y[j],
                            c.rule == ScaleRule::kMultiply ? "*" : "/", c.scale, code, got, want,
                            fp8::value(want, e4m3));
              return check.fail(msg);
            }
            continue;
          }
          const double err =
              (c.norm ? 64.0 * c.width : 4.0) * math_ulp * bound[j] + 1e-6 * std::fabs(y[j]);
          const double scale_mul = c.rule == ScaleRule::kMultiply ? c.scale : 1.0 / c.scale;
          const double lo = scaled_exact - err * scale_mul;
          const double hi = scaled_exact + err * scale_mul;
          const double a_lo = fp8::value(fp8::nearest_code(std::max(-m, lo), e4m3), e4m3);
          const double a_hi = fp8::value(fp8::nearest_code(std::min(m, hi), e4m3), e4m3);
          if (!(got >= std::min(a_lo, a_hi) && got <= std::max(a_lo, a_hi))) {
            std::snprintf(msg, sizeof(msg),
                          "stream %d token %lld head %lld feature %lld: %.9g -> %.9g stored as "
                          "0x%02x (%g), outside [%g, %g]",
                          i, static_cast<long long>(t), static_cast<long long>(h),
                          static_cast<long long>(j), y[j], scaled_exact, code, got, a_lo, a_hi);
            return check.fail(msg);
          }
        }
      }
    }
  }
  // Nothing else changed: the sources, and every byte of the targets the call may not write.
  for (int32_t i = 0; i < num_streams; ++i) {
    const StreamCase& c = cs[static_cast<size_t>(i)];
    if (c.dynamic) {
      // Every float that is not a group's scale keeps its guard value (-7).
      const StreamTarget& tg = a.streams[i].target;
      std::vector<char> is_scale(c.scales.size(), 0);
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t h = 0; h < (c.per_token ? 1 : c.heads); ++h) {
          is_scale[static_cast<size_t>(c.scale_offset + t * tg.scale_token_stride +
                                       h * tg.scale_head_stride)] = 1;
        }
      }
      for (size_t j = 0; j < c.scales.size(); ++j) {
        if (!is_scale[j] && c.scales[j] != -7.0f) {
          return check.fail("stream " + std::to_string(i) + ": a store outside its scales, at " +
                            std::to_string(static_cast<long long>(j) - c.scale_offset));
        }
      }
    }
    if (c.src.bytes != c.src.before) {
      return check.fail("stream " + std::to_string(i) + ": its source changed");
    }
    for (size_t b = 0; b < c.dst.bytes.size(); ++b) {
      if (c.written[b] == 0 && c.dst.bytes[b] != c.dst.before[b]) {
        return check.fail("stream " + std::to_string(i) + ": target byte " +
                          std::to_string(static_cast<long long>(b) - c.dst.offset) +
                          " changed outside the rows the call writes");
      }
    }
  }
  // Coverage.
  for (int32_t i = 0; i < num_streams; ++i) {
    const StreamCase& c = cs[static_cast<size_t>(i)];
    const bool rows = T > 0 && c.width > 0;
    hit("vector path", rows && plan.plan[i].vector);
    hit("scalar path", rows && !plan.plan[i].vector);
    hit("vector path with rotation, half split",
        rows && plan.plan[i].vector && c.rotary_dim > 0 && !interleaved);
    hit("vector path with rotation, interleaved",
        rows && plan.plan[i].vector && c.rotary_dim > 0 && interleaved);
    hit("vector path, norm", rows && plan.plan[i].vector && c.norm);
    hit("norm", rows && c.norm);
    hit("paged cache", rows && c.paged);
    hit("flat cache", rows && c.by_slot && !c.paged);
    hit("feature offset", rows && a.streams[i].target.feature_offset > 0);
    hit("fp8 e4m3fn, multiply",
        rows && c.format == CacheFormat::kFp8E4M3 && c.rule == ScaleRule::kMultiply);
    hit("fp8 e5m2, divide",
        rows && c.format == CacheFormat::kFp8E5M2 && c.rule == ScaleRule::kDivide);
    hit("fp8 without a scale",
        rows && c.format != CacheFormat::kSame && !c.has_scale && !c.dynamic);
    hit("dynamic per-row scales", rows && c.dynamic && !c.per_token);
    hit("dynamic per-token scales", rows && c.dynamic && c.per_token && c.heads > 1);
    hit("dynamic power-of-two scales", rows && c.dynamic && c.pow2);
    hit("dynamic scales, norm", rows && c.dynamic && c.norm);
    hit("dynamic scales, vector path", rows && c.dynamic && plan.plan[i].vector);
  }
  hit("multi-axis positions", T > 0 && multi_axis);
  hit("inverse rotation", T > 0 && R > 0 && inverse);
  hit("multi-axis, axis first", T > 0 && axis_first);
  hit("float64", T > 0 && storage == Storage::kDouble);
  hit("an asserting call", expect_assert);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t cases = 3000;
  uint64_t seed = 1;
  bool gate = true;
  Checker check;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--cases" && i + 1 < argc) {
      cases = std::atoll(argv[++i]);
    } else if (arg == "--seed" && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (arg == "--max-failures" && i + 1 < argc) {
      check.max_failures = std::atoll(argv[++i]);
    } else if (arg == "--no-coverage-gate") {
      gate = false;  // mutation_check.py's common command line
    } else {
      std::fprintf(stderr, "usage: %s [--cases N] [--seed S] [--max-failures M]\n", argv[0]);
      return 2;
    }
  }
  int64_t passed = 0;
  for (int64_t i = 0; i < cases && check.failures < check.max_failures; ++i) {
    passed += run_case(seed, i, check) ? 1 : 0;
  }
  std::printf("row streams host run: %lld of %lld cases passed (seed %llu)\n",
              static_cast<long long>(passed), static_cast<long long>(cases),
              static_cast<unsigned long long>(seed));
  bool covered = true;
  for (const auto& [what, n] : g_coverage) {
    std::printf("  %-45s %lld\n", what.c_str(), static_cast<long long>(n));
    covered = covered && n > 0;
  }
  if (check.failures > 0) {
    return 1;
  }
  if (gate && !covered) {
    std::printf("FAILED: a path was never taken\n");
    return 1;
  }
  return 0;
}
