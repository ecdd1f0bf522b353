# SPDX-License-Identifier: BSD-3-Clause
"""The properties that make RoPE what it is, shown on the library's output (and checks of the test
oracles themselves: the two RoPE routes against each other and the explicit rotation matrix, the
RMSNorm one against scalar math, the float8 storage rule and the cache's slots)."""

import math

import pytest
import references as ref
import torch
from helpers import (
    FLOAT_DTYPES,
    LAYOUT_IDS,
    LAYOUTS,
    TOLERANCES,
    cpu_and_cuda,
    dtype_id,
    make_tables,
    randn,
    table_dtype_for,
)

import torch_rope

MAX_SEQ_LEN = 256


# ---- the oracles themselves ---------------------------------------------------------------------


@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("head_dim,rotary_dim", [(8, 8), (10, 6), (4, 2)])
def test_oracles_equal_explicit_rotation_matrix(head_dim, rotary_dim, interleaved):
    x = torch.randn(5, head_dim, dtype=torch.float64)
    positions = torch.tensor([0, 1, 7, 100, 255])
    ang = ref.angles(positions, x.shape[:-1], rotary_dim)
    got = ref.rope(x, ang, interleaved=interleaved)
    for row in range(5):
        m = ref.rope_matrix(ang[row], head_dim, interleaved=interleaved)
        torch.testing.assert_close(got[row], m @ x[row], rtol=1e-13, atol=1e-13)
    inv = ref.rope(got, ang, interleaved=interleaved, inverse=True)
    torch.testing.assert_close(inv, x, rtol=1e-13, atol=1e-13)


def test_oracles_related_by_deinterleave_permutation():
    head_dim, rotary_dim = 80, 48
    x = torch.randn(4, 6, head_dim, dtype=torch.float64)
    ang = ref.angles(torch.randint(0, MAX_SEQ_LEN, (6,)), x.shape[:-1], rotary_dim)
    perm = ref.deinterleave_permutation(rotary_dim, head_dim)
    complex_form = ref.rope_complex(x, ang)
    rotate_half_form = ref.rope_rotate_half(x[..., perm], ang)
    torch.testing.assert_close(complex_form[..., perm], rotate_half_form, rtol=1e-13, atol=1e-13)


def test_rms_norm_oracle_equals_scalar_math():
    # Row by row with Python's own floats (math.fsum, math.sqrt), not torch's reductions; and
    # through tables that turn nothing (cos 1, sin 0) the fused oracle is the norm alone.
    x = torch.randn(3, 2, 10, dtype=torch.float64)
    w = torch.randn(10, dtype=torch.float64)
    got = ref.rms_norm(x, w, eps=0.25, weight_offset=1.0)
    for index in range(6):
        row = x.reshape(-1, 10)[index].tolist()
        r = 1.0 / math.sqrt(math.fsum(v * v for v in row) / 10 + 0.25)
        want = [v * r * (wi + 1.0) for v, wi in zip(row, w.tolist())]
        torch.testing.assert_close(got.reshape(-1, 10)[index].tolist(), want, rtol=1e-14, atol=0)
    cos, sin = torch.ones(4, 3, dtype=torch.float64), torch.zeros(4, 3, dtype=torch.float64)
    fused = ref.rms_norm_rope_with_tables(
        x, w, cos, sin, torch.tensor([0, 3]), eps=0.25, weight_offset=1.0,
        interleaved=False,
    )  # fmt: skip
    torch.testing.assert_close(fused, got, rtol=0, atol=0)


@pytest.mark.parametrize("fp8", ref.FP8_DTYPES, ids=dtype_id)
def test_fp8_oracle_is_the_storage_rule(fp8):
    # The formats' largest values, written from their encodings, are torch's; every finite byte
    # pattern is stored as itself at scale 1; past the largest value it saturates, with the sign;
    # a scale divides; zero slack brackets one byte.
    assert ref.FP8_MAX[fp8] == torch.finfo(fp8).max
    every = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(fp8)
    finite = every[every.float().isfinite()]
    stored = ref.quantize_fp8(finite.float(), 1.0, fp8)
    assert torch.equal(stored.view(torch.uint8), finite.view(torch.uint8))
    big = torch.tensor([1e30, -1e30, 2 * ref.FP8_MAX[fp8]], dtype=torch.float64)
    assert ref.quantize_fp8(big, 1.0, fp8).double().tolist() == [
        ref.FP8_MAX[fp8], -ref.FP8_MAX[fp8], ref.FP8_MAX[fp8]
    ]  # fmt: skip
    assert ref.quantize_fp8(torch.tensor([3.0]), 0.5, fp8).double().item() == 6.0
    lo, hi = ref.fp8_bounds(finite.double(), torch.zeros(()), 1.0, fp8, torch.float32)
    assert torch.equal(lo.double(), hi.double())  # (-0 - 0 is -0, -0 + 0 is +0: equal values)


def test_cache_oracle_finds_a_slot_in_a_flat_and_a_paged_cache_alike():
    # Slot s of a paged (num_blocks, block_size, H, D) cache is row s of the same memory viewed
    # flat (num_slots, H, D).
    paged = torch.randn(5, 4, 2, 3)
    flat = paged.view(20, 2, 3)
    slots = torch.tensor([0, 3, 4, 19, 7])
    assert torch.equal(
        paged[ref.cache_row_index(paged, slots)], flat[ref.cache_row_index(flat, slots)]
    )
    q = torch.randn(5, 2, 4, dtype=torch.float64)
    cos, sin = torch.randn(8, 2, dtype=torch.float64), torch.randn(8, 2, dtype=torch.float64)
    positions = torch.tensor([1, 2, 3, 4, 5]).view(5, 1)
    q_out, k_rows, v_rows, stored = ref.rope_into_cache(
        q, q[:, :1], None, cos, sin, positions, torch.tensor([3, -1, 0, -7, 2]), interleaved=True
    )
    assert stored.tolist() == [3, 0, 2] and v_rows is None
    # (the complex product is vectorised differently for 2 heads and for 1: an ulp apart)
    torch.testing.assert_close(k_rows, q_out[[0, 2, 4], :1], rtol=1e-14, atol=1e-14)


# ---- the library --------------------------------------------------------------------------------


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("rotary_dim", [80, 48])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
def test_layouts_related_by_deinterleave_permutation(dtype, rotary_dim, device):
    head_dim = 80
    cos, sin = make_tables(MAX_SEQ_LEN, rotary_dim, device, table_dtype_for(dtype))
    x = randn(2, 3, 9, head_dim, dtype=dtype, device=device)
    positions = torch.randint(0, MAX_SEQ_LEN, (9,), device=device)
    perm = ref.deinterleave_permutation(rotary_dim, head_dim).to(device)

    interleaved = torch_rope.apply(x, cos, sin, positions, interleaved=True)
    half_split = torch_rope.apply(x[..., perm], cos, sin, positions, interleaved=False)

    torch.testing.assert_close(interleaved[..., perm], half_split, **TOLERANCES[dtype])


def _scores(q, k, cos, sin, q_pos, k_pos, interleaved):
    """(R_i q) . (R_j k) for each pair (q_pos[n], k_pos[n])."""
    n = q_pos.numel()
    rq = torch_rope.apply(q.expand(n, -1), cos, sin, q_pos, interleaved=interleaved)
    rk = torch_rope.apply(k.expand(n, -1), cos, sin, k_pos, interleaved=interleaved)
    return (rq.double() * rk.double()).sum(-1)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize(
    "dtype,tol", [(torch.float64, 1e-11), (torch.float32, 1e-4)], ids=["float64", "float32"]
)
def test_scores_depend_only_on_relative_position(dtype, tol, interleaved, device):
    head_dim = 64
    cos, sin = make_tables(MAX_SEQ_LEN, head_dim, device, table_dtype_for(dtype))
    q = randn(1, head_dim, dtype=dtype, device=device)
    k = randn(1, head_dim, dtype=dtype, device=device)
    i = torch.tensor([0, 3, 10, 17, 40, 5], device=device)
    j = torch.tensor([0, 9, 2, 17, 1, 60], device=device)

    base = _scores(q, k, cos, sin, i, j, interleaved)
    for shift in (1, 13, 150):
        shifted = _scores(q, k, cos, sin, i + shift, j + shift, interleaved)
        torch.testing.assert_close(shifted, base, rtol=tol, atol=tol * 8)

    # Not vacuous: equal offsets give equal scores, different offsets different ones.
    torch.testing.assert_close(base[3], base[0], rtol=tol, atol=tol * 8)  # i - j = 0 twice
    for n in (1, 2, 4, 5):
        assert (base[n] - base[0]).abs() > 1e-3, f"offset {int(i[n] - j[n])} scored as offset 0"


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
def test_score_matrix_is_toeplitz(interleaved, device):
    # scores[i, j] for one q and one k vector at all positions: constant along each diagonal.
    S, head_dim = 24, 32
    cos, sin = make_tables(MAX_SEQ_LEN, head_dim, device, torch.float64)
    q = randn(1, head_dim, dtype=torch.float64, device=device).expand(S, -1)
    k = randn(1, head_dim, dtype=torch.float64, device=device).expand(S, -1)
    positions = torch.arange(S, device=device)
    rq = torch_rope.apply(q, cos, sin, positions, interleaved=interleaved)
    rk = torch_rope.apply(k, cos, sin, positions, interleaved=interleaved)
    scores = rq @ rk.T
    torch.testing.assert_close(scores[1:, 1:], scores[:-1, :-1], rtol=1e-12, atol=1e-12)
    assert not torch.allclose(scores[0, 1:], scores[0, :-1]), "scores must vary with i - j"


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("rotary_dim", [64, 32])
@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
def test_norm_preserved_per_plane(interleaved, rotary_dim, device):
    head_dim = 64
    cos, sin = make_tables(MAX_SEQ_LEN, rotary_dim, device, torch.float64)
    x = randn(3, 5, head_dim, dtype=torch.float64, device=device)
    positions = torch.randint(1, MAX_SEQ_LEN, (5,), device=device)
    out = torch_rope.apply(x, cos, sin, positions, interleaved=interleaved)

    half = rotary_dim // 2
    if interleaved:
        a, b = slice(0, rotary_dim, 2), slice(1, rotary_dim, 2)
    else:
        a, b = slice(0, half), slice(half, rotary_dim)
    plane_norm_in = x[..., a] ** 2 + x[..., b] ** 2
    plane_norm_out = out[..., a] ** 2 + out[..., b] ** 2
    torch.testing.assert_close(plane_norm_out, plane_norm_in, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1), rtol=1e-12, atol=1e-12)
    # ... while the features themselves moved.
    assert not torch.allclose(out[..., :rotary_dim], x[..., :rotary_dim])


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
def test_inverse_undoes_forward(dtype, interleaved, device):
    head_dim, rotary_dim = 80, 48
    cos, sin = make_tables(MAX_SEQ_LEN, rotary_dim, device, table_dtype_for(dtype))
    x = randn(2, 7, 3, head_dim, dtype=dtype, device=device)
    positions = torch.randint(0, MAX_SEQ_LEN, (7, 1), device=device)
    out = torch_rope.apply(x, cos, sin, positions, interleaved=interleaved)
    back = torch_rope.apply(out, cos, sin, positions, interleaved=interleaved, inverse=True)
    tol = {k: 2 * v for k, v in TOLERANCES[dtype].items()}  # two roundings to storage
    torch.testing.assert_close(back, x, **tol)
    forward_again = torch_rope.apply(back, cos, sin, positions, interleaved=interleaved)
    torch.testing.assert_close(forward_again, out, **{k: 3 * v for k, v in tol.items()})


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
def test_position_zero_is_identity(dtype, interleaved, device):
    cos, sin = make_tables(MAX_SEQ_LEN, 64, device)
    x = randn(4, 3, 64, dtype=dtype, device=device)
    out = torch_rope.apply(
        x, cos, sin, torch.zeros(4, 1, dtype=torch.int32, device=device), interleaved=interleaved
    )
    assert torch.equal(out, x)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
def test_rotations_compose(interleaved, device):
    # R_a R_b = R_(a+b): the angle is linear in the position.
    cos, sin = make_tables(MAX_SEQ_LEN, 64, device, torch.float64)
    x = randn(6, 64, dtype=torch.float64, device=device)
    a = torch.tensor([0, 1, 5, 30, 100, 127], device=device)
    b = torch.tensor([3, 1, 0, 77, 27, 128], device=device)
    twice = torch_rope.apply(
        torch_rope.apply(x, cos, sin, a, interleaved=interleaved),
        cos,
        sin,
        b,
        interleaved=interleaved,
    )
    once = torch_rope.apply(x, cos, sin, a + b, interleaved=interleaved)
    torch.testing.assert_close(twice, once, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
def test_unit_vector_turns_by_its_position(interleaved, device):
    # Worked by hand, no oracle: plane 0 has inv_freq = theta^0 = 1, so e_0 at position p becomes
    # cos(p) e_0 + sin(p) e_partner, where the partner is feature 1 (interleaved) or
    # rotary_dim / 2 (half split); every other feature stays 0. The inverse turns by -p.
    cos, sin = torch_rope.rope_tables(10000.0, 8, 32, device=device)
    x = torch.zeros(8, dtype=torch.float64, device=device)
    x[0] = 1.0
    position = torch.tensor(7, device=device)  # 0-dim: broadcasts to the single row
    partner = 1 if interleaved else 4
    for inverse, sign in ((False, 1.0), (True, -1.0)):
        out = torch_rope.apply(
            x, cos, sin, position, interleaved=interleaved, inverse=inverse
        ).cpu()
        want = torch.zeros(8, dtype=torch.float64)
        want[0], want[partner] = math.cos(7.0), sign * math.sin(7.0)
        torch.testing.assert_close(out, want, rtol=0, atol=1e-7)  # float32 tables


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
def test_decode_rows_equal_prefill_rows(dtype, device):
    # KV-cache decode: rotating the last tokens with start_pos + arange(n) gives exactly, bit for
    # bit, the rows the full-sequence call gives (a row depends on its values and position only).
    cos, sin = make_tables(MAX_SEQ_LEN, 32, device, table_dtype_for(dtype))
    S, start = 12, 9
    x = randn(2, 4, S, 40, dtype=dtype, device=device)
    for interleaved in LAYOUTS:
        full = torch_rope.apply(
            x, cos, sin, torch.arange(S, device=device), interleaved=interleaved
        )
        tail = torch_rope.apply(
            x[:, :, start:],
            cos,
            sin,
            torch.arange(start, S, device=device),
            interleaved=interleaved,
        )
        assert torch.equal(tail, full[:, :, start:])


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_no_head_dim_squared_memory(device):
    # head_dim = 2**18: a d x d rotation matrix would need 256 GiB (float32), more than any
    # machine this runs on; the op must work on the two rows it is given.
    head_dim = 2**18
    cos, sin = make_tables(3, head_dim, device)
    x = randn(2, head_dim, device=device)
    positions = torch.tensor([1, 2], device=device)
    for interleaved in LAYOUTS:
        out = torch_rope.apply(x, cos, sin, positions, interleaved=interleaved)
        want = ref.rope(x, ref.angles(positions, (2,), head_dim), interleaved=interleaved)
        torch.testing.assert_close(out.cpu(), want.float(), rtol=1e-5, atol=1e-5)


# ---- multi-axis positions (mrope_section) ------------------------------------------------------

MROPE = [
    pytest.param(dict(mrope_section=[4, 6, 6], mrope_interleaved=False), id="sections"),
    pytest.param(dict(mrope_section=[6, 5, 5], mrope_interleaved=True), id="interleaved3"),
]


@pytest.mark.parametrize("mrope", MROPE)
@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
def test_multi_axis_oracle_equals_explicit_rotation_matrix(interleaved, mrope):
    # Each plane turns by its own axis' position: the block-diagonal matrix of those angles.
    head_dim, rotary_dim = 40, 32
    x = torch.randn(4, head_dim, dtype=torch.float64)
    positions = torch.tensor([[0, 0, 0], [1, 7, 100], [255, 3, 9], [12, 200, 4]])
    ang = ref.angles(positions, (4,), rotary_dim, **mrope)
    axis = ref.mrope_axis_of_plane(mrope["mrope_section"], mrope["mrope_interleaved"])
    got = ref.rope(x, ang, interleaved=interleaved)
    for row in range(4):
        angle_row = positions[row, axis].double() * ref.inv_freq(rotary_dim)
        m = ref.rope_matrix(angle_row, head_dim, interleaved=interleaved)
        torch.testing.assert_close(got[row], m @ x[row], rtol=1e-13, atol=1e-13)


def test_multi_axis_axis_rule_by_hand():
    # Qwen2-VL (contiguous runs) and Qwen3-VL (interleaved) on small sections, written out.
    assert ref.mrope_axis_of_plane([2, 1, 3]).tolist() == [0, 0, 1, 2, 2, 2]
    assert ref.mrope_axis_of_plane([0, 2, 0, 1]).tolist() == [1, 1, 3]
    assert ref.mrope_axis_of_plane([4, 2, 2], True).tolist() == [0, 1, 2, 0, 1, 2, 0, 0]
    assert ref.mrope_axis_of_plane([2, 3, 1], True).tolist() == [0, 1, 2, 0, 1, 0]


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("mrope", MROPE)
@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
def test_multi_axis_with_equal_axes_is_one_axis_rope(interleaved, mrope, device):
    # Text tokens of Qwen2-VL: t = h = w. Any section then gives plain RoPE, bit for bit.
    cos, sin = make_tables(MAX_SEQ_LEN, 32, device)
    x = randn(2, 9, 3, 40, device=device)
    positions = torch.randint(0, MAX_SEQ_LEN, (9, 1), device=device)
    one = torch_rope.apply(x, cos, sin, positions, interleaved=interleaved)
    multi = torch_rope.apply(
        x, cos, sin, positions.unsqueeze(-1).expand(9, 1, 3), interleaved=interleaved, **mrope
    )
    assert torch.equal(multi, one)


def _multi_axis_scores(q, k, cos, sin, q_pos, k_pos, kw):
    """(R_i q) . (R_j k) for each pair of (A,) positions (q_pos[n], k_pos[n])."""
    n = q_pos.shape[0]
    rq = torch_rope.apply(q.expand(n, -1), cos, sin, q_pos, **kw)
    rk = torch_rope.apply(k.expand(n, -1), cos, sin, k_pos, **kw)
    return (rq.double() * rk.double()).sum(-1)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("mrope", MROPE)
@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize(
    "dtype,tol", [(torch.float64, 1e-11), (torch.float32, 1e-4)], ids=["float64", "float32"]
)
def test_multi_axis_scores_depend_only_on_per_axis_differences(
    dtype, tol, interleaved, mrope, device
):
    # q at (t, h, w), k at (t', h', w'): the score depends on (t - t', h - h', w - w') alone.
    # Shifting every axis by its own amount leaves it; changing one axis' difference does not.
    head_dim = 32
    cos, sin = make_tables(MAX_SEQ_LEN, head_dim, device, table_dtype_for(dtype))
    q = randn(1, head_dim, dtype=dtype, device=device)
    k = randn(1, head_dim, dtype=dtype, device=device)
    i = torch.tensor([[0, 0, 0], [3, 10, 4], [17, 2, 30], [40, 40, 1]], device=device)
    j = torch.tensor([[0, 0, 0], [9, 1, 4], [17, 20, 3], [1, 60, 50]], device=device)
    kw = dict(interleaved=interleaved, **mrope)

    base = _multi_axis_scores(q, k, cos, sin, i, j, kw)
    for shift in ([1, 0, 0], [0, 13, 0], [0, 0, 150], [5, 77, 31]):
        s = torch.tensor(shift, device=device)
        shifted = _multi_axis_scores(q, k, cos, sin, i + s, j + s, kw)
        torch.testing.assert_close(shifted, base, rtol=tol, atol=tol * 8)

    # Not vacuous: moving one axis of q alone changes the score, for every axis (by 100: the
    # last axis of the contiguous section holds the lowest frequencies).
    for axis in range(3):
        s = torch.zeros(3, dtype=torch.long, device=device)
        s[axis] = 100
        moved = _multi_axis_scores(q, k, cos, sin, i + s, j, kw)
        assert ((moved - base).abs() > 1e-3).all(), f"axis {axis} does not reach the score"
