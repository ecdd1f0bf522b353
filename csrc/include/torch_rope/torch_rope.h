// SPDX-License-Identifier: BSD-3-Clause
// torch-rope: everything a LibTorch user needs, in one include.
#pragma once

#include <torch_rope/module.h>
#include <torch_rope/ops.h>
