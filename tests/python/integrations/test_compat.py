# SPDX-License-Identifier: BSD-3-Clause
"""torch_rope.compat: vLLM's / SGLang's rotary_embedding and FlashInfer's
apply_rope_with_cos_sin_cache(_inplace), against a float64 reference written here from vLLM's
documented semantics (cos in the first half of each cache row, sin in the second; NeoX rotates the
two halves of the rotary part, GPT-J adjacent pairs; the rest of each head passes through)."""

import warnings

import pytest
import torch
from helpers import TOLERANCES, cpu_and_cuda, dtype_id, make_tables

import torch_rope.compat as compat

MAX_POSITION = 64


def cos_sin_cache(rotary_dim, dtype=torch.float32, device="cpu"):
    cos, sin = make_tables(MAX_POSITION, rotary_dim, device, torch.float64)
    return torch.cat([cos, sin], dim=-1).to(dtype)


def reference(positions, x, head_size, cache, is_neox, offset=0):
    """vLLM's rotation of one tensor, in float64 on the CPU."""
    heads = x.detach().cpu().double().reshape(*positions.shape, -1, head_size).clone()
    rotary_dim = cache.size(-1)
    half = rotary_dim // 2
    rows = cache.detach().cpu().double()[positions.cpu().long()]
    cos, sin = rows[..., :half].unsqueeze(-2), rows[..., half:].unsqueeze(-2)
    part = heads[..., offset : offset + rotary_dim]
    if is_neox:
        x1, x2 = part[..., :half], part[..., half:]
        rotated = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    else:
        x1, x2 = part[..., 0::2], part[..., 1::2]
        rotated = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)
    heads[..., offset : offset + rotary_dim] = rotated
    return heads.reshape(x.shape)


def assert_close_to(got, want):
    torch.testing.assert_close(got.cpu(), want.to(got.dtype), **TOLERANCES[got.dtype])


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("with_key", [True, False], ids=["q_and_k", "q_only"])
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("flat", [True, False], ids=["T_HD", "T_H_D"])
@pytest.mark.parametrize(
    "dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16], ids=dtype_id
)
def test_rotary_embedding_in_place(dtype, flat, is_neox, with_key, device):
    tokens, q_heads, k_heads, head_size = 7, 4, 2, 32
    positions = torch.randint(0, MAX_POSITION, (tokens,), device=device)
    cache = cos_sin_cache(head_size, torch.float64 if dtype == torch.float64 else torch.float32)
    cache = cache.to(device)
    shape = (tokens, q_heads * head_size) if flat else (tokens, q_heads, head_size)
    query = torch.randn(shape, dtype=dtype, device=device)
    key_shape = (tokens, k_heads * head_size) if flat else (tokens, k_heads, head_size)
    key = torch.randn(key_shape, dtype=dtype, device=device) if with_key else None
    want_q = reference(positions, query, head_size, cache, is_neox)
    want_k = reference(positions, key, head_size, cache, is_neox) if with_key else None
    q_ptr = query.data_ptr()
    assert compat.rotary_embedding(positions, query, key, head_size, cache, is_neox) is None
    assert query.data_ptr() == q_ptr  # in place
    assert_close_to(query, want_q)
    if with_key:
        assert_close_to(key, want_k)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
def test_partial_rotary_and_mla_offset_on_fused_qkv_slices(is_neox, device):
    # q and k as slices of one fused projection (T, (Hq + 2 Hk) * D): written through in place,
    # v untouched. The rotary part is 16 of 48 features, at offset 0 and at MLA's tail slice.
    tokens, q_heads, k_heads, head_size, rotary_dim = 5, 4, 2, 48, 16
    positions = torch.tensor([0, 3, 17, 40, 63], device=device)
    cache = cos_sin_cache(rotary_dim, device=device)
    for offset in (0, head_size - rotary_dim):
        qkv = torch.randn(tokens, (q_heads + 2 * k_heads) * head_size, device=device)
        before = qkv.clone()
        q_end, k_end = q_heads * head_size, (q_heads + k_heads) * head_size
        query, key = qkv[:, :q_end], qkv[:, q_end:k_end]
        want_q = reference(positions, query, head_size, cache, is_neox, offset)
        want_k = reference(positions, key, head_size, cache, is_neox, offset)
        compat.rotary_embedding(
            positions, query, key, head_size, cache, is_neox, rope_dim_offset=offset
        )
        assert_close_to(qkv[:, :q_end], want_q)
        assert_close_to(qkv[:, q_end:k_end], want_k)
        assert torch.equal(qkv[:, k_end:], before[:, k_end:]), "v was written"


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_flashinfer_entry_points(device):
    tokens, heads, head_size = 6, 3, 16
    positions = torch.randint(0, MAX_POSITION, (tokens,), device=device)
    cache = cos_sin_cache(head_size, device=device)
    query = torch.randn(tokens, heads * head_size, dtype=torch.bfloat16, device=device)
    key = torch.randn(tokens, heads * head_size, dtype=torch.bfloat16, device=device)
    q0, k0 = query.clone(), key.clone()
    q_out, k_out = compat.apply_rope_with_cos_sin_cache(positions, query, key, head_size, cache)
    assert torch.equal(query, q0) and torch.equal(key, k0), "the out-of-place form wrote its input"
    assert_close_to(q_out, reference(positions, q0, head_size, cache, True))
    assert_close_to(k_out, reference(positions, k0, head_size, cache, True))
    compat.apply_rope_with_cos_sin_cache_inplace(positions, query, key, head_size, cache)
    assert torch.equal(query, q_out) and torch.equal(key, k_out)


def test_a_16_bit_cache_is_converted_once_with_a_warning():
    positions = torch.arange(4)
    cache32 = cos_sin_cache(16)
    cache16 = cache32.to(torch.bfloat16)
    query = torch.randn(4, 32)
    got = query.clone()
    with pytest.warns(
        UserWarning, match="cos_sin_cache is torch.bfloat16; converting it to float32"
    ):
        compat.rotary_embedding(positions, got, None, 16, cache16, True)
    # The result is that of the converted cache: the 16-bit rounding of the cache stays.
    assert_close_to(got, reference(positions, query, 16, cache16.float(), True))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a float32 cache converts nothing and warns nothing
        compat.rotary_embedding(positions, query.clone(), None, 16, cache32, True)


@pytest.mark.parametrize(
    "call,pattern",
    [
        (lambda q, c: compat.rotary_embedding(torch.arange(4), q, None, 24, c, True),
         r"query must be \(\.\.\., num_heads \* head_size\).*head_size = 24, got shape \[4, 64\]"),
        (lambda q, c: compat.rotary_embedding(torch.arange(4), q, None, 16, c[:, :15], True),
         r"cos_sin_cache must be \(max_position, rotary_dim\) with rotary_dim even"),
        (lambda q, c: compat.rotary_embedding(torch.arange(4), q, None, 16, c, True,
                                              rope_dim_offset=4),
         r"rope_dim_offset \+ rotary_dim must be within head_size = 16"),
    ],
    ids=["head_size", "odd_cache", "offset"],
)  # fmt: skip
def test_bad_calls_name_the_argument_and_write_nothing(call, pattern):
    query, cache = torch.randn(4, 64), cos_sin_cache(16)
    before = query.clone()
    with pytest.raises(ValueError, match=pattern):
        call(query, cache)
    assert torch.equal(query, before)
