# SPDX-License-Identifier: BSD-3-Clause
"""torch_rope.functional: the signatures proposed for PyTorch core (pytorch/pytorch PR #187286,
its description: the PR's code was not found), against a float64 reference written here from
that description (never torch_rope itself):

* ``rotary_embedding(x, cos, sin, position_ids=None, *, interleaved=False)``: x ``(B, H, S, D)``;
  with ``position_ids`` ``(B, S)``, cos/sin ``(N, D/2)`` are gathered at them (every head of a
  token reads the same row); without, cos/sin broadcast against ``(B, H, S, D/2)``.
  ``interleaved=False``: planes ``(k, k + D/2)`` (rotate_half); ``True``: ``(2k, 2k + 1)``; both
  read column ``k``. ``interleaved`` is keyword-only.
* ``RotaryEmbedding(dim, max_seq_len=2048, base=10000)``: cos/sin of ``p * base^(-2k/dim)``.
"""

import pytest
import torch
from helpers import TOLERANCES, cpu_and_cuda, dtype_id

import torch_rope.functional as F

DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
LAYOUTS = pytest.mark.parametrize("interleaved", [False, True], ids=["rotate_half", "adjacent"])


def reference(x, cos, sin, interleaved):
    """x (B, H, S, D) float64; cos/sin already broadcastable against (B, H, S, D/2)."""
    x = x.cpu().double()
    c, s = cos.detach().cpu().double(), sin.detach().cpu().double()
    if interleaved:
        c, s = c.repeat_interleave(2, dim=-1), s.repeat_interleave(2, dim=-1)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        rotated = torch.stack([-x2, x1], dim=-1).flatten(-2)
    else:
        c, s = torch.cat([c, c], dim=-1), torch.cat([s, s], dim=-1)
        x1, x2 = x.chunk(2, dim=-1)
        rotated = torch.cat([-x2, x1], dim=-1)
    return x * c + rotated * s


def tables(n, half, dtype=torch.float32, device="cpu"):
    """Unit-circle rows from random angles: any row differs from any other."""
    angles = torch.rand(n, half, dtype=torch.float64) * 6.0
    return angles.cos().to(dtype).to(device), angles.sin().to(dtype).to(device)


def assert_close_to(got, want):
    torch.testing.assert_close(got.detach().cpu(), want.to(got.dtype), **TOLERANCES[got.dtype])


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@LAYOUTS
@pytest.mark.parametrize("batch_of_ids", [2, 1], ids=["per_batch_ids", "shared_ids"])
def test_gathered_at_position_ids(dtype, interleaved, batch_of_ids, device):
    x = torch.randn(2, 3, 5, 16, dtype=dtype, device=device)
    cos, sin = tables(40, 8, dtype, device)  # a cache in x's dtype
    position_ids = torch.randint(0, 40, (batch_of_ids, 5), device=device)
    out = F.rotary_embedding(x, cos, sin, position_ids, interleaved=interleaved)
    ids = position_ids.cpu()
    want = reference(x, cos.cpu()[ids].unsqueeze(1), sin.cpu()[ids].unsqueeze(1), interleaved)
    assert out.shape == x.shape and out.dtype == x.dtype and out.device == x.device
    assert_close_to(out, want)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@LAYOUTS
@pytest.mark.parametrize(
    "cos_shape", [(5, 8), (2, 1, 5, 8), (1, 3, 5, 8), (3, 1, 8), (1, 8)],
    ids=["S", "B_1_S", "1_H_S", "H_1", "one_row"],
)  # fmt: skip
def test_broadcast_without_position_ids(dtype, interleaved, cos_shape, device):
    x = torch.randn(2, 3, 5, 16, dtype=dtype, device=device)
    cos, sin = tables(1, 8)
    angles = torch.rand(cos_shape, dtype=torch.float64) * 6
    cos, sin = angles.cos().to(device), angles.sin().to(device)
    out = F.rotary_embedding(x, cos, sin, interleaved=interleaved)
    assert_close_to(out, reference(x, cos, sin, interleaved))


def test_expanded_tables_are_read_without_materialising_rows():
    # cos expanded over B and H (stride 0): same result as the (S, D/2) table.
    x = torch.randn(2, 3, 4, 8, dtype=torch.float64)
    cos, sin = tables(4, 4, torch.float64)
    wide_cos, wide_sin = cos.expand(2, 3, 4, 4), sin.expand(2, 3, 4, 4)
    out = F.rotary_embedding(x, wide_cos, wide_sin)
    torch.testing.assert_close(out, reference(x, cos, sin, False))


def test_worked_gather_equals_gathered_rows():
    # PR description, PT-1: position_ids [[5, 0, 7]] reads rows 5, 0, 7 for both heads.
    x = torch.randn(1, 2, 3, 4, dtype=torch.float64)
    cos, sin = tables(8, 2, torch.float64)
    by_ids = F.rotary_embedding(x, cos, sin, torch.tensor([[5, 0, 7]]))
    by_rows = F.rotary_embedding(x, cos[[5, 0, 7]], sin[[5, 0, 7]])
    torch.testing.assert_close(by_ids, by_rows, rtol=0, atol=0)
    torch.testing.assert_close(by_ids, reference(x, cos[[5, 0, 7]], sin[[5, 0, 7]], False))


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@LAYOUTS
@pytest.mark.parametrize("with_ids", [False, True], ids=["broadcast", "position_ids"])
def test_gradient(dtype, interleaved, with_ids, device):
    cos, sin = tables(12, 8, device=device)
    x = torch.randn(2, 2, 4, 16, dtype=dtype, device=device, requires_grad=True)
    g = torch.randn_like(x)
    if with_ids:
        ids = torch.tensor([[3, 1, 0, 11], [7, 7, 2, 9]], device=device)
        out = F.rotary_embedding(x, cos, sin, ids, interleaved=interleaved)
        ref_cos, ref_sin = cos.cpu()[ids.cpu()].unsqueeze(1), sin.cpu()[ids.cpu()].unsqueeze(1)
    else:
        out = F.rotary_embedding(x, cos[:4], sin[:4], interleaved=interleaved)
        ref_cos, ref_sin = cos[:4], sin[:4]
    (grad,) = torch.autograd.grad(out, x, g)
    x64 = x.detach().cpu().double().requires_grad_()
    want_out = reference(x64, ref_cos, ref_sin, interleaved)
    (want,) = torch.autograd.grad(want_out, x64, g.cpu().double())
    assert_close_to(grad, want)


def test_interleaved_is_keyword_only():
    x = torch.randn(1, 1, 2, 4)
    cos, sin = tables(2, 2)
    with pytest.raises(TypeError):
        F.rotary_embedding(x, cos, sin, None, True)


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda x, c, s: F.rotary_embedding(x[0], c, s), "x must be"),
        (lambda x, c, s: F.rotary_embedding(x, c[:, :3], s[:, :3]), "cos"),  # partial: refused
        (lambda x, c, s: F.rotary_embedding(x, c, s[:-1], torch.zeros(1, 4).long()), "sin"),
        (lambda x, c, s: F.rotary_embedding(x, c[:3], s[:3]), "cos"),  # 3 rows, S = 4
        (lambda x, c, s: F.rotary_embedding(x, c, s, torch.zeros(4).long()), "position_ids"),
        (lambda x, c, s: F.rotary_embedding(x, c, s, torch.zeros(1, 4)), "position_ids"),
        (lambda x, c, s: F.rotary_embedding(x, c, s, torch.zeros(3, 4).long()), "position_ids"),
        (lambda x, c, s: F.rotary_embedding(x, c, s, torch.full((1, 4), 10)), "position"),
        (
            lambda x, c, s: F.rotary_embedding(
                x, c.unsqueeze(0), s.unsqueeze(0), torch.zeros(1, 4).long()
            ),
            "cos",
        ),
    ],
    ids=[
        "x_3d",
        "partial_rotary",
        "sin_shape",
        "cos_not_broadcastable",
        "ids_1d",
        "ids_float",
        "ids_batch",
        "ids_past_table",
        "cos_3d_with_ids",
    ],
)
def test_bad_arguments(call, match):
    x = torch.randn(2, 2, 4, 8)
    cos, sin = tables(10, 4)
    with pytest.raises((ValueError, TypeError, IndexError, RuntimeError), match=match):
        call(x, cos, sin)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("with_ids", [False, True], ids=["arange", "position_ids"])
def test_module(dtype, with_ids, device):
    dim, base = 16, 500.0
    rope = F.RotaryEmbedding(dim, max_seq_len=64, base=base).to(device)
    x = torch.randn(2, 3, 6, dim, dtype=dtype, device=device)
    ids = torch.tensor([[0, 9, 2, 63, 4, 4], [1, 2, 3, 4, 5, 6]], device=device)
    out = rope(x, ids) if with_ids else rope(x)
    positions = ids.cpu().double().unsqueeze(1) if with_ids else torch.arange(6.0)
    inv = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = positions.unsqueeze(-1) * inv
    want = reference(x, angles.cos(), angles.sin(), False)
    if dtype == torch.float64:  # float32 tables: float32's accuracy, whatever x's dtype
        torch.testing.assert_close(out, want.to(device), **TOLERANCES[torch.float32])
    else:
        assert_close_to(out, want)


def test_module_buffers_and_limits():
    rope = F.RotaryEmbedding(8, max_seq_len=4)
    assert rope.state_dict() == {}  # derived from the arguments: not persistent
    assert rope.cos.shape == (4, 4) and rope.cos.dtype == torch.float32
    rope.half()  # a model cast keeps the tables' precision
    assert rope.cos.dtype == torch.float32
    with pytest.raises(ValueError, match="max_seq_len"):
        rope(torch.randn(1, 1, 5, 8))
    with pytest.raises(ValueError, match="dim"):
        F.RotaryEmbedding(7)
    assert F.RotaryEmbedding(8).cos.shape == (2048, 4)  # the proposal's defaults


def test_compile_fullgraph():
    rope = F.RotaryEmbedding(8, max_seq_len=16)
    x = torch.randn(2, 2, 4, 8)
    ids = torch.tensor([[0, 5, 2, 15], [1, 1, 1, 1]])
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(rope, fullgraph=True)(x, ids), rope(x, ids))
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(rope, fullgraph=True)(x), rope(x))
