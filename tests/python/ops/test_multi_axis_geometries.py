# SPDX-License-Identifier: BSD-3-Clause
"""Multi-axis positions in the layouts real models hand the ops, against the oracle.

The CPU backend gathers the angles of each distinct multi-axis position once when several rows
(the heads of a token) share it, and gathers per row otherwise (csrc/cpu/common_shared_angles.h,
csrc/cpu/common_mixed_rows.h). Both routes are covered here: positions shared by the heads in every
layout (B, H, S, D), (B, S, H, D), packed (T, H, D), GQA apply_qk, int32 and strided positions,
float64 tables; and positions with one entry per row."""

import pytest
import references as ref
import torch
from helpers import TOLERANCES, cpu_and_cuda, dtype_id

import torch_rope

SECTIONS = [([8, 16, 16], False), ([16, 12, 12], True), ([20, 20], False)]  # 40 planes
MAX = 97


def _case(name, gen, device):
    """(x, positions of shape rows + (A,) broadcastable to x.shape[:-1], description)."""

    def pos(*shape):
        return torch.randint(0, MAX, shape, generator=gen).to(device)

    x = {
        "bhsd_b1s": (2, 4, 9, 96),
        "bhsd_s": (2, 4, 9, 96),
        "bshd": (2, 9, 4, 96),
        "packed": (11, 4, 96),
        "per_row": (2, 4, 9, 96),
        "decode": (5, 4, 1, 96),
    }[name]
    positions = {
        "bhsd_b1s": lambda a: pos(2, 1, 9, a),
        "bhsd_s": lambda a: pos(9, a),
        "bshd": lambda a: pos(2, 9, 1, a),
        "packed": lambda a: pos(11, 1, a),
        "per_row": lambda a: pos(2, 4, 9, a),
        "decode": lambda a: pos(5, 1, 1, a),
    }[name]
    return x, positions


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=dtype_id)
@pytest.mark.parametrize("section,mrope_interleaved", SECTIONS, ids=["contig", "qwen3vl", "2d"])
@pytest.mark.parametrize("interleaved", [True, False], ids=["gptj", "half"])
@pytest.mark.parametrize("layout", ["bhsd_b1s", "bhsd_s", "bshd", "packed", "per_row", "decode"])
@pytest.mark.parametrize("device", cpu_and_cuda())
def test_apply_matches_oracle(device, layout, interleaved, section, mrope_interleaved, dtype):
    gen = torch.Generator().manual_seed(hash((layout, interleaved, len(section))) % 2**31)
    shape, positions_of = _case(layout, gen, device)
    table_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    cos, sin = (t.to(device) for t in ref.tables(MAX, 80, dtype=table_dtype))  # partial rotary
    x = torch.randn(shape, generator=gen).to(device=device, dtype=dtype)
    positions = positions_of(len(section))
    kw = dict(interleaved=interleaved, mrope_section=section, mrope_interleaved=mrope_interleaved)
    got = torch_rope.apply(x, cos, sin, positions, **kw)
    want = ref.rope_with_tables(x.cpu(), cos, sin, positions.cpu(), **kw)
    torch.testing.assert_close(got.cpu(), want.to(dtype), **TOLERANCES[dtype])
    # int32 positions, and positions whose axis dim is the outermost in memory (HF's (A, B, S)
    # position ids moved last): same bits.
    assert torch.equal(torch_rope.apply(x, cos, sin, positions.int(), **kw), got)
    strided = positions.movedim(-1, 0).contiguous().movedim(0, -1)
    assert torch.equal(torch_rope.apply(x, cos, sin, strided, **kw), got)
    # In place and out= take the same route.
    y = x.clone()
    torch_rope.apply_(y, cos, sin, positions, **kw)
    assert torch.equal(y, got)


@pytest.mark.parametrize("section,mrope_interleaved", SECTIONS[:2], ids=["contig", "qwen3vl"])
@pytest.mark.parametrize("device", cpu_and_cuda())
def test_apply_qk_gqa_matches_oracle(device, section, mrope_interleaved):
    gen = torch.Generator().manual_seed(3)
    cos, sin = (t.to(device) for t in ref.tables(MAX, 80))
    q = torch.randn(2, 9, 8, 96, generator=gen).to(device)  # (B, S, Hq, D)
    k = torch.randn(2, 9, 2, 96, generator=gen).to(device)  # (B, S, Hkv, D)
    positions = torch.randint(0, MAX, (2, 9, 1, 3), generator=gen).to(device)
    kw = dict(interleaved=False, mrope_section=section, mrope_interleaved=mrope_interleaved)
    got_q, got_k = torch_rope.apply_qk(q, k, cos, sin, positions, **kw)
    for got, x in ((got_q, q), (got_k, k)):
        want = ref.rope_with_tables(x.cpu(), cos, sin, positions.cpu(), **kw)
        torch.testing.assert_close(got.cpu(), want.float(), **TOLERANCES[torch.float32])
