# SPDX-License-Identifier: BSD-3-Clause
"""rope.apply_: rotates in place, through views into their base, and agrees with rope.apply."""

import pytest
import torch
from helpers import (
    FLOAT_DTYPES,
    LAYOUT_IDS,
    LAYOUTS,
    assert_matches_reference,
    cpu_and_cuda,
    dtype_id,
    make_tables,
    randn,
    table_dtype_for,
)

import torch_rope

B, H, S, D = 2, 3, 9, 80
MAX_SEQ_LEN = 32


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("rotary_dim", [80, 32])
@pytest.mark.parametrize("inverse", [False, True], ids=["forward", "inverse"])
@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
def test_inplace_matches_out_of_place(dtype, interleaved, inverse, rotary_dim, device):
    cos, sin = make_tables(MAX_SEQ_LEN, rotary_dim, device, table_dtype_for(dtype))
    x = randn(B, H, S, D, dtype=dtype, device=device)
    original = x.clone()
    positions = torch.randint(0, MAX_SEQ_LEN, (S,), device=device)
    version = x._version
    data_ptr = x.data_ptr()

    want = torch_rope.apply(x, cos, sin, positions, interleaved=interleaved, inverse=inverse)
    result = torch_rope.apply_(x, cos, sin, positions, interleaved=interleaved, inverse=inverse)

    assert result is x
    assert x.data_ptr() == data_ptr
    assert x._version > version, "apply_ must bump the version counter of x"
    # Same kernel, same math: bit-identical to the out-of-place op.
    assert torch.equal(x, want)
    assert_matches_reference(
        x, original, positions, rotary_dim, interleaved=interleaved, inverse=inverse
    )


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_inplace_on_slice_of_fused_qkv_writes_through(dtype, interleaved, device):
    cos, sin = make_tables(MAX_SEQ_LEN, 48, device)
    qkv = randn(B, S, H, 3 * D, dtype=dtype, device=device)
    before = qkv.clone()
    positions = torch.randint(0, MAX_SEQ_LEN, (S, 1), device=device)
    q, k = qkv[..., :D], qkv[..., D : 2 * D]

    torch_rope.apply_(q, cos, sin, positions, interleaved=interleaved)
    torch_rope.apply_(k, cos, sin, positions, interleaved=interleaved)

    assert_matches_reference(qkv[..., :D], before[..., :D], positions, 48, interleaved=interleaved)
    assert_matches_reference(
        qkv[..., D : 2 * D], before[..., D : 2 * D], positions, 48, interleaved=interleaved
    )
    assert torch.equal(qkv[..., 2 * D :], before[..., 2 * D :]), "v must not be touched"
    assert torch.equal(qkv[..., 48:D], before[..., 48:D]), "pass-through features of q changed"


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
def test_inplace_on_transposed_view_writes_through(interleaved, device):
    cos, sin = make_tables(MAX_SEQ_LEN, D, device)
    base = randn(B, S, H, D, device=device)
    before = base.clone()
    positions = torch.randint(0, MAX_SEQ_LEN, (S,), device=device)
    view = base.transpose(1, 2)  # (B, H, S, D), last dim contiguous
    torch_rope.apply_(view, cos, sin, positions, interleaved=interleaved)
    assert_matches_reference(
        base.transpose(1, 2), before.transpose(1, 2), positions, D, interleaved=interleaved
    )


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float16], ids=dtype_id)
def test_inplace_on_last_dim_strided_tensor(dtype, interleaved, device):
    # stride(-1) != 1: the library may copy internally, but the result must land in x.
    cos, sin = make_tables(MAX_SEQ_LEN, 32, device, table_dtype_for(dtype))
    base = randn(B, H, D, S, dtype=dtype, device=device)
    x = base.transpose(-1, -2)
    assert x.stride(-1) != 1
    before = x.clone()
    positions = torch.randint(0, MAX_SEQ_LEN, (B, 1, S), device=device)

    assert torch_rope.apply_(x, cos, sin, positions, interleaved=interleaved) is x

    assert_matches_reference(x, before, positions, 32, interleaved=interleaved)
    assert_matches_reference(base.transpose(-1, -2), before, positions, 32, interleaved=interleaved)


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_inplace_then_inverse_restores(device):
    cos, sin = make_tables(MAX_SEQ_LEN, D, device, torch.float64)
    x = randn(B, S, H, D, dtype=torch.float64, device=device)
    original = x.clone()
    positions = torch.randint(0, MAX_SEQ_LEN, (B, S, 1), device=device)
    torch_rope.apply_(x, cos, sin, positions)
    assert not torch.allclose(x, original)
    torch_rope.apply_(x, cos, sin, positions, inverse=True)
    torch.testing.assert_close(x, original, rtol=1e-13, atol=1e-13)


def test_raw_op_returns_none_and_mutates():
    cos, sin = make_tables(MAX_SEQ_LEN, 16, "cpu")
    x = torch.randn(S, 16)
    before = x.clone()
    positions = torch.arange(S)
    assert torch.ops.rope.apply_(x, cos, sin, positions) is None
    assert not torch.equal(x, before)
    assert_matches_reference(x, before, positions, 16, interleaved=True)
