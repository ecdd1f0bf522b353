# SPDX-License-Identifier: BSD-3-Clause
"""Multi-process checks of torch_rope under torch.distributed (gloo, CPU), run by
test_distributed.py.

    python distributed_worker.py OUT_DIR [--tier default|slow] [--world-size 2]

The launcher (distributed_launch.py, which imports no torch; or this script without ``--rank``)
starts one child process per rank, all in its own process group, so the test can kill the lot on
a timeout. Every rank runs every check of the tier in the same order (they are collective) and
writes ``OUT_DIR/rank<r>.json``: check name -> "ok", "skip: <why>" or the failure's traceback.
Each check compares the distributed result with the single-process result of the same op/model
on the full tensors, computed in the same process.
"""

import argparse
import copy
import json
import math
import os
import sys
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

CHECKS = {}  # name -> (tier, function(mesh)); insertion order = run order


def check(tier="default"):
    def register(fn):
        CHECKS[fn.__name__] = (tier, fn)
        return fn

    return register


class Skip(Exception):
    """A check that cannot run here (says why); reported as a skip, never as a pass."""


def close(actual, expected, what, **tol):
    torch.testing.assert_close(actual, expected, msg=lambda m: f"{what}: {m}", **tol)


# --- DTensor helpers --------------------------------------------------------------------------


def dt():
    import torch.distributed.tensor as dtensor

    return dtensor


def place(t, mesh, placements):
    """The full tensor ``t`` (same on every rank) as a DTensor with ``placements`` (one per mesh
    dim; a single placement for a 1-D mesh)."""
    d = dt()
    placements = list(placements) if isinstance(placements, (list, tuple)) else [placements]
    plain = [d.Replicate() if p.is_partial() else p for p in placements]
    # distribute_tensor may keep t itself as the local tensor (Replicate): clone, so that in-place
    # ops on the DTensor never touch the caller's full tensor.
    out = d.distribute_tensor(t.clone(), mesh, plain)
    if plain == placements:
        return out
    # A pending reduction whose result is t: rank-dependent pieces that sum (or average) to t.
    local = out.to_local()
    for i, p in enumerate(placements):
        if p.is_partial():
            n, c = mesh.size(i), mesh.get_coordinate()[i]
            weight = (c + 1) / (n * (n + 1) / 2)  # 1..n, normalised to sum to 1
            local = local * (weight if p.reduce_op == "sum" else weight * n)
    return d.DTensor.from_local(
        local, mesh, placements, run_check=False, shape=t.shape, stride=t.stride()
    )


def replicated(t, mesh):
    d = dt()
    return d.DTensor.from_local(t, mesh, [d.Replicate()] * mesh.ndim, run_check=False)


def placements_of(ndim):
    """Every placement of a tensor with ``ndim`` dims on one mesh dim that a rope input can have."""
    d = dt()
    return (
        [d.Replicate()] + [d.Shard(i) for i in range(ndim)] + [d.Partial("sum"), d.Partial("avg")]
    )


def positions_dim_for(x_ndim, pos_shape, x_dim):
    """positions dim aligned with x dim ``x_dim`` (trailing broadcast to x.shape[:-1]), or None."""
    j = x_dim - (x_ndim - 1 - len(pos_shape))
    return j if 0 <= j < len(pos_shape) and pos_shape[j] != 1 else None


def rotate_and_grad(fn, xs, grads):
    """fn(*xs) (a tuple of outputs), and the gradient of sum(out * g) with respect to each x."""
    xs = [x.detach().requires_grad_() for x in xs]
    outs = fn(*xs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    gs = torch.autograd.grad(outs, xs, grads)
    return outs, gs


def full(t):
    d = dt()
    return t.full_tensor() if isinstance(t, d.DTensor) else t


# --- registration ---------------------------------------------------------------------------


@check()
def registration(mesh):
    """No import of torch.distributed.tensor by torch_rope; automatic registration once it is
    loaded: rank 0 by its first eager call on a DTensor, rank 1 by building the module."""
    import torch_rope

    state = IMPORT_STATE  # recorded by run_rank right after `import torch_rope`
    assert not state["dtensor_loaded"], "import torch_rope imported torch.distributed.tensor"
    assert not state["registered"], "rules registered although DTensor was not loaded"
    d = dt()  # imports torch.distributed.tensor
    assert not torch_rope.distributed._registered, "registered before any trigger"
    cos, sin = torch_rope.rope_tables(10000.0, 8, 16)
    x = torch.randn(2, 3, 6, 8)
    pos = torch.arange(6)
    rank = mesh.get_local_rank()
    if rank == 0:  # no collectives here: rank 1 takes the other branch
        xd = d.DTensor.from_local(x.chunk(2, dim=2)[rank], mesh, [d.Shard(2)], run_check=False)
        out = torch_rope.apply(
            xd, replicated(cos, mesh), replicated(sin, mesh), replicated(pos, mesh)
        )
        close(
            out.to_local(),
            torch_rope.apply(x, cos, sin, pos).chunk(2, dim=2)[rank],
            "first eager call",
        )
    else:
        torch_rope.RotaryPositionalEmbedding(10000.0, 8, 16)
    assert torch_rope.distributed._registered, "no trigger registered the rules"
    torch_rope.distributed.register_sharding_rules()  # idempotent


# --- the rules, op by op ----------------------------------------------------------------------

# (name, x shape, positions shapes): uneven on purpose (odd sizes over 2 ranks).
X_SHAPES = [
    ("BHSD", (3, 5, 7, 8), [(7,), (3, 1, 7)]),
    ("BSHD", (3, 7, 5, 8), [(7, 1), (3, 7, 1)]),
    ("THD", (9, 5, 8), [(9, 1)]),
]


@check()
def apply_every_placement(mesh):
    """rope::apply forward and backward for every x placement, positions replicated or sharded."""
    import torch_rope

    d = dt()
    max_len = 40
    for flags_i, (name, shape, pos_shapes) in enumerate(X_SHAPES):
        rotary_dim = 6 if flags_i % 2 == 0 else 8  # partial rotary too
        cos, sin = torch_rope.rope_tables(10000.0, rotary_dim, max_len)
        interleaved = flags_i != 1
        for pos_shape in pos_shapes:
            x = torch.randn(shape, dtype=torch.float64)
            g = torch.randn(shape, dtype=torch.float64)
            pos = torch.randint(0, max_len, pos_shape)
            kw = dict(interleaved=interleaved)
            (ref,), (ref_grad,) = rotate_and_grad(
                lambda x: torch_rope.apply(x, cos, sin, pos, **kw), [x], [g]
            )
            for xp in placements_of(len(shape)):
                variants = [replicated(pos, mesh)]
                if isinstance(xp, d.Shard) and xp.dim < len(shape) - 1:
                    j = positions_dim_for(len(shape), pos_shape, xp.dim)
                    if j is not None:  # positions passed already sharded like x
                        variants.append(place(pos, mesh, d.Shard(j)))
                for pos_d in variants:
                    what = (
                        f"{name} x{list(shape)} {xp} positions{list(pos_shape)} {pos_d.placements}"
                    )
                    xd = place(x, mesh, xp).detach().requires_grad_()
                    out = torch.ops.rope.apply(
                        xd, replicated(cos, mesh), replicated(sin, mesh), pos_d, **kw
                    )
                    close(out.full_tensor(), ref, what + " forward", rtol=0, atol=1e-12)
                    if isinstance(xp, d.Shard) and xp.dim < len(shape) - 1:
                        assert out.placements == (xp,), f"{what}: output {out.placements}"
                    if isinstance(xp, d.Partial):  # linear: stays pending, no communication
                        assert out.placements == (xp,), f"{what}: output {out.placements}"
                    gd = out.redistribute(mesh, [d.Replicate()]).to_local()
                    (gd * g).sum().backward()
                    close(full(xd.grad), ref_grad, what + " backward", rtol=0, atol=1e-12)


@check()
def apply_positions_sharded_x_replicated(mesh):
    """x replicated but positions sharded: still the single-process result."""
    import torch_rope

    d = dt()
    x = torch.randn(2, 3, 7, 8, dtype=torch.float64)
    cos, sin = torch_rope.rope_tables(500.0, 8, 16)
    pos = torch.randint(0, 16, (7,))
    out = torch.ops.rope.apply(
        place(x, mesh, d.Replicate()),
        replicated(cos, mesh),
        replicated(sin, mesh),
        place(pos, mesh, d.Shard(0)),
    )
    close(out.full_tensor(), torch_rope.apply(x, cos, sin, pos), "forward", rtol=0, atol=1e-12)


@check()
def apply_double_backward(mesh):
    """Double backward through the DTensor op (sequence-sharded x)."""
    import torch_rope

    d = dt()
    x = torch.randn(2, 3, 7, 8, dtype=torch.float64)
    g = torch.randn(2, 3, 7, 8, dtype=torch.float64)
    h = torch.randn(2, 3, 7, 8, dtype=torch.float64)
    cos, sin = torch_rope.rope_tables(10000.0, 8, 16)
    pos = torch.randint(0, 16, (7,))

    def second(x, g, cos, sin, pos, h):
        x = x.detach().requires_grad_()
        g = g.detach().requires_grad_()
        out = torch.ops.rope.apply(x, cos, sin, pos)
        (gx,) = torch.autograd.grad(out, x, g, create_graph=True)
        (ggx,) = torch.autograd.grad((gx * h).sum(), g)
        return ggx

    ref = second(x, g, cos, sin, pos, h)
    s2 = d.Shard(2)
    got = second(
        place(x, mesh, s2),
        place(g, mesh, s2),
        replicated(cos, mesh),
        replicated(sin, mesh),
        replicated(pos, mesh),
        place(h, mesh, s2),
    )
    close(got.full_tensor(), ref, "double backward", rtol=0, atol=1e-12)


@check()
def apply_qk_gqa(mesh):
    """rope::apply_qk with 4 query heads and 2 key heads, for pairs of placements."""
    import torch_rope

    d = dt()
    R, P = d.Replicate(), d.Partial("sum")
    S0, S1, S2, S3 = (d.Shard(i) for i in range(4))
    cos, sin = torch_rope.rope_tables(10000.0, 8, 32)
    pairs = [
        (R, R),
        (S0, S0),
        (S1, S1),
        (S2, S2),
        (S1, R),
        (R, S1),
        (P, P),
        (P, S1),
        (S3, S3),
        (S2, R),
    ]  # the last two need redistribution (head_dim; positions disagree)
    for pos_shape in [(7,), (2, 1, 7)]:
        q = torch.randn(2, 4, 7, 8, dtype=torch.float64)
        k = torch.randn(2, 2, 7, 8, dtype=torch.float64)
        gq, gk = torch.randn_like(q), torch.randn_like(k)
        pos = torch.randint(0, 32, pos_shape)
        (rq, rk), (rgq, rgk) = rotate_and_grad(
            lambda q, k: torch_rope.apply_qk(q, k, cos, sin, pos, interleaved=False),
            [q, k],
            [gq, gk],
        )
        for qp, kp in pairs:
            what = f"q {qp} k {kp} positions{list(pos_shape)}"
            qd = place(q, mesh, qp).detach().requires_grad_()
            kd = place(k, mesh, kp).detach().requires_grad_()
            oq, ok = torch.ops.rope.apply_qk(
                qd,
                kd,
                replicated(cos, mesh),
                replicated(sin, mesh),
                replicated(pos, mesh),
                interleaved=False,
            )
            close(oq.full_tensor(), rq, what + " q forward", rtol=0, atol=1e-12)
            close(ok.full_tensor(), rk, what + " k forward", rtol=0, atol=1e-12)
            if (qp, kp) in [(S1, S1), (S2, S2), (S1, R), (P, P)]:  # no redistribution needed
                assert (oq.placements, ok.placements) == ((qp,), (kp,)), what
            loss = (oq.redistribute(mesh, [R]).to_local() * gq).sum() + (
                ok.redistribute(mesh, [R]).to_local() * gk
            ).sum()
            loss.backward()
            close(full(qd.grad), rgq, what + " q backward", rtol=0, atol=1e-12)
            close(full(kd.grad), rgk, what + " k backward", rtol=0, atol=1e-12)


@check()
def rms_norm_apply_qk_placements(mesh):
    """rope::rms_norm_apply_qk (fused QK-RMSNorm + RoPE) on DTensors: q and k sharded on their
    batch, head or sequence dims, replicated, or pending sums (reduced first: the norm is not
    linear); forward and the gradients of q, k and both weights against one process."""
    import torch_rope

    d = dt()
    R, P = d.Replicate(), d.Partial("sum")
    S0, S1, S2, S3 = (d.Shard(i) for i in range(4))
    cos, sin = torch_rope.rope_tables(10000.0, 8, 32)
    q = torch.randn(2, 4, 7, 8, dtype=torch.float64)
    k = torch.randn(2, 2, 7, 8, dtype=torch.float64)
    qw = torch.randn(8, dtype=torch.float64)
    kw = torch.randn(8, dtype=torch.float64)
    gq, gk = torch.randn_like(q), torch.randn_like(k)
    pos = torch.randint(0, 32, (2, 1, 7))
    flags = dict(eps=1e-5, weight_offset=1.0, interleaved=False)
    (rq, rk), want_grads = rotate_and_grad(
        lambda q, k, qw, kw: torch_rope.rms_norm_apply_qk(q, k, qw, kw, cos, sin, pos, **flags),
        [q, k, qw, kw],
        [gq, gk],
    )
    for qp, kp in [(R, R), (S0, S0), (S1, S1), (S2, S2), (S1, R), (P, P), (S3, S3)]:
        what = f"q {qp} k {kp}"
        qd = place(q, mesh, qp).detach().requires_grad_()
        kd = place(k, mesh, kp).detach().requires_grad_()
        qwd = replicated(qw, mesh).detach().requires_grad_()
        kwd = replicated(kw, mesh).detach().requires_grad_()
        oq, ok = torch.ops.rope.rms_norm_apply_qk(
            qd, kd, qwd, kwd, replicated(cos, mesh), replicated(sin, mesh),
            replicated(pos, mesh), **flags,
        )  # fmt: skip
        close(oq.full_tensor(), rq, what + " q forward", rtol=0, atol=1e-12)
        close(ok.full_tensor(), rk, what + " k forward", rtol=0, atol=1e-12)
        if (qp, kp) in [(S1, S1), (S2, S2), (S1, R)]:  # no redistribution needed
            assert (oq.placements, ok.placements) == ((qp,), (kp,)), what
        loss = (oq.redistribute(mesh, [R]).to_local() * gq).sum() + (
            ok.redistribute(mesh, [R]).to_local() * gk
        ).sum()
        loss.backward()
        for got, want, name in zip((qd, kd, qwd, kwd), want_grads, ("q", "k", "q_w", "k_w")):
            close(full(got.grad), want, f"{what} {name} backward", rtol=0, atol=1e-12)


# Multi-axis positions: (name, x shape, positions shapes), each ending in the axis dim (3).
MULTI_AXIS_SHAPES = [
    ("BHSD", (3, 5, 7, 8), [(7, 3), (3, 1, 7, 3)]),
    ("BSHD", (3, 7, 5, 8), [(3, 7, 1, 3)]),
    ("THD", (9, 5, 8), [(9, 1, 3)]),
]


@check()
def apply_multi_axis(mesh):
    """mrope_section: the positions' trailing axis dim aligns with nothing in x and is never
    sharded. Every x placement, positions replicated, sharded like x, or sharded on the axis
    dim (gathered); apply forward and backward, apply_qk (GQA), apply_ and out=."""
    import torch_rope

    d = dt()
    R = d.Replicate()
    max_len = 40
    cos, sin = torch_rope.rope_tables(10000.0, 8, max_len)  # 4 planes
    for i, (name, shape, pos_shapes) in enumerate(MULTI_AXIS_SHAPES):
        kw = dict(
            interleaved=i != 1,
            mrope_section=[2, 1, 1] if i != 1 else [1, 2, 1],
            mrope_interleaved=i != 1,
        )
        for pos_shape in pos_shapes:
            x = torch.randn(shape, dtype=torch.float64)
            g = torch.randn(shape, dtype=torch.float64)
            pos = torch.randint(0, max_len, pos_shape)
            (ref,), (ref_grad,) = rotate_and_grad(
                lambda x: torch_rope.apply(x, cos, sin, pos, **kw), [x], [g]
            )
            for xp in placements_of(len(shape)):
                variants = [replicated(pos, mesh), place(pos, mesh, d.Shard(len(pos_shape) - 1))]
                if isinstance(xp, d.Shard) and xp.dim < len(shape) - 1:
                    j = positions_dim_for(len(shape), pos_shape[:-1], xp.dim)
                    if j is not None:
                        variants.append(place(pos, mesh, d.Shard(j)))
                for pos_d in variants:
                    what = (
                        f"mrope {name} x{list(shape)} {xp} positions{list(pos_shape)} "
                        f"{pos_d.placements}"
                    )
                    xd = place(x, mesh, xp).detach().requires_grad_()
                    out = torch.ops.rope.apply(
                        xd, replicated(cos, mesh), replicated(sin, mesh), pos_d, **kw
                    )
                    close(out.full_tensor(), ref, what + " forward", rtol=0, atol=1e-12)
                    if isinstance(xp, (d.Shard, d.Partial)) and not (
                        isinstance(xp, d.Shard) and xp.dim == len(shape) - 1
                    ):
                        assert out.placements == (xp,), f"{what}: output {out.placements}"
                    (out.redistribute(mesh, [R]).to_local() * g).sum().backward()
                    close(full(xd.grad), ref_grad, what + " backward", rtol=0, atol=1e-12)

    # apply_qk with GQA (4 query heads, 2 key heads), (B, 1, S, A) positions.
    q = torch.randn(2, 4, 7, 8, dtype=torch.float64)
    k = torch.randn(2, 2, 7, 8, dtype=torch.float64)
    pos = torch.randint(0, max_len, (2, 1, 7, 3))
    kw = dict(mrope_section=[1, 2, 1], mrope_interleaved=False, interleaved=False)
    rq, rk = torch_rope.apply_qk(q, k, cos, sin, pos, **kw)
    for qp, kp in [(R, R), (d.Shard(0), d.Shard(0)), (d.Shard(1), d.Shard(1)), (d.Shard(2), R)]:
        what = f"mrope apply_qk q {qp} k {kp}"
        oq, ok = torch.ops.rope.apply_qk(
            place(q, mesh, qp),
            place(k, mesh, kp),
            replicated(cos, mesh),
            replicated(sin, mesh),
            replicated(pos, mesh),
            **kw,
        )
        close(oq.full_tensor(), rq, what + " q", rtol=0, atol=1e-12)
        close(ok.full_tensor(), rk, what + " k", rtol=0, atol=1e-12)

    # apply_ keeps x's placement and storage; out= keeps out's.
    x = torch.randn(3, 5, 7, 8, dtype=torch.float64)
    pos = torch.randint(0, max_len, (3, 1, 7, 3))
    kw = dict(mrope_section=[2, 1, 1], mrope_interleaved=True, inverse=True)
    ref = torch_rope.apply(x, cos, sin, pos, **kw)
    for xp in [R, d.Shard(0), d.Shard(2), d.Partial("sum")]:
        xd = place(x, mesh, xp)
        storage = xd.to_local().data_ptr()
        torch_rope.apply_(
            xd, replicated(cos, mesh), replicated(sin, mesh), replicated(pos, mesh), **kw
        )
        assert xd.placements == (xp,) and xd.to_local().data_ptr() == storage, f"apply_ {xp}"
        close(xd.full_tensor(), ref, f"mrope apply_ {xp}", rtol=0, atol=1e-12)
        out = place(torch.zeros_like(x), mesh, xp if not isinstance(xp, d.Partial) else R)
        result = torch_rope.apply(
            place(x, mesh, xp), replicated(cos, mesh), replicated(sin, mesh),
            replicated(pos, mesh), out=out, **kw,
        )  # fmt: skip
        assert result is out
        close(out.full_tensor(), ref, f"mrope out= {xp}", rtol=0, atol=1e-12)

    # Same global shapes, with and without mrope_section: x (B, 3, 3, D) sharded on dim 1 needs
    # positions (3, 3) sharded on dim 0 when one-axis (they align with (S, H)), replicated when
    # multi-axis ((3,) aligns with H). A cache keyed without mrope_section reuses the first.
    x = torch.randn(2, 3, 3, 8, dtype=torch.float64)
    pos = torch.randint(0, max_len, (3, 3))
    for kw in (dict(), dict(mrope_section=[2, 1, 1]), dict()):
        got = torch.ops.rope.apply(
            place(x, mesh, d.Shard(1)), replicated(cos, mesh), replicated(sin, mesh),
            replicated(pos, mesh), **kw,
        )  # fmt: skip
        close(got.full_tensor(), torch_rope.apply(x, cos, sin, pos, **kw), f"cache key {kw}",
              rtol=0, atol=1e-12)  # fmt: skip


@check()
def apply_inplace(mesh):
    """rope::apply_ keeps x's placement and local storage; refuses what would need to move x."""
    import torch_rope

    d = dt()
    R = d.Replicate()
    cos, sin = torch_rope.rope_tables(10000.0, 6, 32)
    x = torch.randn(3, 5, 7, 8, dtype=torch.float64)
    pos = torch.randint(0, 32, (3, 1, 7))
    ref = torch_rope.apply(x, cos, sin, pos, inverse=True)
    for xp in [R, d.Shard(0), d.Shard(1), d.Shard(2), d.Partial("sum")]:
        for pos_d in [replicated(pos, mesh)] + (
            [place(pos, mesh, xp)] if xp in (d.Shard(0), d.Shard(2)) else []
        ):
            what = f"apply_ x {xp} positions {pos_d.placements}"
            xd = place(x, mesh, xp)
            storage = xd.to_local().data_ptr()
            torch.ops.rope.apply_(
                xd, replicated(cos, mesh), replicated(sin, mesh), pos_d, inverse=True
            )
            assert xd.placements == (xp,), f"{what}: placement became {xd.placements}"
            assert xd.to_local().data_ptr() == storage, f"{what}: not in place"
            close(xd.full_tensor(), ref, what, rtol=0, atol=1e-12)
    # A sharded head_dim would have to be gathered, i.e. x replaced: refused, x untouched.
    xd = place(x, mesh, d.Shard(3))
    before = xd.to_local().clone()
    try:
        torch.ops.rope.apply_(
            xd, replicated(cos, mesh), replicated(sin, mesh), replicated(pos, mesh)
        )
    except RuntimeError as e:
        assert "in-place" in str(e) and "Shard(dim=3)" in str(e), str(e)
    else:
        raise AssertionError("apply_ on a head_dim-sharded x did not raise")
    assert torch.equal(xd.to_local(), before), "apply_ wrote x although it raised"
    # Recorded by autograd (x requires grad through a non-leaf): gradient of the in-place op.
    leaf = place(x, mesh, d.Shard(2)).detach().requires_grad_()
    y = leaf * 1.0
    torch_rope.apply_(y, replicated(cos, mesh), replicated(sin, mesh), replicated(pos, mesh))
    g = torch.randn_like(x)
    (y.redistribute(mesh, [R]).to_local() * g).sum().backward()
    close(
        leaf.grad.full_tensor(),
        torch_rope.apply(g, cos, sin, pos, inverse=True),
        "apply_ backward",
        rtol=0,
        atol=1e-12,
    )


def out_cases(mesh, op):
    """op(x, cos, sin, positions, out=out) for (x, out) placements: out keeps its placement and
    storage, x is moved to out's placement, the values are the single-process result."""
    import torch_rope

    d = dt()
    R = d.Replicate()
    cos, sin = torch_rope.rope_tables(10000.0, 8, 32)
    x = torch.randn(3, 5, 7, 8, dtype=torch.float64)
    pos = torch.randint(0, 32, (7,))
    ref = torch_rope.apply(x, cos, sin, pos, inverse=True)
    # (R, S(2)) right after (R, R): out's placement must be part of DTensor's cache key.
    for xp, outp in [
        (R, R),
        (R, d.Shard(2)),
        (d.Shard(2), d.Shard(2)),
        (d.Shard(1), d.Shard(1)),
        (d.Shard(0), R),
        (d.Shard(3), d.Shard(0)),
        (d.Partial("sum"), R),
    ]:
        what = f"{op} x {xp} out {outp}"
        out = place(torch.zeros_like(x), mesh, outp)
        storage = out.to_local().data_ptr()
        result = op(
            place(x, mesh, xp),
            replicated(cos, mesh),
            replicated(sin, mesh),
            replicated(pos, mesh),
            inverse=True,
            out=out,
        )
        assert result is out, f"{what}: did not return out"
        assert out.placements == (outp,), f"{what}: out placement became {out.placements}"
        assert out.to_local().data_ptr() == storage, f"{what}: out's storage was replaced"
        close(out.full_tensor(), ref, what, rtol=0, atol=1e-12)


@check()
def apply_out(mesh):
    """torch_rope.apply(..., out=) with DTensors. rope::apply.out returns nothing (torch.compile
    refuses custom ops that return an alias), which DTensor cannot dispatch, so the Python API
    writes DTensor outs through rope::apply and copy_: out keeps its placement and storage."""
    import torch_rope

    out_cases(mesh, torch_rope.apply)


def refuses_out_returning_nothing(mesh, op):
    """An out= overload declared -> (): DTensor refuses it clearly, before writing out."""
    import torch_rope

    d = dt()
    cos, sin = torch_rope.rope_tables(10000.0, 8, 32)
    x = place(torch.randn(3, 5, 7, 8), mesh, d.Shard(2))
    out = place(torch.zeros(3, 5, 7, 8), mesh, d.Shard(2))
    try:
        op(
            x,
            replicated(cos, mesh),
            replicated(sin, mesh),
            replicated(torch.arange(7), mesh),
            out=out,
        )
    except RuntimeError as e:
        assert "returns nothing" in str(e), str(e)
    else:
        raise AssertionError(f"DTensor {op} (returning nothing) did not raise")
    assert not out.to_local().any(), "out was written although the call raised"


@check()
def apply_out_returning_nothing(mesh):
    op = getattr(torch.ops.rope.apply, "out", None)
    if op is None or len(op._schema.returns) != 0:
        raise Skip("this build has no rope::apply.out returning nothing")
    refuses_out_returning_nothing(mesh, op)


_STANDIN = None


def standin_out_ops():
    """Two ops with rope::apply.out's schema, one returning out (as ATen's out= ops do), one
    returning nothing, implemented as rope::apply + copy_: they test the out= rule itself on
    any build, whatever the real overload returns."""
    global _STANDIN
    if _STANDIN is None:
        lib = torch.library.Library("torch_rope_test", "DEF")
        args = (
            "(Tensor x, Tensor cos, Tensor sin, Tensor positions, *, bool interleaved=True, "
            "bool inverse=False, Tensor(a!) out)"
        )
        lib.define("apply.out" + args + " -> Tensor(a!)")
        lib.define("apply_void.out" + args + " -> ()")

        def cpu(x, cos, sin, positions, *, interleaved=True, inverse=False, out):
            rotated = torch.ops.rope.apply(
                x, cos, sin, positions, interleaved=interleaved, inverse=inverse
            )
            return out.copy_(rotated)

        def cpu_void(*args, **kwargs):
            cpu(*args, **kwargs)

        def fake(x, cos, sin, positions, *, interleaved=True, inverse=False, out):
            torch.ops.rope.apply(x, cos, sin, positions)  # the op's own shape checks
            return out

        def fake_void(*args, **kwargs):
            fake(*args, **kwargs)

        lib.impl("apply.out", cpu, "CPU")
        lib.impl("apply_void.out", cpu_void, "CPU")
        torch.library.register_fake("torch_rope_test::apply.out", fake, lib=lib)
        torch.library.register_fake("torch_rope_test::apply_void.out", fake_void, lib=lib)
        _STANDIN = lib
    return torch.ops.torch_rope_test.apply.out, torch.ops.torch_rope_test.apply_void.out


@check()
def apply_out_rule_on_standins(mesh):
    """The out= rule on stand-ins with rope::apply.out's schema, returning out or nothing."""
    import torch_rope

    returning_out, returning_nothing = standin_out_ops()
    torch_rope.distributed._register_out_rule(returning_out)
    torch_rope.distributed._register_out_rule(returning_nothing)
    out_cases(mesh, returning_out)
    refuses_out_returning_nothing(mesh, returning_nothing)


@check()
def positions_must_be_global(mesh):
    """Local positions with a DTensor x: an error that says positions must be global."""
    import torch_rope

    d = dt()
    cos, sin = torch_rope.rope_tables(10000.0, 8, 32)
    x = place(torch.randn(2, 3, 8, 8), mesh, d.Shard(2))
    local_pos = replicated(torch.arange(4), mesh)  # this rank's 4 of 8 positions
    c, s = replicated(cos, mesh), replicated(sin, mesh)
    calls = {
        "rope.apply": lambda: torch.ops.rope.apply(x, c, s, local_pos),
        "rope.apply_": lambda: torch.ops.rope.apply_(x, c, s, local_pos),
        "rope.apply_qk": lambda: torch.ops.rope.apply_qk(x, x, c, s, local_pos),
        "module": lambda: torch_rope.RotaryPositionalEmbedding(10000.0, 8, 32)(x, torch.arange(4)),
    }
    for name, call in calls.items():
        try:
            call()
        except (RuntimeError, ValueError) as e:
            msg = str(e)
            assert "positions must be global and broadcastable to the global" in msg, msg
            # The ops name x.shape[:-1], the module x's whole shape: both global.
            assert ("[2, 3, 8]" in msg or "[2, 3, 8, 8]" in msg) and "[4]" in msg, msg
        else:
            raise AssertionError(f"{name} accepted local positions with a DTensor x")


def module_cases(mesh, x_placements):
    """The module on a DTensor x for each placement (a tuple per mesh dim): default and explicit
    positions, (B, H, S, D) and (B, S, H, D), forward and backward against one process."""
    import torch_rope

    d = dt()
    bhsd_rope = torch_rope.RotaryPositionalEmbedding(10000.0, 8, 64)  # seq_dim=-2
    bshd_rope = torch_rope.RotaryPositionalEmbedding(10000.0, 8, 64, seq_dim=-3)
    bhsd = torch.randn(2, 4, 11, 8)
    bshd = bhsd.transpose(1, 2).contiguous()
    pos = torch.randint(0, 64, (11,))
    per_seq = torch.randint(0, 64, (2, 11))
    cases = [
        ("BHSD default", bhsd_rope, bhsd, None),
        ("BHSD (S,)", bhsd_rope, bhsd, pos),
        ("BSHD default", bshd_rope, bshd, None),
        ("BSHD (S,)", bshd_rope, bshd, pos),
        ("BSHD (B, S)", bshd_rope, bshd, per_seq),
        ("BHSD (B, 1, S)", bhsd_rope, bhsd, per_seq[:, None]),
    ]
    for placements in x_placements:
        for name, rope, x, positions in cases:
            what = f"module x {placements} {name} positions"
            g = torch.randn_like(x)
            (ref,), (ref_grad,) = rotate_and_grad(lambda x: rope(x, positions), [x], [g])
            xd = place(x, mesh, placements).detach().requires_grad_()
            out = rope(xd, positions)
            assert isinstance(out, d.DTensor), what
            assert list(out.placements) == list(placements), f"{what}: {out.placements}"
            close(out.full_tensor(), ref, what, rtol=0, atol=0)
            out.backward(place(g, mesh, placements))
            close(xd.grad.full_tensor(), ref_grad, what + " backward", rtol=0, atol=0)


@check()
def module_dtensor_input(mesh):
    """The module with DTensor input, x sharded on every dim but head_dim, or replicated."""
    d = dt()
    module_cases(mesh, [(d.Shard(i),) for i in range(3)] + [(d.Replicate(),)])


# --- models: TP, FSDP2, context parallel ------------------------------------------------------


class Attention(nn.Module):
    """Multi-head self-attention with RoPE on q and k (no mask: plain ops that DTensor shards)."""

    def __init__(self, dim=32, n_heads=4, head_dim=8, max_seq_len=64):
        super().__init__()
        import torch_rope

        self.head_dim = head_dim
        self.wq = nn.Linear(dim, n_heads * head_dim, bias=False)
        self.wk = nn.Linear(dim, n_heads * head_dim, bias=False)
        self.wv = nn.Linear(dim, n_heads * head_dim, bias=False)
        self.wo = nn.Linear(n_heads * head_dim, dim, bias=False)
        self.rope = torch_rope.RotaryPositionalEmbedding(10000.0, head_dim, max_seq_len)

    def forward(self, x, positions=None):
        b, s, _ = x.shape
        # -1: the heads this rank holds (local heads under TP with local outputs), or all of them.
        q = self.wq(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        q, k = self.rope(q, positions), self.rope(k, positions)
        scores = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(self.head_dim), dim=-1)
        return self.wo((scores @ v).transpose(1, 2).reshape(b, s, -1))


class Block(nn.Module):
    def __init__(self, dim=32):
        super().__init__()
        self.attn = Attention(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x):
        x = x + self.attn(x)
        return x + self.mlp(x)


def tp_plan(local_output):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    col = ColwiseParallel(use_local_output=local_output)
    return {"wq": col, "wk": col, "wv": copy.deepcopy(col), "wo": RowwiseParallel()}


def require_heads_sharded_matmul(mesh):
    """Attention's q @ k.T on DTensor heads flattens (batch, heads) with heads sharded, which
    DTensor refuses before torch 2.13 (2.11 seen): a limit of torch, not of rope."""
    dtensor = dt()
    heads = dtensor.distribute_tensor(torch.randn(2, 4, 3, 2), mesh, [dtensor.Shard(1)])
    try:
        heads @ heads.transpose(-2, -1)
    except RuntimeError as error:
        raise Skip(
            f"torch {torch.__version__}'s DTensor cannot matmul tensors sharded on the heads dim "
            f"({str(error).splitlines()[0][:160]})"
        ) from None


def run_tp(mesh, local_output, compile_backend=None):
    """Column-parallel q/k/v, row-parallel output, against the same weights in one process."""
    from torch.distributed.tensor.parallel import parallelize_module

    if not local_output:
        require_heads_sharded_matmul(mesh)
    torch.manual_seed(1)
    ref = Attention()
    tp = parallelize_module(copy.deepcopy(ref), mesh, tp_plan(local_output))
    if compile_backend is not None:
        torch._dynamo.reset()
        tp = torch.compile(tp, backend=compile_backend, fullgraph=True)
    x = torch.randn(2, 12, 32)
    out_ref = ref(x)
    out_ref.square().sum().backward()
    out = tp(x)
    what = f"TP local_output={local_output} compile={compile_backend}"
    close(out, out_ref, what + " forward", rtol=1e-5, atol=1e-5)
    out.square().sum().backward()
    module = tp._orig_mod if compile_backend is not None else tp
    for name in ["wq", "wk", "wv", "wo"]:
        grad = getattr(module, name).weight.grad
        close(
            full(grad),
            getattr(ref, name).weight.grad,
            f"{what} {name}.weight.grad",
            rtol=1e-4,
            atol=1e-5,
        )


@check()
def tp_local_heads(mesh):
    run_tp(mesh, local_output=True)


@check()
def tp_dtensor_heads(mesh):
    run_tp(mesh, local_output=False)


@check()
def tp_dtensor_heads_compiled(mesh):
    run_tp(mesh, local_output=False, compile_backend="aot_eager")


@check()
def tp_local_heads_compiled(mesh):
    run_tp(mesh, local_output=True, compile_backend="aot_eager")


@check()
def fsdp2_training_step(mesh):
    """One FSDP2 step (fp32) equals the single-process step on the whole batch; bf16 mixed
    precision keeps the rope tables float32 and out of the state dict."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(2)
    ref = Block()
    model = copy.deepcopy(ref)
    fully_shard(model.attn, mesh=mesh)
    fully_shard(model, mesh=mesh)
    x = torch.randn(4, 12, 32)
    target = torch.randn(4, 12, 32)
    rank, ws = mesh.get_local_rank(), mesh.size()
    lo, hi = rank * 4 // ws, (rank + 1) * 4 // ws
    lr = 0.1

    F.mse_loss(ref(x), target).backward()
    with torch.no_grad():
        for p in ref.parameters():
            p -= lr * p.grad
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    F.mse_loss(model(x[lo:hi]), target[lo:hi]).backward()  # FSDP averages gradients over ranks
    opt.step()
    for (name, p), p_ref in zip(model.named_parameters(), ref.parameters()):
        close(p.full_tensor(), p_ref, f"FSDP2 {name} after one step", rtol=1e-5, atol=1e-6)

    mixed = copy.deepcopy(ref)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    fully_shard(mixed.attn, mesh=mesh, mp_policy=policy)
    fully_shard(mixed, mesh=mesh, mp_policy=policy)
    out = mixed(x[lo:hi])
    assert out.dtype == torch.bfloat16, out.dtype
    assert mixed.attn.rope.cos.dtype == torch.float32, mixed.attn.rope.cos.dtype
    keys = [k for k in mixed.state_dict() if "rope" in k]
    assert not keys, f"rope tables in the state dict: {keys}"
    F.mse_loss(out.float(), target[lo:hi]).backward()
    torch.optim.SGD(mixed.parameters(), lr=lr).step()
    for name, p in mixed.named_parameters():
        assert torch.isfinite(p.full_tensor()).all(), f"bf16 FSDP2: {name} not finite"


@check()
def context_parallel_positions_buffer(mesh):
    """Positions sharded by context_parallel with q and k (head-tail load balancing): equal to
    one process. The two tempting local derivations are shown to be wrong under it."""
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import context_parallel_unshard

    import torch_rope

    b, s, d = 2, 16, 8
    q, k = torch.randn(b, 4, s, d), torch.randn(b, 2, s, d)
    cos, sin = torch_rope.rope_tables(10000.0, d, 64)
    positions = torch.arange(s) + 5  # e.g. a chunk that starts at 5
    ref_q, ref_k = torch_rope.apply_qk(q, k, cos, sin, positions)
    rope = torch_rope.RotaryPositionalEmbedding(10000.0, d, 64)
    ref_module = rope(q)

    qs, ks, ps = q.clone(), k.clone(), positions.clone()
    with context_parallel(mesh, buffers=[qs, ks, ps], buffer_seq_dims=[2, 2, 0]):
        rq, rk = torch_rope.apply_qk(qs, ks, cos, sin, ps)
        s_local = qs.size(2)
        naive = 5 + mesh.get_local_rank() * s_local + torch.arange(s_local)
        wrong_q, _ = torch_rope.apply_qk(qs, ks, cos, sin, naive)
        wrong_default = rope(qs)
    rq, rk, wrong_q, wrong_default = context_parallel_unshard(
        mesh, [rq, rk, wrong_q, wrong_default], [2, 2, 2, 2]
    )
    close(rq, ref_q, "context parallel q", rtol=0, atol=0)
    close(rk, ref_k, "context parallel k", rtol=0, atol=0)
    assert not torch.allclose(wrong_q, ref_q), "rank*S_local + arange was right: no load balancing?"
    assert not torch.allclose(wrong_default, ref_module), "module default was right under CP?"


# --- slow tier: inductor compiles of whole models ---------------------------------------------


@check("slow")
def tp_dtensor_heads_inductor(mesh):
    run_tp(mesh, local_output=False, compile_backend="inductor")


@check("slow")
def fsdp2_block_inductor(mesh):
    """FSDP2 + torch.compile(inductor) of the whole block: forward and one step, against eager."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(3)
    ref = Block()
    model = copy.deepcopy(ref)
    fully_shard(model, mesh=mesh)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="inductor", fullgraph=True)
    x = torch.randn(2, 12, 32)
    rank, ws = mesh.get_local_rank(), mesh.size()
    lo, hi = rank * 2 // ws, (rank + 1) * 2 // ws
    F.mse_loss(ref(x), torch.zeros_like(x)).backward()
    out = compiled(x[lo:hi])
    close(out, ref(x)[lo:hi], "FSDP2+inductor forward", rtol=1e-4, atol=1e-5)
    F.mse_loss(out, torch.zeros_like(out)).backward()
    for (name, p), p_ref in zip(model.named_parameters(), ref.parameters()):
        close(p.grad.full_tensor(), p_ref.grad, f"FSDP2+inductor {name}.grad", rtol=1e-4, atol=1e-5)


# --- 2-D mesh (4 ranks as 2 x 2), slow tier ------------------------------------------------


@check("mesh2d")
def mesh2d_registration(mesh):
    import torch_rope

    torch_rope.distributed.register_sharding_rules()


@check("mesh2d")
def mesh2d_ops(mesh):
    """apply, apply_qk and apply_ with x placed on both mesh dims (the same tensor dim twice,
    nested; two different dims; with a pending sum), positions replicated or pre-sharded."""
    import torch_rope

    d = dt()
    R, P = d.Replicate(), d.Partial("sum")
    S0, S1, S2, S3 = (d.Shard(i) for i in range(4))
    cos, sin = torch_rope.rope_tables(10000.0, 6, 32)
    x = torch.randn(3, 5, 9, 8, dtype=torch.float64)  # uneven on every dim over 2 (and 4)
    g = torch.randn_like(x)
    pos = torch.randint(0, 32, (3, 1, 9))
    (ref,), (ref_grad,) = rotate_and_grad(lambda x: torch_rope.apply(x, cos, sin, pos), [x], [g])
    c, s_ = replicated(cos, mesh), replicated(sin, mesh)
    for xp in [(S0, S2), (S2, S2), (S1, S2), (S2, S1), (R, S2), (S1, P), (P, S0), (S3, S2)]:
        pos_variants = [replicated(pos, mesh)]
        want = [S0 if p == S0 else S2 if p == S2 else R for p in xp]  # positions dims 0 and 2
        if want != [R, R]:
            pos_variants.append(place(pos, mesh, want))
        for pd in pos_variants:
            what = f"2-D x {xp} positions {pd.placements}"
            xd = place(x, mesh, xp).detach().requires_grad_()
            out = torch.ops.rope.apply(xd, c, s_, pd)
            close(out.full_tensor(), ref, what, rtol=0, atol=1e-12)
            if S3 not in xp:
                assert tuple(out.placements) == xp, f"{what}: output {out.placements}"
            (out.redistribute(mesh, [R, R]).to_local() * g).sum().backward()
            close(full(xd.grad), ref_grad, what + " backward", rtol=0, atol=1e-12)
            if S3 not in xp:
                xi = place(x, mesh, xp)
                torch.ops.rope.apply_(xi, c, s_, pd)
                assert tuple(xi.placements) == xp, f"{what}: apply_ moved x"
                close(xi.full_tensor(), ref, what + " apply_", rtol=0, atol=1e-12)
    q, k = torch.randn(2, 4, 9, 8), torch.randn(2, 2, 9, 8)
    rq, rk = torch_rope.apply_qk(q, k, cos, sin, pos[:2])
    for qp, kp in [((S1, S2), (S1, S2)), ((S0, S1), (S0, R)), ((S2, S2), (S2, S2))]:
        oq, ok = torch.ops.rope.apply_qk(
            place(q, mesh, qp), place(k, mesh, kp), c, s_, replicated(pos[:2], mesh)
        )
        close(oq.full_tensor(), rq, f"2-D apply_qk q {qp}", rtol=0, atol=0)
        close(ok.full_tensor(), rk, f"2-D apply_qk k {kp}", rtol=0, atol=0)


@check("mesh2d")
def mesh2d_module(mesh):
    d = dt()
    S0, S1, S2 = d.Shard(0), d.Shard(1), d.Shard(2)
    module_cases(mesh, [(S0, S2), (S2, S2), (S1, S2), (S2, S1), (d.Replicate(), S1)])


@check("mesh2d")
def mesh2d_fsdp_tp_step(mesh):
    """FSDP2 over "dp" x TP over "tp" (DTensor heads): one step equals one process."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    require_heads_sharded_matmul(mesh["tp"])
    torch.manual_seed(4)
    ref = Block()
    model = copy.deepcopy(ref)
    parallelize_module(model.attn, mesh["tp"], tp_plan(local_output=False))
    fully_shard(model.attn, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    x, target = torch.randn(4, 12, 32), torch.randn(4, 12, 32)
    dp, n_dp = mesh["dp"].get_local_rank(), mesh["dp"].size()
    lo, hi = dp * 4 // n_dp, (dp + 1) * 4 // n_dp
    lr = 0.1
    F.mse_loss(ref(x), target).backward()
    with torch.no_grad():
        for p in ref.parameters():
            p -= lr * p.grad
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    F.mse_loss(model(x[lo:hi]), target[lo:hi]).backward()
    opt.step()
    for (name, p), p_ref in zip(model.named_parameters(), ref.parameters()):
        close(full(p), p_ref, f"FSDP x TP {name} after one step", rtol=1e-5, atol=1e-6)


# --- process plumbing -------------------------------------------------------------------------


IMPORT_STATE = {}


def run_rank(args):
    torch.set_num_threads(1)  # the ranks share the machine's cores
    import torch_rope

    IMPORT_STATE["dtensor_loaded"] = "torch.distributed.tensor" in sys.modules
    IMPORT_STATE["registered"] = torch_rope.distributed._registered
    dist.init_process_group(
        "gloo",
        init_method=f"file://{args.store}",
        rank=args.rank,
        world_size=args.world_size,
        timeout=timedelta(seconds=args.collective_timeout),
    )
    from torch.distributed.device_mesh import init_device_mesh

    if args.tier == "mesh2d":
        mesh = init_device_mesh("cpu", (args.world_size // 2, 2), mesh_dim_names=("dp", "tp"))
    else:
        mesh = init_device_mesh("cpu", (args.world_size,))
    results = {}
    for name, (tier, fn) in CHECKS.items():
        if tier != args.tier or (args.only and name not in args.only.split(",")):
            continue
        torch.manual_seed(0)  # same data on every rank, whatever ran before
        t0 = time.perf_counter()
        try:
            fn(mesh)
            results[name] = "ok"
        except Skip as e:
            results[name] = f"skip: {e}"
        except Exception:  # noqa: BLE001 - reported per check, the test fails on it
            results[name] = traceback.format_exc()
        print(
            f"rank {args.rank}: {name}: {results[name].splitlines()[0]} "
            f"({time.perf_counter() - t0:.1f} s)",
            flush=True,
        )
        dist.barrier()
    with open(os.path.join(args.out, f"rank{args.rank}.json"), "w") as f:
        json.dump(results, f, indent=1)
    dist.destroy_process_group()


def main():
    import distributed_launch  # beside this file (sys.path[0] when run as a script)

    parser = distributed_launch.parser(__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank is None:  # as distributed_launch.py does, having imported torch
        sys.exit(distributed_launch.launch(args))
    run_rank(args)


if __name__ == "__main__":
    main()
