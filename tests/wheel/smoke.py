# SPDX-License-Identifier: BSD-3-Clause
"""Smoke test of an installed torch-rope wheel (run from a fresh virtual environment).

Checks: import registers the ops; the native module's stub (_C.pyi) and the PEP 561 marker
(py.typed) ship beside it; the op on CPU matches the shipped reference; the module works and keeps
float32 tables; the wheel carries the CMake package at torch_rope.cmake_prefix_path; the CUDA
kernels are in it, or not, as the caller built it (--cuda yes / no), by the library's own word and
by its CMake package's; with CUDA kernels and a GPU, the op on the GPU matches the CPU. (Which
architectures it holds, tests/integration/check_cuda_archs.py reads from the binary.) Prints the
prefix path last, for the caller to configure a C++ consumer against it.
"""

import argparse
import re
import sys
from pathlib import Path

import torch

import torch_rope


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cuda", choices=["yes", "no"], required=True)
    with_cuda = parser.parse_args().cuda == "yes"
    checks = {}
    checks["imported from site-packages, not the source tree"] = (
        "site-packages" in torch_rope.__file__
    )
    checks["torch.ops.rope.apply registered"] = hasattr(torch.ops.rope, "apply")
    checks["the native module's typed face (_C.pyi) shipped beside it"] = (
        Path(torch_rope.__file__).parent / "_C.pyi"
    ).is_file()
    checks["the PEP 561 marker (py.typed) shipped, so type checkers read its annotations"] = (
        Path(torch_rope.__file__).parent / "py.typed"
    ).is_file()

    cos, sin = torch_rope.rope_tables(10000.0, 64, 32)
    x = torch.randn(2, 4, 32, 64)
    positions = torch.arange(32)
    out = torch_rope.apply(x, cos, sin, positions, interleaved=False)
    ref = torch_rope.eager.apply(x, cos, sin, positions, interleaved=False)
    checks["op on CPU matches the reference"] = torch.allclose(out, ref, atol=1e-6)

    rope = torch_rope.RotaryPositionalEmbedding(10000.0, 64, 32).to(torch.bfloat16)
    checks["module runs, tables stay float32"] = (
        rope(x.bfloat16()).dtype == torch.bfloat16 and rope.cos.dtype == torch.float32
    )

    prefix = torch_rope.cmake_prefix_path
    checks["CMake package in the wheel"] = (
        prefix is not None and (Path(prefix) / "TorchRope" / "TorchRopeConfig.cmake").is_file()
    )

    word = "with" if with_cuda else "without"
    checks[f"built {word} CUDA kernels (compiled_with_cuda)"] = (
        torch_rope.compiled_with_cuda() == with_cuda
    )
    config = Path(prefix) / "TorchRope" / "TorchRopeConfig.cmake" if prefix else None
    text = config.read_text() if config is not None and config.is_file() else ""
    said = re.search(r"set\(TorchRope_WITH_CUDA (\w+)\)", text)
    checks[f"CMake package says {word} CUDA (TorchRope_WITH_CUDA)"] = said is not None and (
        said.group(1) == ("ON" if with_cuda else "OFF")
    )
    if with_cuda and torch.cuda.is_available():
        xc, cc, sc = x.cuda(), cos.cuda(), sin.cuda()
        on_gpu = torch_rope.apply(xc, cc, sc, positions.cuda(), interleaved=False).cpu()
        checks["op on the GPU matches the CPU"] = torch.allclose(on_gpu, out, atol=1e-5)

    failed = [name for name, ok in checks.items() if not ok]
    for name, ok in checks.items():
        print(f"  {name}: {'ok' if ok else 'FAILED'}")
    print(f"wheel smoke test: {len(checks) - len(failed)} passed, {len(failed)} failed")
    print(f"cmake_prefix_path={prefix}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
