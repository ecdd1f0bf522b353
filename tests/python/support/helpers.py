# SPDX-License-Identifier: BSD-3-Clause
"""Shared test helpers, each defined here once: device parametrization, the pair layouts as
pytest parameters, per-dtype tolerances, table dtypes, table and input builders, and the
environment of child interpreters."""

import os

import pytest
import references as ref
import torch

_HERE = os.path.dirname(os.path.abspath(__file__))

# TORCH_ROPE_REQUIRE_CUDA=1 (for a machine that has a GPU): the CUDA tests run, and fail, rather
# than skip when CUDA is missing.
_REQUIRE_CUDA = os.environ.get("TORCH_ROPE_REQUIRE_CUDA") == "1"
needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available() and not _REQUIRE_CUDA, reason="CUDA not available"
)

FLOAT_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
# The two pair layouts (README.md, "What it computes"), as pytest parameters and their ids.
LAYOUTS = [True, False]
LAYOUT_IDS = ["interleaved", "half_split"]
HEAD_DIMS = (64, 80, 128, 256)

# Agreement with the float64 oracle after casting it to the storage type: about one unit in the
# last place of that type (math is float32, or float64 for float64, so only the final rounding
# and the float32 tables separate the library from the oracle). tests/cpp/assertions.h uses the
# same numbers and the same procedure.
TOLERANCES = {
    torch.float64: dict(rtol=1e-12, atol=1e-12),
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    torch.float16: dict(rtol=1e-3, atol=1e-3),
    torch.bfloat16: dict(rtol=1e-2, atol=1e-2),
}


def cpu_and_cuda():
    """Device parameters: CUDA cases are always collected and show as SKIPPED without a GPU."""
    return ["cpu", pytest.param("cuda", marks=needs_cuda)]


def dtype_id(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def table_dtype_for(dtype: torch.dtype) -> torch.dtype:
    """float64 tables for float64 inputs (so 1e-12 is reachable), float32 otherwise."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def make_tables(max_seq_len, rotary_dim, device, dtype=torch.float32, theta=10000.0):
    cos, sin = ref.tables(max_seq_len, rotary_dim, theta, dtype)
    return cos.to(device), sin.to(device)


def expected(
    x,
    positions,
    rotary_dim,
    *,
    interleaved,
    inverse=False,
    theta=10000.0,
    mrope_section=None,
    mrope_interleaved=False,
):
    """The oracle's answer for ``x`` in float64 on the CPU (multi-axis with ``mrope_section``)."""
    ang = ref.angles(
        positions,
        x.shape[:-1],
        rotary_dim,
        theta,
        mrope_section=mrope_section,
        mrope_interleaved=mrope_interleaved,
    )
    return ref.rope(x, ang, interleaved=interleaved, inverse=inverse)


def assert_matches_reference(
    out, x, positions, rotary_dim, *, interleaved, inverse=False, theta=10000.0
):
    """``out`` equals the float64 oracle cast to ``x.dtype``, within the dtype's tolerance."""
    assert out.shape == x.shape
    assert out.dtype == x.dtype
    assert out.device == x.device
    want = expected(x, positions, rotary_dim, interleaved=interleaved, inverse=inverse, theta=theta)
    torch.testing.assert_close(out.cpu(), want.to(x.dtype), **TOLERANCES[x.dtype])


def rotation_error_bound(
    x,
    cos,
    sin,
    positions,
    *,
    interleaved,
    math_dtype,
    mrope_section=None,
    mrope_interleaved=False,
):
    """How far a correct rotation of ``x`` by the tables, computed in ``math_dtype`` (float32, or
    float64 for float64 x), may be from the float64 oracle, per element (float64, on the CPU): a
    few roundings of each plane's terms, ``4 eps (|a| + |b|)(|c| + |s|)``, which also covers
    float64 tables rounded to float32 for the math; 0 for the features past rotary_dim. Storage
    rounding is the caller's to add."""
    x64 = x.detach().cpu().to(torch.float64)
    bound = torch.zeros_like(x64)
    half = cos.shape[-1]
    if half == 0 or x64.numel() == 0:
        return bound
    math_eps = torch.finfo(math_dtype).eps / 2
    p = ref.plane_positions(positions, x64.shape[:-1], half, mrope_section, mrope_interleaved)
    k = torch.arange(half)
    magnitude = cos.detach().cpu().double()[p, k].abs() + sin.detach().cpu().double()[p, k].abs()
    ia = torch.arange(0, 2 * half, 2) if interleaved else torch.arange(half)
    ib = ia + 1 if interleaved else ia + half
    plane = 4 * math_eps * (x64[..., ia].abs() + x64[..., ib].abs()) * magnitude
    bound[..., ia] += plane
    bound[..., ib] += plane
    return bound


def same_bits(a, b):
    """``a`` and ``b`` hold the same bytes (same shape and dtype): torch.equal, also for float8,
    which torch.equal refuses before torch 2.5, and NaN == NaN."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point():
        bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        a, b = a.contiguous().view(bits), b.contiguous().view(bits)
    return torch.equal(a, b)


def randn(*shape, dtype=torch.float32, device="cpu"):
    return torch.randn(*shape, dtype=torch.float64).to(dtype=dtype, device=device)


def subprocess_env(*, with_test_modules=False, **variables):
    """``os.environ`` for a child interpreter that imports the torch_rope this process imported
    (installed or in-tree, whatever the working directory), plus ``variables``. With
    ``with_test_modules`` the child can also import this directory's modules (helpers,
    references, ...); otherwise their names cannot shadow anything it imports."""
    import torch_rope

    package_root = os.path.dirname(os.path.dirname(os.path.abspath(torch_rope.__file__)))
    paths = [package_root] + ([_HERE] if with_test_modules else [])
    paths += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths), **variables)


def run_python(script, *, with_test_modules=False, timeout=300, **variables):
    """Run ``script`` in a child interpreter that imports this process's torch_rope (see
    subprocess_env); returns the CompletedProcess with text stdout and stderr."""
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-c", script],
        env=subprocess_env(with_test_modules=with_test_modules, **variables),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_device_assert(setup, call):
    """``call`` (Python source, after ``setup``) must trip a CUDA device-side assert. Run in a
    child interpreter: a device assert leaves the CUDA context unusable for the rest of the
    process."""

    script = (
        "import torch, torch_rope\n"
        f"{setup}\n"
        "try:\n"
        f"    {call}\n"
        "    torch.cuda.synchronize()\n"
        "    print('NO ERROR')\n"
        "except Exception as e:\n"
        "    print('ERROR', type(e).__name__, e)\n"
    )
    result = run_python(script)
    assert "NO ERROR" not in result.stdout, "an out-of-range position went unnoticed"
    assert result.returncode != 0 or "ERROR" in result.stdout, result.stderr


TORCH_VERSION = torch.torch_version.TorchVersion(torch.__version__)


def needs_torch(version, what):
    """Skips, visibly, on a torch older than ``version``, naming the feature it lacks (the
    project builds with torch >= 2.4; a few features need newer ones)."""
    return pytest.mark.skipif(
        TORCH_VERSION < version,
        reason=f"needs torch >= {version} for {what}; this is torch {torch.__version__}",
    )


# The /proc/cpuinfo flags each CPU kernel copy is compiled for (CMakeLists.txt). The same sets
# decide which ATEN_CPU_CAPABILITY a child interpreter may be given: torch trusts that variable
# without looking at the CPU, so torch's own avx512 code dies of SIGILL on an AVX2-only CPU.
KERNEL_FLAGS = {
    "default": frozenset(),
    "avx2": frozenset({"avx2", "fma", "f16c"}),
    "avx512": frozenset({"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq"}),
}
KERNEL_FLAGS["avx512_bf16"] = KERNEL_FLAGS["avx512"] | {"avx512_bf16"}


def missing_cpu_flags(kernel, flags):
    """The flags of ``kernel`` (a key of KERNEL_FLAGS) that ``flags`` lacks, sorted."""
    return sorted(KERNEL_FLAGS[kernel] - set(flags))


def cpu_flags():
    """The CPU's feature flags from /proc/cpuinfo (what the hardware has, whatever torch's
    capability string says), or None where that file cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None
