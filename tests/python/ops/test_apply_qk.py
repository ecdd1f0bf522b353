# SPDX-License-Identifier: BSD-3-Clause
"""rope.apply_qk: q and k rotated together, with different head counts (GQA / MQA)."""

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

B, S, D = 2, 7, 64
MAX_SEQ_LEN = 32


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("inverse", [False, True], ids=["forward", "inverse"])
@pytest.mark.parametrize("rotary_dim", [64, 32])
@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
def test_gqa_bhsd_equals_two_apply_calls(dtype, interleaved, rotary_dim, inverse, device):
    cos, sin = make_tables(MAX_SEQ_LEN, rotary_dim, device, table_dtype_for(dtype))
    q = randn(B, 8, S, D, dtype=dtype, device=device)
    k = randn(B, 2, S, D, dtype=dtype, device=device)
    positions = torch.randint(0, MAX_SEQ_LEN, (B, 1, S), device=device)
    kw = dict(interleaved=interleaved, inverse=inverse)

    q_out, k_out = torch_rope.apply_qk(q, k, cos, sin, positions, **kw)

    assert q_out.shape == q.shape and k_out.shape == k.shape
    assert q_out.is_contiguous() and k_out.is_contiguous()
    assert torch.equal(q_out, torch_rope.apply(q, cos, sin, positions, **kw))
    assert torch.equal(k_out, torch_rope.apply(k, cos, sin, positions, **kw))
    assert_matches_reference(q_out, q, positions, rotary_dim, **kw)
    assert_matches_reference(k_out, k, positions, rotary_dim, **kw)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("kv_heads", [2, 1], ids=["gqa", "mqa"])
@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
def test_bshd_from_fused_projection(interleaved, kv_heads, device):
    # Llama-style decode layout (B, S, H, D), q and k sliced out of one fused projection.
    q_heads = 8
    fused = randn(B, S, (q_heads + 2 * kv_heads) * D, device=device)
    q = fused[..., : q_heads * D].view(B, S, q_heads, D)
    k = fused[..., q_heads * D : (q_heads + kv_heads) * D].view(B, S, kv_heads, D)
    fused_before = fused.clone()
    cos, sin = make_tables(MAX_SEQ_LEN, D, device)
    positions = (20 + torch.arange(S, device=device)).unsqueeze(-1)  # decode offsets, (S, 1)

    q_out, k_out = torch_rope.apply_qk(q, k, cos, sin, positions, interleaved=interleaved)

    assert_matches_reference(q_out, q, positions, D, interleaved=interleaved)
    assert_matches_reference(k_out, k, positions, D, interleaved=interleaved)
    assert torch.equal(fused, fused_before), "apply_qk must not modify its inputs"


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("pos_dtype", [torch.int32, torch.int64], ids=dtype_id)
def test_packed_varlen(pos_dtype, device):
    lengths = (3, 6, 1)
    positions = torch.cat([torch.arange(n) for n in lengths]).to(device, pos_dtype).unsqueeze(-1)
    T = sum(lengths)
    q = randn(T, 6, D, dtype=torch.bfloat16, device=device)
    k = randn(T, 2, D, dtype=torch.bfloat16, device=device)
    cos, sin = make_tables(MAX_SEQ_LEN, 32, device)
    q_out, k_out = torch_rope.apply_qk(q, k, cos, sin, positions)
    assert_matches_reference(q_out, q, positions, 32, interleaved=True)
    assert_matches_reference(k_out, k, positions, 32, interleaved=True)


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_k_empty_q_not(device):
    # A prefill step with no cached keys to rotate is still a valid call.
    cos, sin = make_tables(MAX_SEQ_LEN, D, device)
    q = randn(B, 4, S, D, device=device)
    k = randn(B, 0, S, D, device=device)
    positions = torch.arange(S, device=device)
    q_out, k_out = torch_rope.apply_qk(q, k, cos, sin, positions)
    assert k_out.shape == k.shape
    assert_matches_reference(q_out, q, positions, D, interleaved=True)
