// SPDX-License-Identifier: BSD-3-Clause
// The CUDA ops' glue: which device is current during the call (the device guard), which stream
// the kernel goes on, and how a launch status becomes an error. Written once, as templates over a
// `Runtime` policy, so the same code runs in two places:
//   - rope_cuda.cu instantiates it with the real runtime (c10::cuda::OptionalCUDAGuard,
//     at::cuda::getCurrentCUDAStream, the device's SM count, C10_CUDA_CHECK);
//   - the host run of the kernel (tests/cuda_host/host_backend.cpp) instantiates it with a
//     simulated runtime that gives every device its own current stream and records the device and
//     stream of each launch, so dropping the guard, or launching on the default stream, fails a
//     test on a machine without a GPU.
// Keep every decision here; the Runtime's members are one-liners with no choice in them.
//
// A Runtime provides:
//   using Guard;   // RAII: constructed from std::optional<c10::Device>, sets that device current
//   using Stream;  // cudaStream_t
//   static std::optional<c10::Device> device_of(const at::Tensor&);  // the CUDA device of t
//   static Stream current_stream();        // the current stream of the *current* device
//   static int multiprocessor_count();     // of the current device
//   static int launch(c10::ScalarType, const RotationArgs& first, const RotationArgs* second,
//                     const TableArgs&, RotationMode, int num_sms, Stream);  // a cudaError_t
//   static void check(int status);         // throws on a failed launch
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

#include "rope_body.h"  // csrc/ is on the include path of every user

namespace rope::cuda::glue {

// One launch for `first` and, if given, `second` (apply_qk), on the current stream of the current
// device, which the op's guard made x's (q's) device. Nothing here synchronizes.
template <typename Runtime>
void launch(c10::ScalarType dtype, const RotationArgs& first, const RotationArgs* second,
            const TableArgs& tables, RotationMode mode) {
  // Both asked after the guard set the device: the current stream is per device, and a stream of
  // another device (or the legacy default stream) would not be ordered after x's producer.
  const int num_sms = Runtime::multiprocessor_count();
  const typename Runtime::Stream stream = Runtime::current_stream();
  Runtime::check(Runtime::launch(dtype, first, second, tables, mode, num_sms, stream));
}

template <typename Runtime>
struct Backend {
  // The range of positions is checked inside the kernel (a device assert): a host-side check
  // would read positions back and synchronize with the device on every call.
  static void check_positions(const char* /*op*/, const at::Tensor& /*positions*/,
                              int64_t /*max_seq_len*/, const detail::MultiAxisArgs& /*axes*/) {}
  static void rotate(c10::ScalarType dtype, const RotationArgs& args, const TableArgs& tables,
                     RotationMode mode) {
    launch<Runtime>(dtype, args, nullptr, tables, mode);
  }
  static void rotate_pair(c10::ScalarType dtype, const RotationArgs& q, const RotationArgs& k,
                          const TableArgs& tables, RotationMode mode) {
    launch<Runtime>(dtype, q, &k, tables, mode);
  }
};

// The ops: x's (q's) device is current for the whole body, allocation included, so the output is
// allocated there and the launch goes to that device's current stream. When only cos or positions
// is on the GPU there is no guard to set, and the op body reports the device mismatch.
template <typename Runtime>
at::Tensor apply(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                 const at::Tensor& positions, bool interleaved, bool inverse,
                 at::OptionalIntArrayRef mrope_section, bool mrope_interleaved) {
  const typename Runtime::Guard guard(Runtime::device_of(x));
  return detail::apply_body<Backend<Runtime>>(x, cos, sin, positions, interleaved, inverse,
                                              {mrope_section, mrope_interleaved});
}

template <typename Runtime>
void apply_inplace(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                   const at::Tensor& positions, bool interleaved, bool inverse,
                   at::OptionalIntArrayRef mrope_section, bool mrope_interleaved) {
  const typename Runtime::Guard guard(Runtime::device_of(x));
  detail::apply_inplace_body<Backend<Runtime>>(x, cos, sin, positions, interleaved, inverse,
                                               {mrope_section, mrope_interleaved});
}

template <typename Runtime>
void apply_out(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
               const at::Tensor& positions, bool interleaved, bool inverse,
               at::OptionalIntArrayRef mrope_section, bool mrope_interleaved,
               const at::Tensor& out) {
  const typename Runtime::Guard guard(Runtime::device_of(x));
  detail::apply_out_body<Backend<Runtime>>(x, cos, sin, positions, interleaved, inverse,
                                           {mrope_section, mrope_interleaved}, out);
}

template <typename Runtime>
std::tuple<at::Tensor, at::Tensor> apply_qk(const at::Tensor& q, const at::Tensor& k,
                                            const at::Tensor& cos, const at::Tensor& sin,
                                            const at::Tensor& positions, bool interleaved,
                                            bool inverse, at::OptionalIntArrayRef mrope_section,
                                            bool mrope_interleaved) {
  const typename Runtime::Guard guard(Runtime::device_of(q));
  return detail::apply_qk_body<Backend<Runtime>>(q, k, cos, sin, positions, interleaved, inverse,
                                                 {mrope_section, mrope_interleaved});
}

}  // namespace rope::cuda::glue
