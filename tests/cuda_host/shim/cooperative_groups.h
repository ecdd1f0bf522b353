// SPDX-License-Identifier: BSD-3-Clause
// Host build of the CUDA kernel (tests/cuda_host): cooperative groups let threads synchronize and
// exchange data, which the serial launch of rope_host_shim.h cannot model.
#error "the host run of the CUDA kernel refuses cooperative groups: threads must stay independent"
