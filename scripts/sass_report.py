#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""What a GPU would show of the CUDA kernels, read from the machine code in CI.

For every kernel variant in the cubins (sm_75, sm_80, sm_90, sm_100, sm_120) of an object, a
shared library (librope.so) or a cubin, it lists the registers, the spills (stack / local
memory, STL / LDL instructions), the resident blocks per SM those registers allow on that arch
(and so the occupancy), and the widths of the global stores and loads. Accesses are attributed
to source lines through the line info that the build keeps (-lineinfo): the lines of
csrc/cuda/rope_kernel.cuh and of the device helpers it shares with the other kernels,
csrc/cuda/common_device.cuh, marked `// sass: vector store`, `// sass: vector load`,
`// sass: pair store`, `// sass: pair load`, `// sass: rotated store` and `// sass: tail store`.

    python scripts/sass_report.py [--check] [--markdown FILE] [--json FILE] [build/librope.so]

--check fails (exit 1) when
  - any variant spills (stack or local memory, STL / LDL instructions);
  - any store from the vector store (16 bytes of x) compiles to anything but STG.E.128, any
    load from the vector load to anything but LDG.E.128, or a vector variant has no 128-bit
    rotated store at all (the vector path optimised away);
  - any store from the pair store (two 16-bit elements of x) compiles to anything but a 32-bit
    STG.E, any load from the pair load to anything but a 32-bit LDG.E (not .U16, not merged),
    a bf16 / fp16 variant (vector or scalar-only: both carry the paired path) has no paired
    store or load, or a float / double variant has any;
  - any variant uses shared memory, barriers, shuffles or atomics: the host run of the kernel
    (tests/cuda_host) is faithful only without them;
  - a vector variant does not have a whole batch of 16-byte loads in flight before it stores:
    see "Loads in flight" below.
    Likewise for the 32-bit loads of the paired path in every bf16 / fp16 variant;
  - a kernel of the frequency form (rope_freqs_kernel) for 16- or 32-bit storage has any FP64
    instruction (arithmetic, compare or conversion): its angles are computed with integer and
    FP32 arithmetic only (csrc/common_exact_angle.h), since consumer and Blackwell GPUs run FP64
    at 1/64 of the FP32 rate; there must be such kernels at all.

Loads in flight. A thread of a vector variant reads kRowBatch rows (ROPE_CUDA_ROW_BATCH, 4 by
default; --row-batch) of 16 bytes, 32 half split, before it computes and stores any of them, so
that those loads overlap in memory; the half-split bf16 kernel runs at 25% occupancy and has no
other latency hiding. The rule reads the machine code in program order and counts, between two
global stores, the 128-bit loads of x by a rotating lane (LDG.E.128 attributed to the lines
marked `// sass: rotated load`; the line info of the 16-byte load itself varies); every
such run that ends at a rotated 128-bit store must hold the whole batch: kRowBatch loads
interleaved, 2 * kRowBatch half split. Stores are the right fence: x and out may alias
(rope.apply_), so no compiler may move a load of x past a store to out, and a kernel that
computes each row right after its load shows runs of 1 (2 half split) however it is scheduled.
Runs that end at a tail store (the copy lanes) are not counted.
Tuning defaults. The row batch the rule expects is written here (TUNED_ROW_BATCH), not read from
csrc/cuda/rope_launch_plan.h, and --check first compares the two (as --check-tuning HEADER does
alone, with no CUDA build): a default changed in the header fails the check, even where no SASS
can be read, until the change is made here too, with the GPU measurement that justifies it
(scripts/gpu_check.sh compares row batches). A variant build with another batch passes
--row-batch.
Exit 77 (a skip, for ctest) when there is no cuobjdump / nvdisasm or no CUDA code in the file.

The tools come from, in order: $CUOBJDUMP / $NVDISASM, --tool-dir, PATH, /usr/local/cuda/bin,
and the copies the triton wheel (a dependency of torch) ships in triton/backends/nvidia/bin (of
the triton this Python imports, or of the project's .venv).
"""

import argparse
import concurrent.futures
import functools
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SKIP = 77
REPO = Path(__file__).resolve().parent.parent
# The row batch (ROPE_CUDA_ROW_BATCH) the vector kernels are tuned for, and the default that
# csrc/cuda/rope_launch_plan.h must have: see "Tuning defaults" above.
TUNED_ROW_BATCH = 4
PLAN_HEADER = REPO / "csrc" / "cuda" / "rope_launch_plan.h"
# The sources whose marked lines attribute accesses: the kernel, and the shared device helpers
# that hold its 16-byte and paired loads and stores.
KERNEL_SOURCES = [
    REPO / "csrc" / "cuda" / "rope_kernel.cuh",
    REPO / "csrc" / "cuda" / "common_device.cuh",
    REPO / "csrc" / "cuda" / "common_stream_kernel.cuh",
]
MARKERS = {
    "vector": "// sass: vector store",
    "rotated": "// sass: rotated store",
    "tail": "// sass: tail store",
    "vector_load": "// sass: vector load",
    "rotated_load": "// sass: rotated load",
    "pair": "// sass: pair store",
    "pair_load": "// sass: pair load",
    "stream_load": "// sass: stream load",
    "stream_store": "// sass: stream store",
}
SIXTEEN_BIT = ("bf16", "fp16")
# Per SM, from the CUDA C++ Programming Guide's table of compute capabilities: 64K 32-bit
# registers everywhere, allocated per warp in units of 256; resident threads and blocks differ.
REGISTERS_PER_SM = 65536
SM_LIMITS = {  # arch: (max resident threads, max resident blocks)
    "sm_75": (1024, 16),
    "sm_80": (2048, 32),
    "sm_86": (1536, 16),
    "sm_89": (1536, 24),
    "sm_90": (2048, 32),
    "sm_100": (2048, 32),
    "sm_120": (1536, 32),
}
DEFAULT_LIMITS = (2048, 32)
BLOCK_THREADS = 256
STORAGE_NAMES = {"__nv_bfloat16": "bf16", "__half": "fp16", "float": "fp32", "double": "fp64"}


def triton_bin_dirs():
    """triton/backends/nvidia/bin of the triton this Python imports, and of the project's .venv."""
    dirs = []
    spec = importlib.util.find_spec("triton")
    if spec is not None and spec.submodule_search_locations:
        dirs += [
            Path(root) / "backends" / "nvidia" / "bin" for root in spec.submodule_search_locations
        ]
    dirs += sorted(REPO.glob(".venv/lib/python3*/site-packages/triton/backends/nvidia/bin"))
    return dirs


def find_tool(name, tool_dirs):
    env = os.environ.get(name.upper())
    if env and Path(env).is_file():
        return env
    for d in tool_dirs:
        if (Path(d) / name).is_file():
            return str(Path(d) / name)
    found = shutil.which(name)
    if found:
        return found
    for d in [Path("/usr/local/cuda/bin")] + triton_bin_dirs():
        if (d / name).is_file():
            return str(d / name)
    return None


def run(cmd, cwd=None):
    return subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True).stdout


def sm_limits(arch):
    """(max resident threads, max resident blocks) per SM of `arch` (sm_90a counts as sm_90)."""
    return SM_LIMITS.get(arch.rstrip("af"), DEFAULT_LIMITS)


def resident_blocks(registers, arch):
    """Blocks of 256 threads an SM of `arch` holds at `registers` per thread."""
    threads, max_blocks = sm_limits(arch)
    per_warp = -(-registers * 32 // 256) * 256
    warps = REGISTERS_PER_SM // per_warp
    by_registers = warps // (BLOCK_THREADS // 32)
    return max(0, min(by_registers, threads // BLOCK_THREADS, max_blocks))


def demangle(names):
    cxxfilt = shutil.which("c++filt")
    if not cxxfilt or not names:
        return {n: n for n in names}
    out = subprocess.run(
        [cxxfilt], input="\n".join(names), capture_output=True, text=True, check=True
    ).stdout.splitlines()
    return dict(zip(names, out))


# Double-precision SASS: arithmetic, compares, min/max, the 64-bit MUFU halves, and conversions
# from or to F64 (F2F.F64.F32, F2I.S32.F64, I2F.F64...). As
# tests/cuda_host/check_exact_angle_sass.py.
FP64 = re.compile(r"^(DADD|DMUL|DFMA|DSETP|DSET|DMNMX|DMMA)\b|\.F64\b|^MUFU\.\w+64H\b")


@functools.cache
def is_fp64(opcode):
    return FP64.search(opcode) is not None


def describe(demangled):
    """'bf16 / fp32 tables / interleaved / vector' from rope_kernel<__nv_bfloat16, float, true,
    true>, 'bf16 / freqs / ...' from rope_freqs_kernel<__nv_bfloat16, true, true>; the raw name
    for anything else."""
    f = re.search(r"rope_freqs_kernel<([^>]*)>", demangled)
    if f:
        args = [a.strip() for a in f.group(1).split(",")]
        if len(args) != 3:
            return demangled, None
        storage, interleaved, vector = args
        info = {
            "storage": STORAGE_NAMES.get(storage, storage),
            "tables": "freqs",
            "interleaved": interleaved == "true",
            "vector": vector == "true",
        }
        name = "{} / freqs / {} / {}".format(
            info["storage"],
            "interleaved" if info["interleaved"] else "half split",
            "vector" if info["vector"] else "scalar-only",
        )
        return name, info
    s = re.search(r"stream_kernel<([^>]*)>", demangled)
    if s:  # the serving fusions' row streams (common_stream_kernel.cuh)
        args = [a.strip() for a in s.group(1).split(",")]
        if len(args) != 2:
            return demangled, None
        storage, interleaved = args
        info = {
            "storage": STORAGE_NAMES.get(storage, storage),
            "tables": "fp32 or fp64",  # chosen at run time (angle_of)
            "interleaved": interleaved == "true",
            "streams": True,
        }
        name = "{} / {} / row streams".format(
            info["storage"], "interleaved" if info["interleaved"] else "half split"
        )
        return name, info
    m = re.search(r"rope_(packed_)?kernel<([^>]*)>", demangled)
    if not m:
        return demangled, None
    packed = m.group(1) is not None  # the tables with packed sequences (rope_packed_kernel)
    args = [a.strip() for a in m.group(2).split(",")]
    if len(args) != 4:
        return demangled, None
    storage, table, interleaved, vector = args
    info = {
        "storage": STORAGE_NAMES.get(storage, storage),
        "tables": STORAGE_NAMES.get(table, table),
        "interleaved": interleaved == "true",
        "vector": vector == "true",
        "packed": packed,
    }
    name = "{} / {} tables / {} / {}{}".format(
        info["storage"],
        info["tables"],
        "interleaved" if info["interleaved"] else "half split",
        "vector" if info["vector"] else "scalar-only",
        " / packed" if packed else "",
    )
    return name, info


def marker_lines(paths):
    """(file name, line number) of each marker in the kernel sources."""
    lines = {k: set() for k in MARKERS}
    for path in paths:
        try:
            text = Path(path).read_text().splitlines()
        except OSError:
            continue
        for number, line in enumerate(text, start=1):
            for kind, marker in MARKERS.items():
                if marker in line:
                    lines[kind].add((Path(path).name, number))
    return lines


LINE_INFO = re.compile(r'//## File "([^"]+)", line (\d+)(?: inlined at "([^"]+)", line (\d+))?')
INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")


def parse_sass(text):
    """{function: [(opcode, {(file, line), ...}), ...]} from `nvdisasm -gi` output.

    The line info before an instruction (a group of `//## File ...` lines, the instruction's own
    line and its inlining sites) applies to it and to the instructions after it, up to the next
    group. The big cubins repeat a few thousand distinct groups over a million lines, so each
    distinct group is parsed once."""
    functions = {}
    current = None
    chain = frozenset()
    group = []  # the line-info lines read since the last instruction
    parsed = {}  # group (tuple of its lines) -> chain
    for line in text.splitlines():
        if line.startswith(".text."):
            current = line[len(".text.") :].rstrip(":")
            functions[current] = []
            chain = frozenset()
            continue
        if "//## File" in line and LINE_INFO.search(line):
            group.append(line)
            continue
        m = INSTRUCTION.match(line)
        if m and current is not None:
            if group:
                key = tuple(group)
                chain = parsed.get(key)
                if chain is None:
                    chain = parsed[key] = chain_of(group)
                group = []
            functions[current].append((m.group(1), chain))
    return functions


def chain_of(group):
    """The (file name, line) pairs a group of line-info lines names."""
    chain = set()
    for line in group:
        m = LINE_INFO.search(line)
        chain.add((os.path.basename(m.group(1)), int(m.group(2))))
        if m.group(3):
            chain.add((os.path.basename(m.group(3)), int(m.group(4))))
    return frozenset(chain)


RES_FUNCTION = re.compile(r"Function ([^:\s]+):")
RES_VALUES = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")


def parse_resources(text):
    out = {}
    name = None
    for line in text.splitlines():
        m = RES_FUNCTION.search(line)
        if m:
            name = m.group(1)
            continue
        m = RES_VALUES.search(line)
        if m and name:
            reg, stack, shared, local = map(int, m.groups())
            out[name] = {"registers": reg, "stack": stack, "shared": shared, "local": local}
            name = None
    return out


@functools.cache
def width_of(opcode):
    m = re.search(r"\.(128|64|U16|S16|U8|S8)(?:\.|$)", opcode)
    if not m:
        return "32"
    return {"U16": "16", "S16": "16", "U8": "8", "S8": "8"}.get(m.group(1), m.group(1))


def loads_in_flight(instructions, markers, width="128", store="vector"):
    """Lengths of the runs of `width`-bit x loads that end at a rotated store from the `store`
    marker (see above): 128-bit ones at a vector store, or 32-bit ones at a pair store."""
    runs = []
    pending = 0
    for opcode, chain in instructions:
        base = opcode.split(".")[0]
        lines = chain  # (file name, line) of the instruction and of its inlining sites
        if base == "LDG" and width_of(opcode) == width and lines & markers["rotated_load"]:
            pending += 1
        elif base == "STG":
            if pending and lines & markers[store] and lines & markers["rotated"]:
                runs.append(pending)
            pending = 0
    # (No reset at EXIT: the disassembly drops predicates, and a predicated EXIT, the early
    # return of a bad position, sits between a batch's loads and its stores.)
    return runs


def analyse(cubin, arch, tools, markers):
    resources = parse_resources(run([tools["cuobjdump"], "-res-usage", str(cubin)]))
    functions = parse_sass(run([tools["nvdisasm"], "-gi", "-c", str(cubin)]))
    names = demangle(sorted(functions))
    rows = []
    for mangled, instructions in functions.items():
        res = resources.get(mangled, {})
        name, info = describe(names[mangled])
        stores = {"rotated_vector": {}, "tail_vector": {}, "pair": {}, "scalar": {}, "other": {}}
        loads = {}
        vector_loads = {}  # loads of x from the vector load (16 bytes)
        pair_loads = {}  # loads of x from the pair load (4 bytes)
        stream_loads, stream_stores = {}, {}  # the row streams' vector path (16 bytes)
        counts = {"spill": 0, "forbidden": [], "fp64": [], "butterflies": 0}
        for opcode, chain in instructions:
            base = opcode.split(".")[0]
            if is_fp64(opcode):
                counts["fp64"].append(opcode)
            if base in ("STL", "LDL"):
                counts["spill"] += 1
            # The host run models shuffles, barriers and block shared memory (its threads are
            # cooperative fibers), not atomics.
            if base in ("ATOM", "ATOMS", "ATOMG", "RED"):
                counts["forbidden"].append(opcode)
            if opcode.startswith("SHFL.BFLY"):
                counts["butterflies"] += 1
            if base == "LDG":
                w = width_of(opcode)
                loads[w] = loads.get(w, 0) + 1
                if chain & markers["vector_load"]:
                    vector_loads[w] = vector_loads.get(w, 0) + 1
                if chain & markers["pair_load"]:
                    pair_loads[w] = pair_loads.get(w, 0) + 1
                if chain & markers["stream_load"]:
                    stream_loads[w] = stream_loads.get(w, 0) + 1
            if base != "STG":
                continue
            lines = chain
            if lines & markers["stream_store"]:
                w = width_of(opcode)
                stream_stores[w] = stream_stores.get(w, 0) + 1
            if lines & markers["vector"]:
                kind = "rotated_vector" if lines & markers["rotated"] else "tail_vector"
            elif lines & markers["pair"]:
                kind = "pair"  # rotated or tail
            elif lines & (markers["rotated"] | markers["tail"]):
                kind = "scalar"
            else:
                kind = "other"
            w = width_of(opcode)
            stores[kind][w] = stores[kind].get(w, 0) + 1
        registers = res.get("registers", 0)
        blocks = resident_blocks(registers, arch) if registers else None
        in_flight = loads_in_flight(instructions, markers)
        pair_in_flight = loads_in_flight(instructions, markers, "32", "pair")
        rows.append(
            {
                "arch": arch,
                "kernel": name,
                "mangled": mangled,
                "variant": info,
                "registers": registers,
                "stack": res.get("stack", 0),
                "local": res.get("local", 0),
                "shared": res.get("shared", 0),
                "spill_instructions": counts["spill"],
                "resident_blocks": blocks,
                "occupancy": None
                if blocks is None
                else blocks * BLOCK_THREADS / sm_limits(arch)[0],
                "stores": stores,
                "loads": loads,
                "vector_loads": vector_loads,
                "pair_loads": pair_loads,
                "stream_loads": stream_loads,
                "stream_stores": stream_stores,
                "loads_in_flight": min(in_flight) if in_flight else None,
                "pair_loads_in_flight": min(pair_in_flight) if pair_in_flight else None,
                "forbidden": sorted(set(counts["forbidden"])),
                "butterflies": counts["butterflies"],
                "fp64": sorted(set(counts["fp64"])),
            }
        )
    return rows


def fmt_widths(d):
    if not d:
        return "-"
    return " ".join(f"{n}x{w}" for w, n in sorted(d.items(), key=lambda kv: -int(kv[0])))


def markdown(rows):
    out = []
    for arch in sorted({r["arch"] for r in rows}, key=lambda a: int(re.sub(r"\D", "", a) or 0)):
        out.append(f"#### {arch}\n")
        out.append(
            "| kernel (storage / tables / layout / variant) | regs | spills | blocks/SM "
            "(occupancy) | rotated stores, vector | tail stores, vector | paired stores / "
            "loads | stores, scalar path | other stores | global loads | x loads in flight "
            "(16-byte / paired) | FP64 instructions |"
        )
        out.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in sorted((r for r in rows if r["arch"] == arch), key=lambda r: r["kernel"]):
            spills = (
                f"{r['stack']}/{r['local']} B, {r['spill_instructions']} STL/LDL"
                if r["stack"] or r["local"] or r["spill_instructions"]
                else "none"
            )
            occ = (
                "?"
                if r["resident_blocks"] is None
                else f"{r['resident_blocks']} ({100 * r['occupancy']:.1f}%)"
            )
            s = r["stores"]
            out.append(
                f"| {r['kernel']} | {r['registers']} | {spills} | {occ} | "
                f"{fmt_widths(s['rotated_vector'])} | {fmt_widths(s['tail_vector'])} | "
                f"{fmt_widths(s['pair'])} / {fmt_widths(r['pair_loads'])} | "
                f"{fmt_widths(s['scalar'])} | {fmt_widths(s['other'])} | "
                f"{fmt_widths(r['loads'])} | {r['loads_in_flight'] or '-'} / "
                f"{r['pair_loads_in_flight'] or '-'} | {len(r['fp64']) or '-'} |"
            )
        out.append("")
    out.append(
        'Widths in bits, as `count x width`. "other stores" are stores the line info '
        'does not attribute to a marked line. "paired": the 4-byte accesses of two 16-bit '
        'elements (bf16 / fp16 only). "x loads in flight": the fewest 128-bit loads of x issued '
        "before a rotated 16-byte store (the rule of --check), and the fewest 32-bit ones before "
        "a rotated paired store."
    )
    return "\n".join(out)


def default_row_batch(header=PLAN_HEADER):
    """ROPE_CUDA_ROW_BATCH's default in the plan header (csrc/cuda/rope_launch_plan.h)."""
    m = re.search(r"#define ROPE_CUDA_ROW_BATCH (\d+)", Path(header).read_text())
    return int(m.group(1)) if m else None


def tuning_problems(header=PLAN_HEADER):
    """The header's tuning defaults against the values this check was written for."""
    got = default_row_batch(header)
    if got != TUNED_ROW_BATCH:
        return [
            f"{header}: ROPE_CUDA_ROW_BATCH defaults to {got}, the SASS rule expects "
            f"{TUNED_ROW_BATCH} (TUNED_ROW_BATCH in scripts/sass_report.py): a tuning default "
            "changed; change both, with the GPU measurement that justifies it"
        ]
    return []


def stream_problems(r, where):
    """The row streams' vector path: every access from its marked lines 16 bytes wide, and some
    of each in every variant (a path optimised away, or split into narrower accesses, fails); and
    the norm's fold across the row's half-warp as butterfly shuffles (8, 4, 2, 1: four at least)."""
    problems = []
    if r["butterflies"] < 4:
        problems.append(f"{where}: {r['butterflies']} SHFL.BFLY, the norm's fold needs 4 or more")
    for what, widths in (("loads", r["stream_loads"]), ("stores", r["stream_stores"])):
        narrow = {w: n for w, n in widths.items() if w != "128"}
        if narrow:
            problems.append(f"{where}: row-stream vector {what} narrower than 128 bits: "
                            f"{fmt_widths(narrow)}")  # fmt: skip
        if not widths.get("128"):
            problems.append(f"{where}: no 128-bit row-stream vector {what}")
    return problems


def check(rows, markers, row_batch):
    problems = []
    if not markers["vector"] or not markers["rotated"]:
        problems.append(
            f"no `{MARKERS['vector']}` / `{MARKERS['rotated']}` markers in "
            f"{', '.join(map(str, KERNEL_SOURCES))}"
        )
    attributed = sum(
        sum(r["stores"][k].values())
        for r in rows
        for k in ("rotated_vector", "tail_vector", "scalar")
    )
    if rows and attributed == 0:
        problems.append(
            "no store is attributed to a marked line: was the CUDA code built without -lineinfo?"
        )
    if rows and not any(r["variant"] and r["variant"]["tables"] == "freqs" for r in rows):
        problems.append("no frequency-form kernel (rope_freqs_kernel) in the machine code")
    if rows and not any(r["variant"] and r["variant"].get("streams") for r in rows):
        problems.append("no row-streams kernel (stream_kernel) in the machine code")
    for r in rows:
        where = f"{r['arch']} {r['kernel']}"
        if r["stack"] or r["local"] or r["spill_instructions"]:
            problems.append(
                f"{where}: spills ({r['stack']} B stack, {r['local']} B local, "
                f"{r['spill_instructions']} STL/LDL)"
            )
        if r["forbidden"]:
            problems.append(
                f"{where}: uses atomics ({', '.join(r['forbidden'])}); "
                "the host run of the kernel would no longer be faithful"
            )
        for kind in ("rotated_vector", "tail_vector"):
            narrow = {w: n for w, n in r["stores"][kind].items() if w != "128"}
            if narrow:
                problems.append(
                    f"{where}: {kind.replace('_', ' ')} data stored narrower than "
                    f"128 bits: {fmt_widths(narrow)}"
                )
        narrow = {w: n for w, n in r["vector_loads"].items() if w != "128"}
        if narrow:
            problems.append(
                f"{where}: vector loads of x narrower than 128 bits: {fmt_widths(narrow)}"
            )
        info = r["variant"]
        if info is not None and info.get("streams"):
            problems.extend(stream_problems(r, where))
            continue
        narrow = {w: n for w, n in r["stores"]["pair"].items() if w != "32"}
        narrow_loads = {w: n for w, n in r["pair_loads"].items() if w != "32"}
        if narrow or narrow_loads:
            problems.append(
                f"{where}: paired accesses not 32 bits wide: stores {fmt_widths(narrow)}, "
                f"loads {fmt_widths(narrow_loads)}"
            )
        if info is not None and info["storage"] in SIXTEEN_BIT:
            if not r["stores"]["pair"].get("32") or not r["pair_loads"].get("32"):
                problems.append(f"{where}: a 16-bit variant without 32-bit paired stores and loads")
            want = row_batch * (1 if info["interleaved"] else 2)
            got = r["pair_loads_in_flight"]
            if got is None or got < want:
                problems.append(
                    f"{where}: {got or 0} 32-bit paired loads of x in flight before a rotated "
                    f"paired store, expected the whole batch of {want} (kRowBatch {row_batch})"
                )
        elif info is not None and (r["stores"]["pair"] or r["pair_loads"]):
            problems.append(f"{where}: a {info['storage']} variant with paired accesses")
        if info is not None and info["tables"] == "freqs" and info["storage"] != "fp64":
            if r["fp64"]:
                problems.append(
                    f"{where}: FP64 instructions in a frequency-form kernel of "
                    f"{info['storage']} storage: {', '.join(r['fp64'][:8])}"
                )
        if info is not None and info["vector"] and not r["stores"]["rotated_vector"].get("128"):
            problems.append(f"{where}: a vector variant without a single 128-bit rotated store")
        if info is not None and not info["vector"] and r["stores"]["rotated_vector"]:
            problems.append(f"{where}: a scalar-only variant with vector rotated stores")
        if info is not None and info["vector"]:
            want = row_batch * (1 if info["interleaved"] else 2)
            got = r["loads_in_flight"]
            if got is None:
                problems.append(f"{where}: no run of 128-bit x loads ends at a rotated store")
            elif got < want:
                problems.append(
                    f"{where}: only {got} 128-bit loads of x in flight before a rotated store, "
                    f"expected the whole batch of {want} (kRowBatch {row_batch})"
                )
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "files", nargs="*", help="objects / librope.so / cubins (default: build/librope.so)"
    )
    parser.add_argument("--check", action="store_true", help="fail on the rules above")
    parser.add_argument("--markdown", help="write the table here too")
    parser.add_argument("--json", help="write every number here")
    parser.add_argument(
        "--tool-dir",
        action="append",
        default=[],
        help="look for cuobjdump / nvdisasm here first (repeatable)",
    )
    parser.add_argument(
        "--row-batch",
        type=int,
        default=None,
        help="rows a thread loads before it stores (ROPE_CUDA_ROW_BATCH of a variant build; "
        f"default: the tuned {TUNED_ROW_BATCH}, which rope_launch_plan.h must have)",
    )
    parser.add_argument(
        "--check-tuning",
        metavar="HEADER",
        help="only compare the tuning defaults of this plan header with the checked ones",
    )
    parser.add_argument(
        "--source",
        action="append",
        help="a kernel source whose marker lines attribute accesses (repeatable; default: "
        "rope_kernel.cuh and common_device.cuh)",
    )
    args = parser.parse_args()
    if args.check_tuning:
        problems = tuning_problems(args.check_tuning)
        print("\n".join(f"FAILED: {p}" for p in problems) or "PASSED: tuning defaults")
        return 1 if problems else 0
    if args.check and args.row_batch is None:
        problems = tuning_problems()
        if problems:
            print("\n".join(f"FAILED: {p}" for p in problems))
            return 1
    files = [Path(f) for f in args.files] or [REPO / "build" / "librope.so"]

    tools = {t: find_tool(t, args.tool_dir) for t in ("cuobjdump", "nvdisasm")}
    missing = [t for t, p in tools.items() if p is None]
    if missing:
        print(
            f"SKIPPED: {', '.join(missing)} not found ($CUOBJDUMP/$NVDISASM, --tool-dir, PATH, "
            "/usr/local/cuda/bin, triton/backends/nvidia/bin)"
        )
        return SKIP
    markers = marker_lines(args.source or KERNEL_SOURCES)
    rows = []
    for f in files:
        if not f.is_file():
            print(f"SKIPPED: {f} does not exist (not built?)")
            return SKIP
        with tempfile.TemporaryDirectory() as tmp:
            listed = subprocess.run(
                [tools["cuobjdump"], "-lelf", str(f.resolve())], capture_output=True, text=True
            )
            # cuobjdump fails ("does not contain device code") on a file without a fatbinary.
            if "ELF file" not in listed.stdout:
                print(f"SKIPPED: {f} holds no CUDA machine code (a CPU-only build)")
                return SKIP
            run([tools["cuobjdump"], "-xelf", "all", str(f.resolve())], cwd=tmp)
            cubins = sorted(Path(tmp).glob("*.cubin"))
            arches = [re.search(r"sm_\d+a?", c.name) for c in cubins]
            arches = [m.group(0) if m else c.name for m, c in zip(arches, cubins)]
            # One cubin per process: nvdisasm and the parsing of its output are most of the
            # check's time (about 3 minutes on one core for 60 cubins), and cubins are independent.
            with concurrent.futures.ProcessPoolExecutor(max_workers=os.cpu_count()) as pool:
                for found in pool.map(
                    analyse, cubins, arches, [tools] * len(cubins), [markers] * len(cubins)
                ):
                    rows += found
    rows = [r for r in rows if r["variant"] is not None or "rope" in r["mangled"]]
    print(f"SASS of {', '.join(map(str, files))} (cuobjdump: {tools['cuobjdump']})\n")
    table = markdown(rows)
    print(table)
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=sorted) + "\n")
    if args.check:
        row_batch = args.row_batch or TUNED_ROW_BATCH
        problems = check(rows, markers, row_batch)
        if problems:
            print("\nFAILED:")
            for p in problems:
                print(f"  {p}")
            return 1
        print(
            f"\nPASSED: {len(rows)} kernels, no spills, every vector store 128 bits wide, "
            f"every paired access 32 bits wide, a whole batch of loads in flight "
            f"(kRowBatch {row_batch}), no FP64 instruction in the 16/32-bit frequency-form kernels"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
