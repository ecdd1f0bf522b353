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
    """vLLM's rotation of one tensor, in float64 on the CPU: a new tensor, differentiable in x
    (the gradients' reference too)."""
    heads = x.cpu().double().reshape(*positions.shape, -1, head_size)
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
    out = [heads[..., :offset], rotated, heads[..., offset + rotary_dim :]]
    return torch.cat(out, dim=-1).reshape(x.shape)


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


def test_is_neox_defaults_to_true_as_sglang():
    # SGLang's rotary_embedding defaults is_neox=True; vLLM's callers always pass it.
    positions = torch.tensor([3, 0, 17])
    cache = cos_sin_cache(16)
    query, key = torch.randn(3, 32), torch.randn(3, 16)
    want_q = reference(positions, query, 16, cache, True)
    want_k = reference(positions, key, 16, cache, True)
    compat.rotary_embedding(positions, query, key, 16, cache)
    assert_close_to(query, want_q)
    assert_close_to(key, want_k)


# ---- the cache's views, kept per cache tensor ----------------------------------------------------


def _rotate(cache, positions, query, is_neox=True):
    got = query.clone()
    compat.rotary_embedding(positions, got, None, query.size(-1), cache, is_neox)
    return got


def test_a_cache_written_in_any_way_is_read_again():
    # The views of a cache read whatever it holds at the call: in place, through .data, through
    # numpy (no version bump) and under inference_mode.
    positions, query = torch.tensor([1, 5, 9]), torch.randn(3, 16)
    cache = cos_sin_cache(16)
    assert_close_to(_rotate(cache, positions, query), reference(positions, query, 16, cache, True))
    writes = [
        lambda c, new: c.copy_(new),
        lambda c, new: c.data.copy_(new),
        lambda c, new: c.numpy().__setitem__(Ellipsis, new.numpy()),
    ]
    for i, write in enumerate(writes):
        new = cos_sin_cache(16) * (i + 2)
        write(cache, new)
        got = _rotate(cache, positions, query)
        assert_close_to(got, reference(positions, query, 16, new, True))
    with torch.inference_mode():
        cache.copy_(cos_sin_cache(16) * 5)
        got = _rotate(cache, positions, query)
    assert_close_to(got, reference(positions, query, 16, cache, True))


def test_a_cache_tensor_re_pointed_or_replaced_gets_new_views():
    positions, query = torch.tensor([0, 2, 3]), torch.randn(3, 16)
    cache = cos_sin_cache(16)
    _rotate(cache, positions, query)
    # Same tensor object, another storage (set_): the old views would read the old storage.
    other = cos_sin_cache(16) * 2
    cache.set_(other.clone())
    assert_close_to(_rotate(cache, positions, query), reference(positions, query, 16, other, True))
    # Same object, re-pointed at a wider table through .data: another geometry.
    wider = cos_sin_cache(32)[:, :16].contiguous() * 3
    cache.data = torch.cat([wider, torch.zeros(MAX_POSITION, 4)], dim=-1)[:, :16]
    assert_close_to(_rotate(cache, positions, query), reference(positions, query, 16, wider, True))
    # A new tensor that may reuse the freed one's id: never the old views.
    for scale in (4.0, 5.0, 6.0):
        del cache
        cache = cos_sin_cache(16) * scale
        got = _rotate(cache, positions, query)
        assert_close_to(got, reference(positions, query, 16, cache, True))


def test_the_views_do_not_keep_a_dropped_cache_alive():
    import gc
    import weakref

    cache = cos_sin_cache(16)
    _rotate(cache, torch.tensor([1]), torch.randn(1, 16))
    ref_ = weakref.ref(cache)
    del cache
    gc.collect()
    assert ref_() is None


def test_cache_views_under_compile_inference_and_no_grad():
    positions, cache = torch.tensor([4, 1, 30]), cos_sin_cache(16)
    query, key = torch.randn(3, 32), torch.randn(3, 16)
    want_q = reference(positions, query, 16, cache, False)
    want_k = reference(positions, key, 16, cache, False)

    def step(q, k):
        compat.rotary_embedding(positions, q, k, 16, cache, False)
        return q, k

    for mode in (torch.inference_mode, torch.no_grad):
        with mode():
            q, k = step(query.clone(), key.clone())
        assert_close_to(q, want_q)
        assert_close_to(k, want_k)
    torch._dynamo.reset()
    q, k = torch.compile(step, fullgraph=True)(query.clone(), key.clone())
    assert_close_to(q, want_q)
    assert_close_to(k, want_k)
    # Training after inference: views made under inference_mode still serve a call with grad.
    leaf = query.clone().requires_grad_()
    q = leaf * 1.0
    compat.rotary_embedding(positions, q, None, 16, cache, False)
    (grad,) = torch.autograd.grad(q.sum(), leaf)
    assert grad.shape == leaf.shape


@pytest.mark.parametrize("mode", ["plain", "no_grad", "inference_mode"])
def test_the_native_entry_bumps_versions_and_serves_strided_slices(mode):
    # The native entry builds its views without the dispatcher when no tensor carries autograd
    # metadata (plain tensors, inference_mode); a slice of a tensor made outside inference_mode
    # is a tracked view and takes the dispatcher's views. Either way: the right values in the
    # caller's memory, the rest of the fused qkv untouched, and the in-place write seen by
    # version counters (outside inference_mode, where tensors have them).
    tokens, heads, kv_heads, head_size = 5, 4, 2, 16
    context = torch.inference_mode() if mode == "inference_mode" else torch.no_grad()
    with context:
        positions = torch.randint(0, MAX_POSITION, (tokens,))
        cache = cos_sin_cache(head_size)
        qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_size)
        before = qkv.clone()
        sizes = [heads * head_size, kv_heads * head_size, kv_heads * head_size]
        query, key, value = qkv.split(sizes, dim=-1)
        plain_q = torch.randn(tokens, heads * head_size)
        plain_k = torch.randn(tokens, kv_heads, head_size)
        want_q = reference(positions, query, head_size, cache, True)
        want_k = reference(positions, key, head_size, cache, True)
        want_pq = reference(positions, plain_q, head_size, cache, False)
        want_pk = reference(positions, plain_k, head_size, cache, False)
        versions = (
            (qkv._version, plain_q._version, plain_k._version) if mode != "inference_mode" else None
        )
        compat.rotary_embedding(positions, query, key, head_size, cache, True)
        compat.rotary_embedding(positions, plain_q, plain_k, head_size, cache, False)
    assert_close_to(query, want_q)
    assert_close_to(key, want_k)
    assert torch.equal(value, before[:, (heads + kv_heads) * head_size :])
    assert_close_to(plain_q, want_pq)
    assert_close_to(plain_k, want_pk)
    if versions is not None:
        assert qkv._version >= versions[0] + 2  # query and key, views of qkv
        assert plain_q._version == versions[1] + 1 and plain_k._version == versions[2] + 1


@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
def test_gradients_through_the_engines_calls(is_neox):
    # With grad, the views are autograd's: an in-place rotation of a non-leaf query and key
    # backpropagates to their leaves as the float64 rotation does; the out-of-place form too.
    tokens, heads, kv_heads, head_size = 3, 2, 1, 8
    positions = torch.randint(0, MAX_POSITION, (tokens,))
    cache = cos_sin_cache(head_size, torch.float64)
    q_leaf = torch.randn(tokens, heads * head_size, dtype=torch.float64, requires_grad=True)
    k_leaf = torch.randn(tokens, kv_heads, head_size, dtype=torch.float64, requires_grad=True)
    gq, gk = torch.randn_like(q_leaf), torch.randn_like(k_leaf)
    want = torch.autograd.grad(
        (reference(positions, q_leaf, head_size, cache, is_neox),
         reference(positions, k_leaf, head_size, cache, is_neox)),
        (q_leaf, k_leaf), (gq, gk))  # fmt: skip
    q, k = q_leaf * 1.0, k_leaf * 1.0
    compat.rotary_embedding(positions, q, k, head_size, cache, is_neox)
    got = torch.autograd.grad((q, k), (q_leaf, k_leaf), (gq, gk))
    torch.testing.assert_close(got, want)
    q_out, k_out = compat.apply_rope_with_cos_sin_cache(
        positions, q_leaf, k_leaf, head_size, cache, is_neox
    )
    assert q_out.shape == q_leaf.shape and k_out.shape == k_leaf.shape
    got = torch.autograd.grad((q_out, k_out), (q_leaf, k_leaf), (gq, gk))
    torch.testing.assert_close(got, want)


def test_apply_rope_with_cos_sin_cache_returns_new_tensors_of_the_input_shapes():
    positions, cache = torch.tensor([0, 9, 3]), cos_sin_cache(16)
    query, key = torch.randn(3, 2, 16), torch.randn(3, 16)
    q_out, k_out = compat.apply_rope_with_cos_sin_cache(positions, query, key, 16, cache, False)
    assert q_out.shape == query.shape and k_out.shape == key.shape
    assert q_out.data_ptr() != query.data_ptr() and k_out.data_ptr() != key.data_ptr()
    assert_close_to(q_out, reference(positions, query, 16, cache, False))
    assert_close_to(k_out, reference(positions, key, 16, cache, False))


# ---- errors in the engines' words, and nothing half-written ------------------------------------


@pytest.mark.parametrize(
    "fn,peer",
    [(compat.rotary_embedding, "rotary_embedding"),
     (compat.apply_rope_with_cos_sin_cache_inplace, "apply_rope_with_cos_sin_cache_inplace"),
     (compat.apply_rope_with_cos_sin_cache, "apply_rope_with_cos_sin_cache")],
    ids=["vllm", "flashinfer_inplace", "flashinfer"],
)  # fmt: skip
def test_errors_name_the_engines_arguments(fn, peer):
    query, key = torch.randn(4, 32), torch.randn(4, 16)
    with pytest.raises(IndexError) as info:
        fn(torch.tensor([0, 70, 1, 2]), query, key, 16, cos_sin_cache(16), True)
    message = str(info.value)
    assert message.startswith(f"{peer}: positions must be in [0, max_seq_len) with max_seq_len = "
                              f"cos_sin_cache.size(0) = {MAX_POSITION}"), message  # fmt: skip
    assert "cos.size" not in message and "rope." not in message, message


@pytest.mark.parametrize(
    "make_key,pattern",
    [(lambda: torch.randint(0, 5, (4, 16)), r"key must be float64, float32, float16 or bfloat16"),
     (lambda: torch.randn(3, 16), r"key must be \(\.\.\., num_heads \* head_size\)"),
     (lambda: torch.randn(4, 2, 16, device="meta"), r"key must be on query's device cpu")],
    ids=["integer_key", "key_tokens", "key_device"],
)  # fmt: skip
def test_a_bad_key_is_refused_before_query_is_written(make_key, pattern):
    query = torch.randn(4, 32)
    before = query.clone()
    with pytest.raises(ValueError, match=pattern):
        compat.rotary_embedding(torch.arange(4), query, make_key(), 16, cos_sin_cache(16), True)
    assert torch.equal(query, before), "query was rotated before key was refused"
