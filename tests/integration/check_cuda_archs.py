# SPDX-License-Identifier: BSD-3-Clause
"""The CUDA architectures compiled into a librope, read from the binary, against those asked for.

    python tests/integration/check_cuda_archs.py LIB --expect "8.0"          # sm_80 code, no PTX
    python tests/integration/check_cuda_archs.py LIB --expect "7.5;9.0+PTX"  # +PTX: and its PTX
    python tests/integration/check_cuda_archs.py LIB --expect default        # CMakeLists.txt's
    python tests/integration/check_cuda_archs.py LIB --expect none           # no device code

--expect takes torch's form (TORCH_CUDA_ARCH_LIST, ";" or spaces); `default` is
TORCH_ROPE_DEFAULT_CUDA_ARCH_LIST of CMakeLists.txt. cuobjdump lists each CUDA translation unit's
machine code (--list-elf) and PTX (--list-ptx); every unit must hold exactly the architectures
asked for, so a launcher compiled for fewer, or more, fails too. Exits non-zero on a mismatch.
cuobjdump is $CUOBJDUMP, else the copy in triton's wheel next to torch (CUDA 13.0's toolkit here
has none), else PATH, else /usr/local/cuda/bin.
"""

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# "ELF file    3: rope_rotate_fp64.sm_90.cubin", "PTX file    1: rope_rotate_fp64.sm_90.ptx"
LISTED = re.compile(r"^(ELF|PTX) file\s+\d+: (.+)\.(sm_\d+[af]?)\.(?:cubin|ptx)$")


def default_list():
    text = (REPO / "CMakeLists.txt").read_text()
    return re.search(r'^set\(TORCH_ROPE_DEFAULT_CUDA_ARCH_LIST "([^"]*)"\)', text, re.M).group(1)


def expected_sets(expect):
    """(SASS architectures, PTX architectures) for torch's form of a list, e.g. "8.0;9.0+PTX"."""
    sass, ptx = set(), set()
    for entry in filter(None, expect.replace(" ", ";").split(";")):
        m = re.fullmatch(r"(\d+)\.(\d)([af]?)(\+PTX)?", entry)
        if not m:
            sys.exit(f"--expect: '{entry}' is not of torch's numeric form (e.g. 8.0 or 9.0+PTX)")
        arch = f"sm_{m.group(1)}{m.group(2)}{m.group(3)}"
        sass.add(arch)
        if m.group(4):
            ptx.add(arch)
    return sass, ptx


def arch_order(arches):
    """sm_75 before sm_100."""
    return sorted(arches, key=lambda a: (int(re.sub(r"\D", "", a)), a))


def find_cuobjdump():
    candidates = [os.environ.get("CUOBJDUMP")]
    spec = importlib.util.find_spec("triton")
    if spec is not None and spec.submodule_search_locations:
        candidates += [
            str(Path(root) / "backends" / "nvidia" / "bin" / "cuobjdump")
            for root in spec.submodule_search_locations
        ]
    candidates += [shutil.which("cuobjdump"), "/usr/local/cuda/bin/cuobjdump"]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return candidate
    sys.exit("no cuobjdump found (set CUOBJDUMP): the architectures cannot be read")


def listed(cuobjdump, lib, what):
    """{translation unit: architectures} of cuobjdump --list-elf / --list-ptx, and its output."""
    done = subprocess.run([cuobjdump, what, str(lib)], capture_output=True, text=True)
    units = defaultdict(set)
    for line in done.stdout.splitlines():
        m = LISTED.match(line.strip())
        if m:
            units[m.group(2)].add(m.group(3))
    return units, (done.stdout + done.stderr).strip()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("lib", type=Path)
    parser.add_argument("--expect", required=True)
    args = parser.parse_args()
    if not args.lib.is_file():
        sys.exit(f"{args.lib}: no such file")
    cuobjdump = find_cuobjdump()
    sass_units, sass_out = listed(cuobjdump, args.lib, "--list-elf")
    ptx_units, _ = listed(cuobjdump, args.lib, "--list-ptx")
    name = args.lib.name

    if args.expect == "none":
        if sass_units or ptx_units:
            print(f"FAILED: {name} holds device code, a CPU-only build should not:\n{sass_out}")
            return 1
        print(f"{name}: no device code, as asked (a CPU-only build; cuobjdump: {sass_out})")
        return 0

    asked = default_list() if args.expect == "default" else args.expect
    want_sass, want_ptx = expected_sets(asked)
    if not sass_units:
        print(f"FAILED: {name} holds no CUDA machine code; asked for {asked}\n{sass_out}")
        return 1
    # Units that hold the same wrong set, reported together.
    wrong = defaultdict(list)
    for unit in sorted(set(sass_units) | set(ptx_units)):
        got = (
            tuple(arch_order(sass_units.get(unit, ()))),
            tuple(arch_order(ptx_units.get(unit, ()))),
        )
        if got != (tuple(arch_order(want_sass)), tuple(arch_order(want_ptx))):
            wrong[got].append(unit)
    if wrong:
        print(
            f"FAILED: {name}, asked for {asked} (SASS {arch_order(want_sass)}, PTX "
            f"{arch_order(want_ptx)}), holds:"
        )
        for (sass, ptx), units in wrong.items():
            print(f"  SASS {list(sass)}, PTX {list(ptx)}: {', '.join(units)}")
        return 1
    print(
        f"{name}: {len(sass_units)} CUDA translation units, each with SASS "
        f"{', '.join(arch_order(want_sass))} and PTX {', '.join(arch_order(want_ptx)) or 'none'}: "
        f"as asked ({asked})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
