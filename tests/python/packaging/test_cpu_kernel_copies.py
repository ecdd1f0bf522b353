# SPDX-License-Identifier: BSD-3-Clause
"""TORCH_ROPE_CPU_KERNELS=native (the demo's build): DEFAULT and the widest CPU kernel copy the
build machine runs, by the rule csrc/cpu/common_kernel_choice.cpp applies at run time to the
CPU's features (there through __builtin_cpu_supports, here from /proc/cpuinfo's flags)."""

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")

AVX2 = "fpu sse2 avx fma f16c avx2"
AVX512 = AVX2 + " avx512f avx512dq avx512bw avx512vl"


def widest(flags_line):
    script = (
        "cmake_minimum_required(VERSION 3.22)\n"
        f'include("{REPO}/cmake/TorchRopeCpuKernels.cmake")\n'
        f'torch_rope_widest_cpu_kernel(out "{flags_line}")\n'
        'message(STATUS "widest=${out}")\n'
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "check.cmake"
        path.write_text(script)
        done = subprocess.run(
            ["cmake", "-P", str(path)], capture_output=True, text=True, check=True
        )
    return done.stdout.split("widest=")[1].split()[0]


@pytest.mark.parametrize(
    "flags, expected",
    [
        ("flags\t\t: " + AVX512 + " avx512_bf16 avx512_vnni", "AVX512_BF16"),  # Zen 4
        ("flags\t\t: " + AVX512 + " avx512cd", "AVX512"),  # Skylake-SP: no bfloat16
        ("flags\t\t: " + AVX2 + " bmi2", "AVX2"),  # Zen 3
        ("flags\t\t: fpu sse2 avx avx2 f16c", "DEFAULT"),  # AVX2 without FMA: not the AVX2 copy
        # AVX-512 flags without AVX2's: the AVX512 copy is compiled with -mfma -mf16c.
        ("flags\t\t: fpu avx512f avx512dq avx512bw avx512vl avx512_bf16", "DEFAULT"),
        ("", "DEFAULT"),  # no /proc/cpuinfo
    ],
)
def test_widest_copy_from_the_cpu_flags(flags, expected):
    assert widest(flags) == expected


def test_flag_names_match_whole_words():
    # "avx2" must not be found inside another flag's name.
    assert widest("flags : fpu avx2x fma f16c") == "DEFAULT"
