#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""No FP64 instruction in the device code of csrc/common_exact_angle.h.

Reads the machine code (every architecture) of exact_angle_device.cu's build, which holds the
table-free angle kernel (exact_angle_kernel.cuh: reduction, turn, FP32 cos / sin, rotation), and
fails on any double-precision instruction: consumer and Blackwell GPUs run FP64 at 1/64 of the
FP32 rate, and the float path promises none. Also fails on shared memory, barriers, shuffles and
atomics, which the host run (exact_angle_host.cpp) could not model.

    python tests/cuda_host/check_exact_angle_sass.py build/tests/cuda_host/libexact_angle_device.a

Exit 77 (a skip, for ctest) without cuobjdump. The tool is found as scripts/sass_report.py finds
it ($CUOBJDUMP, PATH, /usr/local/cuda/bin, the triton wheel's copy).
"""

import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "scripts"))
from sass_report import find_tool  # noqa: E402

SKIP = 77
# Double-precision SASS: arithmetic, compares, min/max, the 64-bit MUFU halves, and conversions
# from or to F64 (F2F.F64.F32, F2I.S32.F64, I2F.F64...).
FP64 = re.compile(r"^(DADD|DMUL|DFMA|DSETP|DSET|DMNMX|DMMA)\b|\.F64\b|^MUFU\.\w+64H\b")
FORBIDDEN = re.compile(r"^(LDS|STS|ATOMS|BAR|SHFL|VOTE|ATOM|RED|MATCH|REDUX)\b")
INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    tool = find_tool("cuobjdump", [])
    if tool is None:
        print("no cuobjdump: skipped")
        return SKIP
    sass = subprocess.run(
        [tool, "-sass", sys.argv[1]], check=True, capture_output=True, text=True
    ).stdout
    kernels = 0
    counts = {}
    bad = []
    arch = "?"
    for line in sass.splitlines():
        m = re.search(r"arch = (sm_\d+)", line)
        if m:
            arch = m.group(1)
        if "Function :" in line and "exact_angle_kernel" in line:
            kernels += 1
        m = INSTRUCTION.search(line)
        if not m:
            continue
        opcode = m.group(1)
        counts[arch] = counts.get(arch, 0) + 1
        if FP64.search(opcode) or FORBIDDEN.search(opcode):
            bad.append(f"{arch}: {line.strip()}")
    if kernels == 0:
        print(f"no exact_angle_kernel in {sys.argv[1]}")
        return 1
    for a, n in sorted(counts.items()):
        print(f"{a}: {n} instructions")
    if bad:
        print(
            f"{len(bad)} forbidden instructions (FP64, shared memory, barriers, shuffles, atomics):"
        )
        print("\n".join(bad[:40]))
        return 1
    print(f"exact_angle_kernel: {kernels} architectures, no FP64 instruction")
    return 0


if __name__ == "__main__":
    sys.exit(main())
