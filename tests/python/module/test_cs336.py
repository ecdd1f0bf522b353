# SPDX-License-Identifier: BSD-3-Clause
"""The CS336 (Stanford, assignment 1) RoPE module signature, used exactly as the course uses it.

    RotaryPositionalEmbedding(theta, d_k, max_seq_len, device)      # device positional
    forward(x: (..., seq_len, d_k), token_positions: (..., seq_len)) -> (..., seq_len, d_k)

The expected values come from the suite's oracle (references.py) in the course's terms: pairs
(x[2k], x[2k+1]) rotate by position * theta^(-2k / d_k), its complex-product form.
"""

import pytest
import references as ref
import torch

import torch_rope


def course_rope(x, token_positions, theta):
    angles = ref.angles(token_positions, x.shape[:-1], x.size(-1), theta)
    return ref.rope_complex(x, angles).to(x.dtype)


@pytest.mark.parametrize(
    "shape,positions_shape",
    [
        ((4, 12, 64), (4, 12)),  # (batch, seq, d_k), per-sequence positions
        ((4, 12, 64), (12,)),  # shared positions
        ((12, 64), (12,)),  # no batch
        ((2, 3, 12, 64), (12,)),  # (batch, heads, seq, d_k)
        ((2, 3, 12, 64), (1, 12)),
    ],
)
def test_course_signature_and_values(shape, positions_shape):
    theta, d_k, max_seq_len = 10000.0, 64, 128
    rope = torch_rope.RotaryPositionalEmbedding(theta, d_k, max_seq_len, torch.device("cpu"))
    x = torch.randn(shape)
    positions = torch.randint(0, max_seq_len, positions_shape)
    got = rope(x, positions)
    # (batch, seq) positions of a 4-D x belong to (batch, ., seq); the rest broadcast as written.
    full = positions[:, None, :] if positions.dim() == 2 and x.dim() == 4 else positions
    want = course_rope(x, full.expand(x.shape[:-1]), theta)
    assert got.shape == x.shape and got.dtype == x.dtype
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_course_module_positional_arguments_and_defaults():
    rope = torch_rope.RotaryPositionalEmbedding(10000.0, 16, 32, None)
    x = torch.randn(3, 10, 16)
    torch.testing.assert_close(
        rope(x), course_rope(x, torch.arange(10).expand(3, 10), 10000.0), rtol=1e-5, atol=1e-5
    )
    assert list(rope.parameters()) == [] and rope.state_dict() == {}


def test_course_multihead_attention_positions():
    """The course's multi-head attention applies RoPE to (batch, heads, seq, d_k) q and k with
    token_positions of shape (batch, seq): each head gets its sequence's positions."""
    rope = torch_rope.RotaryPositionalEmbedding(10000.0, 16, 64, "cpu")
    q = torch.randn(2, 4, 9, 16)
    positions = torch.stack([torch.arange(9), torch.arange(20, 29)])
    want = course_rope(q, positions[:, None, :], 10000.0)
    torch.testing.assert_close(rope(q, positions), want, rtol=1e-5, atol=1e-5)
