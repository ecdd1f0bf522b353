"""Every CPU vector path (DEFAULT, AVX2, AVX512) against the oracle.

The library picks its CPU kernel once per process from at::get_cpu_capability(), which honours
ATEN_CPU_CAPABILITY, so each path needs its own interpreter.
"""

import os
import subprocess
import sys

import pytest
import torch

import torch_rope

_HERE = os.path.dirname(os.path.abspath(__file__))

CHECK_SCRIPT = r"""
import sys
import torch
import torch_rope
from helpers import FLOAT_DTYPES, assert_matches_reference, make_tables, randn, table_dtype_for

print("capability", torch.backends.cpu.get_cpu_capability())
checks = 0
for dtype in FLOAT_DTYPES:
    for interleaved in (True, False):
        # 1, 3, 17, 24 and 64 planes: vector widths 8 and 16, their tails, a pass-through tail.
        for head_dim, rotary_dim in [(2, 2), (10, 6), (34, 34), (80, 48), (130, 128)]:
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
    env = dict(os.environ)
    env["ATEN_CPU_CAPABILITY"] = capability
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(torch_rope.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(
        [_HERE, package_root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    env["OMP_NUM_THREADS"] = "2"
    return subprocess.run([sys.executable, "-c", CHECK_SCRIPT], env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.skipif(not torch.backends.cpu.get_cpu_capability(), reason="no capability report")
@pytest.mark.parametrize("capability", ["default", "avx2", "avx512"])
def test_cpu_vector_path_matches_reference(capability):
    result = _run_with_capability(capability)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    reported = result.stdout.split("capability ", 1)[1].split()[0]
    if reported.lower() != capability:
        # torch falls back to the best level the CPU has; then this path cannot run here.
        pytest.skip(f"this CPU does not support {capability} (torch runs {reported})")
    assert "checks " in result.stdout and int(result.stdout.split("checks ")[1].split()[0]) > 0
