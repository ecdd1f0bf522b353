# SPDX-License-Identifier: BSD-3-Clause
"""fp8 KV caches of rope.apply_qk_cache are torch's ``(x / scale).clamp(-max, max).to(fp8)``
bit for bit, on every CPU kernel copy.

Every copy quantizes with a branch-free loop the compiler vectorises at its own width
(csrc/cpu/kv_cache_fp8_rows.cpp); the tails of rows (head_dim 88 = 5 * 16 + 8 here) with the
scalar form of that loop. Each copy runs in
its own interpreter, picked with ATEN_CPU_CAPABILITY and TORCH_ROPE_CPU_KERNEL, as in
test_bf16_conversion.py.

The values: every bfloat16 bit pattern (and every float16 one for float16 inputs), so every
sign, exponent and upper-mantissa class: zeros of both signs, subnormals down to the smallest,
ties of both fp8 formats (a bfloat16 has 7 mantissa bits, the formats 3 and 2), values that
saturate, infinities and NaNs of both signs. They go through the op as v (quantized as they are)
and as k, whose first 32 features are rotated at assorted positions (arbitrary float32 values,
and NaN where an infinity meets sin) and whose other 56 pass through unrotated. The expected k
bytes are torch's quantization of the op's own rotated q (q == k, float32), and 16-bit k must
give the bytes of float32 k holding the same values (rotated in float32, rounded once). Scales:
1 (no scaling), powers of two that move the values into saturation or into the subnormals, and
scales whose quotients round.
"""

import os
import subprocess
import sys

import pytest
from helpers import KERNEL_FLAGS, cpu_flags, missing_cpu_flags

import torch_rope

CHILD = r"""
import torch
import torch_rope

torch.set_num_threads(1)
print("variant", torch_rope._C.cpu_kernel_variant())
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
D, ROT, MAX_POS = 88, 32, 64
# 1: no scaling. 2^-4 and 2^-12: more saturate. 2^9: into the subnormals and to zero. The rest
# round their quotients. (float32 values: the op divides by the float32 scale.)
SCALES = [float(torch.tensor(s, dtype=torch.float32))
          for s in (1.0, 2.0**-4, 2.0**-12, 2.0**9, 0.3, 7.1e-5, 3.7e3)]


def patterns(dtype):
    # Every 16-bit pattern of dtype as (T, 1, D), padded with zeros.
    values = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype)
    rows = -(-values.numel() // D)
    out = torch.zeros(rows * D, dtype=dtype)
    out[: values.numel()] = values
    return out.view(rows, 1, D)


def quantize(x, scale, fp8):
    # torch's own: the division in x's dtype (by the float32 scale), clamp, conversion.
    m = FP8_MAX[fp8]
    if scale != 1.0:
        x = x / torch.tensor(scale, dtype=x.dtype)
    return x.clamp(-m, m).to(fp8)


def run(x, scale, fp8):
    # q = k = v = x; returns q_out and the k and v caches.
    T = x.shape[0]
    table_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    cos, sin = torch_rope.rope_tables(10000.0, ROT, MAX_POS, dtype=table_dtype)
    positions = (torch.arange(T) * 7 % MAX_POS).view(T, 1)
    k_cache = torch.zeros(T, 1, D, dtype=torch.uint8).view(fp8)
    v_cache = torch.zeros(T, 1, D, dtype=torch.uint8).view(fp8)
    q_out = torch_rope.apply_qk_cache(
        x, x, x, cos, sin, positions, k_cache, v_cache, torch.arange(T),
        k_scale=scale, v_scale=scale,
    )
    return q_out, k_cache, v_cache


def expect_same(got, want, values, what):
    g = got.view(torch.uint8).reshape(-1)
    w = want.view(torch.uint8).reshape(-1)
    bad = (g != w).nonzero()
    if bad.numel():
        i = bad[0].item()
        v = values.reshape(-1)[i].item()
        raise SystemExit(f"MISMATCH {what}: {bad.numel()} bytes, first value {v!r} -> got "
                         f"{g[i].item():#04x}, torch gives {w[i].item():#04x}")


checked = 0
for fp8 in FP8_MAX:
    for scale in SCALES:
        what = f"{fp8} scale {scale!r}"
        x32 = patterns(torch.bfloat16).float()
        q32, k32, v32 = run(x32, scale, fp8)
        expect_same(k32, quantize(q32, scale, fp8), q32, f"{what} float32 k")
        expect_same(v32, quantize(x32, scale, fp8), x32, f"{what} float32 v")
        for dtype in (torch.bfloat16, torch.float16):
            x16 = patterns(dtype)
            _, k16, v16 = run(x16, scale, fp8)
            expect_same(v16, quantize(x16.float(), scale, fp8), x16, f"{what} {dtype} v")
            q_same, k_same, _ = run(x16.float(), scale, fp8)
            expect_same(k_same, quantize(q_same, scale, fp8), q_same, f"{what} {dtype} k32")
            expect_same(k16, k_same, x16, f"{what} {dtype} k")
        x64 = x32.double()
        q64, k64, v64 = run(x64, scale, fp8)
        expect_same(k64, quantize(q64, scale, fp8), q64, f"{what} float64 k")
        expect_same(v64, quantize(x64, scale, fp8), x64, f"{what} float64 v")
        checked += 2 * (x32.numel() * 4 + x64.numel())
print("checked", checked)
"""


def _run_copy(variant):
    flags = cpu_flags()
    if flags is None or "sse2" not in flags:
        if variant != "default":
            pytest.skip("not an x86 CPU with /proc/cpuinfo: only the DEFAULT kernel is built")
    elif missing_cpu_flags(variant, flags):
        # torch's own code for the capability would die of SIGILL here (test_cpu_capability.py).
        pytest.skip(
            f"this CPU lacks {missing_cpu_flags(variant, flags)} (/proc/cpuinfo) for the "
            f"{variant} kernel"
        )
    env = dict(os.environ)
    env["ATEN_CPU_CAPABILITY"] = "avx512" if variant.startswith("avx512") else variant
    env["TORCH_ROPE_CPU_KERNEL"] = variant
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(torch_rope.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(
        [package_root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    result = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    ran = result.stdout.split("variant ", 1)[1].split()[0]
    assert ran.lower() == variant, f"asked for the {variant} kernel, the library ran {ran}"
    assert int(result.stdout.split("checked ")[1].split()[0]) > 0


@pytest.mark.parametrize("variant", list(KERNEL_FLAGS))
def test_fp8_quantization_matches_torch_on_every_bf16_pattern(variant):
    _run_copy(variant)
