# SPDX-License-Identifier: BSD-3-Clause
"""CUDA-only checks of what the launch plan (csrc/cuda/rope_launch_plan.h) decides: per-tensor and
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


def _free_gpu_bytes():
    free, _ = torch.cuda.mem_get_info()
    return free


@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
def test_offsets_past_2_31_elements_in_a_kv_cache(interleaved):
    # A bf16 KV cache (2, 2^21 + 1, 8, 128): 2^31 + 1024 elements per batch entry, 8 GiB in all, so
    # every row of batch 1 lies past element 2^31. out= into its last slots, apply_ in place there
    # and apply_qk with k read from there must all match the CPU; an index held in 32 bits
    # corrupts them. (The host run checks the same past 2^32 without the memory: ctest -L
    # cuda-host.)
    b, s_max, h, d = 2, (1 << 21) + 1, 8, 128
    need = b * s_max * h * d * 2
    if _free_gpu_bytes() < need + (1 << 30):
        pytest.skip(f"needs {need / 2**30:.1f} GiB of free GPU memory plus 1 GiB")
    cache = torch.empty(b, s_max, h, d, dtype=torch.bfloat16, device="cuda")
    assert cache.stride(0) > 2**31
    cos, sin = make_tables(64, d, "cuda")
    slots = cache[:, -3:]  # (2, 3, 8, 128), batch stride 2^31 + 1024
    positions = torch.randint(0, 64, (b, 3, 1), device="cuda")
    x = randn(b, 3, h, d, dtype=torch.bfloat16, device="cuda")
    want = torch_rope.apply(x.cpu(), cos.cpu(), sin.cpu(), positions.cpu(), interleaved=interleaved)

    slots.zero_()
    torch_rope.apply(x, cos, sin, positions, interleaved=interleaved, out=slots)
    torch.testing.assert_close(slots.cpu(), want, rtol=0, atol=0)

    slots.copy_(x)
    torch_rope.apply_(slots, cos, sin, positions, interleaved=interleaved)
    torch.testing.assert_close(slots.cpu(), want, rtol=0, atol=0)

    slots.copy_(x)
    q = randn(b, 3, 2 * h, d, dtype=torch.bfloat16, device="cuda")
    qo, ko = torch_rope.apply_qk(q, slots, cos, sin, positions, interleaved=interleaved)
    torch.testing.assert_close(ko.cpu(), want, rtol=0, atol=0)
    q_want = torch_rope.apply(
        q.cpu(), cos.cpu(), sin.cpu(), positions.cpu(), interleaved=interleaved
    )
    torch.testing.assert_close(qo.cpu(), q_want, rtol=0, atol=0)
    del cache, slots
    torch.cuda.empty_cache()


def test_grid_of_65536_blocks():
    # (16, 8192, 64, 128) bf16 prefill: 2^24 threads of 8 rows, exactly 65,536 blocks (2 GiB).
    # A grid in gridDim.y (at most 65,535) or capped there fails or leaves the last rows unwritten.
    b, s, h, d = 16, 8192, 64, 128
    if _free_gpu_bytes() < 3 * b * s * h * d * 2 + (1 << 30):
        pytest.skip("needs 7 GiB of free GPU memory")
    cos, sin = make_tables(s, d, "cuda")
    x = randn(b, s, h, d, dtype=torch.bfloat16, device="cuda")
    positions = torch.arange(s, device="cuda").view(s, 1)
    out = torch_rope.apply(x, cos, sin, positions)
    # The last block's rows and the first ones, against the CPU.
    for sl in (slice(0, 1), slice(b - 1, b)):
        want = torch_rope.apply(x[sl].cpu(), cos.cpu(), sin.cpu(), positions.cpu())
        torch.testing.assert_close(out[sl].cpu(), want, rtol=0, atol=0)


def test_first_call_inside_cuda_graph_capture():
    # The first call of a process does one-time work (occupancy query per kernel, device
    # properties); inside stream capture none of it may touch the legacy default stream or
    # synchronize, and the kernel must be captured on the capturing (current) stream. Then the
    # replay must compute what an eager call does. In a child process, so the call is the first.
    from helpers import run_python

    script = """
import torch, torch_rope
cos, sin = torch_rope.rope_tables(10000.0, 128, 64, device='cuda')
q = torch.randn(2, 16, 8, 128, device='cuda', dtype=torch.bfloat16)
k = torch.randn(2, 16, 2, 128, device='cuda', dtype=torch.bfloat16)
x = torch.randn(2, 16, 8, 128, device='cuda', dtype=torch.float16)[..., :100]
positions = torch.randint(0, 64, (16, 1), device='cuda')
inplace = q.clone()
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    qo, ko = torch_rope.apply_qk(q, k, cos, sin, positions, interleaved=False)
    xo = torch_rope.apply(x, cos[:, :32], sin[:, :32], positions)
    torch_rope.apply_(inplace, cos, sin, positions)
g.replay()
torch.cuda.synchronize()
wq, wk = torch_rope.apply_qk(q, k, cos, sin, positions, interleaved=False)
assert torch.equal(qo, wq) and torch.equal(ko, wk)
assert torch.equal(xo, torch_rope.apply(x, cos[:, :32], sin[:, :32], positions))
assert torch.equal(inplace, torch_rope.apply(q, cos, sin, positions))
print('GRAPH OK')
"""
    result = run_python(script)
    assert "GRAPH OK" in result.stdout, result.stdout + result.stderr
