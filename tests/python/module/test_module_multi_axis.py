# SPDX-License-Identifier: BSD-3-Clause
"""RotaryPositionalEmbedding with multi-axis positions (mrope_section / mrope_interleaved): every
pair layout x section layout, partial rotary, every dtype, on the eager fast path, the traced
path (torch.compile, torch.func) and against the C++ rules it mirrors; and its errors."""

import pytest
import torch
from helpers import TOLERANCES, cpu_and_cuda, dtype_id, expected

import torch_rope
from torch_rope import _C
from torch_rope import nn as rope_nn

SECTIONS = {False: [3, 6, 3], True: [5, 4, 3]}  # contiguous / Qwen3-VL interleaved, 12 planes
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


def make(interleaved, mrope_interleaved, device="cpu", **kw):
    return torch_rope.RotaryPositionalEmbedding(
        10000.0,
        32,
        64,
        device,
        rotary_dim=24,
        interleaved=interleaved,
        mrope_section=SECTIONS[mrope_interleaved],
        mrope_interleaved=mrope_interleaved,
        **kw,
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("mrope_interleaved", [False, True], ids=["contiguous", "mrope_inter"])
@pytest.mark.parametrize("interleaved", [True, False], ids=["gptj", "half"])
@pytest.mark.parametrize("device", cpu_and_cuda())
def test_module_matches_the_oracle(device, interleaved, mrope_interleaved, dtype):
    # float64 x gets float64 tables, so the oracle's float64 angles are the reference.
    tables = torch.float64 if dtype == torch.float64 else torch.float32
    rope = make(interleaved, mrope_interleaved, device, dtype=tables)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 5, 32, generator=g).to(device=device, dtype=dtype)  # [b, h, s, d]
    positions = torch.randint(0, 64, (2, 5, 3), generator=g, device="cpu").to(device)
    got = rope(x, positions)
    want = expected(
        x.cpu(),
        positions.cpu().unsqueeze(1),  # (B, S, A) serves every head
        24,
        interleaved=interleaved,
        mrope_section=SECTIONS[mrope_interleaved],
        mrope_interleaved=mrope_interleaved,
    )
    torch.testing.assert_close(got.cpu(), want.to(dtype), **TOLERANCES[dtype])
    # (S, A) positions: the same for every sequence.
    shared = positions[1]
    assert torch.equal(rope(x, shared), rope(x, shared.expand(2, 5, 3)))
    # No positions: the arange on every axis, which is the one-axis rotation.
    plain = torch_rope.RotaryPositionalEmbedding(
        10000.0, 32, 64, device, rotary_dim=24, interleaved=interleaved, dtype=tables
    )
    assert torch.equal(rope(x), plain(x))


@pytest.mark.parametrize("mrope_interleaved", [False, True], ids=["contiguous", "mrope_inter"])
def test_seq_dim_minus3_and_traced_paths_agree(mrope_interleaved):
    rope = make(False, mrope_interleaved, seq_dim=-3, dtype=torch.float64)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 5, 3, 32, generator=g, dtype=torch.float64)  # [b, s, h, d]
    positions = torch.randint(0, 64, (2, 5, 3), generator=g)
    eager = rope(x, positions)
    want = expected(
        x,
        positions.unsqueeze(2),  # (B, S, 1, A)
        24,
        interleaved=False,
        mrope_section=SECTIONS[mrope_interleaved],
        mrope_interleaved=mrope_interleaved,
    )
    torch.testing.assert_close(eager, want, rtol=1e-12, atol=1e-12)
    compiled = torch.compile(rope, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(x, positions), eager)
    # torch.func: grad through the module is the inverse rotation of the cotangent.
    cotangent = torch.randn_like(x)
    grad = torch.func.grad(lambda t: (rope(t, positions) * cotangent).sum())(x)
    want_grad = expected(
        cotangent,
        positions.unsqueeze(2),
        24,
        interleaved=False,
        inverse=True,
        mrope_section=SECTIONS[mrope_interleaved],
        mrope_interleaved=mrope_interleaved,
    )
    torch.testing.assert_close(grad, want_grad, rtol=1e-12, atol=1e-12)


def test_gradcheck_through_the_module():
    rope = make(True, True, dtype=torch.float64)
    x = torch.randn(1, 2, 4, 32, dtype=torch.float64, requires_grad=True)
    positions = torch.randint(0, 64, (1, 4, 3))
    assert torch.autograd.gradcheck(lambda t: rope(t, positions), (x,))
    assert torch.autograd.gradgradcheck(lambda t: rope(t, positions), (x,))


@pytest.mark.parametrize("seq_dim", [-2, -3])
@pytest.mark.parametrize(
    "shape",
    [(5, 3), (2, 5, 3), (2, 1, 5, 3), (5,), (5, 2), (2, 5, 4), (3,), (7, 3)],
    ids=lambda s: "x".join(map(str, s)),
)
def test_multi_axis_positions_match_the_cpp_rules(shape, seq_dim):
    """The traced path's mirror of module_positions, with the axis dim, against the C++ rule."""
    x = torch.randn(2, 5, 4, 32) if seq_dim == -3 else torch.randn(2, 4, 5, 32)
    positions = torch.randint(0, 64, shape)
    for token_positions in (positions, None):
        outcomes = []
        for fn in (rope_nn.module_positions, _C.module_positions):
            try:
                outcomes.append(("ok", fn(x, token_positions, seq_dim, 3)))
            except (ValueError, RuntimeError) as error:
                outcomes.append((type(error), str(error).split("\n")[0]))
        (p_kind, p_val), (c_kind, c_val) = outcomes
        assert p_kind == c_kind, outcomes
        if p_kind == "ok":
            assert p_val.shape == c_val.shape and torch.equal(p_val, c_val)
        else:
            assert p_val == c_val


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(mrope_section=[2, 2, 2]), r"sum\(mrope_section\) must equal rotary_dim / 2 = 12"),
        (dict(mrope_section=[8, -1, 5]), r"mrope_section\[1\] must be >= 0"),
        (dict(mrope_section=[6, 6], mrope_interleaved=True), "needs 3 axes"),
        (dict(mrope_interleaved=True), "needs mrope_section"),
        (dict(mrope_section=[3, 3, 3, 2, 1]), "1 to 4 axes"),
    ],
)
def test_bad_multi_axis_arguments_raise_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        torch_rope.RotaryPositionalEmbedding(10000.0, 32, 64, rotary_dim=24, **kwargs)


def test_bad_multi_axis_positions_write_nothing_and_name_the_axis():
    rope = make(True, False)
    x = torch.randn(2, 3, 5, 32)
    before = x.clone()
    with pytest.raises(ValueError, match=r"trailing axis dim of size len\(mrope_section\) = 3"):
        rope(x, torch.arange(5))
    with pytest.raises(ValueError, match=r"len\(mrope_section\) = 3.*\[2, 5, 2\]"):
        rope(x, torch.zeros(2, 5, 2, dtype=torch.long))
    positions = torch.zeros(2, 5, 3, dtype=torch.long)
    positions[1, 2, 2] = 64
    with pytest.raises(IndexError, match="64"):
        rope(x, positions)
    assert torch.equal(x, before)
    assert "mrope_section=[3, 6, 3]" in repr(rope)
