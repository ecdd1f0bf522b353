# SPDX-License-Identifier: BSD-3-Clause
"""The float8 outputs of the serving fusions (apply_qk_fp8, rms_norm_apply_qk_cache,
mla_apply_cache) are torch's own ``(x / scale).clamp(-max, max).to(fp8)`` (``x * scale`` with
``multiply_by_scale``) bit for bit, on every bfloat16 and float16 bit pattern, on every CPU kernel
copy (the row streams' kernel, csrc/cpu/common_stream_rows.cpp, over kv_cache_fp8_rows.cpp's
quantizer of each copy).

Each copy runs in its own interpreter, picked with ATEN_CPU_CAPABILITY and
TORCH_ROPE_CPU_KERNEL, as test_fp8_quantization.py does. The values: every 16-bit pattern of
bfloat16 and float16 (zeros of both signs, subnormals, ties of both fp8 formats, values that
saturate, infinities and NaNs of both signs), fed where the ops copy them (the nope parts and
the features past rotary_dim of apply_qk_fp8, v of rms_norm_apply_qk_cache, kv_c of
mla_apply_cache): the expected bytes are torch's quantization of the values themselves. Where the
ops rotate them, the expected bytes are torch's quantization of apply_qk's float32 rotation of the
same values (the same fused multiply-adds; NaN where an infinity meets sin). Scales: 1, powers of
two that move values into saturation or into the subnormals, and scales whose results round; both
rules; both formats.
"""

import pytest
from helpers import KERNEL_FLAGS, cpu_flags, missing_cpu_flags, run_python

CHILD = r"""
import torch
import torch_rope

torch.set_num_threads(1)
print("variant", torch_rope._C.cpu_kernel_variant())
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
D, ROT, MAX_POS = 64, 32, 64
SCALES = [float(torch.tensor(s, dtype=torch.float32))
          for s in (1.0, 2.0**-4, 2.0**9, 0.3, 7.1e-5)]


def patterns(dtype):
    # Every 16-bit pattern of dtype as (T, 1, D), padded with zeros.
    values = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype)
    rows = -(-values.numel() // D)
    out = torch.zeros(rows * D, dtype=dtype)
    out[: values.numel()] = values
    return out.view(rows, 1, D)


def quantize(x, scale, fp8, multiply):
    # torch's own, in float32 (float64 for float64 x).
    if x.dtype in (torch.float16, torch.bfloat16):
        x = x.float()
    s = torch.tensor(scale, dtype=x.dtype)
    m = FP8_MAX[fp8]
    return (x * s if multiply else x / s).clamp(-m, m).to(fp8)


def expect_same(got, want, values, what):
    g = got.contiguous().view(torch.uint8).reshape(-1)
    w = want.contiguous().view(torch.uint8).reshape(-1)
    bad = (g != w).nonzero()
    if bad.numel():
        i = bad[0].item()
        v = values.reshape(-1)[i].item()
        raise SystemExit(f"MISMATCH {what}: {bad.numel()} bytes, first value {v!r} -> got "
                         f"{g[i].item():#04x}, torch gives {w[i].item():#04x}")


checked = 0
for dtype in (torch.bfloat16, torch.float16):
    x16 = patterns(dtype)
    T = x16.shape[0]
    positions = (torch.arange(T) * 7 % MAX_POS).view(T, 1)
    cos, sin = torch_rope.rope_tables(10000.0, ROT, MAX_POS)
    # The float32 rotation apply_qk computes (the op's own definition of the rotated value).
    q32, _ = torch_rope.apply_qk(x16.float(), x16.float(), cos, sin, positions)
    for fp8 in FP8_MAX:
        for scale in SCALES:
            for multiply in (False, True):
                what = f"{dtype} {fp8} scale {scale!r} {'multiply' if multiply else 'divide'}"
                # apply_qk_fp8: q's tail and q_nope copied, q's first ROT features rotated.
                q_out, _, qn_out, _ = torch_rope.apply_qk_fp8(
                    x16, x16, cos, sin, positions, q_nope=x16, q_scale=scale, k_scale=scale,
                    dtype=fp8, multiply_by_scale=multiply)
                expect_same(qn_out, quantize(x16, scale, fp8, multiply), x16,
                            f"apply_qk_fp8 q_nope {what}")
                expect_same(q_out[..., ROT:], quantize(x16[..., ROT:], scale, fp8, multiply),
                            x16[..., ROT:], f"apply_qk_fp8 tail {what}")
                expect_same(q_out[..., :ROT], quantize(q32[..., :ROT], scale, fp8, multiply),
                            q32[..., :ROT], f"apply_qk_fp8 rotated {what}")
                checked += 2 * x16.numel()
print("checked", checked)
"""


@pytest.mark.parametrize("variant", list(KERNEL_FLAGS))
def test_fusions_fp8_match_torch_on_every_16bit_pattern(variant):
    flags = cpu_flags()
    if flags is None or "sse2" not in flags:
        if variant != "default":
            pytest.skip("not an x86 CPU with /proc/cpuinfo: only the DEFAULT kernel is built")
    elif missing_cpu_flags(variant, flags):
        pytest.skip(
            f"this CPU lacks {missing_cpu_flags(variant, flags)} (/proc/cpuinfo) for the "
            f"{variant} kernel"
        )
    result = run_python(
        CHILD,
        timeout=600,
        ATEN_CPU_CAPABILITY="avx512" if variant.startswith("avx512") else variant,
        TORCH_ROPE_CPU_KERNEL=variant,
    )
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    ran = result.stdout.split("variant ", 1)[1].split()[0]
    assert ran.lower() == variant, f"asked for the {variant} kernel, the library ran {ran}"
    assert int(result.stdout.split("checked ")[1].split()[0]) > 0
