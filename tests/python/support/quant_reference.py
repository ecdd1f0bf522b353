# SPDX-License-Identifier: BSD-3-Clause
"""Reference quantizers for dynamic fp8, MXFP8 and NVFP4, written from the formats' definitions.

Independent of torch_rope, of torch's float8 casts and of torchao: every encoding below is
rounded here, in float64 numpy, from the bit layout of its format, so the tests
(tests/python/kernels/test_quant_reference.py) can hold these functions against torch's casts
and torchao's quantizers, and the quantizing kernels can later be held against these. The
formats, the scale layouts and the edge cases are written up in docs/quant_formats.md.

* :func:`per_row_fp8` / :func:`dequantize_per_row_fp8` - float8 E4M3 rows with one dynamic float32
  scale per row (or per token: several dims reduced together), ``amax / 448``, optionally rounded
  up to a power of two (UE8M0, DeepSeek's recipe).
* :func:`mxfp8` / :func:`dequantize_mxfp8` - OCP MX v1.0 MXFP8: blocks of 32 E4M3 elements sharing
  one E8M0 scale ``2**X``, ``X = floor(log2(amax)) - 8`` (section 6.3's conversion), or
  ``X = ceil(log2(amax / 448))`` (``scale_mode="rceil"``, NVIDIA's libraries' rounding).
* :func:`nvfp4` / :func:`dequantize_nvfp4` - NVFP4: blocks of 16 E2M1 elements with an E4M3 block
  scale and a float32 tensor scale ``amax / (448 * 6)``, two elements a byte.
* :func:`to_blocked_scales` / :func:`from_blocked_scales` - the 128x4 swizzled ("blocked") scale
  layout of cuBLAS / cuDNN block-scaled GEMMs, from and to the plain row-major one.

The codecs they are built from are public too: :func:`e4m3_encode` / :func:`e4m3_decode`,
:func:`e2m1_encode` / :func:`e2m1_decode`, :func:`e8m0_decode`, :func:`pack_e2m1` /
:func:`unpack_e2m1`.

Exactness. A value is rounded once, from its float64 quotient. For inputs of float32 precision or
narrower (float32, bfloat16, float16) and float32 scales that is the correctly rounded result of
the exact quotient: the quotient of a 24-bit by a 24-bit number is never within 2**-53 of a
rounding boundary of these formats (5 significant bits at most) without being on it. float64
inputs are taken as they are, and their quotient is rounded to float64 first.

``arithmetic=`` (per_row_fp8 and nvfp4) names the float32 sequence a kernel might use instead of
the exact quotient, so that a kernel can be compared bit for bit whichever it uses; the exact
result and the float32 ones differ only where the quotient is within a few float32 ulps of a
rounding boundary (the tests check that too). NaN sign bits are not part of any contract: the
reference writes the input element's sign; compare codes with :func:`codes_equal`.
"""

from typing import Sequence, Tuple, Union

import numpy as np
import torch
from torch import Tensor

# ---- the formats ---------------------------------------------------------------------------------

E4M3_MAX = 448.0  # S.1111.110 = 2**8 * 1.75
E4M3_EMAX = 8  # exponent of the largest power of two in E4M3 (256): OCP MX's emax_elem
E4M3_NAN = 0x7F  # S.1111.111, the only NaN (no infinities)
E2M1_MAX = 6.0  # S.11.1 = 2**2 * 1.5
E8M0_BIAS = 127
E8M0_MIN_EXP, E8M0_MAX_EXP = -127, 127  # codes 0 .. 254; 255 is NaN, there is no zero
E8M0_NAN = 0xFF
NVFP4_TENSOR_SCALE_DIVISOR = E4M3_MAX * E2M1_MAX  # 2688: the tensor scale is amax / 2688
FLOAT32_MIN_SUBNORMAL = 2.0**-149
ARITHMETIC = ("exact", "fp32_div", "fp32_rcp")


def _minifloat_magnitudes(ebits: int, mbits: int, bias: int) -> np.ndarray:
    """The value of every non-negative code 0 .. 2**(ebits+mbits) - 1 of a sign-magnitude
    minifloat with IEEE-style subnormals (exponent field 0: ``m * 2**(1 - bias - mbits)``),
    ignoring what the format reserves for NaN/inf. Increasing in the code."""
    codes = np.arange(1 << (ebits + mbits))
    e = codes >> mbits
    m = codes & ((1 << mbits) - 1)
    sub = m * 2.0 ** (1 - bias - mbits)
    normal = (1.0 + m / 2.0**mbits) * np.exp2((e - bias).astype(np.float64))
    return np.where(e == 0, sub, normal)


# E4M3 ("fn": finite, one NaN): 4 exponent bits, bias 7, 3 mantissa bits. Code 0x7F would be
# 480 in an IEEE-like layout; E4M3 spends it on NaN, so the finite grid stops at 0x7E = 448.
_E4M3_EXTENDED = _minifloat_magnitudes(4, 3, 7)
_E4M3_FINITE = _E4M3_EXTENDED[:E4M3_NAN]
# E2M1: 2 exponent bits, bias 1, 1 mantissa bit: 0, 0.5, 1, 1.5, 2, 3, 4, 6. No NaN, no inf.
_E2M1 = _minifloat_magnitudes(2, 1, 1)
assert _E4M3_FINITE[-1] == E4M3_MAX and _E2M1[-1] == E2M1_MAX


def _round_to_grid(a: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Index of the grid value nearest to each ``a >= 0`` (not NaN), ties to the even index;
    above the last value, the last index (saturation). ``grid``: increasing, adjacent values
    within a factor of two of each other (true of these formats), so the distances below are
    exact in float64 (Sterbenz) and the comparison is the exact one."""
    n = grid.size
    lo = np.clip(np.searchsorted(grid, a, side="right") - 1, 0, n - 2)
    hi = lo + 1
    d_lo = a - grid[lo]
    d_hi = grid[hi] - a
    up = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))
    return np.where(up, hi, lo)


def _as_float64(x) -> np.ndarray:
    if isinstance(x, Tensor):
        return x.detach().cpu().to(torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)


def e4m3_encode(values, saturate: bool = True) -> np.ndarray:
    """float8 E4M3 (``torch.float8_e4m3fn``) codes of ``values`` (taken as float64), round to
    nearest, ties to even.

    ``saturate=True``: a magnitude beyond 448, and infinity, gives ±448 (S.1111.110), as
    ``cvt.rn.satfinite`` and torch's ``clamp(-448, 448).to(float8_e4m3fn)`` do.
    ``saturate=False``: the OCP non-saturating conversion: a value whose rounding (as if the
    exponent were unbounded) exceeds 448 gives NaN, so 448 < |v| <= 464 still gives ±448 (464 is
    the tie between 448 and the 480 that S.1111.111 would be; 448 has the even mantissa) and
    |v| > 464 and infinity give NaN. NaN gives S.1111.111 with NaN's sign bit. Returns uint8."""
    v = np.asarray(values, dtype=np.float64)
    sign = np.signbit(v).astype(np.uint8) << 7
    nan = np.isnan(v)
    a = np.where(nan, 0.0, np.abs(v))
    grid = _E4M3_FINITE if saturate else _E4M3_EXTENDED
    code = _round_to_grid(a, grid).astype(np.uint8)
    code = np.where(nan, np.uint8(E4M3_NAN), code)  # unsaturated overflow already is 0x7F
    return (code | sign).astype(np.uint8)


def e4m3_decode(codes) -> np.ndarray:
    """float64 values of E4M3 codes (uint8); S.1111.111 is NaN."""
    c = np.asarray(codes).astype(np.uint8)
    mag = c & 0x7F
    out = np.where(mag == E4M3_NAN, np.nan, _E4M3_EXTENDED[mag])
    return np.where(c & 0x80, -out, out)


def e2m1_encode(values) -> np.ndarray:
    """E2M1 codes (0 .. 15, sign in bit 3) of finite or infinite ``values``, round to nearest,
    ties to even, saturating at ±6 (infinity too: E2M1 has neither inf nor NaN). NaN gives code 0
    (a caller that can meet NaN decides what it means; the quantizers below never pass one)."""
    v = np.asarray(values, dtype=np.float64)
    sign = np.signbit(v).astype(np.uint8) << 3
    nan = np.isnan(v)
    code = _round_to_grid(np.where(nan, 0.0, np.abs(v)), _E2M1).astype(np.uint8) | sign
    return np.where(nan, np.uint8(0), code).astype(np.uint8)


def e2m1_decode(codes) -> np.ndarray:
    """float64 values of E2M1 codes (low 4 bits of each uint8)."""
    c = np.asarray(codes).astype(np.uint8) & 0xF
    out = _E2M1[c & 0x7]
    return np.where(c & 0x8, -out, out)


def e8m0_decode(codes) -> np.ndarray:
    """float64 values of E8M0 codes: ``2**(code - 127)``, 0xFF is NaN (no zero, no sign)."""
    c = np.asarray(codes).astype(np.int64)
    return np.where(c == E8M0_NAN, np.nan, np.exp2((c - E8M0_BIAS).astype(np.float64)))


def pack_e2m1(codes) -> np.ndarray:
    """Two E2M1 codes a byte along the last dim: element 2i in the low nibble, 2i+1 in the high
    one (NVIDIA's ``__nv_fp4x2_e2m1``, cvt.e2m1x2, torchao's ``pack_uint4`` and torch's own
    test helper for ``float4_e2m1fn_x2``; torch itself has no float4 conversion)."""
    c = np.asarray(codes).astype(np.uint8)
    if c.shape[-1] % 2:
        raise ValueError(f"the last dim ({c.shape[-1]}) must be even to pack two a byte")
    return ((c[..., 0::2] & 0xF) | ((c[..., 1::2] & 0xF) << 4)).astype(np.uint8)


def unpack_e2m1(packed) -> np.ndarray:
    """Inverse of :func:`pack_e2m1`: (..., n) bytes to (..., 2n) codes."""
    p = np.asarray(packed).astype(np.uint8)
    out = np.empty(p.shape[:-1] + (2 * p.shape[-1],), dtype=np.uint8)
    out[..., 0::2] = p & 0xF
    out[..., 1::2] = p >> 4
    return out


def codes_equal(a, b, fmt: str = "e4m3") -> np.ndarray:
    """Elementwise code equality with every NaN code of the format equal to every other
    (``"e4m3"``: S.1111.111 of either sign; ``"e8m0"``, ``"e2m1"``: plain equality)."""
    a = np.asarray(a).astype(np.uint8)
    b = np.asarray(b).astype(np.uint8)
    if fmt == "e4m3":
        both_nan = ((a & 0x7F) == E4M3_NAN) & ((b & 0x7F) == E4M3_NAN)
        return (a == b) | both_nan
    return a == b


def _as_codes(t: Tensor) -> np.ndarray:
    return t.detach().cpu().contiguous().view(torch.uint8).numpy()


def _tensor(codes: np.ndarray, dtype: torch.dtype) -> Tensor:
    return torch.from_numpy(np.ascontiguousarray(codes, dtype=np.uint8)).view(dtype)


# ---- scales --------------------------------------------------------------------------------------


def float32_scale(amax: np.ndarray, divisor: float) -> np.ndarray:
    """The float32 scale ``amax / divisor`` (one rounding), with the edges defined:

    * amax 0 gives 1.0 (any positive scale quantizes an all-zero row exactly; 1 is the one that
      is also a power of two and an exact E8M0, so ``pow2`` leaves it alone);
    * a positive amax whose quotient underflows float32 gives the smallest subnormal, 2**-149,
      never 0 (only float32 inputs below ``divisor * 2**-150`` can get there);
    * +inf gives +inf and NaN gives NaN (IEEE; what those give downstream is each format's)."""
    amax = np.asarray(amax, dtype=np.float64)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        s = (amax / divisor).astype(np.float32)
    s = np.where(amax == 0, np.float32(1.0), s)
    return np.where((amax > 0) & (s == 0), np.float32(FLOAT32_MIN_SUBNORMAL), s).astype(np.float32)


def pow2_round_up(scale: np.ndarray) -> np.ndarray:
    """UE8M0 rounding of positive float32 scales: the least power of two ``>=`` the scale
    (``cvt.rp.satfinite.ue8m0x2.f32``), exactly (frexp, not a float log2), clamped to E8M0's
    range [2**-127, 2**127] (so +inf gives 2**127); NaN stays NaN. Returns float32."""
    s = np.asarray(scale, dtype=np.float64)
    finite = np.isfinite(s)
    m, e = np.frexp(np.where(finite, s, 1.0))  # s = m * 2**e, 0.5 <= m < 1
    k = np.where(m == 0.5, e - 1, e)
    k = np.where(np.isposinf(s), E8M0_MAX_EXP, np.clip(k, E8M0_MIN_EXP, E8M0_MAX_EXP))
    out = np.ldexp(1.0, k.astype(np.int64))
    return np.where(np.isnan(s), np.nan, out).astype(np.float32)


def e8m0_encode_pow2(scale: np.ndarray) -> np.ndarray:
    """E8M0 codes of power-of-two scales in [2**-127, 2**127] (as :func:`pow2_round_up` gives);
    NaN gives 0xFF."""
    s = np.asarray(scale, dtype=np.float64)
    nan = np.isnan(s)
    m, e = np.frexp(np.where(nan, 1.0, s))
    if not np.all(m == 0.5):
        raise ValueError("e8m0_encode_pow2 takes powers of two")
    k = e - 1
    if np.any((k < E8M0_MIN_EXP) | (k > E8M0_MAX_EXP)):
        raise ValueError("scale outside E8M0's range [2**-127, 2**127]")
    return np.where(nan, E8M0_NAN, k + E8M0_BIAS).astype(np.uint8)


def _quotient(v: np.ndarray, scale, arithmetic: str) -> np.ndarray:
    """v / scale as float64, in one of the arithmetic orders of the module docstring."""
    scale = np.asarray(scale, dtype=np.float32)
    with np.errstate(all="ignore"):
        if arithmetic == "exact":
            q = v / scale.astype(np.float64)
        elif arithmetic == "fp32_div":
            q = (v.astype(np.float32) / scale).astype(np.float64)
        elif arithmetic == "fp32_rcp":
            q = (v.astype(np.float32) * (np.float32(1.0) / scale)).astype(np.float64)
        else:
            raise ValueError(f"arithmetic must be one of {ARITHMETIC}, not {arithmetic!r}")
    # A NaN quotient takes the input's sign (inf / inf has the platform's default NaN sign).
    return np.where(np.isnan(q), np.copysign(np.nan, v), q)


# ---- dynamic per-row / per-token fp8 -------------------------------------------------------------


def per_row_fp8(
    x,
    dim: Union[int, Sequence[int]] = -1,
    pow2: bool = False,
    *,
    eps: float = 0.0,
    arithmetic: str = "exact",
) -> Tuple[Tensor, Tensor]:
    """float8 E4M3 with one dynamic scale per row: ``(q, scale)``.

    ``q`` (``torch.float8_e4m3fn``, x's shape) is E4M3 of ``x / scale``, round to nearest even,
    saturating at ±448; ``scale`` (float32, x's shape with the reduced dims kept as size 1) is
    ``amax / 448`` of the row, one float32 rounding, ``amax = max |x|`` over ``dim`` (an int:
    per row, e.g. per (token, head) with dim=-1; a tuple: the dims reduced together, e.g.
    ``(-2, -1)`` per token over all heads). Dequantize: ``q * scale``.

    ``pow2=True``: the scale is rounded up to a power of two, clamped to [2**-127, 2**127]
    (UE8M0, as DeepSeek's recipes store it; a kernel may keep it as float32 or as its E8M0 code,
    :func:`e8m0_encode_pow2`). Rounding up keeps ``|x| / scale <= 448``, so no element saturates.

    ``eps``: a floor on amax (peers use 1e-10, 1e-4, ...); 0 by default.

    ``arithmetic``: ``"exact"`` (the definition), ``"fp32_div"`` (float32 ``x / scale``, rounded,
    then E4M3) or ``"fp32_rcp"`` (float32 ``x * (1 / scale)``); see the module docstring.

    Edge rows (docs/quant_formats.md has the table):

    * amax 0 (the row is all ±0): scale 1.0, q = ±0 with each element's sign.
    * subnormal amax: the float32 scale ``amax / 448`` may itself be subnormal; a positive amax
      never gives scale 0 (2**-149 at least, :func:`float32_scale`); q as usual (a scale that has
      lost bits can put the largest quotient above 448: it saturates).
    * an infinity in the row (no NaN): scale +inf; finite elements give ±0 and ±inf gives NaN
      (inf / inf), so the whole row dequantizes to NaN (0 * inf): the row is flagged, not hidden.
      With ``pow2``: scale 2**127 (E8M0's largest; UE8M0 has no inf), ±inf saturates to ±448 and
      finite elements are divided by 2**127.
    * a NaN in the row: scale NaN (E8M0 0xFF with ``pow2``) and every q is NaN.
    """
    v = _as_float64(x)
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    dims = tuple(d % v.ndim for d in dims)
    if any(v.shape[d] == 0 for d in dims):
        raise ValueError("per_row_fp8 reduces over an empty dim")
    amax = np.max(np.abs(v), axis=dims, keepdims=True)  # NaN propagates
    if eps:
        amax = np.where(np.isnan(amax), amax, np.maximum(amax, eps))
    scale = float32_scale(amax, E4M3_MAX)
    if pow2:
        scale = pow2_round_up(scale)
    q = _quotient(v, scale, arithmetic)
    return _tensor(e4m3_encode(q), torch.float8_e4m3fn), torch.from_numpy(scale.copy())


def dequantize_per_row_fp8(q: Tensor, scale: Tensor) -> Tensor:
    """float64 ``q * scale`` (the E4M3 values decoded here, not by torch)."""
    vals = e4m3_decode(_as_codes(q))
    with np.errstate(invalid="ignore"):
        return torch.from_numpy(vals * scale.detach().cpu().to(torch.float64).numpy())


# ---- MXFP8 (OCP MX v1.0) -------------------------------------------------------------------------


def mx_shared_exponent(amax: np.ndarray, emax_elem: int = E4M3_EMAX) -> np.ndarray:
    """OCP MX v1.0 section 6.3: ``X = floor(log2(amax)) - emax_elem``, clamped to E8M0's range
    [-127, 127], computed exactly (frexp). Where the spec is silent:

    * amax 0 (and any amax whose X is below -127, subnormal ones included): X = -127, E8M0's
      smallest (code 0x00), as torchao;
    * amax +inf: X = 128 - emax_elem (= 120 for E4M3): the exponent field of a float32 infinity
      read as an exponent, as torchao (and any kernel that takes X from the float32 bits) does;
    * NaN: returned as -127 here; :func:`mxfp8` writes the NaN code 0xFF for it."""
    amax = np.asarray(amax, dtype=np.float64)
    finite_pos = np.isfinite(amax) & (amax > 0)
    _, e = np.frexp(np.where(finite_pos, amax, 1.0))  # amax = m * 2**e, 0.5 <= m < 1
    x = np.where(finite_pos, (e - 1) - emax_elem, E8M0_MIN_EXP)
    x = np.where(np.isposinf(amax), 128 - emax_elem, x)
    return np.clip(x, E8M0_MIN_EXP, E8M0_MAX_EXP).astype(np.int64)


def mx_rceil_exponent(amax: np.ndarray, elem_max: float = E4M3_MAX) -> np.ndarray:
    """The other shared exponent in use: ``X = ceil(log2(amax / elem_max))``, the float32
    quotient rounded up to a power of two (cuBLAS / cuDNN's "round up" scale, Blackwell's
    ``cvt.rp.satfinite.ue8m0x2.f32``, torchao's RCEIL), exactly (:func:`pow2_round_up`),
    clamped to [-127, 127]. amax 0 gives -127 (the hardware conversion saturates 0 to E8M0's
    smallest), +inf gives 127, NaN -127 here (0xFF in :func:`mxfp8`). Unlike FLOOR, no element
    saturates: the block's largest lands in (224, 448]."""
    amax = np.asarray(amax, dtype=np.float64)
    p = pow2_round_up(float32_scale(amax, elem_max)).astype(np.float64)
    _, e = np.frexp(np.where(np.isfinite(p), p, 1.0))
    x = np.where((amax == 0) | np.isnan(amax), E8M0_MIN_EXP, e - 1)
    return np.clip(x, E8M0_MIN_EXP, E8M0_MAX_EXP).astype(np.int64)


def mxfp8(x, block: int = 32, scale_mode: str = "floor") -> Tuple[Tensor, Tensor]:
    """MXFP8 (OCP MX v1.0, E4M3 elements): ``(elements, scales)``.

    ``scale_mode="floor"`` is the spec's conversion (below); ``"rceil"`` takes X from
    :func:`mx_rceil_exponent` instead, everything else the same.

    Blocks of ``block`` (32) consecutive elements along the last dim share the scale ``2**X``,
    X from :func:`mx_shared_exponent` (floor of log2 of the block's amax, less E4M3's emax 8);
    ``scales`` are the E8M0 codes (``torch.float8_e8m0fnu``, shape ``(..., D // block)``, the
    plain row-major layout: :func:`to_blocked_scales` makes the swizzled one); ``elements``
    (``torch.float8_e4m3fn``, x's shape) are E4M3 of ``x / 2**X``, round to nearest even.

    Overflow: the spec leaves the conversion of element values above the element format's max to
    the implementation; this one saturates (|x| / 2**X lies in [256, 512) for the block's largest,
    so [448, 512) gives ±448), as torchao does (it clamps before its cast).

    Edge blocks: amax 0: scale 0x00 (2**-127), elements ±0. Subnormal or tiny amax: scale 0x00,
    elements ``x / 2**-127`` (torchao divides by 2**-126 there instead; docs/quant_formats.md).
    One huge value: it sets X, the others may round to ±0. +inf in the block: scale 2**120 (0xF7),
    ±inf saturates to ±448, finite elements are divided by 2**120. NaN in the block: scale 0xFF,
    and every element is written as NaN (0x7F); the spec has the whole block decode to NaN
    whatever its elements hold.
    """
    v = _as_float64(x)
    d = v.shape[-1]
    if d % block:
        raise ValueError(f"the last dim ({d}) must be a multiple of the block ({block})")
    vb = v.reshape(v.shape[:-1] + (d // block, block))
    amax = np.max(np.abs(vb), axis=-1)
    nan = np.isnan(amax)
    if scale_mode == "floor":
        x_exp = mx_shared_exponent(amax)
    elif scale_mode == "rceil":
        x_exp = mx_rceil_exponent(amax)
    else:
        raise ValueError(f"scale_mode must be 'floor' or 'rceil', not {scale_mode!r}")
    scale_codes = np.where(nan, E8M0_NAN, x_exp + E8M0_BIAS).astype(np.uint8)
    q = vb / np.ldexp(1.0, x_exp)[..., None]
    codes = e4m3_encode(q)
    codes = np.where(nan[..., None], np.uint8(E4M3_NAN), codes).reshape(v.shape)
    return _tensor(codes, torch.float8_e4m3fn), _tensor(scale_codes, torch.float8_e8m0fnu)


def dequantize_mxfp8(elements: Tensor, scales: Tensor, block: int = 32) -> Tensor:
    """float64 ``element * 2**X`` per block (NaN scale: the block is NaN)."""
    vals = e4m3_decode(_as_codes(elements))
    sc = e8m0_decode(_as_codes(scales))
    vb = vals.reshape(vals.shape[:-1] + (vals.shape[-1] // block, block))
    with np.errstate(invalid="ignore", over="ignore"):
        return torch.from_numpy((vb * sc[..., None]).reshape(vals.shape))


# ---- NVFP4 ---------------------------------------------------------------------------------------


def nvfp4_tensor_scale(x) -> np.float32:
    """The float32 per-tensor (global) scale ``amax / (448 * 6)`` of NVIDIA's two-level NVFP4
    scaling, in the decode direction (value = e2m1 * block_scale * tensor_scale, FlashInfer's
    ``k_scale`` / ``v_scale``), with :func:`float32_scale`'s edges: amax 0 gives 1.0, inf gives
    inf, NaN gives NaN."""
    v = _as_float64(x)
    return np.float32(
        float32_scale(np.max(np.abs(v)) if v.size else 0.0, NVFP4_TENSOR_SCALE_DIVISOR)
    )


def nvfp4(
    x,
    block: int = 16,
    tensor_scale=None,
    *,
    min_block_scale: float = 0.0,
    arithmetic: str = "exact",
) -> Tuple[Tensor, Tensor, Tensor]:
    """NVFP4: ``(packed, block_scales, tensor_scale)``.

    * ``tensor_scale``: float32; given (a positive finite number or 0-dim tensor, used as the
      float32 it rounds to, as a KV cache's calibrated global scale is) or, when None,
      :func:`nvfp4_tensor_scale` of x. Returned as a 0-dim float32 tensor.
    * ``block_scales``: per block of ``block`` (16) elements along the last dim, E4M3
      (``torch.float8_e4m3fn``, shape ``(..., D // block)``, row-major) of
      ``amax_block / 6 / tensor_scale``, round to nearest even, saturating at 448; subnormal E4M3
      scales are kept (NVIDIA's description, TRT-LLM's kernels); ``min_block_scale=2**-6``
      reproduces torchao, which raises every block scale to E4M3's smallest normal first.
    * ``packed``: E2M1 of ``x / (block_scale * tensor_scale)``, round to nearest even,
      saturating at ±6, two a byte (:func:`pack_e2m1`: even element in the low nibble), as
      ``torch.float4_e2m1fn_x2`` of shape ``(..., D // 2)``.

    Decode: ``e2m1 * block_scale * tensor_scale``.

    ``arithmetic``: ``"exact"`` (the definition: both quotients exact, each rounded once) or
    ``"fp32_rcp"``: torchao's float32 sequence (``bs = amax / 6``; ``bs / tensor_scale`` rounded
    to E4M3; elements ``x * ((1 / tensor_scale) / block_scale)``, every step rounded to float32),
    which the tests use to compare with torchao bit for bit.

    Edges (docs/quant_formats.md): block amax 0, or a block scale that rounds to 0: scale 0x00 and
    elements ±0. Subnormal amax: subnormal or zero block scale as it rounds. One huge value: it
    sets the block scale; the others may round to ±0. With a finite tensor scale, +inf in a block:
    scale saturates to 448 and ±inf to ±6. NaN in a block: scale NaN (0x7F) and its element codes
    are written 0 (E2M1 has no NaN; the NaN scale decodes the block to NaN). When the tensor scale
    is computed from x, an inf or NaN anywhere makes it inf or NaN, and then every block scale is
    0 or NaN: the whole tensor decodes to NaN.
    """
    if arithmetic not in ("exact", "fp32_rcp"):
        raise ValueError(f"nvfp4 arithmetic must be 'exact' or 'fp32_rcp', not {arithmetic!r}")
    v = _as_float64(x)
    d = v.shape[-1]
    if block % 2 or d % block:
        raise ValueError(f"the last dim ({d}) must be a multiple of an even block ({block})")
    if tensor_scale is None:
        ts = nvfp4_tensor_scale(v)
    else:
        ts = np.float32(float(tensor_scale))
        if not (np.isfinite(ts) and ts > 0):
            raise ValueError(f"a given tensor_scale must be positive and finite, not {ts}")
    vb = v.reshape(v.shape[:-1] + (d // block, block))
    amax = np.max(np.abs(vb), axis=-1)
    with np.errstate(all="ignore"):
        if arithmetic == "exact":
            raw = amax / (E2M1_MAX * np.float64(ts))
        else:
            raw = ((amax.astype(np.float32) / np.float32(E2M1_MAX)) / ts).astype(np.float64)
        if min_block_scale:
            raw = np.where(np.isnan(raw), raw, np.maximum(raw, min_block_scale))
        s_codes = np.where(np.isnan(raw), np.uint8(E4M3_NAN), e4m3_encode(raw))  # scales >= 0
        s_val = e4m3_decode(s_codes)
        if arithmetic == "exact":
            q = vb / (s_val * np.float64(ts))[..., None]
        else:
            rcp = (np.float32(1.0) / ts) / s_val.astype(np.float32)
            q = (vb.astype(np.float32) * rcp[..., None]).astype(np.float64)
    codes = e2m1_encode(q)
    zero_scale = (s_val == 0)[..., None]
    codes = np.where(zero_scale, np.signbit(vb).astype(np.uint8) << 3, codes)
    codes = np.where(np.isnan(s_val)[..., None], np.uint8(0), codes).reshape(v.shape)
    packed = _tensor(pack_e2m1(codes), torch.float4_e2m1fn_x2)
    return packed, _tensor(s_codes, torch.float8_e4m3fn), torch.tensor(ts, dtype=torch.float32)


def dequantize_nvfp4(packed: Tensor, block_scales: Tensor, tensor_scale, block: int = 16) -> Tensor:
    """float64 ``e2m1 * block_scale * tensor_scale`` (NaN block scale: the block is NaN)."""
    vals = e2m1_decode(unpack_e2m1(_as_codes(packed)))
    sc = e4m3_decode(_as_codes(block_scales)) * float(tensor_scale)
    vb = vals.reshape(vals.shape[:-1] + (vals.shape[-1] // block, block))
    with np.errstate(invalid="ignore"):
        return torch.from_numpy((vb * sc[..., None]).reshape(vals.shape))


# ---- scale layouts -------------------------------------------------------------------------------


def _blocked_index(rows: int, cols: int) -> Tuple[np.ndarray, int]:
    """Flat offset in the 128x4 blocked layout of each (row, col) of a rows x cols scale matrix,
    and the padded size. cuBLAS "block scaling factors layout": the matrix is cut into 128x4
    tiles of 512 bytes, tiles row-major by (row // 128, col // 4); inside a tile, scale (r, c) is
    at ``(r % 32) * 16 + (r // 32) * 4 + c``."""
    n_rb, n_cb = -(-rows // 128), -(-cols // 4)
    r = np.arange(rows)[:, None]
    c = np.arange(cols)[None, :]
    tile = (r // 128) * n_cb + c // 4
    rr, cc = r % 128, c % 4
    return tile * 512 + (rr % 32) * 16 + (rr // 32) * 4 + cc, n_rb * n_cb * 512


def to_blocked_scales(scales: Tensor) -> Tensor:
    """The swizzled 128x4 layout of a block-scaled GEMM operand's scales (cuBLAS / cuDNN /
    ``torch._scaled_mm`` with ``SWIZZLE_32_4_4``), from the plain row-major ``(..., n_blocks)``
    layout the reference quantizers return: the leading dims are flattened into rows, rows are
    padded with zero codes to a multiple of 128 and columns to a multiple of 4, and the result is
    flat (view it as ``(32 * ceil(rows / 128), 16 * ceil(cols / 4))``, torchao's 2-D shape).
    One-byte scale dtypes (E8M0, E4M3, uint8)."""
    if scales.element_size() != 1:
        raise ValueError("to_blocked_scales takes one-byte scales")
    cols = scales.shape[-1]
    codes = _as_codes(scales).reshape(-1, cols)
    idx, size = _blocked_index(codes.shape[0], cols)
    out = np.zeros(size, dtype=np.uint8)
    out[idx.ravel()] = codes.ravel()
    return _tensor(out, scales.dtype)


def from_blocked_scales(blocked: Tensor, rows: int, cols: int) -> Tensor:
    """Inverse of :func:`to_blocked_scales`: the (rows, cols) row-major scales."""
    idx, size = _blocked_index(rows, cols)
    flat = _as_codes(blocked).reshape(-1)
    if flat.size != size:
        raise ValueError(f"a {rows}x{cols} scale matrix blocks to {size} bytes, not {flat.size}")
    return _tensor(flat[idx], blocked.dtype)


def near_rounding_boundary(q, fmt: str, rel: float = 2.0**-20) -> np.ndarray:
    """Where ``|q|`` is within ``rel`` (relative) of a rounding boundary of ``fmt`` ("e4m3" or
    "e2m1"): a midpoint of two adjacent values. The only places an exact quotient and a float32
    one may round differently."""
    grid = _E4M3_FINITE if fmt == "e4m3" else _E2M1
    mids = (grid[:-1] + grid[1:]) / 2
    a = np.abs(np.asarray(q, dtype=np.float64))
    i = np.searchsorted(mids, a)  # mids[i - 1] <= a < mids[i]
    below = mids[np.clip(i - 1, 0, mids.size - 1)]
    above = mids[np.clip(i, 0, mids.size - 1)]
    nearest = np.minimum(np.abs(a - below), np.abs(a - above))
    return nearest <= rel * a


__all__ = [
    "ARITHMETIC",
    "E2M1_MAX",
    "E4M3_EMAX",
    "E4M3_MAX",
    "E4M3_NAN",
    "E8M0_BIAS",
    "E8M0_NAN",
    "NVFP4_TENSOR_SCALE_DIVISOR",
    "codes_equal",
    "dequantize_mxfp8",
    "dequantize_nvfp4",
    "dequantize_per_row_fp8",
    "e2m1_decode",
    "e2m1_encode",
    "e4m3_decode",
    "e4m3_encode",
    "e8m0_decode",
    "e8m0_encode_pow2",
    "float32_scale",
    "from_blocked_scales",
    "mx_rceil_exponent",
    "mx_shared_exponent",
    "mxfp8",
    "near_rounding_boundary",
    "nvfp4",
    "nvfp4_tensor_scale",
    "pack_e2m1",
    "per_row_fp8",
    "pow2_round_up",
    "to_blocked_scales",
    "unpack_e2m1",
]
