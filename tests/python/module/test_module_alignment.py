# SPDX-License-Identifier: BSD-3-Clause
"""Which row gets which position in the module: (S,) and (B, S) token positions over every rank of
x and every sequence axis, one-axis and multi-axis modules, on the eager path (the C++ rules of
csrc/rules.h) and on the traced path (their Python mirror in torch_rope.nn), against an oracle
that gives each row of x its position by index: row (i_0, ..., i_{r-1}) of x.shape[:-1] reads
positions[i_s] for (S,) and positions[i_0, i_s] for (B, S), with s the sequence axis. Sizes
along x's axes are all different, so a position read along the wrong axis either fails or
rotates the wrong rows."""

import itertools

import pytest
import references as ref
import torch
from torch.overrides import TorchFunctionMode

import torch_rope

D_K = 8
MAX_SEQ_LEN = 64
SECTION = [1, 2, 1]  # multi-axis module: 3 axes (time, height, width), rotary_dim / 2 = 4
# Sizes of x.shape[:-1] by rank: the first axis is B = 2, the others 3, 5, 4, 6, all different.
ROW_SHAPES = [(5,), (2, 5), (2, 3, 5), (2, 3, 5, 4), (2, 3, 5, 4, 6)]


class _NoFastPath(TorchFunctionMode):
    """A __torch_function__ mode that changes nothing but turns off the eager fast path, so the
    module runs its traced path (the Python mirror of the C++ rules), as torch.compile does."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _row_positions(row_shape, seq_axis, positions, num_axes):
    """The oracle's alignment: every row's position(s), row_shape (+ (num_axes,)), by index."""
    axis_shape = (num_axes,) if num_axes else ()
    out = torch.empty(tuple(row_shape) + axis_shape, dtype=torch.int64)
    for index in itertools.product(*(range(n) for n in row_shape)):
        if positions.dim() - (1 if num_axes else 0) == 1:  # (S,)
            out[index] = positions[index[seq_axis]]
        else:  # (B, S)
            out[index] = positions[index[0], index[seq_axis]]
    return out


def _cases():
    for row_shape in ROW_SHAPES:
        rank = len(row_shape)
        for seq_dim in range(-2, -rank - 2, -1):
            seq_axis = rank + 1 + seq_dim  # in x.shape[:-1]
            yield pytest.param(row_shape, seq_dim, "S", id=f"rank{rank}-seq_dim{seq_dim}-S")
            if seq_axis >= 1:  # a batch axis before the sequence axis
                yield pytest.param(row_shape, seq_dim, "BS", id=f"rank{rank}-seq_dim{seq_dim}-BS")


@pytest.mark.parametrize("path", ["eager", "traced"])
@pytest.mark.parametrize("multi_axis", [False, True], ids=["one_axis", "multi_axis"])
@pytest.mark.parametrize("row_shape,seq_dim,form", list(_cases()))
def test_positions_align_with_the_sequence_axis(row_shape, seq_dim, form, multi_axis, path):
    rank = len(row_shape)
    seq_axis = rank + 1 + seq_dim
    num_axes = len(SECTION) if multi_axis else 0
    S = row_shape[seq_axis]
    lead = (S,) if form == "S" else (row_shape[0], S)
    positions = torch.randint(0, MAX_SEQ_LEN, lead + ((num_axes,) if num_axes else ()))
    x = torch.randn(*row_shape, D_K, dtype=torch.float64)
    extra = dict(mrope_section=SECTION) if multi_axis else {}
    rope = torch_rope.RotaryPositionalEmbedding(
        10000.0, D_K, MAX_SEQ_LEN, seq_dim=seq_dim, dtype=torch.float64, **extra
    )
    if path == "traced":
        with _NoFastPath():
            got = rope(x, positions)
    else:
        got = rope(x, positions)
    rows = _row_positions(row_shape, seq_axis, positions, num_axes)
    angles = ref.angles(rows, row_shape, D_K, **({"mrope_section": SECTION} if multi_axis else {}))
    want = ref.rope(x, angles, interleaved=True)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
