# SPDX-License-Identifier: BSD-3-Clause
"""Autograd rules: gradients against the differentiated oracle on full-size inputs, undefined and
expanded gradients, what is not differentiable, and the in-place rules (leaves, version counters,
saved tensors). gradcheck / gradgradcheck of every op run over samples.sample_inputs
(test_samples.py)."""

import pytest
import references as ref
import torch
from helpers import (
    FLOAT_DTYPES,
    LAYOUT_IDS,
    LAYOUTS,
    TOLERANCES,
    cpu_and_cuda,
    dtype_id,
    make_tables,
    randn,
    table_dtype_for,
)

import torch_rope

MAX_SEQ_LEN = 16


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("inverse", [False, True], ids=["forward", "inverse"])
@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
def test_gradient_matches_differentiated_oracle(dtype, interleaved, inverse, device):
    # head_dim 80 with partial rotary: the vector paths and a pass-through tail, in every dtype
    # (the gradient keeps x's dtype and is rounded to it once).
    rotary_dim = 48
    cos, sin = make_tables(64, rotary_dim, device, table_dtype_for(dtype))
    x = randn(2, 3, 7, 80, dtype=dtype, device=device).requires_grad_()
    positions = torch.randint(0, 64, (2, 1, 7), device=device)
    weight = randn(2, 3, 7, 80, dtype=dtype, device=device)

    out = torch_rope.apply(x, cos, sin, positions, interleaved=interleaved, inverse=inverse)
    (out * weight).sum().backward()

    x_ref = x.detach().cpu().double().requires_grad_()
    ang = ref.angles(positions, x.shape[:-1], rotary_dim)
    want = ref.rope(x_ref, ang, interleaved=interleaved, inverse=inverse)
    (want * weight.cpu().double()).sum().backward()

    assert x.grad.dtype == dtype
    torch.testing.assert_close(x.grad.cpu(), x_ref.grad.to(dtype), **TOLERANCES[dtype])


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
def test_backward_with_expanded_grad_output(interleaved, device):
    # out.sum() hands backward an all-stride-0 gradient.
    cos, sin = make_tables(MAX_SEQ_LEN, 16, device, torch.float64)
    x = randn(3, 5, 16, dtype=torch.float64, device=device).requires_grad_()
    positions = torch.randint(0, MAX_SEQ_LEN, (5,), device=device)
    torch_rope.apply(x, cos, sin, positions, interleaved=interleaved).sum().backward()
    ones = torch.ones(3, 5, 16, dtype=torch.float64)
    want = ref.rope(ones, ref.angles(positions, (3, 5), 16), interleaved=interleaved, inverse=True)
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
def test_apply_qk_with_only_q_requiring_grad(device):
    cos, sin = make_tables(MAX_SEQ_LEN, 16, device, torch.float64)
    q = randn(2, 4, 5, 16, dtype=torch.float64, device=device).requires_grad_()
    k = randn(2, 2, 5, 16, dtype=torch.float64, device=device)
    positions = torch.randint(0, MAX_SEQ_LEN, (5,), device=device)
    q_out, k_out = torch_rope.apply_qk(q, k, cos, sin, positions)
    assert q_out.requires_grad and not k_out.requires_grad
    (q_out.sum() + k_out.sum()).backward()
    ones = torch.ones(2, 4, 5, 16, dtype=torch.float64)
    want = ref.rope(ones, ref.angles(positions, (2, 4, 5), 16), interleaved=True, inverse=True)
    torch.testing.assert_close(q.grad.cpu(), want, rtol=1e-12, atol=1e-12)
    assert k.grad is None


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
    want = 3.0 * ref.rope(weight, ref.angles(positions, (3,), 16), interleaved=False, inverse=True)
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


# ---- multi-axis positions (mrope_section) ------------------------------------------------------

MROPE = [
    pytest.param(dict(mrope_section=[6, 10, 8], mrope_interleaved=False), id="sections"),
    pytest.param(dict(mrope_section=[8, 8, 8], mrope_interleaved=True), id="interleaved3"),
]


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("mrope", MROPE)
@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
def test_multi_axis_gradient_matches_differentiated_oracle(dtype, interleaved, mrope, device):
    # (B, S, H, D) with (B, S, 1, 3) positions, partial rotary (48 of 80), every dtype.
    rotary_dim = 48
    cos, sin = make_tables(64, rotary_dim, device, table_dtype_for(dtype))
    x = randn(2, 7, 3, 80, dtype=dtype, device=device).requires_grad_()
    positions = torch.randint(0, 64, (2, 7, 1, 3), device=device)
    weight = randn(2, 7, 3, 80, dtype=dtype, device=device)
    kw = dict(interleaved=interleaved, **mrope)

    out = torch_rope.apply(x, cos, sin, positions, **kw)
    (out * weight).sum().backward()

    x_ref = x.detach().cpu().double().requires_grad_()
    ang = ref.angles(positions, x.shape[:-1], rotary_dim, **mrope)
    want = ref.rope(x_ref, ang, interleaved=interleaved)
    (want * weight.cpu().double()).sum().backward()

    assert x.grad.dtype == dtype
    torch.testing.assert_close(x.grad.cpu(), x_ref.grad.to(dtype), **TOLERANCES[dtype])


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("mrope", MROPE)
def test_multi_axis_double_backward_and_qk(mrope, device):
    # grad_x <f(x), g> = R^T g, so d/dg <R^T g, h> = R h: the backward of the backward is the
    # forward rotation, for both outputs of apply_qk (GQA) with multi-axis positions.
    rotary_dim = 48
    cos, sin = make_tables(64, rotary_dim, device, torch.float64)
    q = randn(2, 4, 5, 64, dtype=torch.float64, device=device).requires_grad_()
    k = randn(2, 2, 5, 64, dtype=torch.float64, device=device).requires_grad_()
    positions = torch.randint(0, 64, (2, 1, 5, 3), device=device)
    gq = randn(2, 4, 5, 64, dtype=torch.float64, device=device).requires_grad_()
    gk = randn(2, 2, 5, 64, dtype=torch.float64, device=device).requires_grad_()
    hq, hk = torch.randn_like(q), torch.randn_like(k)
    oq, ok = torch_rope.apply_qk(q, k, cos, sin, positions, interleaved=False, **mrope)
    dq, dk = torch.autograd.grad((oq, ok), (q, k), (gq, gk), create_graph=True)
    ddq, ddk = torch.autograd.grad((dq * hq).sum() + (dk * hk).sum(), (gq, gk))
    for dd, h in ((ddq, hq), (ddk, hk)):
        ang = ref.angles(positions, h.shape[:-1], rotary_dim, **mrope)
        want = ref.rope(h, ang, interleaved=False)
        torch.testing.assert_close(dd.cpu(), want, rtol=1e-12, atol=1e-12)
