# SPDX-License-Identifier: BSD-3-Clause
"""Test oracles, written from the math and independent of torch_rope: one section per op family.

Nothing here imports the library. Each family's oracle is a separate block, so a new op family
appends its own section (and reuses the rotation below rather than writing a third one):

* **RoPE** (``apply``, ``apply_``, ``apply.out``, ``apply_qk``): :func:`rope_with_tables`,
  :func:`rope`, :func:`angles` and what they are built from (below).
* **Fused QK-RMSNorm + RoPE** (``rms_norm_apply_qk``): :func:`rms_norm` and
  :func:`rms_norm_rope_with_tables`.
* **RoPE into a KV cache** (``apply_qk_cache``): :func:`rope_into_cache` (q rotated, the rows
  written and where), :func:`cache_row_index` (flat or paged slots) and the float8 storage rule
  :func:`quantize_fp8` / :func:`fp8_bounds`.

The RoPE oracle: angles are computed in float64 from the positions, and two oracles get there by
different routes, so a bug would have to be made twice, in two different ways, to slip through:

* :func:`rope_complex` - the interleaved layout as complex multiplication (Meta Llama's
  ``view_as_complex(x) * polar(1, angle)``), in complex128.
* :func:`rope_rotate_half` - the half-split layout as ``x * cos + rotate_half(x) * sin`` (HF
  transformers), in float64.

The other layout of each is reached through the feature permutation
:func:`deinterleave_permutation`, which maps the interleaved layout onto the half-split one.
:func:`rope_matrix` builds the explicit block-diagonal rotation, used only to check the two
oracles themselves on small head_dims.

:func:`rope` takes angles (the math of README.md, "What it computes"); :func:`rope_with_tables`
takes the caller's own ``cos``/``sin`` tables, gathered at the positions, through the same two
routes. The latter is what tests with arbitrary (non-trigonometric) tables, float64 tables or
fuzzed table layouts compare against: the tables' own values, so any table dtype compares
tightly. This file is the suite's only Python oracle (tests/cpp/oracle.h is the C++ one).

Multi-axis positions (M-RoPE: ``mrope_section=[s_0, ..., s_{A-1}]``): ``positions`` then has a
trailing axis dim of size ``A`` and plane ``k`` turns by the position of its axis,
:func:`mrope_axis_of_plane` (written out plane by plane from the rule, not vectorised the way a
kernel would be). :func:`plane_positions` gathers each plane's position, ``row_shape + (half,)``,
and both :func:`angles` and :func:`rope_with_tables` take it from there, so both routes (angles and
the caller's tables, each through the complex and the rotate_half form) see multi-axis positions.
"""

from typing import Optional, Tuple

import torch
from torch import Tensor

# ---- RoPE: apply, apply_, apply.out, apply_qk ----------------------------------------------------


def inv_freq(rotary_dim: int, theta: float = 10000.0) -> Tensor:
    """float64 ``theta ** (-2k / rotary_dim)`` for the ``rotary_dim // 2`` planes."""
    k = torch.arange(rotary_dim // 2, dtype=torch.float64)
    return torch.tensor(theta, dtype=torch.float64) ** (-2.0 * k / rotary_dim)


def mrope_axis_of_plane(mrope_section, mrope_interleaved: bool = False) -> Tensor:
    """The axis each plane reads (int64, ``sum(mrope_section)`` entries), from the rule itself.

    ``mrope_interleaved=False``: contiguous runs, the first ``s_0`` planes axis 0, the next
    ``s_1`` axis 1, and so on. ``True`` (Qwen3-VL, three axes): plane ``k`` is axis 1 when
    ``k % 3 == 1 and k < 3 * s_1``, axis 2 when ``k % 3 == 2 and k < 3 * s_2``, else axis 0."""
    section = [int(s) for s in mrope_section]
    half = sum(section)
    axis = []
    for k in range(half):
        if mrope_interleaved:
            assert len(section) == 3, "interleaved M-RoPE has three axes"
            if k % 3 == 1 and k < 3 * section[1]:
                axis.append(1)
            elif k % 3 == 2 and k < 3 * section[2]:
                axis.append(2)
            else:
                axis.append(0)
        else:
            a, end = 0, section[0]
            while k >= end:  # the run plane k falls in
                a += 1
                end += section[a]
            axis.append(a)
    return torch.tensor(axis, dtype=torch.int64)


def plane_positions(
    positions: Tensor, row_shape, half: int, mrope_section=None, mrope_interleaved: bool = False
) -> Tensor:
    """int64 position of every plane of every row, ``row_shape + (half,)``, on the CPU.

    One axis: the row's position, the same for every plane. Multi-axis: ``positions[..., a]``
    broadcast to ``row_shape``, for the axis ``a`` of each plane."""
    pos = positions.cpu().to(torch.int64)
    row_shape = tuple(row_shape)
    if mrope_section is None:
        pos = torch.broadcast_to(pos, row_shape)
        return pos.unsqueeze(-1).expand(row_shape + (half,))
    axis = mrope_axis_of_plane(mrope_section, mrope_interleaved)
    assert axis.numel() == half, f"sum(mrope_section) = {axis.numel()}, rotary_dim/2 = {half}"
    assert pos.dim() >= 1 and pos.size(-1) == len(mrope_section), "no trailing axis dim"
    pos = torch.broadcast_to(pos, row_shape + (pos.size(-1),))
    return pos[..., axis]  # plane k takes its axis' column


def angles(
    positions: Tensor,
    row_shape,
    rotary_dim: int,
    theta: float = 10000.0,
    *,
    mrope_section=None,
    mrope_interleaved: bool = False,
) -> Tensor:
    """float64 angles ``position * inv_freq`` as ``row_shape + (rotary_dim // 2,)``: each plane at
    its own position (its axis' one with ``mrope_section``)."""
    pos = plane_positions(positions, row_shape, rotary_dim // 2, mrope_section, mrope_interleaved)
    return pos.to(torch.float64) * inv_freq(rotary_dim, theta)


def tables(max_seq_len: int, rotary_dim: int, theta: float = 10000.0, dtype=torch.float32):
    """``(cos, sin)`` tables ``(max_seq_len, rotary_dim // 2)`` from float64 angles, cast once."""
    ang = torch.arange(max_seq_len, dtype=torch.float64).unsqueeze(-1) * inv_freq(rotary_dim, theta)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def deinterleave_permutation(rotary_dim: int, head_dim: int) -> Tensor:
    """Index ``perm``: ``x[..., perm]`` moves plane k from ``(2k, 2k+1)`` to ``(k, k + r/2)``."""
    return torch.cat(
        [
            torch.arange(0, rotary_dim, 2),
            torch.arange(1, rotary_dim, 2),
            torch.arange(rotary_dim, head_dim),
        ]
    )


def rope_complex(x: Tensor, angle: Tensor, *, inverse: bool = False) -> Tensor:
    """Interleaved layout, as complex multiplication. Returns float64 on the CPU.

    ``angle`` is ``x.shape[:-1] + (rotary_dim // 2,)`` (see :func:`angles`).
    """
    signed = -angle if inverse else angle
    return _turn_complex(x, torch.polar(torch.ones_like(signed), signed))


def _turn_complex(x: Tensor, factor: Tensor) -> Tensor:
    """Multiplies plane k, the complex number ``x[2k] + i x[2k+1]``, by ``factor[..., k]``."""
    x64 = x.cpu().to(torch.float64)  # differentiable, so gradients can be compared too
    rotary_dim = 2 * factor.size(-1)
    if rotary_dim == 0:
        return x64.clone()
    # A contiguous clone, not .contiguous(): an empty view of a padded tensor already counts as
    # contiguous yet sits at an odd storage offset, which view_as_complex refuses; the clone starts
    # at offset 0 with unit last stride (plain .clone() would keep a permuted input's strides).
    pairs = x64[..., :rotary_dim].reshape(*x64.shape[:-1], rotary_dim // 2, 2)
    pairs = pairs.clone(memory_format=torch.contiguous_format)
    turned = torch.view_as_complex(pairs) * factor
    rotated = torch.view_as_real(turned).reshape(*x64.shape[:-1], rotary_dim)
    return torch.cat([rotated, x64[..., rotary_dim:]], dim=-1)


def rotate_half(x: Tensor) -> Tensor:
    """``(x1, x2) -> (-x2, x1)`` on the two halves of the last dim (HF transformers)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def rope_rotate_half(x: Tensor, angle: Tensor, *, inverse: bool = False) -> Tensor:
    """Half-split layout, as ``x * cos + rotate_half(x) * sin``. Returns float64 on the CPU."""
    signed = -angle if inverse else angle
    return _turn_rotate_half(x, signed.cos(), signed.sin())


def _turn_rotate_half(x: Tensor, c: Tensor, s: Tensor) -> Tensor:
    """``x * cos + rotate_half(x) * sin`` on the first ``2 * c.size(-1)`` features."""
    x64 = x.cpu().to(torch.float64)  # differentiable, so gradients can be compared too
    rotary_dim = 2 * c.size(-1)
    if rotary_dim == 0:
        return x64.clone()
    cos = torch.cat([c, c], dim=-1)
    sin = torch.cat([s, s], dim=-1)
    rot = x64[..., :rotary_dim]
    return torch.cat([rot * cos + rotate_half(rot) * sin, x64[..., rotary_dim:]], dim=-1)


def rope(x: Tensor, angle: Tensor, *, interleaved: bool, inverse: bool = False) -> Tensor:
    """float64 oracle for either layout: the complex form for interleaved, rotate_half otherwise."""
    if interleaved:
        return rope_complex(x, angle, inverse=inverse)
    return rope_rotate_half(x, angle, inverse=inverse)


def rope_with_tables(
    x: Tensor,
    cos: Tensor,
    sin: Tensor,
    positions: Tensor,
    *,
    interleaved: bool,
    inverse: bool = False,
    mrope_section=None,
    mrope_interleaved: bool = False,
) -> Tensor:
    """float64 oracle that rotates by the given tables' rows (any values, any strides), gathered
    at ``positions`` broadcast to ``x.shape[:-1]`` (multi-axis: plane k's entry of the row at
    its axis' position). Returns float64 on the CPU.

    The transpose of ``[[c, -s], [s, c]]`` is ``[[c, s], [-s, c]]`` for any c and s, so
    ``inverse=True`` (s negated) is the gradient even when the tables are not a rotation."""
    half = cos.size(-1)
    pos = plane_positions(positions, x.shape[:-1], half, mrope_section, mrope_interleaved)
    plane = torch.arange(half)
    c = cos.detach().cpu().to(torch.float64)[pos, plane]
    s = sin.detach().cpu().to(torch.float64)[pos, plane]
    if inverse:
        s = -s
    if interleaved:
        return _turn_complex(x, torch.complex(c, s))
    return _turn_rotate_half(x, c, s)


def rope_matrix(angle_row: Tensor, head_dim: int, *, interleaved: bool) -> Tensor:
    """The explicit ``head_dim x head_dim`` rotation for one row's angles (small dims only)."""
    half = angle_row.numel()
    m = torch.eye(head_dim, dtype=torch.float64)
    for k in range(half):
        a, b = (2 * k, 2 * k + 1) if interleaved else (k, k + half)
        c, s = torch.cos(angle_row[k]), torch.sin(angle_row[k])
        m[a, a], m[a, b], m[b, a], m[b, b] = c, -s, s, c
    return m


# ---- fused QK-RMSNorm + RoPE: rms_norm_apply_qk -------------------------------------------------
# Normalise each row over its whole head_dim, then rotate it as apply_qk does (the tables' own
# values, so real, float64 and arbitrary tables all compare tightly).


def rms_norm(x: Tensor, weight: Tensor, *, eps: float, weight_offset: float = 0.0) -> Tensor:
    """float64 ``x / sqrt(mean(x**2) + eps) * (weight + weight_offset)`` over the last dim, on the
    CPU; differentiable in ``x`` and ``weight``."""
    x64 = x.cpu().to(torch.float64)
    w64 = weight.cpu().to(torch.float64)
    return x64 / torch.sqrt(x64.square().mean(-1, keepdim=True) + eps) * (w64 + weight_offset)


def rms_norm_rope_with_tables(
    x: Tensor,
    weight: Tensor,
    cos: Tensor,
    sin: Tensor,
    positions: Tensor,
    *,
    eps: float,
    weight_offset: float = 0.0,
    interleaved: bool,
    inverse: bool = False,
    mrope_section=None,
    mrope_interleaved: bool = False,
) -> Tensor:
    """float64 oracle of one output of ``rms_norm_apply_qk``: :func:`rms_norm`, then
    :func:`rope_with_tables` (features past rotary_dim only normalised). Differentiable in ``x``
    and ``weight``, so the gradients of the four inputs can be compared too."""
    return rope_with_tables(
        rms_norm(x, weight, eps=eps, weight_offset=weight_offset),
        cos,
        sin,
        positions,
        interleaved=interleaved,
        inverse=inverse,
        mrope_section=mrope_section,
        mrope_interleaved=mrope_interleaved,
    )


# ---- RoPE into a KV cache: apply_qk_cache --------------------------------------------------------
# q rotated as apply_qk rotates it; token t stores its rotated k row (and its v row as it is) at
# slot slot_mapping[t] of the caches, nothing for a negative (padding) slot. A 16/32-bit cache
# holds the values in its dtype; a float8 cache the storage rule below.

# The largest finite value of each float8 format, from its encoding: e4m3fn's 1.110 x 2^8 (its
# all-ones pattern is NaN, so 1.111 x 2^8 is not a number) and e5m2's 1.11 x 2^15 (an IEEE layout).
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
FP8_DTYPES = tuple(FP8_MAX)


def rope_into_cache(
    q: Tensor,
    k: Tensor,
    v: Optional[Tensor],
    cos: Tensor,
    sin: Tensor,
    positions: Tensor,
    slot_mapping: Tensor,
    *,
    interleaved: bool,
) -> Tuple[Tensor, Tensor, Optional[Tensor], Tensor]:
    """float64 oracle of ``apply_qk_cache``, on the CPU: ``(q_out, k_rows, v_rows, slots)``.

    ``q_out`` is ``q`` rotated; ``k_rows`` (``v_rows``) are the rotated k rows (the v rows, None
    without v) of the tokens whose slot is >= 0, in token order, and ``slots`` their slots.
    positions broadcast to ``(T, H)`` of q and of k, as in apply_qk."""
    q_out = rope_with_tables(q.detach(), cos, sin, positions, interleaved=interleaved)
    k_out = rope_with_tables(k.detach(), cos, sin, positions, interleaved=interleaved)
    slots = slot_mapping.detach().cpu().to(torch.int64)
    stored = slots >= 0
    v_rows = None if v is None else v.detach().cpu().to(torch.float64)[stored]
    return q_out, k_out[stored], v_rows, slots[stored]


def cache_row_index(cache: Tensor, slots: Tensor) -> Tuple[Tensor, ...]:
    """The index of the rows of ``slots`` (>= 0) in a flat ``(num_slots, H, D)`` cache, or a paged
    ``(num_blocks, block_size, H, D)`` one: slot ``s`` is block ``s // block_size``, row
    ``s % block_size``. ``cache[cache_row_index(cache, slots)]`` is ``(len(slots), H, D)``."""
    slots = slots.to(device=cache.device, dtype=torch.int64)
    if cache.dim() == 3:
        return (slots,)
    block_size = cache.size(1)
    return (torch.div(slots, block_size, rounding_mode="floor"), slots % block_size)


def quantize_fp8(value: Tensor, scale, fp8_dtype: torch.dtype, *, multiply: bool = False) -> Tensor:
    """The float8 storage rule: ``(value / scale).clamp(-max, max).to(fp8_dtype)`` with PyTorch's
    own conversion (round to nearest even; NaN stays NaN); ``value * scale`` with ``multiply``
    (FlashInfer's rule, the serving fusions' ``multiply_by_scale``). ``scale`` is a float32 number
    (the op's scale is a float32 tensor; a Python float is rounded to float32 first). The
    division is in ``value``'s dtype: float32 for 16-bit values (widened here, exactly) and
    float32 ones, float64 for float64 ones, as the op computes them. On the CPU."""
    value = value.detach().cpu()
    if value.dtype in (torch.float16, torch.bfloat16):
        value = value.float()
    assert value.dtype in (torch.float32, torch.float64), f"a float value, got {value.dtype}"
    s = torch.as_tensor(scale).detach().cpu().to(torch.float32).reshape(()).to(value.dtype)
    m = FP8_MAX[fp8_dtype]
    return (value * s if multiply else value / s).clamp(-m, m).to(fp8_dtype)


def fp8_bounds(
    value: Tensor, slack: Tensor, scale, fp8_dtype: torch.dtype, math_dtype: torch.dtype
) -> Tuple[Tensor, Tensor]:
    """float8 bytes ``(lo, hi)`` that the stored byte must lie between (decoded) when the op
    computes ``value`` (float64) in ``math_dtype`` with an error of at most ``slack``: the
    storage rule is monotone, so whatever the op computed within the slack quantizes between
    the quantizations of the slack's two ends. With zero slack they decode alike: the exact byte."""
    value = value.detach().cpu().to(torch.float64)
    lo = quantize_fp8((value - slack).to(math_dtype), scale, fp8_dtype)
    hi = quantize_fp8((value + slack).to(math_dtype), scale, fp8_dtype)
    return lo, hi


# ---- the frequency form (table-free): angles p * f exactly ------------------------------------
# The angle of plane k at integer position p is the exact real number p * freqs[k] (freqs[k] the
# float64 value as stored). Its cosine and sine come from mpmath, with the reduction modulo 2 pi
# carried out at the angle's own magnitude plus 100 bits, so they are correct to float64 rounding
# at any position up to 2^63. Nothing here knows how the library reduces angles.


def exact_cos_sin(position: int, freq: float):
    """(cos, sin) of position * freq as Python floats, correctly rounded in practice (the error
    before rounding is below 2^-90)."""
    import mpmath

    p = int(position)
    f = float(freq)
    if p == 0 or f == 0.0:
        return 1.0, 0.0
    magnitude = max(0, int(mpmath.mag(mpmath.mpf(f) * p)))
    with mpmath.workprec(magnitude + 160):
        angle = mpmath.mpf(f) * p  # exact: 53 x 63 bits fit
        return float(mpmath.cos(angle)), float(mpmath.sin(angle))


def exact_tables(positions, freqs, attention_factor: float = 1.0):
    """float64 (cos, sin) of shape ``positions.shape + (len(freqs),)``: attention_factor times the
    cos / sin of every (position, plane) pair, each pair computed once."""
    pos = positions.cpu().to(torch.int64)
    f = [float(v) for v in freqs.cpu().to(torch.float64).tolist()]
    flat = pos.reshape(-1).tolist()
    cache = {}
    cos = torch.empty(len(flat), len(f), dtype=torch.float64)
    sin = torch.empty(len(flat), len(f), dtype=torch.float64)
    for i, p in enumerate(flat):
        for k, fk in enumerate(f):
            key = (p, fk)
            if key not in cache:
                cache[key] = exact_cos_sin(p, fk)
            c, s = cache[key]
            cos[i, k] = c * attention_factor
            sin[i, k] = s * attention_factor
    shape = tuple(pos.shape) + (len(f),)
    return cos.view(shape), sin.view(shape)


def rope_with_frequencies(
    x: Tensor,
    freqs: Tensor,
    positions: Tensor,
    *,
    attention_factor: float = 1.0,
    interleaved: bool,
    inverse: bool = False,
    mrope_section=None,
    mrope_interleaved: bool = False,
) -> Tensor:
    """float64 oracle of the frequency form: plane k of each row turns by its position (its
    axis' position with ``mrope_section``) times freqs[k], exactly, and is scaled by the attention
    factor. Returns float64 on the CPU, differentiable in x."""
    half = freqs.numel()
    pos = plane_positions(positions, x.shape[:-1], half, mrope_section, mrope_interleaved)
    # Every distinct (position, plane) once.
    distinct, inverse_index = torch.unique(pos.reshape(-1, half), dim=0, return_inverse=True)
    c = torch.empty(distinct.shape, dtype=torch.float64)
    s = torch.empty(distinct.shape, dtype=torch.float64)
    f = [float(v) for v in freqs.cpu().to(torch.float64).tolist()]
    for r, row in enumerate(distinct.tolist()):
        for k, p in enumerate(row):
            ck, sk = exact_cos_sin(p, f[k])
            c[r, k] = ck * attention_factor
            s[r, k] = sk * attention_factor
    c = c[inverse_index].view(pos.shape)
    s = s[inverse_index].view(pos.shape)
    if inverse:
        s = -s
    if interleaved:
        return _turn_complex(x, torch.complex(c, s))
    return _turn_rotate_half(x, c, s)


# ---- packed sequences: the positions the rules give ----------------------------------------------


def packed_positions(cu_seqlens, seq_offsets=None, cp_size: int = 1, cp_rank: int = 0):
    """int64 (T,) positions of the local tokens of packed sequences, written out token by token
    from the rules (docs/architecture.md; TransformerEngine's zigzag layout): sequence i holds
    global tokens [cu[i], cu[i + 1]); with cp_size > 1 it is cut into 2 cp_size chunks of
    c = len / (2 cp_size) and rank r keeps chunks r and 2 cp_size - 1 - r, in that order."""
    cu = [int(v) for v in cu_seqlens.cpu().tolist()]
    offsets = [0] * (len(cu) - 1) if seq_offsets is None else [int(v) for v in seq_offsets.tolist()]
    out = []
    for i in range(len(cu) - 1):
        length = cu[i + 1] - cu[i]
        global_positions = list(range(length))  # position of global token j of the sequence
        if cp_size == 1:
            mine = global_positions
        else:
            c = length // (2 * cp_size)
            chunks = [global_positions[n * c : (n + 1) * c] for n in range(2 * cp_size)]
            mine = chunks[cp_rank] + chunks[2 * cp_size - 1 - cp_rank]
        out += [offsets[i] + p for p in mine]
    return torch.tensor(out, dtype=torch.int64)


# ---- fp8 outputs of the serving fusions (apply_qk_fp8 and the fused cache writes) -------------
# The quantization's bit-exact reference is quantize_fp8 above (torch's own cast of the float32
# value, saturated); fp8_close holds an output to the float64 oracle within one fp8 step.

# One fp8 step relative to the value (3 / 2 mantissa bits) and the smallest subnormal.
FP8_STEP = {torch.float8_e4m3fn: (2.0**-3, 2.0**-9), torch.float8_e5m2: (2.0**-2, 2.0**-16)}


def fp8_close(got: Tensor, value: Tensor, scale, dtype, *, multiply: bool = False) -> None:
    """``got`` (fp8) decodes to ``value`` scaled (float64) within one fp8 step."""
    rel, tiny = FP8_STEP[dtype]
    v = value.double().cpu()
    want = (v * float(scale) if multiply else v / float(scale)).clamp(
        -FP8_MAX[dtype], FP8_MAX[dtype]
    )
    torch.testing.assert_close(got.cpu().double(), want, rtol=rel, atol=tiny)


def same_bits(a: Tensor, b: Tensor) -> bool:
    """Bit equality of two tensors of one element size (NaN codes compare equal)."""
    return torch.equal(a.cpu().view(torch.uint8), b.cpu().view(torch.uint8))
