// SPDX-License-Identifier: BSD-3-Clause
// The glue of every CUDA op (rope.apply, apply_, apply.out, apply_qk, rms_norm_apply_qk,
// apply_qk_cache): which device is current during the call (the device guard), which stream the
// kernel goes on, and how a launch status becomes an error. Written once, as templates over a
// `Runtime` policy, so the same code runs in two places:
//   - rope_cuda.cpp, rms_norm_cuda.cpp, kv_cache_cuda.cpp and the other ops' files instantiate it
//     with the real runtime (common_runtime.h: c10::cuda::OptionalCUDAGuard,
//     at::cuda::getCurrentCUDAStream, the device's SM count, C10_CUDA_CHECK) and their kernel's
//     launcher;
//   - the host run of the kernels (tests/cuda_host/host_backend.cpp) instantiates it with a
//     simulated runtime that gives every device its own current stream and records the device and
//     stream of each launch, so dropping the guard, or launching on the default stream, fails a
//     test on a machine without a GPU, for every op.
// Keep every decision here; the Runtime's members are one-liners with no choice in them.
//
// A Runtime provides:
//   using Guard;   // RAII: constructed from std::optional<c10::Device>, sets that device current
//   using Stream;  // cudaStream_t
//   static std::optional<c10::Device> device_of(const at::Tensor&);  // the CUDA device of t
//   static Stream current_stream();        // the current stream of the *current* device
//   static int multiprocessor_count();     // of the current device
//   static void check(int status);         // throws on a failed launch
//   static at::Tensor to_device(const at::Tensor& host, const at::Tensor& like);
//                                          // a CPU tensor copied to like's device (blocking)
// and the launch of each kernel it serves (each returns a cudaError_t as int):
//   static int launch(c10::ScalarType, const RotationArgs& first, const RotationArgs* second,
//                     const TableArgs&, RotationMode, int num_sms, Stream);     // rope_kernel.cuh
//   static int launch_streams(c10::ScalarType, const StreamArgs&, const TableArgs&,
//                             Stream);                                  // common_stream_kernel.cuh
// (the row streams of the fused ops: rms_norm_apply_qk, apply_qk_cache, apply_qk_fp8,
// rms_norm_apply_qk_cache, mla_apply_cache).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

// csrc/ is on the include path of every user.
#include "kv_cache_body.h"
#include "kv_cache_norm_body.h"
#include "mla_body.h"
#include "qk_fp8_body.h"
#include "rms_norm_body.h"
#include "rope_body.h"
#include "rope_forms.h"

namespace rope::cuda::glue {

// Every launch of every op: on the current stream of the current device, which the op's guard
// made x's (q's) device, and its status checked. `launch(stream)` enqueues the kernel. The stream
// is asked after the guard set the device: the current stream is per device, and a stream of
// another device (or the legacy default stream) would not be ordered after x's producer. Nothing
// here synchronizes.
template <typename Runtime, typename Launch>
void launch_on_current_stream(const Launch& launch) {
  const typename Runtime::Stream stream = Runtime::current_stream();
  Runtime::check(launch(stream));
}

// ---- the backends of the op bodies (rope_body.h, rms_norm_body.h, kv_cache_body.h) -------------

// The range of positions (and of slots) is checked inside the kernels (a device assert): a
// host-side check would read them back and synchronize with the device on every call.
template <typename Runtime>
struct RopeBackend {
  static void check_positions(const char* /*op*/, const at::Tensor& /*positions*/,
                              int64_t /*max_seq_len*/, const detail::MultiAxisArgs& /*axes*/) {}
  static void rotate(c10::ScalarType dtype, const RotationArgs& args, const TableArgs& tables,
                     RotationMode mode) {
    rotate_pair_or_one(dtype, args, nullptr, tables, mode);
  }
  static void rotate_pair(c10::ScalarType dtype, const RotationArgs& q, const RotationArgs& k,
                          const TableArgs& tables, RotationMode mode) {
    rotate_pair_or_one(dtype, q, &k, tables, mode);
  }

  // The new forms (rope_body.h). Values on the device are asserted in the kernel; only packed
  // sequences a caller passed as CPU tensors are checked here, on the host, before anything is
  // copied or launched, and then copied to x's device.
  static void check_form_values(const char* op, const detail::AngleSource& angles,
                                const detail::PositionSource& where, int64_t num_tokens,
                                const detail::MultiAxisArgs& axes) {
    detail::check_form_values_on_host(op, angles, where, num_tokens, axes, on_host);
  }
  static detail::PackedArgs packed_for_kernel(const detail::PackedArgs& packed,
                                              const at::Tensor& x) {
    if (!on_host(packed.cu_seqlens)) {
      return packed;
    }
    detail::PackedArgs on_device = packed;
    on_device.cu_seqlens = Runtime::to_device(packed.cu_seqlens, x);
    if (packed.seq_offsets.defined()) {
      on_device.seq_offsets = Runtime::to_device(packed.seq_offsets, x);
    }
    return on_device;
  }
  // Whether t's data is on the host: on no CUDA device, as the runtime sees it.
  static bool on_host(const at::Tensor& t) { return !Runtime::device_of(t).has_value(); }
  static at::Tensor frequency_positions(const at::Tensor& positions,
                                        const detail::MultiAxisArgs& /*axes*/) {
    return positions;
  }
  // The kernel computes each lane's angles from the frequencies (rope_kernel.cuh's
  // rope_freqs_kernel): one launch, as for tables, through the same launcher (rotate<T> of
  // common_launchers.h chooses the frequency kernel from TableArgs::from_frequencies), so the
  // form needs no launcher of its own and this glue sees no kernel header.
  static void rotate_frequencies(c10::ScalarType dtype, const detail::PreparedRotation& first,
                                 const detail::PreparedRotation* second, const TableArgs& freqs,
                                 RotationMode mode) {
    rotate_pair_or_one(dtype, first.args, second != nullptr ? &second->args : nullptr, freqs, mode);
  }

 private:
  // One launch for `first` and, if given, `second` (apply_qk), sized for the current device.
  static void rotate_pair_or_one(c10::ScalarType dtype, const RotationArgs& first,
                                 const RotationArgs* second, const TableArgs& tables,
                                 RotationMode mode) {
    const int num_sms = Runtime::multiprocessor_count();
    launch_on_current_stream<Runtime>([&](typename Runtime::Stream stream) {
      return Runtime::launch(dtype, first, second, tables, mode, num_sms, stream);
    });
  }
};

// The row streams (qk_fp8_body.h and the other serving fusions): values of positions and slots
// are checked in the kernel too, and a repeated slot is not detected.
template <typename Runtime>
struct StreamsBackend {
  static void check_positions(const char* /*op*/, const at::Tensor& /*positions*/,
                              int64_t /*max_seq_len*/, const detail::MultiAxisArgs& /*axes*/) {}
  static void check_slots(const char* /*op*/, const at::Tensor& /*slot_mapping*/,
                          int64_t /*num_slots*/) {}
  static void run_streams(c10::ScalarType dtype, const detail::PreparedStreams& p) {
    launch_on_current_stream<Runtime>([&](typename Runtime::Stream stream) {
      return Runtime::launch_streams(dtype, p.args, p.tables.args, stream);
    });
  }
};

// ---- the ops -----------------------------------------------------------------------------------
// x's (q's) device is current for the whole body, allocation included, so the output is allocated
// there and the launch goes to that device's current stream. When only cos or positions is on
// the GPU there is no guard to set, and the op body reports the device mismatch.

template <typename Runtime>
at::Tensor apply(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                 const at::Tensor& positions, bool interleaved, bool inverse,
                 at::OptionalIntArrayRef mrope_section, bool mrope_interleaved) {
  const typename Runtime::Guard guard(Runtime::device_of(x));
  return detail::apply_body<RopeBackend<Runtime>>(x, cos, sin, positions, interleaved, inverse,
                                                  {mrope_section, mrope_interleaved});
}

template <typename Runtime>
void apply_inplace(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                   const at::Tensor& positions, bool interleaved, bool inverse,
                   at::OptionalIntArrayRef mrope_section, bool mrope_interleaved) {
  const typename Runtime::Guard guard(Runtime::device_of(x));
  detail::apply_inplace_body<RopeBackend<Runtime>>(x, cos, sin, positions, interleaved, inverse,
                                                   {mrope_section, mrope_interleaved});
}

template <typename Runtime>
void apply_out(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
               const at::Tensor& positions, bool interleaved, bool inverse,
               at::OptionalIntArrayRef mrope_section, bool mrope_interleaved,
               const at::Tensor& out) {
  const typename Runtime::Guard guard(Runtime::device_of(x));
  detail::apply_out_body<RopeBackend<Runtime>>(x, cos, sin, positions, interleaved, inverse,
                                               {mrope_section, mrope_interleaved}, out);
}

template <typename Runtime>
std::tuple<at::Tensor, at::Tensor> apply_qk(const at::Tensor& q, const at::Tensor& k,
                                            const at::Tensor& cos, const at::Tensor& sin,
                                            const at::Tensor& positions, bool interleaved,
                                            bool inverse, at::OptionalIntArrayRef mrope_section,
                                            bool mrope_interleaved) {
  const typename Runtime::Guard guard(Runtime::device_of(q));
  return detail::apply_qk_body<RopeBackend<Runtime>>(q, k, cos, sin, positions, interleaved,
                                                     inverse, {mrope_section, mrope_interleaved});
}

// The twelve overloads of the new forms (rope_forms.h), each with x's (q's) device current.
template <typename Runtime>
struct Forms {
  using Backend = RopeBackend<Runtime>;
  static at::Tensor apply(const char* op, const at::Tensor& x, const detail::AngleSource& angles,
                          const detail::PositionSource& where, bool interleaved, bool inverse,
                          const detail::MultiAxisArgs& axes) {
    const typename Runtime::Guard guard(Runtime::device_of(x));
    return detail::apply_form_body<Backend>(op, x, angles, where, interleaved, inverse, axes);
  }
  static void apply_inplace(const char* op, const at::Tensor& x, const detail::AngleSource& angles,
                            const detail::PositionSource& where, bool interleaved, bool inverse,
                            const detail::MultiAxisArgs& axes) {
    const typename Runtime::Guard guard(Runtime::device_of(x));
    detail::apply_inplace_form_body<Backend>(op, x, angles, where, interleaved, inverse, axes);
  }
  static void apply_out(const char* op, const at::Tensor& x, const detail::AngleSource& angles,
                        const detail::PositionSource& where, bool interleaved, bool inverse,
                        const detail::MultiAxisArgs& axes, const at::Tensor& out) {
    const typename Runtime::Guard guard(Runtime::device_of(x));
    detail::apply_out_form_body<Backend>(op, x, angles, where, interleaved, inverse, out, axes);
  }
  static std::tuple<at::Tensor, at::Tensor> apply_qk(const char* op, const at::Tensor& q,
                                                     const at::Tensor& k,
                                                     const detail::AngleSource& angles,
                                                     const detail::PositionSource& where,
                                                     bool interleaved, bool inverse,
                                                     const detail::MultiAxisArgs& axes) {
    const typename Runtime::Guard guard(Runtime::device_of(q));
    return detail::apply_qk_form_body<Backend>(op, q, k, angles, where, interleaved, inverse, axes);
  }
};

template <typename Runtime>
std::tuple<at::Tensor, at::Tensor> rms_norm_apply_qk(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& q_weight,
    const at::Tensor& k_weight, const at::Tensor& cos, const at::Tensor& sin,
    const at::Tensor& positions, double eps, double weight_offset, bool interleaved, bool inverse,
    at::OptionalIntArrayRef mrope_section, bool mrope_interleaved) {
  const typename Runtime::Guard guard(Runtime::device_of(q));
  return detail::rms_norm_apply_qk_body<StreamsBackend<Runtime>>(
      q, k, q_weight, k_weight, cos, sin, positions, eps, weight_offset, interleaved, inverse,
      {mrope_section, mrope_interleaved});
}

template <typename Runtime>
at::Tensor apply_qk_cache(const at::Tensor& q, const at::Tensor& k,
                          const std::optional<at::Tensor>& v, const at::Tensor& cos,
                          const at::Tensor& sin, const at::Tensor& positions,
                          const at::Tensor& k_cache, const std::optional<at::Tensor>& v_cache,
                          const at::Tensor& slot_mapping, bool interleaved,
                          const std::optional<at::Tensor>& k_scale,
                          const std::optional<at::Tensor>& v_scale,
                          at::OptionalIntArrayRef mrope_section, bool mrope_interleaved) {
  const typename Runtime::Guard guard(Runtime::device_of(q));
  return detail::apply_qk_cache_body<StreamsBackend<Runtime>>({q,
                                                               k,
                                                               v,
                                                               cos,
                                                               sin,
                                                               positions,
                                                               k_cache,
                                                               v_cache,
                                                               slot_mapping,
                                                               k_scale,
                                                               v_scale,
                                                               {mrope_section, mrope_interleaved}},
                                                              interleaved);
}

template <typename Runtime>
at::Tensor rms_norm_apply_qk_cache(
    const at::Tensor& q, const at::Tensor& k, const std::optional<at::Tensor>& v,
    const at::Tensor& q_weight, const at::Tensor& k_weight, const at::Tensor& cos,
    const at::Tensor& sin, const at::Tensor& positions, const at::Tensor& k_cache,
    const std::optional<at::Tensor>& v_cache, const at::Tensor& slot_mapping, double eps,
    double weight_offset, bool interleaved, const std::optional<at::Tensor>& k_scale,
    const std::optional<at::Tensor>& v_scale, std::optional<at::ScalarType> q_dtype,
    const std::optional<at::Tensor>& q_scale, at::OptionalIntArrayRef mrope_section,
    bool mrope_interleaved) {
  const typename Runtime::Guard guard(Runtime::device_of(q));
  return detail::rms_norm_apply_qk_cache_body<StreamsBackend<Runtime>>(
      {{q,
        k,
        v,
        cos,
        sin,
        positions,
        k_cache,
        v_cache,
        slot_mapping,
        k_scale,
        v_scale,
        {mrope_section, mrope_interleaved}},
       q_weight,
       k_weight,
       eps,
       weight_offset,
       q_dtype,
       q_scale},
      interleaved);
}

// ---- the serving fusions (the row streams) ------------------------------------------------------

template <typename Runtime>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> apply_qk_fp8(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
    const at::Tensor& positions, const std::optional<at::Tensor>& q_nope,
    const std::optional<at::Tensor>& k_nope, const std::optional<at::Tensor>& q_scale,
    const std::optional<at::Tensor>& k_scale, std::optional<at::ScalarType> dtype, bool interleaved,
    bool multiply_by_scale, at::OptionalIntArrayRef mrope_section, bool mrope_interleaved,
    bool inverse) {
  const typename Runtime::Guard guard(Runtime::device_of(q));
  return detail::apply_qk_fp8_body<StreamsBackend<Runtime>>(
      {q,
       k,
       cos,
       sin,
       positions,
       q_nope,
       k_nope,
       q_scale,
       k_scale,
       {mrope_section, mrope_interleaved}},
      dtype, RotationMode{interleaved, inverse}, multiply_by_scale);
}

template <typename Runtime>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> apply_qk_fp8_dynamic(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
    const at::Tensor& positions, std::optional<at::ScalarType> dtype, bool interleaved,
    bool per_token, bool pow2_scale, at::OptionalIntArrayRef mrope_section, bool mrope_interleaved,
    bool inverse) {
  const typename Runtime::Guard guard(Runtime::device_of(q));
  const std::optional<at::Tensor> none;
  return detail::apply_qk_fp8_dynamic_body<StreamsBackend<Runtime>>(
      {q, k, cos, sin, positions, none, none, none, none, {mrope_section, mrope_interleaved}},
      dtype, RotationMode{interleaved, inverse}, per_token, pow2_scale);
}

template <typename Runtime>
void apply_qk_fp8_dynamic_out(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                              const at::Tensor& sin, const at::Tensor& positions, bool interleaved,
                              bool per_token, bool pow2_scale,
                              at::OptionalIntArrayRef mrope_section, bool mrope_interleaved,
                              bool inverse, const at::Tensor& q_out, const at::Tensor& k_out,
                              const at::Tensor& q_scale_out, const at::Tensor& k_scale_out) {
  const typename Runtime::Guard guard(Runtime::device_of(q));
  const std::optional<at::Tensor> none;
  detail::apply_qk_fp8_dynamic_out_body<StreamsBackend<Runtime>>(
      {q, k, cos, sin, positions, none, none, none, none, {mrope_section, mrope_interleaved}},
      {q_out, k_out, at::Tensor(), at::Tensor()}, {q_scale_out, k_scale_out},
      RotationMode{interleaved, inverse}, per_token, pow2_scale);
}

template <typename Runtime>
void apply_qk_fp8_out(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                      const at::Tensor& sin, const at::Tensor& positions,
                      const std::optional<at::Tensor>& q_nope,
                      const std::optional<at::Tensor>& k_nope,
                      const std::optional<at::Tensor>& q_scale,
                      const std::optional<at::Tensor>& k_scale, bool interleaved,
                      bool multiply_by_scale, at::OptionalIntArrayRef mrope_section,
                      bool mrope_interleaved, bool inverse, const at::Tensor& q_out,
                      const at::Tensor& k_out, const std::optional<at::Tensor>& q_nope_out,
                      const std::optional<at::Tensor>& k_nope_out) {
  const typename Runtime::Guard guard(Runtime::device_of(q));
  detail::apply_qk_fp8_out_body<StreamsBackend<Runtime>>(
      {q,
       k,
       cos,
       sin,
       positions,
       q_nope,
       k_nope,
       q_scale,
       k_scale,
       {mrope_section, mrope_interleaved}},
      {q_out, k_out, q_nope_out.has_value() ? *q_nope_out : at::Tensor(),
       k_nope_out.has_value() ? *k_nope_out : at::Tensor()},
      RotationMode{interleaved, inverse}, multiply_by_scale);
}

template <typename Runtime>
std::tuple<at::Tensor, at::Tensor> mla_apply_cache(
    const at::Tensor& q_pe, const at::Tensor& k_pe, const at::Tensor& kv_c, const at::Tensor& cos,
    const at::Tensor& sin, const at::Tensor& positions, const at::Tensor& kv_cache,
    const std::optional<at::Tensor>& kpe_cache, const at::Tensor& slot_mapping,
    const std::optional<at::Tensor>& q_nope, const std::optional<at::Tensor>& v,
    const std::optional<at::Tensor>& v_cache, bool interleaved,
    const std::optional<at::Tensor>& kv_scale, const std::optional<at::Tensor>& v_scale,
    std::optional<at::ScalarType> q_dtype, const std::optional<at::Tensor>& q_scale,
    bool multiply_by_scale) {
  const typename Runtime::Guard guard(Runtime::device_of(q_pe));
  return detail::mla_apply_cache_body<StreamsBackend<Runtime>>(
      {q_pe, k_pe, kv_c, cos, sin, positions, kv_cache, kpe_cache, slot_mapping, q_nope, v, v_cache,
       kv_scale, v_scale, q_dtype, q_scale},
      interleaved, multiply_by_scale);
}

}  // namespace rope::cuda::glue
