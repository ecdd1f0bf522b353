# SPDX-License-Identifier: BSD-3-Clause
"""torch.func through the torch_rope API and module (grad, vjp, jvp, vmap and compositions), the
raw ops' vmap rule and their clear refusal of grad/jvp, and plain forward-mode AD
(torch.autograd.forward_ad) on the raw ops. Expected values come from the float64 oracle and
from RoPE's structure (a rotation: its Jacobian is the rotation matrix, its transpose undoes it)."""

import warnings

import pytest
import references as ref
import torch
import torch.autograd.forward_ad as fwAD
from helpers import LAYOUT_IDS, LAYOUTS, cpu_and_cuda, expected, make_tables, needs_torch
from torch.func import grad, jacfwd, jacrev, jvp, vjp, vmap

import torch_rope

MAX_SEQ_LEN, HEAD_DIM, ROTARY_DIM = 32, 10, 6
TOL = dict(rtol=1e-12, atol=1e-12)


def tables(device):
    return make_tables(MAX_SEQ_LEN, ROTARY_DIM, device, torch.float64)


def rand(*shape, device="cpu"):
    return torch.randn(*shape, dtype=torch.float64, device=device)


def rotate_ref(x, positions, *, interleaved, inverse=False):
    return expected(x, positions, ROTARY_DIM, interleaved=interleaved, inverse=inverse).to(x.device)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
def test_grad_vjp_jvp_of_apply(interleaved, device):
    cos, sin = tables(device)
    x, g, t = (rand(3, 4, HEAD_DIM, device=device) for _ in range(3))
    positions = torch.randint(0, MAX_SEQ_LEN, (4,), device=device)

    def f(x):
        return torch_rope.apply(x, cos, sin, positions, interleaved=interleaved)

    # grad of <f(x), g> is R^T g: the inverse rotation of g.
    got = grad(lambda x: (f(x) * g).sum())(x)
    torch.testing.assert_close(
        got, rotate_ref(g, positions, interleaved=interleaved, inverse=True), **TOL
    )
    out, pullback = vjp(f, x)
    torch.testing.assert_close(out, rotate_ref(x, positions, interleaved=interleaved), **TOL)
    torch.testing.assert_close(pullback(g)[0], got, **TOL)
    # jvp: linear in x, so the tangent is the same rotation of the tangent.
    out, tangent = jvp(f, (x,), (t,))
    torch.testing.assert_close(tangent, rotate_ref(t, positions, interleaved=interleaved), **TOL)


@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
def test_jacobian_is_the_rotation_matrix(interleaved):
    cos, sin = tables("cpu")
    x = rand(HEAD_DIM)
    position = torch.tensor(13)

    def f(x):
        return torch_rope.apply(x, cos, sin, position, interleaved=interleaved)

    angle = ref.angles(position, (), ROTARY_DIM)
    want = ref.rope_matrix(angle, HEAD_DIM, interleaved=interleaved)
    torch.testing.assert_close(jacrev(f)(x), want, **TOL)
    torch.testing.assert_close(jacfwd(f)(x), want, **TOL)
    # Compositions: the Hessian of |R x|^2 is 2 R^T R = 2 I.
    hess = jacfwd(jacrev(lambda x: (f(x) ** 2).sum()))(x)
    torch.testing.assert_close(hess, 2 * torch.eye(HEAD_DIM, dtype=torch.float64), **TOL)


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_apply_qk_under_grad_and_jvp_gqa(device):
    cos, sin = tables(device)
    q, k = rand(2, 4, 5, HEAD_DIM, device=device), rand(2, 2, 5, HEAD_DIM, device=device)
    gq, gk = rand(*q.shape, device=device), rand(*k.shape, device=device)
    positions = torch.randint(0, MAX_SEQ_LEN, (5,), device=device)

    def f(q, k):
        return torch_rope.apply_qk(q, k, cos, sin, positions, interleaved=False)

    dq, dk = grad(
        lambda q, k: sum((o * g).sum() for o, g in zip(f(q, k), (gq, gk))), argnums=(0, 1)
    )(q, k)
    torch.testing.assert_close(
        dq, rotate_ref(gq, positions, interleaved=False, inverse=True), **TOL
    )
    torch.testing.assert_close(
        dk, rotate_ref(gk, positions, interleaved=False, inverse=True), **TOL
    )
    _, (tq, tk) = jvp(f, (q, k), (gq, gk))
    torch.testing.assert_close(tq, rotate_ref(gq, positions, interleaved=False), **TOL)
    torch.testing.assert_close(tk, rotate_ref(gk, positions, interleaved=False), **TOL)


def test_apply_inplace_under_grad_and_jvp():
    cos, sin = tables("cpu")
    x, g, t = rand(3, HEAD_DIM), rand(3, HEAD_DIM), rand(3, HEAD_DIM)
    positions = torch.tensor([0, 7, 31])

    def f(x):
        y = x * 1.0  # in place on a non-leaf, as a model would
        return torch_rope.apply_(y, cos, sin, positions)

    got = grad(lambda x: (f(x) * g).sum())(x)
    torch.testing.assert_close(got, rotate_ref(g, positions, interleaved=True, inverse=True), **TOL)
    out, tangent = jvp(f, (x,), (t,))
    torch.testing.assert_close(out, rotate_ref(x, positions, interleaved=True), **TOL)
    torch.testing.assert_close(tangent, rotate_ref(t, positions, interleaved=True), **TOL)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("batched", ["x", "positions", "both"])
def test_vmap_of_the_api(batched, device):
    cos, sin = tables(device)
    x = rand(5, 3, 4, HEAD_DIM, device=device)  # a batch of 5 (3, 4, D) inputs
    positions = torch.randint(0, MAX_SEQ_LEN, (5, 4), device=device)
    in_dims = {"x": (0, None), "positions": (None, 0), "both": (0, 0)}[batched]
    xs = x if in_dims[0] == 0 else x[0]
    ps = positions if in_dims[1] == 0 else positions[0]

    got = vmap(lambda x, p: torch_rope.apply(x, cos, sin, p), in_dims=in_dims)(xs, ps)
    for i in range(5):
        xi = xs[i] if in_dims[0] == 0 else xs
        pi = ps[i] if in_dims[1] == 0 else ps
        torch.testing.assert_close(got[i], rotate_ref(xi, pi, interleaved=True), **TOL)


def test_vmap_of_grad_per_example():
    # Per-example gradients: vmap(grad(...)), the canonical composition.
    cos, sin = tables("cpu")
    x, g = rand(6, 4, HEAD_DIM), rand(6, 4, HEAD_DIM)
    positions = torch.randint(0, MAX_SEQ_LEN, (6, 4))

    def loss(x, g, p):
        return (torch_rope.apply(x, cos, sin, p) * g).sum()

    got = vmap(grad(loss))(x, g, positions)
    for i in range(6):
        torch.testing.assert_close(
            got[i], rotate_ref(g[i], positions[i], interleaved=True, inverse=True), **TOL
        )


def test_module_under_torch_func():
    rope = torch_rope.RotaryPositionalEmbedding(
        10000.0, HEAD_DIM, MAX_SEQ_LEN, rotary_dim=ROTARY_DIM
    )
    x, g = torch.randn(2, 5, HEAD_DIM), torch.randn(2, 5, HEAD_DIM)
    positions = torch.arange(5)
    got = grad(lambda x: (torch.func.functional_call(rope, {}, (x, positions)) * g).sum())(x)
    want = expected(g, positions, ROTARY_DIM, interleaved=True, inverse=True).float()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    per_example = vmap(rope, in_dims=(0, None))(torch.randn(3, 2, 5, HEAD_DIM), positions)
    assert per_example.shape == (3, 2, 5, HEAD_DIM)


# ---- the raw ops -----------------------------------------------------------------------------


@needs_torch("2.5", "torch.library.register_vmap")
@pytest.mark.parametrize("op", ["apply", "apply_", "apply_qk"])
def test_raw_ops_vmap_without_fallback_warning(op):
    cos, sin = tables("cpu")
    x = rand(4, 3, HEAD_DIM)
    positions = torch.randint(0, MAX_SEQ_LEN, (4, 3))

    def f(x, p):
        if op == "apply":
            return torch.ops.rope.apply(x, cos, sin, p)
        if op == "apply_":
            y = x.clone()
            torch.ops.rope.apply_(y, cos, sin, p)
            return y
        return torch.ops.rope.apply_qk(x, 2 * x, cos, sin, p)[0]

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the slow fallback warns; the rule must not
        got = vmap(f)(x, positions)
    for i in range(4):
        torch.testing.assert_close(got[i], rotate_ref(x[i], positions[i], interleaved=True), **TOL)


@pytest.mark.parametrize("transform", ["grad", "jvp", "jacrev"])
@pytest.mark.parametrize("op", ["apply", "apply_", "apply_qk"])
def test_raw_ops_refuse_grad_and_jvp_clearly(op, transform):
    cos, sin = tables("cpu")
    positions = torch.arange(3)

    def f(x):
        if op == "apply":
            return torch.ops.rope.apply(x, cos, sin, positions)
        if op == "apply_":
            y = x * 1.0
            torch.ops.rope.apply_(y, cos, sin, positions)
            return y
        return torch.ops.rope.apply_qk(x, x, cos, sin, positions)[0]

    x = rand(3, HEAD_DIM)
    pattern = (
        rf"rope\.{op}: torch\.ops\.rope\.\* cannot be differentiated by torch\.func .*"
        rf"call torch_rope\.{op}"
    )
    with pytest.raises(RuntimeError, match=pattern):
        if transform == "grad":
            grad(lambda x: f(x).sum())(x)
        elif transform == "jvp":
            jvp(f, (x,), (x,))
        else:
            jacrev(f)(x)


@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
def test_raw_ops_forward_mode_ad(interleaved):
    # torch.autograd.forward_ad (not functorch) on the raw ops: the tangent is rotated too.
    cos, sin = tables("cpu")
    x, t, t2 = rand(2, 5, HEAD_DIM), rand(2, 5, HEAD_DIM), rand(2, 5, HEAD_DIM)
    positions = torch.randint(0, MAX_SEQ_LEN, (5,))
    kw = dict(interleaved=interleaved)
    with fwAD.dual_level():
        dual = fwAD.make_dual(x, t)
        out = torch.ops.rope.apply(dual, cos, sin, positions, **kw)
        torch.testing.assert_close(
            fwAD.unpack_dual(out).tangent, rotate_ref(t, positions, **kw), **TOL
        )
        q, k = torch.ops.rope.apply_qk(
            dual, fwAD.make_dual(x[:1], t2[:1]), cos, sin, positions, **kw
        )
        torch.testing.assert_close(
            fwAD.unpack_dual(q).tangent, rotate_ref(t, positions, **kw), **TOL
        )
        torch.testing.assert_close(
            fwAD.unpack_dual(k).tangent, rotate_ref(t2[:1], positions, **kw), **TOL
        )
        inplace = fwAD.make_dual(x.clone(), t.clone())
        torch.ops.rope.apply_(inplace, cos, sin, positions, **kw)
        primal, tangent = fwAD.unpack_dual(inplace)
        torch.testing.assert_close(primal, rotate_ref(x, positions, **kw), **TOL)
        torch.testing.assert_close(tangent, rotate_ref(t, positions, **kw), **TOL)


def test_forward_and_reverse_mode_together():
    # A dual input that also requires grad: the tangent and the gradient are both right.
    cos, sin = tables("cpu")
    x = rand(3, HEAD_DIM).requires_grad_()
    t, g = rand(3, HEAD_DIM), rand(3, HEAD_DIM)
    positions = torch.tensor([1, 2, 30])
    with fwAD.dual_level():
        out = torch.ops.rope.apply(fwAD.make_dual(x, t), cos, sin, positions)
        tangent = fwAD.unpack_dual(out).tangent
        (out * g).sum().backward()
    torch.testing.assert_close(tangent, rotate_ref(t, positions, interleaved=True), **TOL)
    torch.testing.assert_close(
        x.grad, rotate_ref(g, positions, interleaved=True, inverse=True), **TOL
    )


# ---- multi-axis positions (mrope_section) ------------------------------------------------------
# rotary_dim 8 (4 planes) out of HEAD_DIM: a contiguous and an interleaved section that send the
# planes to different axes ([0, 1, 1, 2] and [0, 1, 2, 0]), so a dropped or flipped flag shows.
MROPE_ROTARY_DIM = 8
MROPE = [
    pytest.param(dict(mrope_section=[1, 2, 1], mrope_interleaved=False), id="sections"),
    pytest.param(dict(mrope_section=[2, 1, 1], mrope_interleaved=True), id="interleaved3"),
]


def mrope_tables(device):
    return make_tables(MAX_SEQ_LEN, MROPE_ROTARY_DIM, device, torch.float64)


def mrope_ref(x, positions, mrope, *, interleaved=True, inverse=False, **_):
    return expected(
        x, positions, MROPE_ROTARY_DIM, interleaved=interleaved, inverse=inverse, **mrope
    ).to(x.device)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("mrope", MROPE)
@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
def test_grad_vjp_jvp_of_apply_multi_axis(interleaved, mrope, device):
    cos, sin = mrope_tables(device)
    x, g, t = (rand(3, 4, HEAD_DIM, device=device) for _ in range(3))
    positions = torch.randint(0, MAX_SEQ_LEN, (4, 3), device=device)  # (S, A)
    kw = dict(interleaved=interleaved, **mrope)

    def f(x):
        return torch_rope.apply(x, cos, sin, positions, **kw)

    got = grad(lambda x: (f(x) * g).sum())(x)
    torch.testing.assert_close(got, mrope_ref(g, positions, mrope, **kw, inverse=True), **TOL)
    out, pullback = vjp(f, x)
    torch.testing.assert_close(out, mrope_ref(x, positions, mrope, **kw), **TOL)
    torch.testing.assert_close(pullback(g)[0], got, **TOL)
    out, tangent = jvp(f, (x,), (t,))
    torch.testing.assert_close(tangent, mrope_ref(t, positions, mrope, **kw), **TOL)


@pytest.mark.parametrize("mrope", MROPE)
def test_jacobian_is_the_per_axis_rotation_matrix(mrope):
    # One row at (t, h, w) = (13, 2, 29): plane k turns by the position of its own axis.
    cos, sin = mrope_tables("cpu")
    x = rand(HEAD_DIM)
    position = torch.tensor([13, 2, 29])

    def f(x):
        return torch_rope.apply(x, cos, sin, position, **mrope)

    axis = ref.mrope_axis_of_plane(mrope["mrope_section"], mrope["mrope_interleaved"])
    angle = position[axis].double() * ref.inv_freq(MROPE_ROTARY_DIM)
    want = ref.rope_matrix(angle, HEAD_DIM, interleaved=True)
    torch.testing.assert_close(jacrev(f)(x), want, **TOL)
    torch.testing.assert_close(jacfwd(f)(x), want, **TOL)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("mrope", MROPE)
def test_apply_qk_and_apply_inplace_multi_axis_under_grad_and_jvp(mrope, device):
    cos, sin = mrope_tables(device)
    q, k = rand(2, 4, 5, HEAD_DIM, device=device), rand(2, 2, 5, HEAD_DIM, device=device)
    gq, gk = rand(*q.shape, device=device), rand(*k.shape, device=device)
    positions = torch.randint(0, MAX_SEQ_LEN, (2, 1, 5, 3), device=device)  # (B, 1, S, A)
    kw = dict(interleaved=False, **mrope)

    def f(q, k):
        return torch_rope.apply_qk(q, k, cos, sin, positions, **kw)

    dq, dk = grad(
        lambda q, k: sum((o * g).sum() for o, g in zip(f(q, k), (gq, gk))), argnums=(0, 1)
    )(q, k)
    torch.testing.assert_close(dq, mrope_ref(gq, positions, mrope, **kw, inverse=True), **TOL)
    torch.testing.assert_close(dk, mrope_ref(gk, positions, mrope, **kw, inverse=True), **TOL)
    _, (tq, tk) = jvp(f, (q, k), (gq, gk))
    torch.testing.assert_close(tq, mrope_ref(gq, positions, mrope, **kw), **TOL)
    torch.testing.assert_close(tk, mrope_ref(gk, positions, mrope, **kw), **TOL)

    def g_inplace(x):
        return torch_rope.apply_(x * 1.0, cos, sin, positions, **kw)

    got = grad(lambda x: (g_inplace(x) * gq).sum())(q)
    torch.testing.assert_close(got, mrope_ref(gq, positions, mrope, **kw, inverse=True), **TOL)
    out, tangent = jvp(g_inplace, (q,), (gq,))
    torch.testing.assert_close(out, mrope_ref(q, positions, mrope, **kw), **TOL)
    torch.testing.assert_close(tangent, mrope_ref(gq, positions, mrope, **kw), **TOL)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("mrope", MROPE)
@pytest.mark.parametrize(
    "batched,pos_bdim",
    [("x", None), ("positions", 0), ("both", 0), ("both", 1), ("positions", 2)],
    ids=["x", "positions", "both", "both_bdim1", "positions_bdim2"],
)
def test_vmap_of_the_api_multi_axis(batched, pos_bdim, mrope, device):
    # A batch of 5 (3, 4, D) inputs with (4, A) positions each; the batch dim of positions is
    # anywhere but the axis dim, which stays last.
    cos, sin = mrope_tables(device)
    x = rand(5, 3, 4, HEAD_DIM, device=device)
    positions = torch.randint(0, MAX_SEQ_LEN, (5, 4, 3), device=device)
    xs = x if batched in ("x", "both") else x[0]
    ps = positions[0] if pos_bdim is None else positions.movedim(0, pos_bdim)
    in_dims = (0 if batched in ("x", "both") else None, pos_bdim)

    got = vmap(lambda x, p: torch_rope.apply(x, cos, sin, p, **mrope), in_dims=in_dims)(xs, ps)
    assert got.shape == (5, 3, 4, HEAD_DIM)
    for i in range(5):
        xi = x[i] if in_dims[0] == 0 else xs
        pi = positions[i] if pos_bdim is not None else ps
        torch.testing.assert_close(got[i], mrope_ref(xi, pi, mrope), **TOL)


@pytest.mark.parametrize("mrope", MROPE)
def test_vmap_of_grad_per_example_multi_axis(mrope):
    cos, sin = mrope_tables("cpu")
    x, g = rand(6, 4, HEAD_DIM), rand(6, 4, HEAD_DIM)
    positions = torch.randint(0, MAX_SEQ_LEN, (6, 4, 3))

    def loss(x, g, p):
        return (torch_rope.apply(x, cos, sin, p, **mrope) * g).sum()

    got = vmap(grad(loss))(x, g, positions)
    for i in range(6):
        want = mrope_ref(g[i], positions[i], mrope, inverse=True)
        torch.testing.assert_close(got[i], want, **TOL)


@needs_torch("2.5", "torch.library.register_vmap")
@pytest.mark.parametrize("mrope", MROPE)
@pytest.mark.parametrize("op", ["apply", "apply_", "apply_qk"])
def test_raw_ops_vmap_multi_axis_without_fallback_warning(op, mrope):
    cos, sin = mrope_tables("cpu")
    x = rand(4, 2, 3, HEAD_DIM)
    positions = torch.randint(0, MAX_SEQ_LEN, (4, 3, 3))  # per example (S, A) for (H, S, D)

    def f(x, p):
        if op == "apply":
            return torch.ops.rope.apply(x, cos, sin, p, **mrope)
        if op == "apply_":
            y = x.clone()
            torch.ops.rope.apply_(y, cos, sin, p, **mrope)
            return y
        return torch.ops.rope.apply_qk(x, 2 * x[:1], cos, sin, p, **mrope)[0]

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = vmap(f)(x, positions)
        # positions batched on a middle dim (the axis dim stays last)
        got_p = vmap(f, in_dims=(0, 1))(x, positions.movedim(0, 1))
    for i in range(4):
        torch.testing.assert_close(got[i], mrope_ref(x[i], positions[i], mrope), **TOL)
        torch.testing.assert_close(got_p[i], mrope_ref(x[i], positions[i], mrope), **TOL)


@pytest.mark.parametrize("mrope", MROPE)
@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
def test_raw_ops_forward_mode_ad_multi_axis(interleaved, mrope):
    cos, sin = mrope_tables("cpu")
    x, t, t2 = rand(2, 5, HEAD_DIM), rand(2, 5, HEAD_DIM), rand(2, 5, HEAD_DIM)
    positions = torch.randint(0, MAX_SEQ_LEN, (5, 3))
    kw = dict(interleaved=interleaved, **mrope)
    with fwAD.dual_level():
        dual = fwAD.make_dual(x, t)
        out = torch.ops.rope.apply(dual, cos, sin, positions, **kw)
        torch.testing.assert_close(
            fwAD.unpack_dual(out).tangent, mrope_ref(t, positions, mrope, **kw), **TOL
        )
        q, k = torch.ops.rope.apply_qk(
            dual, fwAD.make_dual(x[:1], t2[:1]), cos, sin, positions, **kw
        )
        torch.testing.assert_close(
            fwAD.unpack_dual(q).tangent, mrope_ref(t, positions, mrope, **kw), **TOL
        )
        torch.testing.assert_close(
            fwAD.unpack_dual(k).tangent, mrope_ref(t2[:1], positions, mrope, **kw), **TOL
        )
        inplace = fwAD.make_dual(x.clone(), t.clone())
        torch.ops.rope.apply_(inplace, cos, sin, positions, **kw)
        primal, tangent = fwAD.unpack_dual(inplace)
        torch.testing.assert_close(primal, mrope_ref(x, positions, mrope, **kw), **TOL)
        torch.testing.assert_close(tangent, mrope_ref(t, positions, mrope, **kw), **TOL)
