// SPDX-License-Identifier: BSD-3-Clause
// Which copies of the CPU row kernels this build holds. Every one, unless CMake was told to
// build only DEFAULT and the widest copy the build machine runs (TORCH_ROPE_CPU_KERNELS=native,
// cmake/TorchRopeCpuKernels.cmake, as scripts/demo.sh does): it then defines
// TORCH_ROPE_CPU_WITHOUT_<copy> for each copy left out, and the dispatch steps down past them.
#pragma once

#if defined(TORCH_ROPE_CPU_X86_DISPATCH) && !defined(TORCH_ROPE_CPU_WITHOUT_AVX2)
#define ROPE_CPU_HAS_AVX2 1
#else
#define ROPE_CPU_HAS_AVX2 0
#endif

#if defined(TORCH_ROPE_CPU_X86_DISPATCH) && !defined(TORCH_ROPE_CPU_WITHOUT_AVX512)
#define ROPE_CPU_HAS_AVX512 1
#else
#define ROPE_CPU_HAS_AVX512 0
#endif

#if defined(TORCH_ROPE_CPU_X86_DISPATCH) && !defined(TORCH_ROPE_CPU_WITHOUT_AVX512_BF16)
#define ROPE_CPU_HAS_AVX512_BF16 1
#else
#define ROPE_CPU_HAS_AVX512_BF16 0
#endif
