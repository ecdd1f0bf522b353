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


# --------------------------------------------------------------------- DiT helpers
def test_axes_inv_freq_gives_each_axis_a_share_of_its_own():
    inv, section = torch_rope.vision.axes_inv_freq((4, 0, 6), (100.0, 7.0, 50.0), scales=2.0)
    assert section == [2, 0, 3]
    want = [100.0 ** (-0 / 4), 100.0 ** (-2 / 4), 50.0 ** (-0 / 6), 50.0 ** (-2 / 6)]
    want += [50.0 ** (-4 / 6)]
    assert inv.dtype == torch.float64
    assert torch.allclose(inv, torch.tensor(want, dtype=torch.float64) / 2.0, rtol=1e-15, atol=0)


def test_axes_inv_freq_bad_arguments():
    with pytest.raises(ValueError, match="even non-negative ints"):
        torch_rope.vision.axes_inv_freq((3, 4))
    with pytest.raises(ValueError, match="theta must be a number or 2 numbers"):
        torch_rope.vision.axes_inv_freq((4, 4), (1e4, 1e4, 1e4))
    with pytest.raises(ValueError, match="theta must be > 1 and scales > 0"):
        torch_rope.vision.axes_inv_freq((4, 4), scales=0.0)


def test_grid_positions_are_frame_major_then_row_major():
    got = torch_rope.vision.grid_positions(2, 3, 4, start=(5, 0, 1))
    want = [[5 + f, r, 1 + c] for f in range(2) for r in range(3) for c in range(4)]
    assert got.dtype == torch.long and torch.equal(got, torch.tensor(want))
    with pytest.raises(ValueError, match="rows must be an int >= 0"):
        torch_rope.vision.grid_positions(1, -1, 2)


@pytest.mark.parametrize("axes", [3, 4])
def test_flux_ids_put_text_first_then_the_image(axes):
    got = torch_rope.vision.flux_ids(3, 2, 2, frame=1, axes=axes)
    text = [[0, 0, 0] + ([i] if axes == 4 else []) for i in range(3)]
    image = [[1, r, c] + ([0] if axes == 4 else []) for r in range(2) for c in range(2)]
    assert torch.equal(got, torch.tensor(text + image))
    with pytest.raises(ValueError, match="axes must be 3"):
        torch_rope.vision.flux_ids(1, 1, 1, axes=2)


def test_a_dit_rope_from_the_helpers_matches_the_math():
    """FLUX-style: per-axis shares (4, 6, 6) of a 16 head, GPT-J pairs, ids from flux_ids; the
    reference rotates each pair by its axis' position times its frequency, in float64."""
    dims, theta = (4, 6, 6), 10000.0
    cos, sin, section = torch_rope.vision.axes_tables(dims, theta, max_position=16)
    ids = torch_rope.vision.flux_ids(2, 3, 4)
    x = torch.randn(1, ids.size(0), 2, 16, dtype=torch.float64)
    got = torch_rope.apply(x, cos, sin, ids.unsqueeze(-2), interleaved=True, mrope_section=section)
    want = x.clone()
    plane = 0
    for axis, d in enumerate(dims):
        for j in range(d // 2):
            angle = ids[:, axis].double() * theta ** (-2 * j / d)
            c, s = torch.cos(angle)[None, :, None], torch.sin(angle)[None, :, None]
            x0, x1 = x[..., 2 * plane], x[..., 2 * plane + 1]
            want[..., 2 * plane] = x0 * c - x1 * s
            want[..., 2 * plane + 1] = x0 * s + x1 * c
            plane += 1
    assert torch.allclose(got, want, atol=1e-6, rtol=0)
    assert not math.isnan(got.sum().item())
