// SPDX-License-Identifier: BSD-3-Clause
// Host build of the CUDA kernels (tests/cuda_host): cooperative groups (thread_block_tile,
// grid syncs, reductions) are a library over collectives the fibers do not all model (grid-wide
// barriers, __activemask's convergence). The kernels use the intrinsics (__shfl_xor_sync,
// __syncwarp, __syncthreads, ROPE_BLOCK_SHARED), which rope_host_fibers.h checks.
#error "the host run of the CUDA kernels refuses cooperative groups: use the warp intrinsics"
