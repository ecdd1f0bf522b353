# SPDX-License-Identifier: BSD-3-Clause
"""torch_rope.vision: axial frequencies and patch positions, and 2-D RoPE through the ops.

The references here are written patch by patch and plane by plane from the definitions (the
vision towers' loops), not vectorised the way the library builds them.
"""

import math

import pytest
import torch
from helpers import cpu_and_cuda

import torch_rope
from torch_rope.vision import axial_inv_freq, patch_positions


def naive_patch_positions(grid_thw, m, temporal):
    out = []
    for t, h, w in grid_thw:
        for frame in range(t):
            for r0 in range(h // m):
                for c0 in range(w // m):
                    for r1 in range(m):
                        for c1 in range(m):
                            rc = [r0 * m + r1, c0 * m + c1]
                            out.append([frame] + rc if temporal else rc)
    return torch.tensor(out, dtype=torch.long).reshape(-1, 3 if temporal else 2)


@pytest.mark.parametrize("temporal", [False, True])
@pytest.mark.parametrize("m", [1, 2, 3])
def test_patch_positions_follow_the_merge_windows(m, temporal):
    grid = [[1, 2 * m, 3 * m], [2, 3 * m, m], [1, m, m]]
    got = patch_positions(torch.tensor(grid), m, temporal=temporal)
    assert got.dtype == torch.long
    assert torch.equal(got, naive_patch_positions(grid, m, temporal))


def test_patch_positions_empty_and_bad_grids():
    assert patch_positions(torch.zeros(0, 3, dtype=torch.long)).shape == (0, 2)
    with pytest.raises(ValueError, match="multiples of spatial_merge_size = 2"):
        patch_positions(torch.tensor([[1, 3, 4]]), 2)
    with pytest.raises(ValueError, match=r"integer \(num_images, 3\)"):
        patch_positions(torch.tensor([[1.0, 2.0, 2.0]]))
    with pytest.raises(ValueError, match=r"integer \(num_images, 3\)"):
        patch_positions(torch.tensor([1, 2, 2]))
    with pytest.raises(ValueError, match="spatial_merge_size must be an int >= 1"):
        patch_positions(torch.tensor([[1, 2, 2]]), 0)


@pytest.mark.parametrize("temporal", [False, True])
def test_patch_positions_match_transformers(temporal):
    """The positions transformers' vision towers rotate by (transformers.vision_utils)."""
    pytest.importorskip("transformers")
    vision_utils = pytest.importorskip("transformers.vision_utils")
    grid = torch.tensor([[1, 4, 6], [2, 6, 4], [3, 2, 2]])
    want = vision_utils.get_vision_position_ids(grid, 2, include_temporal=temporal)
    assert torch.equal(patch_positions(grid, 2, temporal=temporal), want)


@pytest.mark.parametrize("num_axes", [1, 2, 3])
def test_axial_inv_freq_restart(num_axes):
    rotary_dim = 12 * num_axes
    inv_freq, section = axial_inv_freq(100.0, rotary_dim, num_axes)
    n = rotary_dim // (2 * num_axes)
    assert section == [n] * num_axes
    assert inv_freq.dtype == torch.float64
    for a in range(num_axes):
        for j in range(n):
            assert inv_freq[a * n + j].item() == pytest.approx(100.0 ** (-j / n), rel=1e-15)


def test_axial_inv_freq_alternate_is_pixtral():
    head_dim = 16
    inv_freq, section = axial_inv_freq(10000.0, head_dim, 2, per_axis="alternate")
    plain = [10000.0 ** (-2 * i / head_dim) for i in range(head_dim // 2)]
    assert section == [4, 4]
    assert inv_freq.tolist() == pytest.approx(plain[0::2] + plain[1::2], rel=1e-15)


def test_axial_inv_freq_bad_arguments():
    with pytest.raises(ValueError, match="multiple of 2 \\* num_axes = 4"):
        axial_inv_freq(10000.0, 6, 2)
    with pytest.raises(ValueError, match="per_axis"):
        axial_inv_freq(10000.0, 8, 2, per_axis="other")
    with pytest.raises(ValueError, match="theta must be > 1"):
        axial_inv_freq(1.0, 8, 2)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("device", cpu_and_cuda())
def test_2d_rope_of_patches_matches_the_math(device, interleaved):
    """2-D RoPE with the helpers: plane j < n turns by the patch's row times theta^(-j/n), plane
    n + j by its column, computed here plane by plane."""
    theta, head_dim, heads = 10000.0, 16, 3
    grid = torch.tensor([[1, 4, 6]])
    positions = patch_positions(grid, 2, device=device)
    inv_freq, section = axial_inv_freq(theta, head_dim, 2)
    cos, sin = torch_rope.rope_tables_from_inv_freq(inv_freq, 8, device)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(positions.shape[0], heads, head_dim, generator=g, dtype=torch.float64)
    got = torch_rope.apply(
        x.float().to(device),
        cos,
        sin,
        positions.unsqueeze(-2),
        interleaved=interleaved,
        mrope_section=section,
    )
    n = head_dim // 4
    want = x.clone()
    for p in range(positions.shape[0]):
        row, col = positions[p].tolist()
        for k in range(2 * n):
            angle = (row if k < n else col) * theta ** (-(k % n) / n)
            a, b = (2 * k, 2 * k + 1) if interleaved else (k, k + head_dim // 2)
            c, s = math.cos(angle), math.sin(angle)
            want[p, :, a] = x[p, :, a] * c - x[p, :, b] * s
            want[p, :, b] = x[p, :, a] * s + x[p, :, b] * c
    torch.testing.assert_close(got.cpu().double(), want, atol=2e-6, rtol=2e-6)
