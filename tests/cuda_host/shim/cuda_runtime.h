// SPDX-License-Identifier: BSD-3-Clause
// Host stand-in for the CUDA toolkit's cuda_runtime.h (tests/cuda_host only): see rope_host_shim.h.
#pragma once

#include "rope_host_shim.h"
