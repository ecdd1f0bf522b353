# SPDX-License-Identifier: BSD-3-Clause
"""CUDA-only checks of what the launch plan (csrc/cuda/launch_plan.h) decides: per-tensor and
per-part vector paths, and the range check of positions when nothing rotates. SKIPPED without a
GPU; the same behaviour is exercised on the host by ``ctest -L cuda-host`` in every run."""

import pytest
import torch
from helpers import (
    LAYOUT_IDS,
    LAYOUTS,
    TOLERANCES,
    assert_device_assert,
    assert_matches_reference,
    make_tables,
    needs_cuda,
    randn,
)

import torch_rope

pytestmark = needs_cuda


@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
def test_misaligned_k_beside_aligned_q(interleaved):
    # k starts 8 bytes into a 16-byte vector: k takes the scalar path, q stays on the vector
    # path, in one launch.
    cos, sin = make_tables(64, 128, "cuda")
    q = randn(2, 16, 8, 128, dtype=torch.bfloat16, device="cuda")
    k = randn(2 * 16 * 2 * 128 + 4, dtype=torch.bfloat16, device="cuda")[4:].view(2, 16, 2, 128)
    positions = torch.randint(0, 64, (16, 1), device="cuda")
    qo, ko = torch_rope.apply_qk(q, k, cos, sin, positions, interleaved=interleaved)
    assert_matches_reference(qo, q, positions, 128, interleaved=interleaved)
    assert_matches_reference(ko, k, positions, 128, interleaved=interleaved)


@pytest.mark.parametrize("rotary_dim", [24, 64, 72])
def test_partial_rotary_tails(rotary_dim):
    # GPT-NeoX-style partial rotary: the tail takes its own path (vector where it starts on a
    # 16-byte boundary, element by element otherwise) and is copied bit for bit.
    cos, sin = make_tables(32, rotary_dim, "cuda")
    for head_dim, rows in ((96, 7), (100, 1), (136, 5)):
        x = randn(rows, head_dim, dtype=torch.bfloat16, device="cuda")
        positions = torch.randint(0, 32, (rows,), device="cuda")
        for interleaved in LAYOUTS:
            out = torch_rope.apply(x, cos, sin, positions, interleaved=interleaved)
            assert torch.equal(out[:, rotary_dim:], x[:, rotary_dim:])
            assert_matches_reference(out, x, positions, rotary_dim, interleaved=interleaved)


def test_cpu_and_cuda_agree_on_a_fused_cos_sin_cache():
    # cos and sin as two halves of one [max_seq_len, rotary_dim + 1] cache: read in place, rows
    # not 16-byte aligned, so the table loads are scalar.
    cache = torch.randn(40, 65, dtype=torch.float32)
    cos, sin = cache[:, :32], cache[:, 32:64]
    x = randn(3, 9, 64, dtype=torch.float16)
    positions = torch.randint(0, 40, (9, 1))
    want = torch_rope.apply(x, cos, sin, positions)
    got = torch_rope.apply(x.cuda(), cos.cuda(), sin.cuda(), positions.cuda())
    torch.testing.assert_close(got.cpu(), want, **TOLERANCES[torch.float16])


@pytest.mark.parametrize("op", ["apply", "apply_"])
def test_out_of_range_position_asserts_without_rotary_dims(op):
    # rotary_dim 0: no lane rotates, yet every position is range-checked, as on the CPU.
    assert_device_assert(
        "cos = torch.empty(8, 0, device='cuda'); sin = torch.empty(8, 0, device='cuda')\n"
        "x = torch.randn(4, 16, device='cuda')\n"
        "p = torch.tensor([0, 1, 8, 2], device='cuda')",
        f"torch_rope.{op}(x, cos, sin, p)",
    )
