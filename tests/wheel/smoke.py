# SPDX-License-Identifier: BSD-3-Clause
"""Smoke test of an installed torch-rope wheel (run from a fresh virtual environment).

Checks: import registers the ops; the op on CPU matches the shipped reference; the module works
and keeps float32 tables; the wheel carries the CMake package at torch_rope.cmake_prefix_path.
Prints the prefix path last, for the caller to configure a C++ consumer against it.
"""

import sys
from pathlib import Path

import torch

import torch_rope


def main() -> int:
    checks = {}
    checks["imported from site-packages, not the source tree"] = (
        "site-packages" in torch_rope.__file__
    )
    checks["torch.ops.rope.apply registered"] = hasattr(torch.ops.rope, "apply")

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

    failed = [name for name, ok in checks.items() if not ok]
    for name, ok in checks.items():
        print(f"  {name}: {'ok' if ok else 'FAILED'}")
    print(f"wheel smoke test: {len(checks) - len(failed)} passed, {len(failed)} failed")
    print(f"cmake_prefix_path={prefix}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
