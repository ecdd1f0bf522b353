# SPDX-License-Identifier: BSD-3-Clause
"""torch.compile(fullgraph=True) and torch.export of models and functions using the ops (every
op on every sample, and opcheck, run in test_samples.py)."""

import pytest
import torch
from blocks import AttentionBlock
from helpers import cpu_and_cuda, make_tables, needs_cuda

import torch_rope


def _count_rope_nodes(gm):
    return sum(1 for n in gm.graph.nodes if n.target is torch.ops.rope.apply.default)


def test_compile_traces_the_op_as_one_node():
    # A recording backend: the op must reach the graph as rope.apply itself, once per call.
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    rope = torch_rope.RotaryPositionalEmbedding(10000.0, 16, 32)
    block = AttentionBlock(32, 2, rope, causal=True)
    compiled = torch.compile(block, backend=backend, fullgraph=True)
    x = torch.randn(2, 7, 32)
    torch.testing.assert_close(compiled(x), block(x))
    assert len(graphs) == 1
    assert _count_rope_nodes(graphs[0]) == 2  # q and k


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_compile_inductor_matches_eager(device):
    torch._dynamo.reset()
    rope = torch_rope.RotaryPositionalEmbedding(10000.0, 16, 64, device=device)
    block = AttentionBlock(32, 2, rope).to(device)
    compiled = torch.compile(block, fullgraph=True)
    x = torch.randn(2, 9, 32, device=device)
    positions = torch.randint(0, 64, (9,), device=device)
    tol = 1e-5 if device == "cpu" else 1e-4  # generated GPU kernels may reorder reductions
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, positions), block(x, positions), rtol=tol, atol=tol)


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_compile_backward_and_dynamic_shapes(device):
    # aot_eager traces forward and backward through the fake kernels and autograd formula
    # without paying for code generation; two sequence lengths exercise symbolic shapes.
    torch._dynamo.reset()
    rope = torch_rope.RotaryPositionalEmbedding(10000.0, 16, 64, interleaved=False, device=device)
    block = AttentionBlock(32, 2, rope).to(device)
    compiled = torch.compile(block, backend="aot_eager", fullgraph=True, dynamic=True)
    for seq in (5, 11):
        x = torch.randn(2, seq, 32, device=device, requires_grad=True)
        x_eager = x.detach().clone().requires_grad_()
        out = compiled(x)
        want = block(x_eager)
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
        out.square().sum().backward()
        want.square().sum().backward()
        torch.testing.assert_close(x.grad, x_eager.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_compile_inplace_and_qk_ops(device):
    # The mutating op and the two-output op under fullgraph compile.
    torch._dynamo.reset()
    cos, sin = make_tables(32, 16, device)

    def f(q, k, positions):
        q2, k2 = torch_rope.apply_qk(q, k, cos, sin, positions, interleaved=False)
        v = k.clone()
        torch_rope.apply_(v, cos, sin, positions)
        return q2 * 2, k2 + 1, v

    q = torch.randn(2, 4, 6, 16, device=device)
    k = torch.randn(2, 2, 6, 16, device=device)
    positions = torch.arange(6, device=device)
    got = torch.compile(f, backend="aot_eager", fullgraph=True)(q, k, positions)
    for a, b in zip(got, f(q, k, positions)):
        torch.testing.assert_close(a, b)


def test_export_module():
    rope = torch_rope.RotaryPositionalEmbedding(10000.0, 16, 32, rotary_dim=8)
    x = torch.randn(2, 3, 7, 16)
    positions = torch.arange(7)
    exported = torch.export.export(rope, (x, positions))
    torch.testing.assert_close(exported.module()(x, positions), rope(x, positions))
    targets = {n.target for n in exported.graph.nodes if n.op == "call_function"}
    assert torch.ops.rope.apply.default in targets


@needs_cuda
def test_compile_reduce_overhead_cuda():
    # CUDA graphs replay on their own stream: a kernel launched on the legacy default stream
    # instead of the current one would be missing from the graph or race with it.
    torch._dynamo.reset()
    rope = torch_rope.RotaryPositionalEmbedding(10000.0, 16, 64, device="cuda")
    block = AttentionBlock(32, 2, rope).cuda()
    compiled = torch.compile(block, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():
        for step in range(4):
            x = torch.randn(2, 9, 32, device="cuda")
            positions = step + torch.arange(9, device="cuda")
            got = compiled(x, positions).clone()
            torch.testing.assert_close(got, block(x, positions), rtol=1e-5, atol=1e-5)


# ---- multi-axis positions (mrope_section) ------------------------------------------------------


class _MultiAxisRope(torch.nn.Module):
    """q and k of a (B, S, H, D) block rotated with (B, S, 1, 3) positions (Qwen3-VL style)."""

    def __init__(self, mrope_section, mrope_interleaved):
        super().__init__()
        cos, sin = make_tables(64, 2 * sum(mrope_section), "cpu")
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.kw = dict(
            interleaved=False, mrope_section=mrope_section, mrope_interleaved=mrope_interleaved
        )

    def forward(self, q, k, positions):
        q, k = torch_rope.apply_qk(q, k, self.cos, self.sin, positions, **self.kw)
        v = torch_rope.apply(k, self.cos, self.sin, positions, inverse=True, **self.kw)
        return q, k, v


MROPE = [([2, 3, 3], False), ([2, 3, 3], True)]


@pytest.mark.parametrize("mrope_section,mrope_interleaved", MROPE, ids=["sections", "il3"])
def test_export_multi_axis(mrope_section, mrope_interleaved):
    module = _MultiAxisRope(mrope_section, mrope_interleaved)
    q, k = torch.randn(2, 7, 4, 24), torch.randn(2, 7, 2, 24)
    positions = torch.randint(0, 64, (2, 7, 1, 3))
    exported = torch.export.export(module, (q, k, positions))
    for got, want in zip(exported.module()(q, k, positions), module(q, k, positions)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    calls = [n for n in exported.graph.nodes if n.op == "call_function"]
    mrope_calls = [
        n
        for n in calls
        if n.target in (torch.ops.rope.apply.default, torch.ops.rope.apply_qk.default)
    ]
    assert len(mrope_calls) == 2
    for n in mrope_calls:  # the keywords reach the graph
        assert list(n.kwargs["mrope_section"]) == mrope_section
        assert n.kwargs.get("mrope_interleaved", False) == mrope_interleaved


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("mrope_section,mrope_interleaved", MROPE, ids=["sections", "il3"])
def test_compile_multi_axis_backward_and_dynamic_shapes(mrope_section, mrope_interleaved, device):
    torch._dynamo.reset()
    module = _MultiAxisRope(mrope_section, mrope_interleaved).to(device)
    compiled = torch.compile(module, backend="aot_eager", fullgraph=True, dynamic=True)
    for seq in (5, 11):
        q = torch.randn(2, seq, 4, 24, device=device, requires_grad=True)
        k = torch.randn(2, seq, 2, 24, device=device, requires_grad=True)
        positions = torch.randint(0, 64, (2, seq, 1, 3), device=device)
        q_e, k_e = (t.detach().clone().requires_grad_() for t in (q, k))
        got, want = compiled(q, k, positions), module(q_e, k_e, positions)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        sum(t.square().sum() for t in got).backward()
        sum(t.square().sum() for t in want).backward()
        torch.testing.assert_close(q.grad, q_e.grad, rtol=0, atol=0)
        torch.testing.assert_close(k.grad, k_e.grad, rtol=0, atol=0)
