#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""The device code of csrc/common_exact_angle.h computes the bits the host run checks: nvcc
contracts a product and a following sum into one FMA by default (--fmad=true), which rounds once
where the host run (built with -ffp-contract=off) rounds twice. The angle core therefore writes
every product whose rounding matters as __fmul_rn / __fmaf_rn (never contracted); this check holds
it to that: the same translation unit (exact_angle_device.cu) compiled with --fmad=true and with
--fmad=false must give the same machine code, instruction for instruction, on every
architecture. A product left to the compiler shows as an FFMA in the first where the second has an
FMUL and an FADD.

    python tests/cuda_host/check_no_contraction.py libexact_angle_device.a \\
        libexact_angle_device_nofma.a

Exit 77 (a skip, for ctest) without cuobjdump (found as scripts/sass_report.py finds it).
"""

import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "scripts"))
from sass_report import find_tool  # noqa: E402

SKIP = 77
INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+([^;]*);")


def instructions(tool, path):
    """{(arch, function): [instruction text without its address]} of an object or archive."""
    sass = subprocess.run([tool, "-sass", path], check=True, capture_output=True, text=True).stdout
    out = {}
    arch = "?"
    function = None
    for line in sass.splitlines():
        m = re.search(r"arch = (sm_\d+)", line)
        if m:
            arch = m.group(1)
        m = re.search(r"Function : (\S+)", line)
        if m:
            function = m.group(1)
            out[(arch, function)] = []
            continue
        m = INSTRUCTION.search(line)
        if m and function is not None:
            out[(arch, function)].append(" ".join(m.group(1).split()))
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    tool = find_tool("cuobjdump", [])
    if tool is None:
        print("no cuobjdump: skipped")
        return SKIP
    fused = instructions(tool, sys.argv[1])
    unfused = instructions(tool, sys.argv[2])
    if not fused or set(fused) != set(unfused):
        print(f"the two builds hold different kernels: {sorted(fused)} and {sorted(unfused)}")
        return 1
    failed = 0
    for key in sorted(fused):
        a, b = fused[key], unfused[key]
        if a == b:
            print(f"{key[0]} {key[1]}: {len(a)} instructions, the same with --fmad=false")
            continue
        failed += 1
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        ffma = sum(x.startswith("FFMA") for x in a) - sum(x.startswith("FFMA") for x in b)
        print(
            f"{key[0]} {key[1]}: the machine code differs with --fmad=false ({len(a)} and {len(b)} "
            f"instructions, {ffma:+d} FFMA): nvcc contracted a product and a sum that the host "
            f"run rounds apart. First difference at instruction {first}:\n"
            f"  --fmad=true : {a[first] if first < len(a) else '(end)'}\n"
            f"  --fmad=false: {b[first] if first < len(b) else '(end)'}"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
