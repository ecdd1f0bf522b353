// SPDX-License-Identifier: BSD-3-Clause
#include "host_backend.h"

#include <c10/util/Exception.h>

#include <optional>
#include <sstream>

#include "access_tracker.h"
#include "cuda/common_glue.h"
#include "store_ledger.h"

namespace rope_host {
namespace {

CaseContext* g_ctx = nullptr;
// The simulated runtime's current device, as cudaSetDevice / c10::cuda::CUDAGuard would set it.
int g_current_device = 0;

Storage storage_of(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::ScalarType::Double:
      return Storage::kDouble;
    case c10::ScalarType::Float:
      return Storage::kFloat;
    case c10::ScalarType::Half:
      return Storage::kHalf;
    case c10::ScalarType::BFloat16:
      return Storage::kBFloat16;
    default:
      TORCH_CHECK(false, "cuda host run: unsupported dtype ", dtype);
  }
}

// Counts the device asserts of a launch that nothing else observes, and checks that no byte is
// stored twice in it. The KV-cache and row-stream kernels give every output element one thread;
// a second store is a race on a GPU (the last to land wins), even where the serial run's order
// happens to leave the right value (the runs alternate the order too: see set_reverse_order).
class StoreOnceCounter final : public Observer {
 public:
  void load(const void*, size_t, int64_t) override {}
  void store(const void* p, size_t bytes, int64_t thread) override {
    ledger.note(p, bytes, thread);
  }
  void ldg(const void*, size_t, int64_t) override {}
  void device_assert(const char*, int64_t) override { ++asserts; }
  int64_t asserts = 0;
  StoreLedger ledger;
};

void check_stored_once(CaseContext& ctx, const char* what, const StoreOnceCounter& counter) {
  if (counter.ledger.double_stores() > 0) {
    ctx.problems.push_back(std::string(what) + ": " +
                           std::to_string(counter.ledger.double_stores()) +
                           " bytes stored more than once; first: " + counter.ledger.first());
  }
}

// No launch of the call received a pointer into the memory the case kept on the host.
void check_no_host_pointers(CaseContext& ctx) {
  const void* first = nullptr;
  const int64_t seen = host_pointers_seen(&first);
  if (seen > 0) {
    std::ostringstream m;
    m << seen << " kernel parameter word(s) point into host memory (a tensor the case kept on the "
      << "CPU, which the glue must copy to the device first); first: " << first;
    ctx.problems.push_back(m.str());
  }
}

// A launch must land on the call's device (x's or q's), on that device's current stream.
void check_device_and_stream(CaseContext& ctx, const char* what, bool launched, int device,
                             const void* stream) {
  if (!launched) {
    return;
  }
  const void* want = current_stream_of(ctx.device.ordinal);
  if (device != ctx.device.ordinal || stream != want) {
    std::ostringstream m;
    m << what << " on device " << device << ", stream " << stream << "; expected the device "
      << ctx.device.ordinal << " of the call's tensors and its current stream " << want
      << " (the caller's device was " << ctx.start_device << ")";
    ctx.problems.push_back(m.str());
  }
}

// The simulated CUDA runtime of common_glue.h.
struct HostRuntime {
  // c10::cuda::OptionalCUDAGuard: sets the device when given one, restores the previous on exit.
  class Guard {
   public:
    explicit Guard(std::optional<c10::Device> device) : previous_(g_current_device) {
      if (device.has_value()) {
        g_current_device = device->index();
      }
    }
    ~Guard() { g_current_device = previous_; }
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;

   private:
    int previous_;
  };
  using Stream = const void*;

  static std::optional<c10::Device> device_of(const at::Tensor& t) {
    if (g_ctx != nullptr && t.defined() && t.has_storage() &&
        g_ctx->on_device.count(t.storage().unsafeGetStorageImpl()) > 0) {
      return c10::Device(c10::DeviceType::CUDA,
                         static_cast<c10::DeviceIndex>(g_ctx->device.ordinal));
    }
    return std::nullopt;
  }
  static Stream current_stream() { return current_stream_of(g_current_device); }
  // Another device has another SM count: a plan sized for the wrong device shows in the record.
  static int multiprocessor_count() {
    return g_current_device == g_ctx->device.ordinal ? g_ctx->device.num_sms
                                                     : 1 + g_current_device % 5;
  }
  static int launch(c10::ScalarType dtype, const rope::RotationArgs& first,
                    const rope::RotationArgs* second, const rope::TableArgs& tables,
                    rope::RotationMode mode, int num_sms, Stream stream) {
    CaseContext& ctx = *g_ctx;
    const int storage_bytes = static_cast<int>(c10::elementSize(dtype));
    std::optional<AccessTracker> tracker;
    Observer* observer = ctx.observer;
    if (observer == nullptr) {
      tracker.emplace(first, second, tables, storage_bytes, tables.tables_are_double ? 8 : 4);
      observer = &*tracker;
    }
    LaunchOptions options = ctx.sample;
    options.stream = stream;
    LaunchRecord record;
    const int status =
        rope_host::rotate(storage_of(dtype), first, second, tables, mode,
                          Device{g_current_device, num_sms}, observer, &record, options);
    if (tracker.has_value()) {
      for (std::string& p : tracker->finish(ctx.positions_in_range)) {
        ctx.problems.push_back("launch: " + p);
      }
    }
    check_device_and_stream(ctx, "launch", record.launched, record.device, record.stream);
    ctx.launches.push_back(record);
    ctx.tables.push_back(tables);
    return status;
  }
  // The row streams' launch (every fused op): its device and stream as launch()'s, its device
  // asserts counted unless the case observes the launch itself (the sampled big cases), and which
  // of its streams took the vector path.
  static int launch_streams(c10::ScalarType dtype, const rope::StreamArgs& args,
                            const rope::TableArgs& tables, Stream stream) {
    CaseContext& ctx = *g_ctx;
    StoreOnceCounter counter;
    Observer* observer = ctx.observer != nullptr ? ctx.observer : &counter;
    LaunchOptions options = ctx.sample;
    options.stream = stream;
    GridLaunchRecord record;
    bool vector[rope::kMaxStreams] = {};
    const int status = rope_host::streams_launch(storage_of(dtype), args, tables,
                                                 Device{g_current_device, ctx.device.num_sms},
                                                 observer, &record, options, vector);
    if (counter.asserts > 0 && ctx.positions_in_range) {
      ctx.problems.push_back("row streams launch: " + std::to_string(counter.asserts) +
                             " device asserts fired on positions and slots all in range");
    }
    check_stored_once(ctx, "row streams launch", counter);
    check_device_and_stream(ctx, "row streams launch", record.launched, record.device,
                            record.stream);
    ctx.grid_launches.push_back(record);
    ctx.stream_vector_paths.emplace_back(vector, vector + args.num_streams);
    return status;
  }
  static void check(int status) {
    TORCH_CHECK(status == 0, "host launch of the CUDA kernel failed with cudaError_t ", status);
  }
  // A host (CPU) tensor copied to the call's device: a copy placed on it.
  static at::Tensor to_device(const at::Tensor& host, const at::Tensor& like) {
    at::Tensor copy = host.clone();
    if (g_ctx != nullptr && device_of(like).has_value()) {
      g_ctx->place(copy);
      ++g_ctx->host_copies;
    }
    return copy;
  }
};

// Enters the call: the caller's device is current, not x's, and the simulated runtime knows
// which memory the case kept on the host. Leaving checks the caller's device is current again and
// that no launch received a pointer into host memory.
class Enter {
 public:
  explicit Enter(CaseContext& ctx) : ctx_(ctx) {
    g_ctx = &ctx;
    g_current_device = ctx.start_device;
    set_host_memory(ctx.on_host.data(), ctx.on_host.size());
  }
  ~Enter() {
    if (g_current_device != ctx_.start_device) {
      ctx_.problems.push_back("the caller's device " + std::to_string(ctx_.start_device) +
                              " is not current after the call (device " +
                              std::to_string(g_current_device) + " is)");
    }
    check_no_host_pointers(ctx_);
    set_host_memory(nullptr, 0);
    g_ctx = nullptr;
  }

 private:
  CaseContext& ctx_;
};

}  // namespace

void CaseContext::place(const at::Tensor& t) {
  if (t.defined() && t.has_storage()) {
    on_device.insert(t.storage().unsafeGetStorageImpl());
  }
}

void CaseContext::keep_on_host(const at::Tensor& t) {
  if (t.defined() && t.has_storage() && t.storage().nbytes() > 0) {
    on_host.push_back(HostRange{t.storage().data(), t.storage().nbytes()});
  }
}

const void* current_stream_of(int device) {
  // Distinct, non-null handles: the default (legacy) stream is nullptr.
  return reinterpret_cast<const void*>(static_cast<uintptr_t>(0x5000 + 0x10 * device));
}

at::Tensor host_apply(CaseContext& ctx, const at::Tensor& x, const at::Tensor& cos,
                      const at::Tensor& sin, const at::Tensor& positions, bool interleaved,
                      bool inverse, at::OptionalIntArrayRef mrope_section, bool mrope_interleaved) {
  Enter enter(ctx);
  return rope::cuda::glue::apply<HostRuntime>(x, cos, sin, positions, interleaved, inverse,
                                              mrope_section, mrope_interleaved);
}

void host_apply_(CaseContext& ctx, const at::Tensor& x, const at::Tensor& cos,
                 const at::Tensor& sin, const at::Tensor& positions, bool interleaved, bool inverse,
                 at::OptionalIntArrayRef mrope_section, bool mrope_interleaved) {
  Enter enter(ctx);
  rope::cuda::glue::apply_inplace<HostRuntime>(x, cos, sin, positions, interleaved, inverse,
                                               mrope_section, mrope_interleaved);
}

void host_apply_out(CaseContext& ctx, const at::Tensor& x, const at::Tensor& cos,
                    const at::Tensor& sin, const at::Tensor& positions, bool interleaved,
                    bool inverse, const at::Tensor& out, at::OptionalIntArrayRef mrope_section,
                    bool mrope_interleaved) {
  Enter enter(ctx);
  rope::cuda::glue::apply_out<HostRuntime>(x, cos, sin, positions, interleaved, inverse,
                                           mrope_section, mrope_interleaved, out);
}

std::tuple<at::Tensor, at::Tensor> host_apply_qk(CaseContext& ctx, const at::Tensor& q,
                                                 const at::Tensor& k, const at::Tensor& cos,
                                                 const at::Tensor& sin, const at::Tensor& positions,
                                                 bool interleaved, bool inverse,
                                                 at::OptionalIntArrayRef mrope_section,
                                                 bool mrope_interleaved) {
  Enter enter(ctx);
  return rope::cuda::glue::apply_qk<HostRuntime>(q, k, cos, sin, positions, interleaved, inverse,
                                                 mrope_section, mrope_interleaved);
}

std::tuple<at::Tensor, at::Tensor> host_rms_norm_apply_qk(
    CaseContext& ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& q_weight,
    const at::Tensor& k_weight, const at::Tensor& cos, const at::Tensor& sin,
    const at::Tensor& positions, double eps, double weight_offset, bool interleaved, bool inverse,
    at::OptionalIntArrayRef mrope_section, bool mrope_interleaved) {
  Enter enter(ctx);
  return rope::cuda::glue::rms_norm_apply_qk<HostRuntime>(
      q, k, q_weight, k_weight, cos, sin, positions, eps, weight_offset, interleaved, inverse,
      mrope_section, mrope_interleaved);
}

at::Tensor host_apply_qk_cache(CaseContext& ctx, const at::Tensor& q, const at::Tensor& k,
                               const std::optional<at::Tensor>& v, const at::Tensor& cos,
                               const at::Tensor& sin, const at::Tensor& positions,
                               const at::Tensor& k_cache, const std::optional<at::Tensor>& v_cache,
                               const at::Tensor& slot_mapping, bool interleaved,
                               const std::optional<at::Tensor>& k_scale,
                               const std::optional<at::Tensor>& v_scale,
                               at::OptionalIntArrayRef mrope_section, bool mrope_interleaved) {
  Enter enter(ctx);
  return rope::cuda::glue::apply_qk_cache<HostRuntime>(q, k, v, cos, sin, positions, k_cache,
                                                       v_cache, slot_mapping, interleaved, k_scale,
                                                       v_scale, mrope_section, mrope_interleaved);
}

at::Tensor host_rms_norm_apply_qk_cache(
    CaseContext& ctx, const at::Tensor& q, const at::Tensor& k, const std::optional<at::Tensor>& v,
    const at::Tensor& q_weight, const at::Tensor& k_weight, const at::Tensor& cos,
    const at::Tensor& sin, const at::Tensor& positions, const at::Tensor& k_cache,
    const std::optional<at::Tensor>& v_cache, const at::Tensor& slot_mapping, double eps,
    double weight_offset, bool interleaved, const std::optional<at::Tensor>& k_scale,
    const std::optional<at::Tensor>& v_scale, std::optional<at::ScalarType> q_dtype,
    const std::optional<at::Tensor>& q_scale, at::OptionalIntArrayRef mrope_section,
    bool mrope_interleaved) {
  Enter enter(ctx);
  return rope::cuda::glue::rms_norm_apply_qk_cache<HostRuntime>(
      q, k, v, q_weight, k_weight, cos, sin, positions, k_cache, v_cache, slot_mapping, eps,
      weight_offset, interleaved, k_scale, v_scale, q_dtype, q_scale, mrope_section,
      mrope_interleaved);
}

// ---- the new forms (frequencies, packed sequences): common_glue.h's Forms, simulated runtime --

at::Tensor host_apply_form(CaseContext& ctx, const char* op, const at::Tensor& x,
                           const rope::detail::AngleSource& angles,
                           const rope::detail::PositionSource& where, bool interleaved,
                           bool inverse, const rope::detail::MultiAxisArgs& axes) {
  Enter enter(ctx);
  return rope::cuda::glue::Forms<HostRuntime>::apply(op, x, angles, where, interleaved, inverse,
                                                     axes);
}

void host_apply_inplace_form(CaseContext& ctx, const char* op, const at::Tensor& x,
                             const rope::detail::AngleSource& angles,
                             const rope::detail::PositionSource& where, bool interleaved,
                             bool inverse, const rope::detail::MultiAxisArgs& axes) {
  Enter enter(ctx);
  rope::cuda::glue::Forms<HostRuntime>::apply_inplace(op, x, angles, where, interleaved, inverse,
                                                      axes);
}

void host_apply_out_form(CaseContext& ctx, const char* op, const at::Tensor& x,
                         const rope::detail::AngleSource& angles,
                         const rope::detail::PositionSource& where, bool interleaved, bool inverse,
                         const rope::detail::MultiAxisArgs& axes, const at::Tensor& out) {
  Enter enter(ctx);
  rope::cuda::glue::Forms<HostRuntime>::apply_out(op, x, angles, where, interleaved, inverse, axes,
                                                  out);
}

std::tuple<at::Tensor, at::Tensor> host_apply_qk_form(CaseContext& ctx, const char* op,
                                                      const at::Tensor& q, const at::Tensor& k,
                                                      const rope::detail::AngleSource& angles,
                                                      const rope::detail::PositionSource& where,
                                                      bool interleaved, bool inverse,
                                                      const rope::detail::MultiAxisArgs& axes) {
  Enter enter(ctx);
  return rope::cuda::glue::Forms<HostRuntime>::apply_qk(op, q, k, angles, where, interleaved,
                                                        inverse, axes);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> host_apply_qk_fp8(
    CaseContext& ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
    const at::Tensor& sin, const at::Tensor& positions, const std::optional<at::Tensor>& q_nope,
    const std::optional<at::Tensor>& k_nope, const std::optional<at::Tensor>& q_scale,
    const std::optional<at::Tensor>& k_scale, std::optional<at::ScalarType> dtype, bool interleaved,
    bool multiply_by_scale, at::OptionalIntArrayRef mrope_section, bool mrope_interleaved,
    bool inverse) {
  Enter enter(ctx);
  return rope::cuda::glue::apply_qk_fp8<HostRuntime>(
      q, k, cos, sin, positions, q_nope, k_nope, q_scale, k_scale, dtype, interleaved,
      multiply_by_scale, mrope_section, mrope_interleaved, inverse);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> host_apply_qk_fp8_dynamic(
    CaseContext& ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
    const at::Tensor& sin, const at::Tensor& positions, std::optional<at::ScalarType> dtype,
    bool interleaved, bool per_token, bool pow2_scale, at::OptionalIntArrayRef mrope_section,
    bool mrope_interleaved, bool inverse) {
  Enter enter(ctx);
  return rope::cuda::glue::apply_qk_fp8_dynamic<HostRuntime>(
      q, k, cos, sin, positions, dtype, interleaved, per_token, pow2_scale, mrope_section,
      mrope_interleaved, inverse);
}

void host_apply_qk_fp8_dynamic_out(CaseContext& ctx, const at::Tensor& q, const at::Tensor& k,
                                   const at::Tensor& cos, const at::Tensor& sin,
                                   const at::Tensor& positions, bool interleaved, bool per_token,
                                   bool pow2_scale, at::OptionalIntArrayRef mrope_section,
                                   bool mrope_interleaved, bool inverse, const at::Tensor& q_out,
                                   const at::Tensor& k_out, const at::Tensor& q_scale_out,
                                   const at::Tensor& k_scale_out) {
  Enter enter(ctx);
  rope::cuda::glue::apply_qk_fp8_dynamic_out<HostRuntime>(
      q, k, cos, sin, positions, interleaved, per_token, pow2_scale, mrope_section,
      mrope_interleaved, inverse, q_out, k_out, q_scale_out, k_scale_out);
}

void host_apply_qk_fp8_out(CaseContext& ctx, const at::Tensor& q, const at::Tensor& k,
                           const at::Tensor& cos, const at::Tensor& sin,
                           const at::Tensor& positions, const std::optional<at::Tensor>& q_nope,
                           const std::optional<at::Tensor>& k_nope,
                           const std::optional<at::Tensor>& q_scale,
                           const std::optional<at::Tensor>& k_scale, bool interleaved,
                           bool multiply_by_scale, at::OptionalIntArrayRef mrope_section,
                           bool mrope_interleaved, const at::Tensor& q_out, const at::Tensor& k_out,
                           const std::optional<at::Tensor>& q_nope_out,
                           const std::optional<at::Tensor>& k_nope_out, bool inverse) {
  Enter enter(ctx);
  rope::cuda::glue::apply_qk_fp8_out<HostRuntime>(
      q, k, cos, sin, positions, q_nope, k_nope, q_scale, k_scale, interleaved, multiply_by_scale,
      mrope_section, mrope_interleaved, inverse, q_out, k_out, q_nope_out, k_nope_out);
}

std::tuple<at::Tensor, at::Tensor> host_mla_apply_cache(
    CaseContext& ctx, const at::Tensor& q_pe, const at::Tensor& k_pe, const at::Tensor& kv_c,
    const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& positions,
    const at::Tensor& kv_cache, const std::optional<at::Tensor>& kpe_cache,
    const at::Tensor& slot_mapping, const std::optional<at::Tensor>& q_nope,
    const std::optional<at::Tensor>& v, const std::optional<at::Tensor>& v_cache, bool interleaved,
    const std::optional<at::Tensor>& kv_scale, const std::optional<at::Tensor>& v_scale,
    std::optional<at::ScalarType> q_dtype, const std::optional<at::Tensor>& q_scale,
    bool multiply_by_scale) {
  Enter enter(ctx);
  return rope::cuda::glue::mla_apply_cache<HostRuntime>(
      q_pe, k_pe, kv_c, cos, sin, positions, kv_cache, kpe_cache, slot_mapping, q_nope, v, v_cache,
      interleaved, kv_scale, v_scale, q_dtype, q_scale, multiply_by_scale);
}

}  // namespace rope_host
