# SPDX-License-Identifier: BSD-3-Clause
"""The Python module's traced path against the C++ rules it mirrors (csrc/rules.h).

torch.compile and torch.func cannot trace into a pybind11 call, so the Python module keeps one
mirror of three C++ functions: check_module_input, module_positions and long_rope_positions.
Each is compared with its C++ original (reached through torch_rope._C) over the sample geometries,
every sequence axis and every kind of token_positions: the same positions (shape, values) or the
same error (type and message)."""

import pytest
import torch
from samples import GEOMETRIES

import torch_rope
from torch_rope import _C
from torch_rope import nn as rope_nn


def _outcome(fn, *args):
    try:
        return ("ok", fn(*args))
    except (ValueError, TypeError, IndexError, RuntimeError) as e:
        return (type(e), str(e).split("\n")[0])


def _assert_same(python, cpp):
    assert python[0] == cpp[0], f"Python {python} vs C++ {cpp}"
    if python[0] == "ok" and python[1] is None:  # a check that passed
        assert cpp[1] is None
    elif python[0] == "ok":
        assert python[1].shape == cpp[1].shape
        assert torch.equal(python[1], cpp[1])
    else:
        assert python[1] == cpp[1]


def _position_variants(x, positions, seq_dim):
    """None, the geometry's own positions, and the module's documented (S,) and (B, S) forms
    built for the axis seq_dim (which may or may not fit x)."""
    variants = [None, positions]
    if x.dim() - 1 >= -seq_dim - 1:
        s = x.shape[seq_dim]
        variants.append(torch.arange(s))
        variants.append(torch.arange(s).expand(x.shape[0], s))
    variants.append(torch.arange(5).view(5, 1))  # the op's form, usually wrong for the module
    return variants


@pytest.mark.parametrize("seq_dim", [-2, -3, -4])
@pytest.mark.parametrize("geometry", list(GEOMETRIES))
def test_positions_and_input_checks_match_the_cpp_rules(geometry, seq_dim):
    x, positions = GEOMETRIES[geometry](8, torch.float32, "cpu")
    compared = 0
    for token_positions in _position_variants(x, positions, seq_dim):
        has = token_positions is not None
        for d_k in (8, 6):
            _assert_same(
                _outcome(rope_nn.check_module_input, x, d_k, seq_dim, has),
                _outcome(_C.check_module_input, x, d_k, seq_dim, has),
            )
        _assert_same(
            _outcome(rope_nn.module_positions, x, token_positions, seq_dim),
            _outcome(_C.module_positions, x, token_positions, seq_dim),
        )
        compared += 1
    assert compared >= 3


@pytest.mark.parametrize("num_axes", [0, 3], ids=["one_axis", "multi_axis"])
@pytest.mark.parametrize("seq_dim", [-2, -3, -4, -5])
@pytest.mark.parametrize("rank", [1, 2, 3, 4, 5])
def test_positions_with_axes_on_both_sides_of_the_sequence_match_the_cpp_rule(
    rank, seq_dim, num_axes
):
    # x.shape[:-1] up to (B, N, S, H, W): (S,) and (B, S) positions with axes between B and the
    # sequence axis and after it (the samples' geometries stop at 4-D x).
    x = torch.randn(*(2, 3, 5, 4, 6)[:rank], 8)
    axis = (num_axes,) if num_axes else ()
    variants = [None]
    if rank >= -seq_dim - 1:
        s = x.shape[seq_dim]
        variants += [torch.randint(0, 9, (s,) + axis), torch.randint(0, 9, (2, s) + axis)]
    for token_positions in variants:
        _assert_same(
            _outcome(rope_nn.module_positions, x, token_positions, seq_dim, num_axes),
            _outcome(_C.module_positions, x, token_positions, seq_dim, num_axes),
        )


@pytest.mark.parametrize(
    "positions",
    [torch.arange(6), torch.tensor([[3, 9], [11, 2]]), torch.empty(0, dtype=torch.long)],
    ids=["below_and_at", "above", "empty"],
)
@pytest.mark.parametrize("long_offset,long_after", [(0, 0), (64, 9), (64, 12)])
def test_long_rope_switch_matches_the_cpp_rule(positions, long_offset, long_after):
    python = rope_nn.long_rope_positions(positions, long_offset, long_after)
    cpp = _C.long_rope_positions(positions, long_offset, long_after)
    assert python.dtype == cpp.dtype and torch.equal(python, cpp)


def test_both_modules_refuse_the_same_constructor_arguments():
    # The Python module calls the C++ rule itself: the same words from both entry points.
    with pytest.raises(ValueError) as python:
        torch_rope.RotaryPositionalEmbedding(10000.0, 16, 32, rotary_dim=18)
    with pytest.raises(ValueError) as cpp:
        _C.check_module_arguments(10000.0, 16, 18, 32, torch.float32, -2)
    assert str(python.value) == str(cpp.value)
    assert "rotary_dim must be even and in [2, d_k = 16]" in str(cpp.value)
