// SPDX-License-Identifier: BSD-3-Clause
// The one cos/sin table builder, shared by the C++ module, the Python module, the integrations
// and users.
//
// Angles are p * inv_freq[k] in float64 (p is exact, so one rounding), cos/sin in float64, times
// the attention scaling, rounded once to the table dtype. Rows are built in chunks written
// straight into the output, so the peak memory is the tables plus a few chunks: at 2^24
// positions of a 128-wide head a whole-table float64 angle matrix would be 8 GiB of scratch.
#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cos.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/outer.h>
#include <ATen/ops/sin.h>
#include <c10/util/Exception.h>
#include <torch_rope/ops.h>
#include <torch_rope/tables.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "rules.h"

namespace rope {
namespace {

// float64 elements per chunk temporary: 256 KiB, so a chunk's angles stay in L2 on CPU. Devices
// get bigger chunks (fewer launches); 32 MiB is still nothing next to tables worth building there.
constexpr int64_t kCpuChunkElements = int64_t{1} << 15;
constexpr int64_t kDeviceChunkElements = int64_t{1} << 22;

// Rows [begin, end) of the tables: positions first_position + row.
void fill_rows(const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& inv_freq,
               double scaling, int64_t first_position, int64_t begin, int64_t end) {
  const auto f64 = inv_freq.options();
  const auto positions = at::arange(static_cast<double>(first_position + begin),
                                    static_cast<double>(first_position + end), f64);
  const auto angles = at::outer(positions, inv_freq);
  auto value = at::cos(angles);
  if (scaling != 1.0) value.mul_(scaling);
  cos.narrow(0, begin, end - begin).copy_(value);
  at::sin_out(value, angles);
  if (scaling != 1.0) value.mul_(scaling);
  sin.narrow(0, begin, end - begin).copy_(value);
}

}  // namespace

void fill_rope_tables(const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& inv_freq,
                      double attention_scaling, int64_t first_position) {
  TORCH_CHECK_VALUE(inv_freq.dim() == 1 && inv_freq.is_floating_point(),
                    "fill_rope_tables: inv_freq must be a 1-D floating tensor, got ",
                    inv_freq.scalar_type(), " of shape ", inv_freq.sizes());
  const int64_t planes = inv_freq.numel();
  TORCH_CHECK_VALUE(cos.dim() == 2 && sin.sizes() == cos.sizes() && cos.size(1) == planes,
                    "fill_rope_tables: cos and sin must both be (rows, inv_freq.numel() = ", planes,
                    "), got ", cos.sizes(), " and ", sin.sizes());
  detail::check_table_dtype("fill_rope_tables", cos.scalar_type());
  detail::check_table_dtype("fill_rope_tables", sin.scalar_type());
  TORCH_CHECK_VALUE(cos.device() == sin.device(), "fill_rope_tables: cos is on ", cos.device(),
                    " but sin is on ", sin.device());
  TORCH_CHECK_VALUE(std::isfinite(attention_scaling),
                    "fill_rope_tables: attention_scaling must be finite, got ", attention_scaling);
  TORCH_CHECK_VALUE(first_position >= 0, "fill_rope_tables: first_position must be >= 0, got ",
                    first_position);
  const int64_t rows = cos.size(0);
  if (rows == 0 || planes == 0 || cos.is_meta()) return;

  const auto freq = inv_freq.to(cos.device(), at::kDouble);
  if (cos.device().is_cpu()) {
    // Threads take disjoint chunks; the ops inside a parallel region run single-threaded, so each
    // thread holds exactly one chunk's temporaries at a time.
    const int64_t chunk_rows = std::max<int64_t>(1, kCpuChunkElements / planes);
    const int64_t chunks = (rows + chunk_rows - 1) / chunk_rows;
    // The workers run aten ops on the caller's tensors, so they need the caller's thread-local
    // state: tables allocated under torch.inference_mode() are inference tensors, which only an
    // InferenceMode thread may write.
    const at::ThreadLocalState caller_state;
    at::parallel_for(0, chunks, 1, [&](int64_t first, int64_t last) {
      const at::ThreadLocalStateGuard state_guard(caller_state);
      for (int64_t c = first; c < last; ++c) {
        const int64_t begin = c * chunk_rows;
        fill_rows(cos, sin, freq, attention_scaling, first_position, begin,
                  std::min(rows, begin + chunk_rows));
      }
    });
  } else {
    const int64_t chunk_rows = std::max<int64_t>(1, kDeviceChunkElements / planes);
    for (int64_t begin = 0; begin < rows; begin += chunk_rows) {
      fill_rows(cos, sin, freq, attention_scaling, first_position, begin,
                std::min(rows, begin + chunk_rows));
    }
  }
}

std::tuple<at::Tensor, at::Tensor> rope_tables_from_inv_freq(const at::Tensor& inv_freq,
                                                             int64_t max_seq_len,
                                                             double attention_scaling,
                                                             c10::ScalarType dtype,
                                                             std::optional<c10::Device> device) {
  TORCH_CHECK_VALUE(inv_freq.dim() == 1 && inv_freq.numel() >= 1 && inv_freq.is_floating_point(),
                    "rope_tables: inv_freq must be a non-empty 1-D floating tensor, got ",
                    inv_freq.scalar_type(), " of shape ", inv_freq.sizes());
  detail::check_table_dtype("rope_tables", dtype);
  detail::check_table_length("rope_tables", max_seq_len, 2 * inv_freq.numel());
  TORCH_CHECK_VALUE(std::isfinite(attention_scaling),
                    "rope_tables: attention_scaling must be finite, got ", attention_scaling);
  const c10::Device where = device.value_or(inv_freq.device());
  detail::check_table_memory("rope_tables", max_seq_len, max_seq_len, 2 * inv_freq.numel(), dtype,
                             where);
  const auto options = at::TensorOptions().dtype(dtype).device(where);
  at::Tensor cos;
  at::Tensor sin;
  try {
    cos = at::empty({max_seq_len, inv_freq.numel()}, options);
    sin = at::empty({max_seq_len, inv_freq.numel()}, options);
  } catch (const c10::OutOfMemoryError& error) {
    detail::throw_tables_do_not_fit("rope_tables", max_seq_len, max_seq_len, 2 * inv_freq.numel(),
                                    dtype, where, error);
  }
  if (!cos.is_meta()) {
    TORCH_CHECK_VALUE(inv_freq.device().is_cpu() || inv_freq.device() == cos.device(),
                      "rope_tables: inv_freq is on ", inv_freq.device(), ", tables requested on ",
                      cos.device());
    const auto freq_cpu = inv_freq.to(at::kCPU, at::kDouble);
    const auto* f = freq_cpu.const_data_ptr<double>();
    for (int64_t k = 0; k < freq_cpu.numel(); ++k) {
      TORCH_CHECK_VALUE(std::isfinite(f[k]), "rope_tables: inv_freq must be finite, got ", f[k],
                        " at index ", k);
    }
    fill_rope_tables(cos, sin, freq_cpu, attention_scaling);
  }
  return {cos, sin};
}

std::tuple<at::Tensor, at::Tensor> rope_tables(double theta, int64_t rotary_dim,
                                               int64_t max_seq_len, const TableOptions& options) {
  detail::check_table_dtype("rope_tables", options.dtype());
  detail::check_table_length("rope_tables", max_seq_len, rotary_dim);
  const auto frequencies = rope_frequencies(theta, rotary_dim, options.scaling(), max_seq_len);
  return rope_tables_from_inv_freq(frequencies.inv_freq, max_seq_len, frequencies.attention_scaling,
                                   options.dtype(), options.device().value_or(at::kCPU));
}

std::tuple<at::Tensor, at::Tensor> rope_tables(double theta, int64_t rotary_dim,
                                               int64_t max_seq_len,
                                               std::optional<c10::Device> device) {
  return rope_tables(theta, rotary_dim, max_seq_len, TableOptions().device(device));
}

}  // namespace rope
