"""torch.library.opcheck on every op, and torch.compile(fullgraph=True) of models using them."""

import pytest
import torch

import torch_rope
from blocks import AttentionBlock
from helpers import cpu_and_cuda, make_tables, needs_cuda, randn


def sample_inputs(device, requires_grad):
    """(op, args, kwargs) samples covering layouts, dtypes, strides, positions shapes."""
    cos, sin = make_tables(32, 16, device)
    cos64, sin64 = make_tables(32, 24, device, torch.float64)

    def x(*shape, dtype=torch.float32, view=None):
        t = randn(*shape, dtype=dtype, device=device)
        if view is not None:
            t = view(t)
        if requires_grad:
            t = t.detach().requires_grad_()
        return t

    def mutable(t):
        # apply_ mutates x: autograd forbids that on a leaf which requires grad, so hand it a
        # non-leaf (as a model would) when gradients are on.
        return t.clone() if requires_grad else t

    s = lambda n: torch.arange(n, device=device)  # noqa: E731
    samples = []
    as_is = lambda t: t  # noqa: E731
    for op, op_x in ((torch.ops.rope.apply.default, as_is),
                     (torch.ops.rope.apply_.default, mutable)):
        samples += [
            (op, (op_x(x(2, 3, 5, 16)), cos, sin, s(5)), {}),
            (op, (op_x(x(2, 5, 3, 24)), cos, sin, s(5).view(5, 1).int()),
             {"interleaved": False, "inverse": True}),
            (op, (op_x(x(2, 5, 48, view=lambda t: t[..., 8:32])), cos, sin, 7 + s(5)),
             {"interleaved": False}),
            (op, (op_x(x(6, 2, 24, dtype=torch.float64)), cos64, sin64,
                  torch.tensor([0, 1, 2, 0, 1, 31], device=device).view(6, 1)), {}),
            (op, (op_x(x(2, 4, 16, dtype=torch.bfloat16)), cos, sin,
                  torch.tensor([[3], [9]], device=device)), {"inverse": True}),
            (op, (op_x(x(3, 16, 4, view=lambda t: t.transpose(-1, -2))), cos, sin, s(4)),
             {"interleaved": False}),
        ]
    qk = torch.ops.rope.apply_qk.default
    samples += [
        (qk, (x(2, 8, 5, 16), x(2, 2, 5, 16), cos, sin, s(5)), {}),
        (qk, (x(2, 5, 4, 24), x(2, 5, 1, 24), cos, sin, s(5).view(5, 1)),
         {"interleaved": False}),
        (qk, (x(3, 4, 16, dtype=torch.float16), x(3, 2, 16, dtype=torch.float16), cos, sin,
              s(3).view(3, 1)), {"inverse": True}),
    ]
    return samples


SAMPLE_IDS = [
    f"{op._schema.name.split('::')[1]}-{i}"
    for i, (op, _, _) in enumerate(sample_inputs("cpu", False))
]


def test_samples_cover_every_op():
    ops = {op for op, _, _ in sample_inputs("cpu", True)}
    assert ops == {torch.ops.rope.apply.default, torch.ops.rope.apply_.default,
                   torch.ops.rope.apply_qk.default}


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("requires_grad", [False, True], ids=["no_grad", "requires_grad"])
@pytest.mark.parametrize("index", range(len(SAMPLE_IDS)), ids=SAMPLE_IDS)
def test_opcheck(index, requires_grad, device):
    op, args, kwargs = sample_inputs(device, requires_grad)[index]
    torch.library.opcheck(op, args, kwargs)


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
        torch.testing.assert_close(compiled(x, positions), block(x, positions),
                                   rtol=tol, atol=tol)


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_compile_backward_and_dynamic_shapes(device):
    # aot_eager traces forward and backward through the fake kernels and autograd formula
    # without paying for code generation; two sequence lengths exercise symbolic shapes.
    torch._dynamo.reset()
    rope = torch_rope.RotaryPositionalEmbedding(10000.0, 16, 64, interleaved=False,
                                                device=device)
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
            positions = (step + torch.arange(9, device="cuda"))
            got = compiled(x, positions).clone()
            torch.testing.assert_close(got, block(x, positions), rtol=1e-5, atol=1e-5)
