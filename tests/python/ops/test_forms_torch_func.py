# SPDX-License-Identifier: BSD-3-Clause
"""torch.func through the torch_rope API for the frequency and packed-sequence forms (grad, vjp,
jvp, vmap, jacrev, jacfwd), against the same transforms of the positions form given the positions
each form stands for; the raw overloads' vmap rules; and the raw ops' refusal of grad/jvp."""

import pytest
import references as ref
import torch
from helpers import make_tables, needs_torch

import torch_rope

CU = torch.tensor([0, 4, 4, 9])
OFFSETS = torch.tensor([2, 0, 100])
POSITIONS = ref.packed_positions(CU, OFFSETS)  # (9,)


def _forms():
    """(name, call(x) in the form, call(x) given positions) pairs, float64."""
    cos, sin = make_tables(256, 8, "cpu", torch.float64)
    freqs = ref.inv_freq(8, 5e5)
    p = POSITIONS.view(9, 1)
    return {
        "freqs": (
            lambda x: torch_rope.apply(x, freqs=freqs, positions=p + 2**33, attention_factor=0.9),
            lambda x: torch_rope.apply(x, freqs=freqs, positions=p + 2**33, attention_factor=0.9),
        ),
        "varlen": (
            lambda x: torch_rope.apply(x, cos, sin, cu_seqlens=CU, seq_offsets=OFFSETS),
            lambda x: torch_rope.apply(x, cos, sin, p),
        ),
        "freqs_varlen": (
            lambda x: torch_rope.apply(
                x, freqs=freqs, cu_seqlens=CU, seq_offsets=OFFSETS, interleaved=False
            ),  # fmt: skip
            lambda x: torch_rope.apply(x, freqs=freqs, positions=p, interleaved=False),
        ),
    }


@pytest.mark.parametrize("form", ["freqs", "varlen", "freqs_varlen"])
def test_grad_vjp_jvp_jacobians_match_the_positions_form(form):
    call, reference = _forms()[form]
    x = torch.randn(9, 2, 10, dtype=torch.float64)
    t = torch.randn_like(x)
    g = torch.func.grad(lambda v: (call(v) ** 2).sum())(x)
    assert torch.equal(g, torch.func.grad(lambda v: (reference(v) ** 2).sum())(x))
    out, vjp = torch.func.vjp(call, x)
    assert torch.equal(vjp(t)[0], torch.func.vjp(reference, x)[1](t)[0])
    _, tangent = torch.func.jvp(call, (x,), (t,))
    assert torch.equal(tangent, torch.func.jvp(reference, (x,), (t,))[1])
    small = x[:, :1, :]
    assert torch.equal(torch.func.jacrev(call)(small), torch.func.jacrev(reference)(small))
    assert torch.equal(torch.func.jacfwd(call)(small), torch.func.jacfwd(reference)(small))


@pytest.mark.parametrize("form", ["freqs", "varlen", "freqs_varlen"])
def test_vmap_over_x_matches_a_loop(form):
    call, _ = _forms()[form]
    xs = torch.randn(3, 9, 2, 10, dtype=torch.float64)
    got = torch.func.vmap(call)(xs)
    assert torch.equal(got, torch.stack([call(x) for x in xs]))


@pytest.mark.parametrize("form", ["freqs", "varlen", "freqs_varlen"])
def test_inplace_and_qk_under_grad_and_vmap(form):
    cos, sin = make_tables(256, 8, "cpu", torch.float64)
    angles = {"freqs": {"freqs": ref.inv_freq(8)}, "varlen": {"cos": cos, "sin": sin},
              "freqs_varlen": {"freqs": ref.inv_freq(8)}}[form]  # fmt: skip
    where = (
        {"positions": POSITIONS.view(9, 1)}
        if form == "freqs"
        else {"cu_seqlens": CU, "seq_offsets": OFFSETS}
    )
    q = torch.randn(9, 2, 8, dtype=torch.float64)
    k = torch.randn(9, 1, 8, dtype=torch.float64)

    def qk_loss(q, k):
        a, b = torch_rope.apply_qk(q, k, **angles, **where)
        return (a * a).sum() + (b * b * 3).sum()

    gq, gk = torch.func.grad(qk_loss, argnums=(0, 1))(q, k)
    torch.testing.assert_close(gq, 2 * q, rtol=0, atol=1e-12)  # a rotation keeps norms
    torch.testing.assert_close(gk, 6 * k, rtol=0, atol=1e-12)

    def inplace(x):
        return torch_rope.apply_(x.clone(), **angles, **where)

    xs = torch.randn(3, 9, 2, 8, dtype=torch.float64)
    got = torch.func.vmap(inplace)(xs)
    want = torch.stack([torch_rope.apply(x, **angles, **where) for x in xs])
    assert torch.equal(got, want)
    q_out, k_out = torch.func.vmap(lambda a: torch_rope.apply_qk(a, k, **angles, **where))(xs)
    assert torch.equal(q_out, want)


@needs_torch("2.5", "torch.library.register_vmap")
def test_raw_overloads_vmap():
    freqs = ref.inv_freq(8)
    xs = torch.randn(4, 9, 2, 8)
    positions = torch.randint(0, 2**40, (4, 9, 1))
    got = torch.func.vmap(torch.ops.rope.apply.freqs, in_dims=(0, None, 0))(xs, freqs, positions)
    want = torch.stack([torch.ops.rope.apply.freqs(x, freqs, p) for x, p in zip(xs, positions)])
    assert torch.equal(got, want)
    got = torch.func.vmap(torch.ops.rope.apply.freqs_varlen, in_dims=(0, None, None))(xs, freqs, CU)
    want = torch.stack([torch.ops.rope.apply.freqs_varlen(x, freqs, CU) for x in xs])
    assert torch.equal(got, want)
    cos, sin = make_tables(64, 8, "cpu")
    got = torch.func.vmap(torch.ops.rope.apply.varlen, in_dims=(1, None, None, None))(
        xs.transpose(0, 1), cos, sin, CU
    )
    want = torch.stack([torch.ops.rope.apply.varlen(x, cos, sin, CU) for x in xs])
    assert torch.equal(got, want)


def test_raw_overloads_refuse_grad_and_point_to_the_api():
    x = torch.randn(9, 8, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="call torch_rope.apply"):
        raw = torch.ops.rope.apply.freqs
        torch.func.grad(lambda v: raw(v, ref.inv_freq(8), POSITIONS).sum())(x)
    with pytest.raises(RuntimeError, match="call torch_rope.apply_qk"):
        torch.func.grad(
            lambda v: torch.ops.rope.apply_qk.freqs_varlen(v, v, ref.inv_freq(8), CU)[0].sum()
        )(x)
