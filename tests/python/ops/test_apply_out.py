# SPDX-License-Identifier: BSD-3-Clause
"""rope.apply.out: the rotation written into an existing buffer (e.g. a KV-cache slot) of x's
shape and dtype, any strides, never resized; not differentiable; traced by torch.compile."""

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
    needs_torch,
    randn,
    table_dtype_for,
)

import torch_rope

MAX_SEQ_LEN = 64


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
def test_out_into_a_kv_cache_slot(dtype, interleaved, device):
    # A (B, max_len, H, D) cache; the new tokens' keys go to positions [start, start + S).
    B, S, H, D, rotary_dim, start = 2, 5, 3, 80, 48, 17
    cos, sin = make_tables(MAX_SEQ_LEN, rotary_dim, device, table_dtype_for(dtype))
    cache = torch.full((B, 32, H, D), 7.0, dtype=dtype, device=device)
    k = randn(B, S, H, D, dtype=dtype, device=device)
    positions = (start + torch.arange(S, device=device)).view(S, 1)
    slot = cache[:, start : start + S]
    assert not slot.is_contiguous()

    returned = torch_rope.apply(k, cos, sin, positions, interleaved=interleaved, out=slot)

    assert returned is slot
    assert_matches_reference(slot, k, positions, rotary_dim, interleaved=interleaved)
    assert torch.equal(slot, torch_rope.apply(k, cos, sin, positions, interleaved=interleaved))
    untouched = torch.ones(32, dtype=torch.bool)
    untouched[start : start + S] = False
    assert (cache[:, untouched] == 7.0).all(), "out= wrote outside its slot"


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("layout", ["last_dim_strided", "transposed_rows", "padded_rows"])
def test_out_with_any_strides(layout, device):
    cos, sin = make_tables(MAX_SEQ_LEN, 16, device)
    x = torch.randn(4, 6, 24, device=device)
    positions = torch.randint(0, MAX_SEQ_LEN, (6,), device=device)
    if layout == "last_dim_strided":
        out = torch.zeros(4, 6, 24, 2, device=device)[..., 0]
    elif layout == "transposed_rows":
        out = torch.zeros(6, 4, 24, device=device).transpose(0, 1)
    else:
        out = torch.zeros(4, 6, 40, device=device)[..., 8:32]
    torch_rope.apply(x, cos, sin, positions, out=out)
    assert torch.equal(out, torch_rope.apply(x, cos, sin, positions))


def test_out_with_empty_input_is_a_no_op():
    cos, sin = make_tables(MAX_SEQ_LEN, 16, "cpu")
    out = torch.empty(0, 3, 16)
    assert torch_rope.apply(torch.empty(0, 3, 16), cos, sin, torch.arange(3), out=out) is out


def test_out_is_not_differentiable():
    cos, sin = make_tables(MAX_SEQ_LEN, 16, "cpu")
    x = torch.randn(3, 16, requires_grad=True)
    out = torch.empty(3, 16)
    with pytest.raises(
        RuntimeError,
        match=r"rope\.apply\.out: functions with out=\.\.\. arguments "
        r"don't support automatic differentiation",
    ):
        torch_rope.apply(x, cos, sin, torch.arange(3), out=out)
    with torch.no_grad():
        torch_rope.apply(x, cos, sin, torch.arange(3), out=out)
    assert torch.equal(out, torch_rope.apply(x.detach(), cos, sin, torch.arange(3)))


def test_out_bumps_the_version_counter():
    cos, sin = make_tables(MAX_SEQ_LEN, 16, "cpu")
    out = torch.empty(3, 16)
    version = out._version
    torch_rope.apply(torch.randn(3, 16), cos, sin, torch.arange(3), out=out)
    assert out._version > version


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_out_under_compile_fullgraph(device):
    torch._dynamo.reset()
    cos, sin = make_tables(MAX_SEQ_LEN, 16, device)

    def write_keys(cache, k, start):
        positions = start + torch.arange(k.size(1), device=k.device).view(-1, 1)
        torch_rope.apply(k, cos, sin, positions, out=cache[:, start : start + k.size(1)])
        return cache

    cache = torch.zeros(2, 32, 3, 16, device=device)
    k = torch.randn(2, 4, 3, 16, device=device)
    want = write_keys(cache.clone(), k, 9)
    got = torch.compile(write_keys, backend="aot_eager", fullgraph=True)(cache, k, 9)
    assert torch.equal(got, want)
    assert torch.equal(cache, want), "the compiled out= call did not write the caller's buffer"


@needs_torch("2.6", "Dynamo tracing an out= op that returns nothing (older: out.copy_ of apply)")
def test_out_contiguous_buffer_under_compile_is_the_out_op():
    # A contiguous out= stays the out= op in the graph (no extra copy).
    torch._dynamo.reset()
    cos, sin = make_tables(MAX_SEQ_LEN, 16, "cpu")
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def f(x, positions, out):
        return torch_rope.apply(x, cos, sin, positions, out=out)

    x, out = torch.randn(3, 5, 16), torch.empty(3, 5, 16)
    torch.compile(f, backend=backend, fullgraph=True)(x, torch.arange(5), out)
    assert torch.equal(out, torch_rope.apply(x, cos, sin, torch.arange(5)))
    targets = {n.target for n in graphs[0].graph.nodes if n.op == "call_function"}
    assert torch.ops.rope.apply.out in targets
