# SPDX-License-Identifier: BSD-3-Clause
"""What nvcc compiles: kernels and their launchers only, never torch's headers.

On the first GPU run (H100, torch 2.11, nvcc 13.0 with GCC 13), every exception a CUDA op raised
from glue compiled by nvcc killed the process (SIGSEGV); the same errors from the CPU glue, plain
C++, were raised as they should be. So the glue of the CUDA ops is plain C++ (csrc/cuda/*_cuda.cpp)
and calls the launchers through csrc/cuda/common_launchers.h; these checks keep it that way
(no GPU needed: they read the sources).
"""

import re
from pathlib import Path

CUDA_DIR = Path(__file__).resolve().parents[3] / "csrc" / "cuda"
# c10's macros header only (CUDA_KERNEL_ASSERT): no ATen, torch or c10 types in device code TUs.
ALLOWED_TORCH_INCLUDES = {"c10/macros/Macros.h"}
TORCH_INCLUDE = re.compile(r'#include\s*[<"]((?:ATen|torch|c10|caffe2)/[^>"]+)[>"]')
LOCAL_INCLUDE = re.compile(r'#include\s*"([^"]+)"')


def nvcc_sources():
    return (
        sorted(CUDA_DIR.glob("*.cu"))
        + sorted(CUDA_DIR.glob("*.cuh"))
        + sorted(CUDA_DIR.glob("*.cu.in"))
    )


def includes_of(path: Path, seen=None):
    """Every torch include reached from `path` through local includes (transitively)."""
    seen = set() if seen is None else seen
    found = set()
    if path in seen or not path.exists():
        return found
    seen.add(path)
    text = path.read_text()
    found |= set(TORCH_INCLUDE.findall(text))
    for name in LOCAL_INCLUDE.findall(text):
        if "@" in name:  # a CMake placeholder of the generated instance file
            continue
        found |= includes_of((path.parent / name).resolve(), seen)
    return found


def test_the_glue_of_every_cuda_op_is_plain_cpp():
    assert not list(CUDA_DIR.glob("*.cu")), "glue in a .cu goes through nvcc: make it a .cpp"
    glue = sorted(p.name for p in CUDA_DIR.glob("*_cuda.cpp"))
    assert glue == [
        "kv_cache_cuda.cpp",
        "mla_cuda.cpp",
        "qk_fp8_cuda.cpp",
        "rms_norm_cuda.cpp",
        "rope_cuda.cpp",
    ], glue
    for path in CUDA_DIR.glob("*_cuda.cpp"):
        text = path.read_text()
        # The launchers' declarations, directly or through the row streams' runtime.
        assert (
            '#include "common_launchers.h"' in text or '#include "common_stream_runtime.h"' in text
        ), path.name
        assert not any(n.endswith(".cuh") for n in LOCAL_INCLUDE.findall(text)), path.name


def test_nothing_nvcc_compiles_includes_torch_headers():
    sources = nvcc_sources()
    assert any(p.name == "common_kernel_instance.cu.in" for p in sources)
    for path in sources:
        torch_includes = includes_of(path) - ALLOWED_TORCH_INCLUDES
        assert not torch_includes, f"{path.name} reaches {sorted(torch_includes)}"
