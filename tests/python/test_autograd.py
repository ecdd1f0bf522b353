"""Autograd: gradcheck / gradgradcheck of all three ops, gradients against the differentiated
oracle, and the in-place rules (leaves, version counters)."""

import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck

import references as ref
import torch_rope
from helpers import cpu_and_cuda, make_tables, randn

LAYOUTS = [True, False]
LAYOUT_IDS = ["interleaved", "half_split"]
MAX_SEQ_LEN = 16


def tables_for(kind, rotary_dim, device):
    """float64 tables: real cos/sin, or random values (every plane, hence both halves of a
    rotate_half layout, differs; rows are not unit-norm, so only the true transpose passes)."""
    if kind == "real":
        return make_tables(MAX_SEQ_LEN, rotary_dim, device, torch.float64)
    g = torch.Generator().manual_seed(1234)
    shape = (MAX_SEQ_LEN, rotary_dim // 2)
    cos = torch.randn(shape, generator=g, dtype=torch.float64)
    sin = torch.randn(shape, generator=g, dtype=torch.float64)
    return cos.to(device), sin.to(device)


GRAD_CASES = [
    pytest.param(interleaved, head_dim, rotary_dim, tables, inverse,
                 id=f"{'il' if interleaved else 'half'}-d{head_dim}-r{rotary_dim}-{tables}"
                 f"{'-inverse' if inverse else ''}")
    for interleaved in LAYOUTS
    for head_dim, rotary_dim in [(8, 8), (10, 6)]
    for tables in ("real", "random")
    for inverse in (False, True)
    if not (inverse and tables == "real")
]


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("interleaved,head_dim,rotary_dim,tables,inverse", GRAD_CASES)
def test_gradcheck_apply(interleaved, head_dim, rotary_dim, tables, inverse, device):
    cos, sin = tables_for(tables, rotary_dim, device)
    x = torch.randn(2, 5, head_dim, dtype=torch.float64, device=device, requires_grad=True)
    positions = torch.randint(0, MAX_SEQ_LEN, (5,), device=device)

    def f(x):
        return torch_rope.apply(x, cos, sin, positions, interleaved=interleaved, inverse=inverse)

    assert gradcheck(f, (x,))
    assert gradgradcheck(f, (x,))


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("interleaved,head_dim,rotary_dim,tables,inverse", GRAD_CASES)
def test_gradcheck_apply_inplace_on_non_leaf(interleaved, head_dim, rotary_dim, tables, inverse,
                                            device):
    cos, sin = tables_for(tables, rotary_dim, device)
    x = torch.randn(5, 2, head_dim, dtype=torch.float64, device=device, requires_grad=True)
    positions = torch.randint(0, MAX_SEQ_LEN, (5, 1), device=device)

    def f(x):
        y = x.clone()  # a non-leaf, so in-place is allowed
        return torch_rope.apply_(y, cos, sin, positions, interleaved=interleaved, inverse=inverse)

    assert gradcheck(f, (x,))
    assert gradgradcheck(f, (x,))


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("interleaved,head_dim,rotary_dim,tables,inverse", GRAD_CASES)
def test_gradcheck_apply_qk(interleaved, head_dim, rotary_dim, tables, inverse, device):
    cos, sin = tables_for(tables, rotary_dim, device)
    q = torch.randn(1, 4, 3, head_dim, dtype=torch.float64, device=device, requires_grad=True)
    k = torch.randn(1, 2, 3, head_dim, dtype=torch.float64, device=device, requires_grad=True)
    positions = torch.randint(0, MAX_SEQ_LEN, (3,), device=device)

    def f(q, k):
        return torch_rope.apply_qk(q, k, cos, sin, positions, interleaved=interleaved,
                                   inverse=inverse)

    assert gradcheck(f, (q, k))
    assert gradgradcheck(f, (q, k))


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("inverse", [False, True], ids=["forward", "inverse"])
@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_gradient_matches_differentiated_oracle(dtype, interleaved, inverse, device):
    rotary_dim = 48
    tab_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    cos, sin = make_tables(64, rotary_dim, device, tab_dtype)
    x = randn(2, 3, 7, 80, dtype=dtype, device=device).requires_grad_()
    positions = torch.randint(0, 64, (2, 1, 7), device=device)
    weight = randn(2, 3, 7, 80, dtype=dtype, device=device)

    out = torch_rope.apply(x, cos, sin, positions, interleaved=interleaved, inverse=inverse)
    (out * weight).sum().backward()

    x_ref = x.detach().cpu().double().requires_grad_()
    ang = ref.angles(positions, x.shape[:-1], rotary_dim)
    want = ref.rope(x_ref, ang, interleaved=interleaved, inverse=inverse)
    (want * weight.cpu().double()).sum().backward()

    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(x.grad.cpu(), x_ref.grad.to(dtype), rtol=tol, atol=tol)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
def test_backward_with_expanded_grad_output(interleaved, device):
    # out.sum() hands backward an all-stride-0 gradient.
    cos, sin = make_tables(MAX_SEQ_LEN, 16, device, torch.float64)
    x = randn(3, 5, 16, dtype=torch.float64, device=device).requires_grad_()
    positions = torch.randint(0, MAX_SEQ_LEN, (5,), device=device)
    torch_rope.apply(x, cos, sin, positions, interleaved=interleaved).sum().backward()
    ones = torch.ones(3, 5, 16, dtype=torch.float64)
    want = ref.rope(ones, ref.angles(positions, (3, 5), 16), interleaved=interleaved,
                    inverse=True)
    torch.testing.assert_close(x.grad.cpu(), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_tables_and_positions_get_no_gradient(device):
    cos, sin = make_tables(MAX_SEQ_LEN, 16, device, torch.float64)
    cos.requires_grad_()
    sin.requires_grad_()
    x = randn(4, 16, dtype=torch.float64, device=device).requires_grad_()
    positions = torch.arange(4, device=device)
    torch_rope.apply(x, cos, sin, positions).sum().backward()
    assert x.grad is not None
    assert cos.grad is None and sin.grad is None


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_apply_qk_with_only_q_used(device):
    cos, sin = make_tables(MAX_SEQ_LEN, 16, device, torch.float64)
    q = randn(2, 4, 16, dtype=torch.float64, device=device).requires_grad_()
    k = randn(1, 4, 16, dtype=torch.float64, device=device).requires_grad_()
    positions = torch.arange(4, device=device)
    q_out, _ = torch_rope.apply_qk(q, k, cos, sin, positions)
    q_out.pow(2).sum().backward()
    # d/dq |Rq|^2 = 2q: rotation preserves the norm.
    torch.testing.assert_close(q.grad, 2 * q.detach(), rtol=1e-12, atol=1e-12)
    assert k.grad is None or torch.count_nonzero(k.grad) == 0


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_inplace_on_leaf_requiring_grad_raises_and_leaves_it(device):
    cos, sin = make_tables(MAX_SEQ_LEN, 16, device)
    x = torch.randn(4, 16, device=device, requires_grad=True)
    before = x.detach().clone()
    with pytest.raises(RuntimeError, match="leaf"):
        torch_rope.apply_(x, cos, sin, torch.arange(4, device=device))
    assert torch.equal(x.detach(), before)


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_inplace_under_no_grad_on_leaf(device):
    cos, sin = make_tables(MAX_SEQ_LEN, 16, device)
    x = torch.randn(4, 16, device=device, requires_grad=True)
    want = torch_rope.apply(x.detach(), cos, sin, torch.arange(4, device=device))
    with torch.no_grad():
        torch_rope.apply_(x, cos, sin, torch.arange(4, device=device))
    assert torch.equal(x.detach(), want)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("grad_mode", [True, False], ids=["grad", "no_grad"])
def test_inplace_invalidates_saved_tensors(grad_mode, device):
    # sin() saves its input; rotating that input in place afterwards must make backward refuse.
    cos, sin = make_tables(MAX_SEQ_LEN, 16, device)
    x = torch.randn(4, 16, device=device, requires_grad=True)
    y = x.clone()
    z = y.sin()
    with torch.set_grad_enabled(grad_mode):
        torch_rope.apply_(y, cos, sin, torch.arange(4, device=device))
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.sum().backward()


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_inplace_gradient_flows_through_history(device):
    cos, sin = make_tables(MAX_SEQ_LEN, 16, device, torch.float64)
    x = randn(3, 16, dtype=torch.float64, device=device).requires_grad_()
    positions = torch.tensor([2, 5, 9], device=device)
    y = x * 3.0
    torch_rope.apply_(y, cos, sin, positions, interleaved=False)
    weight = randn(3, 16, dtype=torch.float64)
    (y * weight.to(device)).sum().backward()
    want = 3.0 * ref.rope(weight, ref.angles(positions, (3,), 16), interleaved=False,
                          inverse=True)
    torch.testing.assert_close(x.grad.cpu(), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_inference_mode(device):
    cos, sin = make_tables(MAX_SEQ_LEN, 16, device)
    positions = torch.arange(4, device=device)
    with torch.inference_mode():
        x = torch.randn(3, 4, 16, device=device)
        out = torch_rope.apply(x, cos, sin, positions)
        q, k = torch_rope.apply_qk(x, x, cos, sin, positions)
        torch_rope.apply_(x, cos, sin, positions)
    assert torch.equal(x, out) and torch.equal(q, out) and torch.equal(k, out)
    assert not out.requires_grad
