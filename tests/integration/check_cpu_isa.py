# SPDX-License-Identifier: BSD-3-Clause
"""Reads librope's x86 machine code: no function outside a CPU copy's namespace uses AVX or AVX-512.

librope holds its CPU row kernels once per instruction set (DEFAULT, AVX2, AVX512,
AVX512_BF16), each compiled with its own flags into its own ``CPU_CAPABILITY`` namespace, and
picks one at run time. An inline function that lives outside those namespaces (a header's class,
c10's string helpers, a standard-library template) is emitted by every copy that uses it, and the
linker keeps one of the definitions: if it keeps the AVX-512 copy's, the AVX2 and DEFAULT kernels
call AVX-512 code and die with SIGILL on an AVX2-only CPU (Zen 2 / Zen 3). That bug shipped once
(``rope::cpu::RowCursor``) and every machine the tests ran on had AVX-512, so no test saw it.

The rule read here, per global or weak function of the disassembly (a local one, such as the
compiler's ``[clone .cold]`` parts of a copy's functions, is never merged across translation
units, so only its own copy reaches it):
- a function whose name mentions AVX512 may hold any instruction;
- one whose name mentions AVX2 (and not AVX512) may hold VEX instructions, never EVEX (AVX-512);
- every other function holds neither.
An instruction's encoding is read from its bytes (after the legacy prefixes): 0x62 starts an EVEX
instruction and 0xC4 / 0xC5 a VEX one in 64-bit code, so no mnemonic list can go stale.

    python tests/integration/check_cpu_isa.py build/librope.so
Exit 0: clean; 1: a leak (each offending function named with its first offending instruction);
77: not an x86-64 library or objdump missing (ctest reports it as skipped).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

_LEGACY_PREFIXES = {0x66, 0x67, 0xF2, 0xF3, 0x2E, 0x3E, 0x26, 0x64, 0x65, 0x36, 0xF0}
_FUNCTION = re.compile(r"^([0-9a-f]+) <(.*)>:$")
# "  4011d6:\t62 f1 7c 48 10 00 \tvmovups (%rax),%zmm0"; continuation lines have no third field.
_INSTRUCTION = re.compile(r"^\s*[0-9a-f]+:\t([0-9a-f ]+)\t(.*)$")


def encoding(raw: str) -> str:
    """'evex', 'vex' or 'legacy', from an instruction's hex bytes."""
    for byte in (int(b, 16) for b in raw.split()):
        if byte in _LEGACY_PREFIXES:
            continue
        if byte == 0x62:
            return "evex"
        if byte in (0xC4, 0xC5):
            return "vex"
        return "legacy"
    return "legacy"


def allowed(function: str) -> set[str]:
    if "AVX512" in function:
        return {"legacy", "vex", "evex"}
    if "AVX2" in function:
        return {"legacy", "vex"}
    return {"legacy"}


def linked_addresses(symbols: str) -> set[int]:
    """Addresses of the global and weak functions in `nm --defined-only` output."""
    linked = set()
    for line in symbols.splitlines():
        fields = line.split(maxsplit=2)
        if len(fields) == 3 and fields[1] in ("T", "W"):
            linked.add(int(fields[0], 16))
    return linked


def leaks(disassembly: str, linked: set[int]) -> dict[str, str]:
    """Offending function -> its first offending instruction, over the functions at `linked`."""
    found: dict[str, str] = {}
    function = ""
    checked = False
    permitted = allowed("")
    for line in disassembly.splitlines():
        head = _FUNCTION.match(line)
        if head:
            function = head.group(2)
            checked = int(head.group(1), 16) in linked
            permitted = allowed(function)
            continue
        ins = _INSTRUCTION.match(line)
        if ins is None or not checked or function in found:
            continue
        kind = encoding(ins.group(1))
        if kind not in permitted:
            found[function] = f"{kind.upper()}: {ins.group(2).strip()}"
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__)
        return 2
    library = argv[1]
    objdump = shutil.which("objdump")
    if objdump is None or shutil.which("nm") is None:
        print("SKIPPED: objdump or nm not found (binutils)")
        return 77
    header = subprocess.run([objdump, "-f", library], capture_output=True, text=True, check=True)
    if "x86-64" not in header.stdout:
        print(f"SKIPPED: {library} is not an x86-64 library")
        return 77
    text = subprocess.run(
        [objdump, "-d", "-C", "--section=.text", library],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    symbols = subprocess.run(
        ["nm", "--defined-only", library], capture_output=True, text=True, check=True
    ).stdout
    linked = linked_addresses(symbols)
    functions = sum(
        1 for m in map(_FUNCTION.match, text.splitlines()) if m and int(m.group(1), 16) in linked
    )
    if functions == 0:
        print(f"FAIL: no global function read from {library}'s .text (objdump's format changed?)")
        return 1
    found = leaks(text, linked)
    if found:
        print(
            f"FAIL: {len(found)} function(s) of {library} outside the CPU copies' namespaces "
            "use a wider instruction set than the baseline (see this script's docstring):"
        )
        for name, instruction in sorted(found.items()):
            print(f"  {name}\n      {instruction}")
        return 1
    print(f"ok: {functions} global and weak functions of {library}: no AVX outside the CPU copies")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
