# SPDX-License-Identifier: BSD-3-Clause
"""rope.apply against the float64 oracles: dtypes, layouts, head_dims, partial rotary, input
strides and every documented positions shape."""

import pytest
import references as ref
import torch
from helpers import (
    FLOAT_DTYPES,
    HEAD_DIMS,
    LAYOUT_IDS,
    LAYOUTS,
    TOLERANCES,
    assert_matches_reference,
    cpu_and_cuda,
    dtype_id,
    expected,
    make_tables,
    randn,
    table_dtype_for,
)
from samples import GEOMETRIES, MAX_SEQ_LEN, B, H, S, spread_positions

import torch_rope


def partial_rotary_dim(head_dim: int) -> int:
    return 32 if head_dim == 80 else head_dim // 2


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("rotary", ["full", "partial"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
def test_apply_matches_reference(device, dtype, interleaved, head_dim, rotary):
    rotary_dim = head_dim if rotary == "full" else partial_rotary_dim(head_dim)
    cos, sin = make_tables(MAX_SEQ_LEN, rotary_dim, device, table_dtype_for(dtype))
    x = randn(B, H, S, head_dim, dtype=dtype, device=device)
    x_before = x.clone()
    positions = spread_positions(S, device)

    out = torch_rope.apply(x, cos, sin, positions, interleaved=interleaved)

    assert_matches_reference(out, x, positions, rotary_dim, interleaved=interleaved)
    assert out.is_contiguous()
    assert torch.equal(out[..., rotary_dim:], x[..., rotary_dim:]), "pass-through features changed"
    assert torch.equal(x, x_before), "apply must not modify its input"


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
def test_inverse_matches_reference(device, dtype, interleaved):
    head_dim, rotary_dim = 80, 48
    cos, sin = make_tables(MAX_SEQ_LEN, rotary_dim, device, table_dtype_for(dtype))
    x = randn(B, S, H, head_dim, dtype=dtype, device=device)
    positions = spread_positions(S, device).unsqueeze(-1)
    out = torch_rope.apply(x, cos, sin, positions, interleaved=interleaved, inverse=True)
    assert_matches_reference(out, x, positions, rotary_dim, interleaved=interleaved, inverse=True)


# ---- input layouts x positions shapes (samples.GEOMETRIES) ---------------------------------------


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("pos_dtype", [torch.int32, torch.int64], ids=dtype_id)
@pytest.mark.parametrize("head_dim,rotary_dim", [(80, 80), (80, 48)])
@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("case", list(GEOMETRIES))
def test_input_layouts_and_positions(
    case, dtype, interleaved, head_dim, rotary_dim, pos_dtype, device
):
    x, positions = GEOMETRIES[case](head_dim, dtype, device)
    positions = positions.to(pos_dtype)
    x_before = x.clone()
    cos, sin = make_tables(MAX_SEQ_LEN, rotary_dim, device)

    out = torch_rope.apply(x, cos, sin, positions, interleaved=interleaved)

    assert_matches_reference(out, x, positions, rotary_dim, interleaved=interleaved)
    assert out.is_contiguous()
    assert torch.equal(x, x_before)
    if pos_dtype == torch.int32:  # the index type cannot change a bit of the result
        wide = torch_rope.apply(x, cos, sin, positions.long(), interleaved=interleaved)
        assert torch.equal(out, wide)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize(
    "head_dim,rotary_dim", [(2, 2), (6, 4), (10, 10), (34, 18), (66, 62), (130, 2), (96, 96)]
)
def test_vector_tails(head_dim, rotary_dim, dtype, interleaved, device):
    # Plane counts that are not multiples of any vector width, odd row counts, a lone plane.
    cos, sin = make_tables(MAX_SEQ_LEN, rotary_dim, device, table_dtype_for(dtype))
    x = randn(37, head_dim, dtype=dtype, device=device)
    positions = torch.randint(0, MAX_SEQ_LEN, (37,), device=device)
    out = torch_rope.apply(x, cos, sin, positions, interleaved=interleaved)
    assert_matches_reference(out, x, positions, rotary_dim, interleaved=interleaved)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=dtype_id)
@pytest.mark.parametrize("layout", ["bhsd_B1S", "qkv_slice_S1"])
def test_many_rows_split_across_threads(layout, dtype, interleaved, device):
    # Enough rows for at::parallel_for to hand out several chunks, which then start in the middle
    # of a dim: a contiguous input, and a slice of a fused projection whose rows are not evenly
    # spaced.
    cos, sin = make_tables(4096, 64, device)
    if layout == "bhsd_B1S":
        x = randn(4, 8, 512, 64, dtype=dtype, device=device)
        positions = torch.randint(0, 4096, (4, 1, 512), device=device)
    else:
        x = randn(3, 700, 3, 2, 64, dtype=dtype, device=device).select(2, 2)
        positions = torch.randint(0, 4096, (700, 1), device=device, dtype=torch.int32)
    out = torch_rope.apply(x, cos, sin, positions, interleaved=interleaved)
    assert_matches_reference(out, x, positions, 64, interleaved=interleaved)
    if device == "cpu":
        # Rows are independent: the thread count cannot change a single bit.
        threads = torch.get_num_threads()
        try:
            torch.set_num_threads(1)
            serial = torch_rope.apply(x, cos, sin, positions, interleaved=interleaved)
        finally:
            torch.set_num_threads(threads)
        assert torch.equal(serial, out)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
def test_long_context_positions(interleaved, device):
    # Angles of ~1e5 rad: float32 tables built from float64 angles keep float32 accuracy.
    max_seq_len = 131072
    cos, sin = make_tables(max_seq_len, 128, device)
    x = randn(2, 4, 128, device=device)
    positions = torch.tensor([max_seq_len - 1, 100003, 65536, 7], device=device)
    out = torch_rope.apply(x, cos, sin, positions.view(1, 4), interleaved=interleaved)
    assert_matches_reference(out, x, positions.view(1, 4), 128, interleaved=interleaved)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("inverse", [False, True], ids=["forward", "inverse"])
@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("table_dtype", [torch.float32, torch.float64], ids=dtype_id)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=dtype_id)
def test_uses_the_given_tables(dtype, table_dtype, interleaved, inverse, device):
    # Arbitrary tables (not cos/sin of anything, rows not unit-norm), given as strided views:
    # catches swapped cos/sin, a transposed gather, or a kernel that recomputes angles itself.
    half, rows = 12, 20
    big = torch.randn(2 * rows, 3 * half, dtype=torch.float64).to(table_dtype)
    cos, sin = big[::2, :half], big[1::2, half : 2 * half]
    x = randn(B, S, 2 * half + 6, dtype=dtype)
    positions = torch.randint(0, rows, (S,))
    kw = dict(interleaved=interleaved, inverse=inverse)

    out = torch_rope.apply(x.to(device), cos.to(device), sin.to(device), positions.to(device), **kw)

    # The oracle multiplies by the tables' own values, so they need not be a rotation.
    want = ref.rope_with_tables(x, cos, sin, positions, **kw)
    torch.testing.assert_close(out.cpu(), want.to(dtype), **TOLERANCES[dtype])


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("first,count", [(0, 6), (3, 1)], ids=["prefix", "single_row"])
@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
def test_tables_given_as_a_window_of_rows(first, count, interleaved, device):
    # A window of rows of a fused [cos | sin] cache is a shorter table: max_seq_len is the
    # window's size, position p reads row first + p, and the window's end is the bound.
    cos_full, sin_full = make_tables(MAX_SEQ_LEN, 32, "cpu")
    cache = torch.cat([cos_full, sin_full], dim=1).to(device)
    cos, sin = cache[first : first + count, :16], cache[first : first + count, 16:]
    x = randn(2, 3, 5, 40, device=device)
    positions = torch.randint(0, count, (5,), device=device)
    out = torch_rope.apply(x, cos, sin, positions, interleaved=interleaved)
    assert_matches_reference(out, x, first + positions.cpu(), 32, interleaved=interleaved)
    if device == "cpu":  # (CUDA: a device-side assert, tested in test_cuda.py)
        with pytest.raises(
            IndexError,
            match=rf"max_seq_len = cos\.size\(0\) = {count}, "
            rf"got {count}",
        ):
            torch_rope.apply(x, cos, sin, torch.full((5,), count, device=device))


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=dtype_id)
def test_float64_tables_with_lower_precision_input(dtype, interleaved, device):
    cos, sin = make_tables(MAX_SEQ_LEN, 48, device, torch.float64)
    x = randn(B, H, S, 64, dtype=dtype, device=device)
    positions = spread_positions(S, device)
    out = torch_rope.apply(x, cos, sin, positions, interleaved=interleaved)
    assert_matches_reference(out, x, positions, 48, interleaved=interleaved)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
def test_float32_tables_with_float64_input(interleaved, device):
    # Math is float64; only the tables' float32 rounding (~6e-8) separates it from the oracle.
    cos, sin = make_tables(MAX_SEQ_LEN, 64, device, torch.float32)
    x = randn(B, H, S, 64, dtype=torch.float64, device=device)
    positions = spread_positions(S, device)
    out = torch_rope.apply(x, cos, sin, positions, interleaved=interleaved)
    assert out.dtype == torch.float64
    want = expected(x, positions, 64, interleaved=interleaved)
    torch.testing.assert_close(out.cpu(), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("pos_dtype", [torch.int32, torch.int64], ids=dtype_id)
@pytest.mark.parametrize(
    "x_shape,pos_shape",
    [((0, H, S, 64), (S,)), ((B, H, 0, 64), (0,)), ((0, 64), (0,)), ((B, 0, H, 64), (0, 1))],
)
def test_empty_inputs(x_shape, pos_shape, pos_dtype, device):
    cos, sin = make_tables(MAX_SEQ_LEN, 32, device)
    x = torch.randn(x_shape, device=device)
    positions = torch.zeros(pos_shape, dtype=pos_dtype, device=device)
    out = torch_rope.apply(x, cos, sin, positions)
    assert out.shape == x.shape and out.dtype == x.dtype and out.device == x.device
    assert torch_rope.apply_(x, cos, sin, positions) is x
    q, k = torch_rope.apply_qk(x, x, cos, sin, positions)
    assert q.shape == x.shape and k.shape == x.shape


def test_typed_wrapper_matches_raw_op():
    cos, sin = make_tables(MAX_SEQ_LEN, 16, "cpu")
    x = torch.randn(B, S, 24)
    positions = spread_positions(S, "cpu")
    for interleaved in LAYOUTS:
        for inverse in (True, False):
            a = torch_rope.apply(x, cos, sin, positions, interleaved=interleaved, inverse=inverse)
            b = torch.ops.rope.apply(
                x, cos, sin, positions, interleaved=interleaved, inverse=inverse
            )
            assert torch.equal(a, b)
    # The defaults are interleaved=True, inverse=False, in both.
    assert torch.equal(
        torch.ops.rope.apply(x, cos, sin, positions),
        torch_rope.apply(x, cos, sin, positions, interleaved=True, inverse=False),
    )


# More leading dims than the kernel's merged-row descriptor holds (kMaxRowDims = 8), which no
# stride pattern merges: the op falls back to one contiguous copy instead of failing.
@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("case", ["contiguous_x_alternating_positions", "permuted_x"])
def test_many_leading_dims(case, device):
    shape = (2, 3, 2, 3, 2, 3, 2, 3, 2)
    cos, sin = make_tables(MAX_SEQ_LEN, 8, device)
    if case == "permuted_x":
        x = randn(*shape, 16, device=device).permute(8, 7, 6, 5, 4, 3, 2, 1, 0, 9)
        positions = torch.tensor(3, device=device)
    else:
        x = randn(*shape, 16, device=device)
        positions = torch.randint(0, MAX_SEQ_LEN, (2, 1, 2, 1, 2, 1, 2, 1, 2), device=device)
    out = torch_rope.apply(x, cos, sin, positions)
    assert_matches_reference(out, x, positions, 8, interleaved=True)


# ---- cos and sin given with independent layouts --------------------------------------------------
# Regression (outside review, defect 1): the tables were kept in place when only one of them had
# unit last stride and both had the same row stride, then both indexed with the kept one's row
# stride: wrong rows, reads past the end of the copy, and a SIGSEGV at large positions.


def _table_view(table, layout):
    """`table` (rows, half) as a view with the given memory layout and the same values."""
    rows, half = table.shape
    if layout == "contiguous":
        return table.clone()
    if layout == "row_padded":  # slice of a wider table: row stride > half, last stride 1
        wide = torch.zeros(rows, 3 * half, dtype=table.dtype, device=table.device)
        wide[:, :half] = table
        return wide[:, :half]
    if layout == "last_strided":  # every other column of a wider table: last stride 2
        wide = torch.zeros(rows, 3 * half, dtype=table.dtype, device=table.device)
        wide[:, 0 : 2 * half : 2] = table
        return wide[:, 0 : 2 * half : 2]
    if layout == "transposed":  # column-major
        return table.t().contiguous().t()
    raise ValueError(layout)


TABLE_LAYOUTS = ["contiguous", "row_padded", "last_strided", "transposed"]


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("sin_layout", TABLE_LAYOUTS)
@pytest.mark.parametrize("cos_layout", TABLE_LAYOUTS)
def test_regression_tables_with_independent_layouts(cos_layout, sin_layout, device):
    rows, half = 16, 4
    cos = torch.randn(rows, half, device=device)
    sin = torch.randn(rows, half, device=device)
    x = torch.randn(3, 2 * half, device=device)
    positions = torch.tensor([0, 5, 15], device=device)
    want = torch_rope.apply(x, cos, sin, positions)
    got = torch_rope.apply(x, _table_view(cos, cos_layout), _table_view(sin, sin_layout), positions)
    assert torch.equal(got, want)
    q, k = torch_rope.apply_qk(
        x, x[:1], _table_view(cos, cos_layout), _table_view(sin, sin_layout), positions[:1].view(1)
    )
    assert torch.equal(k, want[:1])


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_regression_mixed_table_layouts_at_the_last_row(device):
    # The review's crash: cos row-padded, sin every other column, read at the last position.
    cos = torch.randn(4097, 128, device=device)[:, :64]
    sin = torch.randn(4097, 128, device=device)[:, ::2]
    x = torch.randn(1, 128, device=device)
    positions = torch.tensor([4096], device=device)
    got = torch_rope.apply(x, cos, sin, positions)
    want = torch_rope.apply(x, cos.contiguous(), sin.contiguous(), positions)
    assert torch.equal(got, want)
