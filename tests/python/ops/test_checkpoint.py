# SPDX-License-Identifier: BSD-3-Clause
"""Activation checkpointing (torch.utils.checkpoint) through every differentiable op and the
module: in both modes (use_reentrant=False is what transformers' gradient_checkpointing_enable()
uses; it lets a backward unpack each saved tensor only once), eager and under torch.compile, the
gradients equal those of the float64 oracle differentiated by autograd, as they do without
checkpointing; double backward through a non-reentrant checkpoint works too."""

import pytest
import references as ref
import torch
from helpers import cpu_and_cuda, make_tables, randn
from torch.utils.checkpoint import checkpoint

import torch_rope

MAX_SEQ_LEN = 32
HEAD_DIM = 16
ROTARY_DIM = 12  # partial rotary: the pass-through tail carries gradient too
EPS = 1e-6


def _inputs(device):
    """The leaves (q, k and the norm weights: GQA, 4 q heads and 2 kv heads; gq and gk weigh the
    outputs in the loss, so the gradient is not trivial and a second derivative exists) and the
    positions."""
    grad = dict(dtype=torch.float64, device=device)
    return dict(
        q=randn(2, 4, 5, HEAD_DIM, **grad).requires_grad_(),
        k=randn(2, 2, 5, HEAD_DIM, **grad).requires_grad_(),
        q_weight=(1 + 0.1 * randn(HEAD_DIM, **grad)).requires_grad_(),
        k_weight=(1 + 0.1 * randn(HEAD_DIM, **grad)).requires_grad_(),
        gq=randn(2, 4, 5, HEAD_DIM, **grad).requires_grad_(),
        gk=randn(2, 2, 5, HEAD_DIM, **grad).requires_grad_(),
        positions=torch.randint(0, MAX_SEQ_LEN, (2, 1, 5), device=device),
    )


LEAVES = ("q", "k", "q_weight", "k_weight", "gq", "gk")

# Each case: its loss through torch_rope, and the leaves it differentiates. The oracle computes
# the same loss in float64 on the CPU from the math (_oracle).


def _loss_apply(t, q, k, qw, kw, gq, gk):
    return (torch_rope.apply(q, t["cos"], t["sin"], t["positions"], interleaved=False) * gq).sum()


def _loss_apply_inplace(t, q, k, qw, kw, gq, gk):
    y = q * 2.0  # a non-leaf: apply_ records the rotation and rebases y's history
    torch_rope.apply_(y, t["cos"], t["sin"], t["positions"], interleaved=False)
    return (y * gq).sum()


def _loss_apply_qk(t, q, k, qw, kw, gq, gk):
    q_out, k_out = torch_rope.apply_qk(q, k, t["cos"], t["sin"], t["positions"], interleaved=False)
    return (q_out * gq).sum() + (k_out * gk).sum()


def _loss_apply_qk_q_only(t, q, k, qw, kw, gq, gk):
    # k_out unused: its gradient reaches backward undefined.
    q_out, _ = torch_rope.apply_qk(q, k, t["cos"], t["sin"], t["positions"], interleaved=False)
    return (q_out * gq).sum()


def _loss_rms_norm_apply_qk(t, q, k, qw, kw, gq, gk):
    q_out, k_out = torch_rope.rms_norm_apply_qk(
        q, k, qw, kw, t["cos"], t["sin"], t["positions"], eps=EPS, interleaved=False
    )
    return (q_out * gq).sum() + (k_out * gk).sum()


def _loss_module(t, q, k, qw, kw, gq, gk):
    return (t["module"](q, t["positions"].view(2, 5)) * gq).sum()  # (B, S) positions


CASES = {
    "apply": (_loss_apply, ("q", "gq")),
    "apply_": (_loss_apply_inplace, ("q", "gq")),
    "apply_qk": (_loss_apply_qk, ("q", "k", "gq", "gk")),
    "apply_qk_q_only": (_loss_apply_qk_q_only, ("q", "gq")),
    "rms_norm_apply_qk": (
        _loss_rms_norm_apply_qk,
        ("q", "k", "q_weight", "k_weight", "gq", "gk"),
    ),
    "module": (_loss_module, ("q", "gq")),
}


def _rms_norm(x, w):
    return x / torch.sqrt(x.square().mean(-1, keepdim=True) + EPS) * w


def _rotate(x, positions):
    return ref.rope(x, ref.angles(positions, x.shape[:-1], ROTARY_DIM), interleaved=False)


def _oracle(name, positions, q, k, qw, kw, gq, gk):
    pos = positions.cpu()
    if name in ("apply", "module", "apply_qk_q_only"):
        return (_rotate(q, pos) * gq).sum()
    if name == "apply_":
        return (_rotate(q * 2.0, pos) * gq).sum()
    if name == "apply_qk":
        return (_rotate(q, pos) * gq).sum() + (_rotate(k, pos) * gk).sum()
    assert name == "rms_norm_apply_qk"
    return (_rotate(_rms_norm(q, qw), pos) * gq).sum() + (_rotate(_rms_norm(k, kw), pos) * gk).sum()


def _setup(device):
    t = _inputs(device)
    t["cos"], t["sin"] = make_tables(MAX_SEQ_LEN, ROTARY_DIM, device, torch.float64)
    t["module"] = torch_rope.RotaryPositionalEmbedding(
        10000.0, HEAD_DIM, MAX_SEQ_LEN, device, rotary_dim=ROTARY_DIM, interleaved=False,
        dtype=torch.float64,
    )  # fmt: skip
    return t


def _oracle_leaves(t):
    return {n: t[n].detach().cpu().requires_grad_() for n in LEAVES}


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("use_reentrant", [False, True], ids=["non_reentrant", "reentrant"])
@pytest.mark.parametrize("name", list(CASES))
def test_checkpointed_gradient_matches_oracle(name, use_reentrant, compiled, device):
    loss_fn, wanted = CASES[name]
    t = _setup(device)
    leaves = [t[n] for n in LEAVES]

    def checkpointed(*leaves):
        return checkpoint(lambda *a: loss_fn(t, *a), *leaves, use_reentrant=use_reentrant)

    if compiled:
        torch._dynamo.reset()
        # aot_eager traces forward and backward through the Meta and Autograd kernels without
        # paying for code generation.
        checkpointed = torch.compile(checkpointed, backend="aot_eager")
    ref_leaves = _oracle_leaves(t)
    ref_loss = _oracle(name, t["positions"], *(ref_leaves[n] for n in LEAVES))
    want = torch.autograd.grad(ref_loss, [ref_leaves[n] for n in wanted])
    plain = torch.autograd.grad(loss_fn(t, *leaves), [t[n] for n in wanted])
    # The reentrant mode supports .backward() only (not torch.autograd.grad).
    checkpointed(*leaves).backward()
    for n, w, p in zip(wanted, want, plain):
        torch.testing.assert_close(p.cpu(), w, rtol=1e-12, atol=1e-12, msg=f"{n} (plain)")
        torch.testing.assert_close(t[n].grad.cpu(), w, rtol=1e-12, atol=1e-12, msg=n)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("name", list(CASES))
def test_double_backward_through_non_reentrant_checkpoint(name, device):
    # The gradient of <grad loss, h> (create_graph=True through the checkpoint), against the
    # oracle's: for a rotation that is R h with respect to the output weights; the norm adds
    # curvature in q, k and the weights.
    loss_fn, wanted = CASES[name]
    t = _setup(device)
    hs = {n: torch.randn_like(t[n]) for n in wanted}

    def second_derivatives(loss, leaves):
        grads = torch.autograd.grad(loss, [leaves[n] for n in wanted], create_graph=True)
        inner = sum((g * hs[n].to(g.device)).sum() for n, g in zip(wanted, grads))
        return torch.autograd.grad(inner, [leaves[n] for n in wanted], allow_unused=True)

    loss = checkpoint(lambda *a: loss_fn(t, *a), *(t[n] for n in LEAVES), use_reentrant=False)
    got = second_derivatives(loss, t)
    ref_leaves = _oracle_leaves(t)
    want = second_derivatives(
        _oracle(name, t["positions"], *(ref_leaves[n] for n in LEAVES)), ref_leaves
    )
    assert any(w is not None for w in want)  # the check below has something to compare
    for n, g, w in zip(wanted, got, want):
        if w is None:  # linear in that leaf alone
            assert g is None or torch.count_nonzero(g) == 0, n
        else:
            torch.testing.assert_close(g.cpu(), w, rtol=1e-10, atol=1e-10, msg=n)
