// SPDX-License-Identifier: BSD-3-Clause
// The CUDA ops of the host run, all six: csrc/cuda/common_glue.h (device guard, stream, launch,
// error check, the op bodies) instantiated with a simulated CUDA runtime, launching the host build
// of the kernels (host_kernel.h). The simulated runtime has many devices, each with its own current
// stream; a call starts with some *other* device current. Each launch must happen with x's device
// current and on that device's current stream, and the caller's device must be current again
// afterwards: that is what a dropped device guard or a launch on the default stream gets wrong,
// and no other test without a GPU can see.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <tuple>
#include <unordered_set>
#include <vector>

#include "common_kernel_args.h"
#include "host_kernel.h"
#include "rope_validation.h"

namespace rope_host {

// One op call of the host run.
struct CaseContext {
  Device device;         // the simulated GPU the tensors of the call live on
  int start_device = 0;  // the current device when the op is called; must differ from device's
  bool positions_in_range = true;
  // Tensors on `device`, by storage (its StorageImpl, not its data pointer: every empty storage
  // has a null one); every other tensor is on the CPU for device_of.
  std::unordered_set<const void*> on_device;
  // The storages of tensors the case keeps on the CPU (keep_on_host): no launch may receive a
  // pointer into them (the glue must copy them to the device first).
  std::vector<HostRange> on_host;
  // Checks each launch's accesses with an AccessTracker, unless `observer` is given (the big
  // cases, which check what they sample themselves).
  Observer* observer = nullptr;
  LaunchOptions sample;  // stream is ignored: the glue chooses it
  std::vector<std::string> problems;
  std::vector<LaunchRecord> launches;
  std::vector<rope::TableArgs> tables;
  std::vector<GridLaunchRecord> grid_launches;  // of the row streams
  int64_t host_copies = 0;  // CPU tensors (packed sequences) the glue copied to the device
  // Of each row-streams launch (common_stream_kernel.cuh): its streams' vector-path flags.
  std::vector<std::vector<bool>> stream_vector_paths;

  // Puts t's storage (and so every view of it) on `device`.
  void place(const at::Tensor& t);
  // Records that t's storage stays on the CPU (see on_host).
  void keep_on_host(const at::Tensor& t);
};

// The stream the simulated runtime reports as current on `device` (never the default stream).
const void* current_stream_of(int device);

// The four CUDA ops through common_glue.h with the simulated runtime, for the call `ctx`; a
// non-empty `mrope_section` makes the positions multi-axis (M-RoPE).
at::Tensor host_apply(CaseContext& ctx, const at::Tensor& x, const at::Tensor& cos,
                      const at::Tensor& sin, const at::Tensor& positions, bool interleaved,
                      bool inverse, at::OptionalIntArrayRef mrope_section = std::nullopt,
                      bool mrope_interleaved = false);
void host_apply_(CaseContext& ctx, const at::Tensor& x, const at::Tensor& cos,
                 const at::Tensor& sin, const at::Tensor& positions, bool interleaved, bool inverse,
                 at::OptionalIntArrayRef mrope_section = std::nullopt,
                 bool mrope_interleaved = false);
void host_apply_out(CaseContext& ctx, const at::Tensor& x, const at::Tensor& cos,
                    const at::Tensor& sin, const at::Tensor& positions, bool interleaved,
                    bool inverse, const at::Tensor& out,
                    at::OptionalIntArrayRef mrope_section = std::nullopt,
                    bool mrope_interleaved = false);
std::tuple<at::Tensor, at::Tensor> host_apply_qk(
    CaseContext& ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
    const at::Tensor& sin, const at::Tensor& positions, bool interleaved, bool inverse,
    at::OptionalIntArrayRef mrope_section = std::nullopt, bool mrope_interleaved = false);

// rope.rms_norm_apply_qk through csrc/cuda/common_glue.h with the simulated runtime.
std::tuple<at::Tensor, at::Tensor> host_rms_norm_apply_qk(
    CaseContext& ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& q_weight,
    const at::Tensor& k_weight, const at::Tensor& cos, const at::Tensor& sin,
    const at::Tensor& positions, double eps, double weight_offset, bool interleaved, bool inverse,
    at::OptionalIntArrayRef mrope_section, bool mrope_interleaved);

// rope.apply_qk_cache through csrc/cuda/common_glue.h with the simulated runtime. Its launch
// honours ctx.sample (a sampled grid) and ctx.observer (every access of the sampled blocks);
// without an observer, a device assert on a call whose positions and slots are all in range is
// a problem of the call.
at::Tensor host_apply_qk_cache(CaseContext& ctx, const at::Tensor& q, const at::Tensor& k,
                               const std::optional<at::Tensor>& v, const at::Tensor& cos,
                               const at::Tensor& sin, const at::Tensor& positions,
                               const at::Tensor& k_cache, const std::optional<at::Tensor>& v_cache,
                               const at::Tensor& slot_mapping, bool interleaved,
                               const std::optional<at::Tensor>& k_scale = std::nullopt,
                               const std::optional<at::Tensor>& v_scale = std::nullopt,
                               at::OptionalIntArrayRef mrope_section = std::nullopt,
                               bool mrope_interleaved = false);

// rope.rms_norm_apply_qk_cache through common_glue.h on the simulated runtime (the row streams).
at::Tensor host_rms_norm_apply_qk_cache(
    CaseContext& ctx, const at::Tensor& q, const at::Tensor& k, const std::optional<at::Tensor>& v,
    const at::Tensor& q_weight, const at::Tensor& k_weight, const at::Tensor& cos,
    const at::Tensor& sin, const at::Tensor& positions, const at::Tensor& k_cache,
    const std::optional<at::Tensor>& v_cache, const at::Tensor& slot_mapping, double eps,
    double weight_offset, bool interleaved, const std::optional<at::Tensor>& k_scale,
    const std::optional<at::Tensor>& v_scale, std::optional<at::ScalarType> q_dtype,
    const std::optional<at::Tensor>& q_scale, at::OptionalIntArrayRef mrope_section,
    bool mrope_interleaved);

// The frequency and packed-sequence forms (csrc/rope_forms.h) through common_glue.h's Forms with
// the simulated runtime; `op` is the overload's name in messages.
at::Tensor host_apply_form(CaseContext& ctx, const char* op, const at::Tensor& x,
                           const rope::detail::AngleSource& angles,
                           const rope::detail::PositionSource& where, bool interleaved,
                           bool inverse, const rope::detail::MultiAxisArgs& axes = {});
void host_apply_inplace_form(CaseContext& ctx, const char* op, const at::Tensor& x,
                             const rope::detail::AngleSource& angles,
                             const rope::detail::PositionSource& where, bool interleaved,
                             bool inverse, const rope::detail::MultiAxisArgs& axes = {});
void host_apply_out_form(CaseContext& ctx, const char* op, const at::Tensor& x,
                         const rope::detail::AngleSource& angles,
                         const rope::detail::PositionSource& where, bool interleaved, bool inverse,
                         const rope::detail::MultiAxisArgs& axes, const at::Tensor& out);
std::tuple<at::Tensor, at::Tensor> host_apply_qk_form(CaseContext& ctx, const char* op,
                                                      const at::Tensor& q, const at::Tensor& k,
                                                      const rope::detail::AngleSource& angles,
                                                      const rope::detail::PositionSource& where,
                                                      bool interleaved, bool inverse,
                                                      const rope::detail::MultiAxisArgs& axes = {});
// The serving fusions through csrc/cuda/common_glue.h with the simulated runtime; their launches
// (the row streams' kernel) honour ctx.sample and ctx.observer as apply_qk_cache's does.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> host_apply_qk_fp8(
    CaseContext& ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
    const at::Tensor& sin, const at::Tensor& positions, const std::optional<at::Tensor>& q_nope,
    const std::optional<at::Tensor>& k_nope, const std::optional<at::Tensor>& q_scale,
    const std::optional<at::Tensor>& k_scale, std::optional<at::ScalarType> dtype, bool interleaved,
    bool multiply_by_scale, at::OptionalIntArrayRef mrope_section, bool mrope_interleaved,
    bool inverse = false);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> host_apply_qk_fp8_dynamic(
    CaseContext& ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
    const at::Tensor& sin, const at::Tensor& positions, std::optional<at::ScalarType> dtype,
    bool interleaved, bool per_token, bool pow2_scale, at::OptionalIntArrayRef mrope_section,
    bool mrope_interleaved, bool inverse = false);
void host_apply_qk_fp8_dynamic_out(CaseContext& ctx, const at::Tensor& q, const at::Tensor& k,
                                   const at::Tensor& cos, const at::Tensor& sin,
                                   const at::Tensor& positions, bool interleaved, bool per_token,
                                   bool pow2_scale, at::OptionalIntArrayRef mrope_section,
                                   bool mrope_interleaved, bool inverse, const at::Tensor& q_out,
                                   const at::Tensor& k_out, const at::Tensor& q_scale_out,
                                   const at::Tensor& k_scale_out);
std::tuple<at::Tensor, at::Tensor> host_mla_apply_cache(
    CaseContext& ctx, const at::Tensor& q_pe, const at::Tensor& k_pe, const at::Tensor& kv_c,
    const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& positions,
    const at::Tensor& kv_cache, const std::optional<at::Tensor>& kpe_cache,
    const at::Tensor& slot_mapping, const std::optional<at::Tensor>& q_nope,
    const std::optional<at::Tensor>& v, const std::optional<at::Tensor>& v_cache, bool interleaved,
    const std::optional<at::Tensor>& kv_scale, const std::optional<at::Tensor>& v_scale,
    std::optional<at::ScalarType> q_dtype, const std::optional<at::Tensor>& q_scale,
    bool multiply_by_scale);
void host_apply_qk_fp8_out(CaseContext& ctx, const at::Tensor& q, const at::Tensor& k,
                           const at::Tensor& cos, const at::Tensor& sin,
                           const at::Tensor& positions, const std::optional<at::Tensor>& q_nope,
                           const std::optional<at::Tensor>& k_nope,
                           const std::optional<at::Tensor>& q_scale,
                           const std::optional<at::Tensor>& k_scale, bool interleaved,
                           bool multiply_by_scale, at::OptionalIntArrayRef mrope_section,
                           bool mrope_interleaved, const at::Tensor& q_out, const at::Tensor& k_out,
                           const std::optional<at::Tensor>& q_nope_out,
                           const std::optional<at::Tensor>& k_nope_out, bool inverse = false);

}  // namespace rope_host
