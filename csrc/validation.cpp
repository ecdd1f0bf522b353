#include "validation.h"

#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>
#include <c10/util/Exception.h>

namespace rope::detail {

void check_tables(const char* op, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(cos.dim() == 2, op, ": cos must be a 2-D table [max_seq_len, rotary_dim / 2], got ",
              cos.dim(), "-D tensor of shape ", cos.sizes());
  TORCH_CHECK(cos.sizes() == sin.sizes(), op, ": cos and sin must have the same shape, got cos ",
              cos.sizes(), " and sin ", sin.sizes());
  const auto dtype = cos.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble, op,
              ": cos must be float32 or float64 (half-precision tables lose accuracy at long "
              "context), got ", dtype);
  TORCH_CHECK(sin.scalar_type() == dtype, op, ": cos and sin must have the same dtype, got cos ",
              dtype, " and sin ", sin.scalar_type());
  TORCH_CHECK(cos.device() == sin.device(), op,
              ": cos and sin must be on the same device, got cos on ", cos.device(),
              " and sin on ", sin.device());
}

void check_rotated_input(const char* op, const char* name, const at::Tensor& x,
                         const at::Tensor& cos, const at::Tensor& positions) {
  TORCH_CHECK(at::isFloatingType(x.scalar_type()), op, ": ", name,
              " must be a floating tensor (float64, float32, float16 or bfloat16), got ",
              x.scalar_type());
  TORCH_CHECK(x.dim() >= 1, op, ": ", name, " must have at least 1 dim (..., head_dim), got a ",
              "0-dim tensor");
  TORCH_CHECK(x.device() == cos.device(), op, ": ", name, " and cos must be on the same device, got ",
              name, " on ", x.device(), " and cos on ", cos.device());
  TORCH_CHECK(positions.device() == x.device(), op, ": positions and ", name,
              " must be on the same device, got positions on ", positions.device(), " and ", name,
              " on ", x.device());

  const int64_t rotary_dim = 2 * cos.size(1);
  TORCH_CHECK(x.size(-1) >= rotary_dim, op, ": ", name,
              ".size(-1) (head_dim) must be >= rotary_dim = 2 * cos.size(-1) = ", rotary_dim,
              ", got ", x.size(-1));

  const auto pos_dtype = positions.scalar_type();
  TORCH_CHECK(pos_dtype == at::kInt || pos_dtype == at::kLong, op,
              ": positions must be an integer tensor (int32 or int64), got ", pos_dtype);
  const auto row_shape = x.sizes().slice(0, x.dim() - 1);
  TORCH_CHECK(at::is_expandable_to(positions.sizes(), row_shape), op, ": positions of shape ",
              positions.sizes(), " cannot be broadcast to ", name, ".shape[:-1] = ", row_shape,
              " (shapes align from the right; use e.g. (S,) for (B, H, S, D) or (S, 1) for "
              "(B, S, H, D))");
}

void check_positions_in_range(const char* op, const at::Tensor& positions, int64_t max_seq_len) {
  TORCH_INTERNAL_ASSERT(positions.device().is_cpu(), op, ": host-side range check on ",
                        positions.device());
  // positions is usually tiny (S or B entries, before broadcasting): one scan beats a reduction
  // op plus two .item() calls, and it can name the first offending entry.
  const at::Tensor p = positions.contiguous();
  auto scan = [&](const auto* data) {
    const int64_t n = p.numel();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t value = static_cast<int64_t>(data[i]);
      TORCH_CHECK_INDEX(value >= 0 && value < max_seq_len, op,
                        ": positions must be in [0, max_seq_len) with max_seq_len = cos.size(0) = ",
                        max_seq_len, ", got ", value, " at flat index ", i,
                        " of positions (build longer tables or check the positions)");
    }
  };
  if (p.scalar_type() == at::kLong) {
    scan(p.const_data_ptr<int64_t>());
  } else {
    scan(p.const_data_ptr<int32_t>());
  }
}

void check_writable(const char* op, const char* name, const at::Tensor& x) {
  TORCH_CHECK(at::has_internal_overlap(x) != at::MemOverlap::Yes, op, ": ", name,
              " has overlapping memory (e.g. a result of expand()), so it cannot be written in "
              "place; pass ", name, ".clone() or use the out-of-place op");
}

}  // namespace rope::detail
