# SPDX-License-Identifier: BSD-3-Clause
"""rope.rms_norm_apply_qk (fused QK-RMSNorm + RoPE): what the shared machinery does not already
run. The sample matrix (samples.py, test_samples.py: the float64 oracle, gradients, gradcheck and
gradgradcheck, opcheck, torch.compile), the bad-call catalogue (test_errors.py) and the fuzz
(test_fuzz.py) take this op like every other; here: its geometries crossed with every dtype and
pair layout through the same builder and check, the contract with torch's RMSNorm followed by
apply_qk, its bf16 error against Hugging Face's bf16 sequence, gradient details, the smallest eps,
and compile / torch.func paths that need more than one call."""

import pytest
import references as ref
import torch
from helpers import FLOAT_DTYPES, LAYOUT_IDS, LAYOUTS, cpu_and_cuda, dtype_id, make_tables
from samples import rms_norm_sample

import torch_rope

# ---- every dtype and pair layout, through the sample matrix's builder and check ------------------

# (id, geometry, q heads, k heads, head_dim, rotary_dim, mrope, b, s): decode, partial rotary,
# packed GQA with an odd tail, multi-axis of both section layouts, fused-qkv slices, a last-dim
# stride with a strided weight.
GRID = [
    ("bshd_decode", "bshd_decode", 4, 2, 64, 64, None, 2, 1),
    ("bhsd_partial", "bhsd_S", 4, 2, 64, 32, None, 2, 5),
    ("packed_gqa_odd_tail", "packed_T1", 4, 1, 72, 48, None, 2, 3),
    ("mrope", "bhsd_B1S", 3, 1, 64, 64, ((8, 12, 12), False, False), 2, 5),
    ("mrope_interleaved", "bhsd_S", 4, 2, 96, 64, ((10, 11, 11), True, False), 1, 6),
    ("fused_qkv_slices", "fused_qkv_bshd", 4, 2, 64, 64, None, 2, 5),
    ("last_dim_strided_q", "last_dim_strided", 4, 2, 64, 64, None, 2, 5),
]
# (inverse, eps, weight_offset, weights): the defaults; and inverse with a large eps, Gemma's
# (1 + w) and a strided float32 q weight.
VARIANTS = [(False, 1e-6, 0.0, "float32_k"), (True, 0.5, 1.0, "strided")]


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("case", GRID, ids=[c[0] for c in GRID])
def test_matches_reference(device, dtype, interleaved, case):
    _, geometry, hq, hk, head_dim, rotary_dim, mrope, b, s = case
    for inverse, eps, offset, weights in VARIANTS:
        sample = rms_norm_sample(
            geometry, hq, hk, dtype, head_dim, rotary_dim, interleaved, inverse, "real", False,
            eps, offset, weights, mrope, device, b=b, s=s,
        )  # fmt: skip
        before = sample.snapshot()
        sample.check(sample.call(), before)


# ---- contracts with other implementations --------------------------------------------------------


def test_matches_unfused_sequence_fp32():
    # The op is torch's RMSNorm followed by rope.apply_qk, in one pass.
    torch.manual_seed(2)
    q, k = torch.randn(2, 3, 4, 128), torch.randn(2, 3, 2, 128)
    qw, kw = torch.randn(128), torch.randn(128)
    cos, sin = make_tables(16, 128, "cpu")
    positions = torch.arange(3).view(3, 1)
    fq, fk = torch_rope.rms_norm_apply_qk(q, k, qw, kw, cos, sin, positions, eps=1e-5)
    nq = torch.nn.functional.rms_norm(q, (128,), qw, eps=1e-5)
    nk = torch.nn.functional.rms_norm(k, (128,), kw, eps=1e-5)
    uq, uk = torch_rope.apply_qk(nq, nk, cos, sin, positions)
    torch.testing.assert_close(fq, uq, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fk, uk, rtol=1e-5, atol=1e-5)


def _hf_bf16(x, w, cos32, sin32, positions, eps):
    """Hugging Face's bf16 sequence: torch RMSNorm in bf16 (Qwen3RMSNorm: float32 inside, cast to
    bf16, times the bf16 weight), then rotate_half with cos/sin cast to bf16, all in bf16."""
    xf = x.float()
    n = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(torch.bfloat16) * w
    c = torch.cat([cos32, cos32], -1)[positions].to(torch.bfloat16)
    s = torch.cat([sin32, sin32], -1)[positions].to(torch.bfloat16)
    h = n.shape[-1] // 2
    rot = torch.cat([-n[..., h:], n[..., :h]], -1)
    return n * c + rot * s


def test_bf16_error_no_worse_than_hf():
    torch.manual_seed(3)
    B, S, H, D = 2, 64, 8, 128
    x = (2.0 * torch.randn(B, S, H, D)).to(torch.bfloat16)
    w = (1.0 + 0.3 * torch.randn(D)).to(torch.bfloat16)
    cos, sin = make_tables(4096, D, "cpu")
    positions = torch.randint(0, 4096, (S,)).view(S, 1)
    want = ref.rms_norm_rope_with_tables(
        x, w, cos, sin, positions, eps=1e-6, interleaved=False
    )  # fmt: skip
    ours, _ = torch_rope.rms_norm_apply_qk(x, x, w, w, cos, sin, positions, interleaved=False)
    hf = _hf_bf16(x, w, cos, sin, positions, 1e-6)
    err_ours = (ours.double() - want).abs()
    err_hf = (hf.double() - want).abs()
    assert err_ours.max() <= err_hf.max()
    assert err_ours.mean() <= err_hf.mean()


# ---- gradients -----------------------------------------------------------------------------------


def _good(device="cpu"):
    torch.manual_seed(5)
    q, k = torch.randn(2, 4, 3, 16, device=device), torch.randn(2, 2, 3, 16, device=device)
    w = torch.ones(16, device=device)
    cos, sin = make_tables(8, 16, device)
    return dict(
        q=q,
        k=k,
        q_weight=w,
        k_weight=w.clone(),
        cos=cos,
        sin=sin,
        positions=torch.arange(3, device=device),
    )


def test_grad_of_one_output_only_and_dtype_of_weight_grad():
    q = torch.randn(2, 4, 16, requires_grad=True)
    k = torch.randn(2, 2, 16)
    qw = torch.randn(16, dtype=torch.bfloat16, requires_grad=True)
    kw = torch.randn(16)
    cos, sin = make_tables(8, 16, "cpu")
    q_out, k_out = torch_rope.rms_norm_apply_qk(
        q, k, qw, kw, cos, sin, torch.zeros(1, dtype=torch.long)
    )
    assert q_out.requires_grad and not k_out.requires_grad
    q_out.sum().backward()
    assert q.grad.shape == q.shape and qw.grad.dtype == torch.bfloat16


def test_forward_ad_is_refused():
    import torch.autograd.forward_ad as fwAD

    cos, sin = make_tables(8, 16, "cpu")
    q, k, w = torch.randn(2, 16), torch.randn(2, 16), torch.ones(16)
    with fwAD.dual_level():
        dq = fwAD.make_dual(q, torch.randn_like(q))
        with pytest.raises(RuntimeError, match="forward-mode automatic differentiation"):
            torch.ops.rope.rms_norm_apply_qk(dq, k, w, w, cos, sin, torch.arange(2))


@pytest.mark.parametrize(
    "dtype,eps",
    [(torch.float32, 1.2e-38), (torch.bfloat16, 1.2e-38), (torch.float64, 1e-300)],
    ids=["float32", "bfloat16", "float64"],
)
def test_smallest_accepted_eps_keeps_a_zero_row_zero(dtype, eps):
    # The edge of the eps rule (its refusals are in test_errors.py): an all-zero row is
    # 0 * 1 / sqrt(eps), not NaN, through the wrapper and its gradient (the backward recomputes
    # the norm in the same math type).
    args = _good()
    q = torch.zeros(2, 4, 3, 16, dtype=dtype, requires_grad=True)
    k = torch.randn(2, 2, 3, 16, dtype=dtype, requires_grad=True)
    args.update(q=q, k=k)
    if dtype == torch.float64:
        args["cos"], args["sin"] = make_tables(8, 16, "cpu", torch.float64)
    q_out, k_out = torch_rope.rms_norm_apply_qk(*args.values(), eps=eps)
    assert torch.equal(q_out, torch.zeros_like(q_out))
    (q_out.sum() + k_out.sum()).backward()
    assert torch.isfinite(q.grad).all() and torch.isfinite(k.grad).all()


# ---- compile and torch.func paths ----------------------------------------------------------------


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_compile_fullgraph_keeps_one_node_and_differentiates(device):
    # test_samples.py compiles every sample's forward; here the graph holds the op as one node,
    # and the backward runs through the fake kernel and the autograd formula.
    torch._dynamo.reset()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def f(q, k, qw, kw, cos, sin, positions):
        q, k = torch_rope.rms_norm_apply_qk(q, k, qw, kw, cos, sin, positions, weight_offset=1.0)
        return (q * q.detach().cos()).sum() + k.square().sum()

    args = _good(device)
    compiled = torch.compile(f, backend=backend, fullgraph=True)
    torch.testing.assert_close(compiled(*args.values()), f(*args.values()))
    assert len(graphs) == 1
    assert any(n.target is torch.ops.rope.rms_norm_apply_qk.default for n in graphs[0].graph.nodes)
    torch._dynamo.reset()
    aot = torch.compile(f, backend="aot_eager", fullgraph=True)
    a = {n: (t.requires_grad_() if n in ("q", "k", "q_weight") else t) for n, t in args.items()}
    aot(*a.values()).backward()
    got = [a[n].grad.clone() for n in ("q", "k", "q_weight")]
    for n in ("q", "k", "q_weight"):
        a[n].grad = None
    f(*a.values()).backward()
    for g, n in zip(got, ("q", "k", "q_weight")):
        torch.testing.assert_close(g, a[n].grad, rtol=1e-5, atol=1e-5)


def test_compile_inductor():
    torch._dynamo.reset()
    args = _good()

    def f(q, k, qw, kw, cos, sin, positions):
        return torch_rope.rms_norm_apply_qk(q, k, qw, kw, cos, sin, positions, interleaved=False)

    compiled = torch.compile(f, fullgraph=True)
    for got, want in zip(compiled(*args.values()), f(*args.values())):
        torch.testing.assert_close(got, want)


def test_torch_func_grad_and_vmap():
    torch.manual_seed(6)
    cos, sin = make_tables(8, 16, "cpu", torch.float64)
    q = torch.randn(3, 2, 16, dtype=torch.float64)
    k = torch.randn(3, 1, 16, dtype=torch.float64)
    qw = torch.randn(16, dtype=torch.float64)
    kw = torch.randn(16, dtype=torch.float64)
    positions = torch.arange(3).view(3, 1)

    def loss(q, qw):
        a, b = torch_rope.rms_norm_apply_qk(q, k, qw, kw, cos, sin, positions, weight_offset=1.0)
        return (a.sum(-1) * b.sum(-1)).sum()

    gq, gw = torch.func.grad(loss, argnums=(0, 1))(q, qw)
    q2, qw2 = q.clone().requires_grad_(), qw.clone().requires_grad_()
    a, b = torch.ops.rope.rms_norm_apply_qk(q2, k, qw2, kw, cos, sin, positions, weight_offset=1.0)
    (a.sum(-1) * b.sum(-1)).sum().backward()
    torch.testing.assert_close(gq, q2.grad)
    torch.testing.assert_close(gw, qw2.grad)
    # vmap over a batch of q.
    qs = torch.randn(4, 3, 2, 16, dtype=torch.float64)
    out = torch.func.vmap(
        lambda x: torch_rope.rms_norm_apply_qk(x, k, qw, kw, cos, sin, positions)[0]
    )(qs)
    want = torch.ops.rope.rms_norm_apply_qk(qs, k, qw, kw, cos, sin, positions)[0]
    torch.testing.assert_close(out, want)
    # The raw op under a grad transform: a clear error naming the Python API.
    with pytest.raises(RuntimeError, match="call torch_rope.rms_norm_apply_qk"):
        torch.func.grad(
            lambda x: torch.ops.rope.rms_norm_apply_qk(x, k, qw, kw, cos, sin, positions)[0].sum()
        )(q)


# ---- layouts as stream rows ----------------------------------------------------------------------
# The op runs on the row streams, which take (tokens, heads, head_dim) rows: the dims where
# positions vary become the tokens, the rest the heads (csrc/common_stream_layout.h), and where
# that does not merge, positions are expanded over the leading dims, or q and k go in two calls.
# Each case below takes one of those paths; all are held to the float64 oracle.
def _layout_case(name):
    g = torch.Generator().manual_seed(11)
    b, s, hq, hk, d = 2, 5, 4, 2, 32

    def rand(*shape):
        return torch.randn(*shape, generator=g)

    def ints(*shape):
        return torch.randint(0, 40, shape, generator=g)

    if name == "bshd_positions_per_sequence":  # tokens (B, S) merge: direct
        return rand(b, s, hq, d), rand(b, s, hk, d), ints(b, s, 1)
    if name == "bshd_positions_shared_over_batch":  # B broadcasts apart from H: expanded
        return rand(b, s, hq, d), rand(b, s, hk, d), ints(s, 1)
    if name == "bhsd_positions_shared":  # heads (B, H) before the tokens S: direct
        return rand(b, hq, s, d), rand(b, hk, s, d), ints(s)
    if name == "bhsd_positions_per_sequence":  # q and k cannot share a token count: two calls
        return rand(b, hq, s, d), rand(b, hk, s, d), ints(b, 1, s)
    if name == "positions_per_head":  # every row its own position: tokens (S, H)
        return rand(s, hq, d), rand(s, hq, d), ints(s, hq)
    if name == "one_position_for_all":  # a 0-d position: the outer dims become the tokens
        return rand(b, 1, hq, d), rand(b, 1, hk, d), torch.tensor(7)
    if name == "positions_strided":  # a non-contiguous positions view
        return rand(b, s, hq, d), rand(b, s, hk, d), ints(b, 2 * s, 1)[:, ::2]
    if name == "q_heads_first_k_tokens_first":
        return rand(b, hq, s, d).transpose(1, 2), rand(b, s, hk, d), ints(b, s, 1)
    if name == "q_strided_rows":  # q's heads a slice of a wider buffer: its dims do not merge
        return rand(b, s, 2 * hq, d)[:, :, ::2], rand(b, s, hk, d), ints(s, 1)
    raise AssertionError(name)


LAYOUT_CASES = [
    "bshd_positions_per_sequence",
    "bshd_positions_shared_over_batch",
    "bhsd_positions_shared",
    "bhsd_positions_per_sequence",
    "positions_per_head",
    "one_position_for_all",
    "positions_strided",
    "q_heads_first_k_tokens_first",
    "q_strided_rows",
]


@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("name", LAYOUT_CASES)
def test_layouts_as_stream_rows(name, interleaved):
    q, k, positions = _layout_case(name)
    d = q.size(-1)
    cos, sin = make_tables(40, d, "cpu", torch.float32)
    qw = 1.0 + 0.25 * torch.randn(d, generator=torch.Generator().manual_seed(3))
    kw = 1.0 - 0.25 * torch.randn(d, generator=torch.Generator().manual_seed(4))
    q_out, k_out = torch_rope.rms_norm_apply_qk(
        q, k, qw, kw, cos, sin, positions, eps=1e-5, interleaved=interleaved
    )
    for name_, x, w, out in (("q", q, qw, q_out), ("k", k, kw, k_out)):
        want = ref.rms_norm_rope_with_tables(
            x, w, cos, sin, positions, eps=1e-5, interleaved=interleaved
        )
        assert out.shape == x.shape and out.is_contiguous(), name_
        # float32 math, rounded once: a few ulps of the row's scale.
        torch.testing.assert_close(out.double(), want, rtol=2e-6, atol=2e-6, msg=name_)
