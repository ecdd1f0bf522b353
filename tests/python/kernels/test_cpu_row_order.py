# SPDX-License-Identifier: BSD-3-Clause
"""Every row the CPU kernel visits, in whatever order, is rotated exactly once.

The CPU kernel walks rows as runs along the innermost row dim, and when positions change along
that dim but not along the next one out ((B, H, S, D) with positions (S,) or (B, 1, S)) it visits
groups of whole heads (up to 1 MiB of x) in tiles of 16 positions. Parallel chunks start and end
anywhere, mid-head and mid-run. These cases put chunk edges, partial tiles and partial runs
everywhere and check every row against the float64 oracle; in-place results must equal the
out-of-place ones bit for bit.
"""

import pytest
import torch
from helpers import assert_matches_reference, make_tables, randn, table_dtype_for

import torch_rope

# (x shape, positions shape): (B, H, S, D) with S above and below the tile, odd sizes, and layouts
# where the tiled order does not apply.
CASES = [
    ((3, 5, 37, 64), (37,)),  # tiled; 555 rows, about 2 chunks of 512-row grain
    ((2, 7, 53, 64), (2, 1, 53)),  # tiled, positions per sequence
    ((1, 4, 16, 64), (16,)),  # exactly one tile: runs in order
    ((2, 3, 300, 32), (300,)),  # long runs, several tiles, small head_dim (large grain)
    ((1, 5, 1600, 64), (1600,)),  # heads of 400 KiB (fp32): tiled groups of 2, then 1 head
    ((4, 33, 6, 64), (33, 1)),  # (B, S, H, D) layout: heads innermost, no tiling
    ((2, 9, 41, 64), (9, 41)),  # positions vary along both inner dims: no tiling
]


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float64], ids=lambda d: str(d)[6:]
)
@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "half_split"])
@pytest.mark.parametrize("shape,pos_shape", CASES, ids=lambda v: "x".join(map(str, v)))
def test_every_row_rotated_once(two_threads, shape, pos_shape, interleaved, dtype):
    head_dim = shape[-1]
    cos, sin = make_tables(512, head_dim, "cpu", table_dtype_for(dtype))
    x = randn(*shape, dtype=dtype)
    positions = torch.randint(0, 512, pos_shape, dtype=torch.int32)
    out = torch_rope.apply(x, cos, sin, positions, interleaved=interleaved)
    assert_matches_reference(out, x, positions, head_dim, interleaved=interleaved)
    y = x.clone()
    torch_rope.apply_(y, cos, sin, positions, interleaved=interleaved)
    assert torch.equal(y, out)
    # A strided view (every other head) goes through the same traversal with other strides.
    xs = x[:, ::2]
    ps = (
        positions[..., ::2, :]
        if positions.dim() >= 2 and positions.size(-2) == shape[1]
        else positions
    )
    outs = torch_rope.apply(xs, cos, sin, ps, interleaved=interleaved)
    assert_matches_reference(outs, xs, ps, head_dim, interleaved=interleaved)
