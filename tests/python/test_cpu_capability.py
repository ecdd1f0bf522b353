# SPDX-License-Identifier: BSD-3-Clause
"""Every CPU vector path (DEFAULT, AVX2, AVX512) against the oracle.

The library picks its CPU kernel once per process: the widest instruction set that the CPU
supports and at::get_cpu_capability() (which honours ATEN_CPU_CAPABILITY) allows. So each path
needs its own interpreter. What the CPU supports is read here from /proc/cpuinfo, independently of
the library: asking for AVX512 on an AVX2-only CPU must run the AVX2 kernel, never crash.
"""

import subprocess
import sys

import pytest
import torch
from helpers import cpu_flags, subprocess_env

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
            for rows_shape in [(2, 3, 7)]:
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
print("checks", checks)
"""


def _run_with_capability(capability):
    env = subprocess_env(
        with_test_modules=True, ATEN_CPU_CAPABILITY=capability, OMP_NUM_THREADS="2"
    )
    return subprocess.run(
        [sys.executable, "-c", CHECK_SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )


# The flags each kernel copy is compiled with (CMakeLists.txt).
_NEEDS = {
    "default": set(),
    "avx2": {"avx2", "fma", "f16c"},
    "avx512": {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq"},
}
_ORDER = ["default", "avx2", "avx512"]


def _expected_kernel(requested, flags):
    """The widest kernel <= requested that the CPU supports."""
    best = "default"
    for name in _ORDER[: _ORDER.index(requested) + 1]:
        if _NEEDS[name] <= flags:
            best = name
    return best


@pytest.mark.skipif(not torch.backends.cpu.get_cpu_capability(), reason="no capability report")
@pytest.mark.parametrize("capability", _ORDER)
def test_cpu_vector_path_matches_reference(capability):
    flags = cpu_flags()
    if flags is None or "avx2" not in flags and "sse2" not in flags:
        pytest.skip("not an x86 CPU with /proc/cpuinfo: only the DEFAULT kernel is built")
    result = _run_with_capability(capability)
    # Asking for more than the CPU has must fall back, not die of SIGILL (returncode -4).
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    kernel = result.stdout.split("kernel ", 1)[1].split()[0].lower()
    assert int(result.stdout.split("checks ")[1].split()[0]) > 0
    want = _expected_kernel(capability, flags)
    assert kernel == want, f"asked for {capability}, CPU supports {want}, library ran {kernel}"
    if kernel != capability:
        pytest.skip(f"this CPU lacks {capability}: checked that the {kernel} kernel ran instead")
