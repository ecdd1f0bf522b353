# SPDX-License-Identifier: BSD-3-Clause
"""Every CPU vector path (DEFAULT, AVX2, AVX512) against the oracle, and the kernel choice under
every capability setting.

The library picks its CPU kernel once per process: the widest instruction set that the CPU
supports and at::get_cpu_capability() (which honours ATEN_CPU_CAPABILITY) allows. So each path
needs its own interpreter. What the CPU supports is read here from /proc/cpuinfo, independently of
the library.

torch trusts ATEN_CPU_CAPABILITY without looking at the CPU: under ``avx512`` on an AVX2-only CPU,
torch's own AVX-512 code dies of SIGILL at its first vectorised op. So a capability the CPU lacks
gets only the kernel-choice check, in a child that imports torch_rope and runs no torch math (the
library must fall back to what the CPU has); the numeric check runs only for capabilities the CPU
has, and the others are skipped naming the missing /proc/cpuinfo flags.
"""

import pytest
import torch
from helpers import cpu_flags, missing_cpu_flags, run_python

CHECK_SCRIPT = r"""
import sys
import torch
import torch_rope
from helpers import FLOAT_DTYPES, LAYOUTS, assert_matches_reference, make_tables, randn
from helpers import table_dtype_for

print("capability", torch.backends.cpu.get_cpu_capability())
print("kernel", torch_rope._C.cpu_kernel_isa())
checks = 0
for dtype in FLOAT_DTYPES:
    for interleaved in LAYOUTS:
        # 1, 3, 17, 24 and 64 planes: vector widths 8 and 16, their tails, a pass-through tail;
        # then each rotary dim with its own compiled copy (rotate_rows_sized: 32, 64, 80, 96, 128,
        # 256), with and without pass-through features.
        for head_dim, rotary_dim in [(2, 2), (10, 6), (34, 34), (80, 48), (130, 128), (64, 32),
                                     (64, 64), (96, 80), (96, 96), (256, 256)]:
            cos, sin = make_tables(64, rotary_dim, "cpu", table_dtype_for(dtype))
            rows_shape = (2, 3, 7)
            x = randn(*rows_shape, head_dim, dtype=dtype)
            positions = torch.randint(0, 64, rows_shape)
            for inverse in (False, True):
                kw = dict(interleaved=interleaved, inverse=inverse)
                out = torch_rope.apply(x, cos, sin, positions, **kw)
                assert_matches_reference(out, x, positions, rotary_dim, **kw)
                y = x.clone()
                torch_rope.apply_(y, cos, sin, positions, **kw)
                assert torch.equal(y, out)
                q, k = torch_rope.apply_qk(x, x[..., :1, :], cos, sin, positions[..., :1],
                                           **kw)
                assert_matches_reference(k, x[..., :1, :], positions[..., :1], rotary_dim,
                                         **kw)
                checks += 3
            # A strided input (a slice of a wider row).
            wide = randn(5, 2 * head_dim + 3, dtype=dtype)
            x = wide[:, 3 : head_dim + 3]
            positions = torch.randint(0, 64, (5,))
            out = torch_rope.apply(x, cos, sin, positions, interleaved=interleaved)
            assert_matches_reference(out, x, positions, rotary_dim, interleaved=interleaved)
            checks += 1
# rope.rms_norm_apply_qk's copy of this capability (the row streams, common_stream_rows.cpp): each
# row normalised over
# head_dim in float64 here, then rotated by the oracle. 33 rows: blocks of 8 rows and a tail.
from helpers import TOLERANCES, expected
for dtype in FLOAT_DTYPES:
    for interleaved in LAYOUTS:
        for head_dim, rotary_dim in [(16, 16), (64, 64), (128, 128), (256, 256), (80, 48),
                                     (128, 64)]:
            cos, sin = make_tables(64, rotary_dim, "cpu", table_dtype_for(dtype))
            # 11 tokens at different positions, 3 q heads and 1 k head each: a block of 8 rows
            # spans several positions.
            q = randn(11, 3, head_dim, dtype=dtype)
            k = randn(11, 1, head_dim, dtype=dtype)
            wq = randn(head_dim) * 0.5 + 1.0
            wk = randn(head_dim, dtype=dtype)
            positions = torch.randperm(64)[:11].unsqueeze(-1)
            for offset, inverse in ((0.0, False), (1.0, True)):
                kw = dict(interleaved=interleaved, inverse=inverse)
                q_out, k_out = torch_rope.rms_norm_apply_qk(
                    q, k, wq, wk, cos, sin, positions, eps=1e-5, weight_offset=offset, **kw
                )
                for out, x, w in ((q_out, q, wq), (k_out, k, wk)):
                    xd = x.double()
                    normed = xd * torch.rsqrt(xd.square().mean(-1, keepdim=True) + 1e-5)
                    normed = normed * (w.double() + offset)
                    want = expected(normed, positions, rotary_dim, **kw)
                    torch.testing.assert_close(out, want.to(dtype), **TOLERANCES[dtype])
                checks += 2
print("checks", checks)
"""


# Imports the library and asks which copy it chose; not one torch op runs (see the docstring).
CHOICE_SCRIPT = r"""
import torch_rope
print("kernel", torch_rope._C.cpu_kernel_isa())
"""

# The capability strings torch accepts, narrowest first. Each admits the kernel copies up to its
# own name (torch's "avx512" admits both AVX-512 copies; cpu_kernel_isa() names both "AVX512").
CAPABILITIES = ["default", "avx2", "avx512"]


def _run_child(script, capability):
    return run_python(
        script, with_test_modules=True, ATEN_CPU_CAPABILITY=capability, OMP_NUM_THREADS="2"
    )


def expected_kernel(requested, flags):
    """The kernel the library must run (as cpu_kernel_isa() names it, lower case): the widest
    copy up to ``requested`` whose flags the CPU has."""
    best = "default"
    for name in CAPABILITIES[: CAPABILITIES.index(requested) + 1]:
        if not missing_cpu_flags(name, flags):
            best = name
    return best


def _x86_flags_or_skip():
    flags = cpu_flags()
    if flags is None or "sse2" not in flags:
        pytest.skip("not an x86 CPU with /proc/cpuinfo: only the DEFAULT kernel is built")
    return flags


# /proc/cpuinfo flag lines of the two kinds of machine this project runs on (abridged to the
# flags that matter here): an AMD EPYC Zen 3 (AVX2 only) and an Intel Sapphire Rapids.
ZEN3_FLAGS = {"sse2", "avx", "avx2", "fma", "f16c", "bmi2"}
SAPPHIRE_RAPIDS_FLAGS = ZEN3_FLAGS | {
    "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd", "avx512_bf16",
}  # fmt: skip


@pytest.mark.parametrize(
    "flags,requested,want,numeric",
    [
        (ZEN3_FLAGS, "default", "default", True),
        (ZEN3_FLAGS, "avx2", "avx2", True),
        # The failing case of an outside review: the numeric check must not run here.
        (ZEN3_FLAGS, "avx512", "avx2", False),
        (SAPPHIRE_RAPIDS_FLAGS, "avx512", "avx512", True),
        (SAPPHIRE_RAPIDS_FLAGS, "avx2", "avx2", True),
        (SAPPHIRE_RAPIDS_FLAGS - {"avx512bw"}, "avx512", "avx2", False),
        ({"sse2"}, "avx2", "default", False),
        (set(), "avx512", "default", False),
    ],
)
def test_expected_kernel_rule(flags, requested, want, numeric):
    """The rule both tests below rely on, on flag sets of CPUs this machine may not be."""
    assert expected_kernel(requested, flags) == want
    # Numeric checks run exactly when torch may run its own code for `requested` on this CPU.
    assert (not missing_cpu_flags(requested, flags)) == numeric


@pytest.mark.skipif(not torch.backends.cpu.get_cpu_capability(), reason="no capability report")
@pytest.mark.parametrize("capability", CAPABILITIES)
def test_kernel_choice_under_every_capability(capability):
    """Asking for more than the CPU has falls back to what it has, never dies of SIGILL."""
    flags = _x86_flags_or_skip()
    result = _run_child(CHOICE_SCRIPT, capability)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    kernel = result.stdout.split("kernel ", 1)[1].split()[0].lower()
    want = expected_kernel(capability, flags)
    assert kernel == want, f"asked for {capability}, CPU supports {want}, library ran {kernel}"


@pytest.mark.skipif(not torch.backends.cpu.get_cpu_capability(), reason="no capability report")
@pytest.mark.parametrize("capability", CAPABILITIES)
def test_cpu_vector_path_matches_reference(capability):
    flags = _x86_flags_or_skip()
    missing = missing_cpu_flags(capability, flags)
    if missing:
        pytest.skip(
            f"this CPU lacks {missing} (/proc/cpuinfo), so torch's own {capability} code cannot "
            f"run here; test_kernel_choice_under_every_capability checked the fallback kernel"
        )
    result = _run_child(CHECK_SCRIPT, capability)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert int(result.stdout.split("checks ")[1].split()[0]) > 0
    kernel = result.stdout.split("kernel ", 1)[1].split()[0].lower()
    assert kernel == capability, f"asked for {capability} on a CPU that has it, ran {kernel}"
