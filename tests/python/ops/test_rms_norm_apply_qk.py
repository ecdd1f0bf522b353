# SPDX-License-Identifier: BSD-3-Clause
"""rope.rms_norm_apply_qk (fused QK-RMSNorm + RoPE) against an independent float64 reference
written here from the math (RMSNorm over head_dim, then the rotation of each plane by
position * theta^(-2k / rotary_dim)), on every dtype, both pair layouts, partial rotary, GQA,
broadcast and multi-axis positions, weight_offset and strided inputs; its bf16 error against
Hugging Face's bf16 sequence; gradients, bad inputs, opcheck, torch.compile and torch.func."""

import math

import pytest
import torch
from helpers import cpu_and_cuda, dtype_id

import torch_rope

THETA = 10000.0
DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
# One rounding to the storage type plus float32 normalisation: about two ulps of the storage.
TOL = {
    torch.float64: dict(rtol=1e-12, atol=1e-12),
    torch.float32: dict(rtol=2e-5, atol=2e-5),
    torch.float16: dict(rtol=2e-3, atol=2e-3),
    torch.bfloat16: dict(rtol=1.6e-2, atol=1.6e-2),
}


# ---- the reference ----------------------------------------------------------------------------


def plane_axes(half, section, mrope_interleaved):
    """Axis of each plane: contiguous runs of `section`, or Qwen3-VL's interleaving."""
    if section is None:
        return [0] * half
    if mrope_interleaved:
        return [
            1
            if k % 3 == 1 and k < 3 * section[1]
            else 2
            if k % 3 == 2 and k < 3 * section[2]
            else 0
            for k in range(half)
        ]
    axes = []
    for a, s in enumerate(section):
        axes += [a] * s
    return axes


def reference(
    x,
    w,
    positions,
    rotary_dim,
    *,
    eps=1e-6,
    weight_offset=0.0,
    interleaved=True,
    inverse=False,
    section=None,
    mrope_interleaved=False,
):
    """float64: x / sqrt(mean(x^2) + eps) * (w + offset), then the rotation, on the CPU."""
    x = x.detach().cpu().double()
    w = w.detach().cpu().double()
    y = x / torch.sqrt(x.square().mean(-1, keepdim=True) + eps) * (w + weight_offset)
    half = rotary_dim // 2
    k = torch.arange(half, dtype=torch.float64)
    inv_freq = THETA ** (-2.0 * k / rotary_dim)
    p = positions.detach().cpu().to(torch.float64)
    if section is None:
        ang = p.unsqueeze(-1) * inv_freq  # (..., half)
    else:
        axes = torch.tensor(plane_axes(half, section, mrope_interleaved))
        ang = p[..., axes] * inv_freq  # positions (..., A): plane k takes its axis
    ang = ang.expand(*x.shape[:-1], half)
    if inverse:
        ang = -ang
    c, s = torch.cos(ang), torch.sin(ang)
    out = y.clone()
    if interleaved:
        a, b = y[..., 0:rotary_dim:2], y[..., 1:rotary_dim:2]
        out[..., 0:rotary_dim:2] = a * c - b * s
        out[..., 1:rotary_dim:2] = a * s + b * c
    else:
        a, b = y[..., :half], y[..., half:rotary_dim]
        out[..., :half] = a * c - b * s
        out[..., half:rotary_dim] = a * s + b * c
    return out


def tables(max_seq_len, rotary_dim, device, dtype=torch.float32):
    return torch_rope.rope_tables(THETA, rotary_dim, max_seq_len, device=device, dtype=dtype)


def weight(head_dim, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (1.0 + 0.5 * torch.randn(head_dim, generator=g)).to(dtype).to(device)


# ---- correctness --------------------------------------------------------------------------------

# (name, q shape, k shape, positions builder, rotary_dim or None for head_dim, mrope)
CASES = [
    (
        "bshd_decode",
        (2, 1, 4, 64),
        (2, 1, 2, 64),
        lambda: torch.tensor([[7], [40]]).view(2, 1, 1),
        None,
        None,
    ),
    ("bhsd_partial", (2, 4, 5, 64), (2, 2, 5, 64), lambda: torch.arange(5) + 3, 32, None),
    ("packed_gqa_odd_tail", (6, 4, 72), (6, 1, 72), lambda: torch.arange(6).view(6, 1), 48, None),
    (
        "mrope",
        (2, 3, 5, 64),
        (2, 1, 5, 64),
        lambda: torch.randint(0, 60, (2, 1, 5, 3)),
        None,
        ([8, 12, 12], False),
    ),
    (
        "mrope_interleaved",
        (1, 4, 6, 96),
        (1, 2, 6, 96),
        lambda: torch.randint(0, 60, (6, 3)),
        64,
        ([10, 11, 11], True),
    ),
]


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "half_split"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_matches_reference(device, dtype, interleaved, case):
    _, q_shape, k_shape, make_positions, rotary_dim, mrope = case
    torch.manual_seed(0)
    head_dim = q_shape[-1]
    rotary_dim = rotary_dim or head_dim
    q = (3.0 * torch.randn(q_shape)).to(dtype).to(device)
    k = (0.2 * torch.randn(k_shape)).to(dtype).to(device)
    qw = weight(head_dim, dtype, device, 1)
    kw = weight(head_dim, torch.float32, device, 2)  # any floating dtype, not necessarily q's
    cos, sin = tables(
        64, rotary_dim, device, torch.float64 if dtype == torch.float64 else torch.float32
    )
    positions = make_positions().to(device)
    section, mi = mrope if mrope else (None, False)
    for inverse, eps, offset in [(False, 1e-6, 0.0), (True, 0.5, 1.0)]:
        q_out, k_out = torch_rope.rms_norm_apply_qk(
            q,
            k,
            qw,
            kw,
            cos,
            sin,
            positions,
            eps=eps,
            weight_offset=offset,
            interleaved=interleaved,
            inverse=inverse,
            mrope_section=section,
            mrope_interleaved=mi,
        )
        assert q_out.dtype == dtype and k_out.dtype == dtype
        assert q_out.shape == q.shape and k_out.shape == k.shape and q_out.is_contiguous()
        kw_eff = kw.to(torch.float64 if dtype == torch.float64 else torch.float32)
        for got, x, w in ((q_out, q, qw), (k_out, k, kw_eff)):
            want = reference(
                x,
                w,
                positions,
                rotary_dim,
                eps=eps,
                weight_offset=offset,
                interleaved=interleaved,
                inverse=inverse,
                section=section,
                mrope_interleaved=mi,
            )
            torch.testing.assert_close(got.cpu().double(), want.to(dtype).double(), **TOL[dtype])


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_strided_qkv_slices(device, dtype):
    # q and k sliced out of a fused qkv projection: last-dim stride 1, rows strided.
    torch.manual_seed(1)
    B, S, Hq, Hk, D = 2, 5, 4, 2, 64
    qkv = torch.randn(B, S, (Hq + 2 * Hk) * D).to(dtype).to(device)
    q = qkv[..., : Hq * D].view(B, S, Hq, D)
    k = qkv[..., Hq * D : (Hq + Hk) * D].view(B, S, Hk, D)
    assert not q.is_contiguous()
    qw, kw = weight(D, dtype, device, 3), weight(D, dtype, device, 4)
    cos, sin = tables(32, D, device)
    positions = (torch.arange(S) + 4).view(S, 1).to(device)
    before = qkv.clone()
    q_out, k_out = torch_rope.rms_norm_apply_qk(
        q, k, qw, kw, cos, sin, positions, interleaved=False
    )
    assert torch.equal(qkv, before)
    tol = TOL[dtype] if dtype != torch.float64 else TOL[torch.float32]  # float32 tables
    for got, x, w in ((q_out, q, qw), (k_out, k, kw)):
        want = reference(x, w, positions, D, interleaved=False)
        torch.testing.assert_close(got.cpu().double(), want.to(dtype).double(), **tol)
    # A non-unit last-dim stride (copied once) and a strided weight.
    qt = torch.randn(B, S, Hq, D, 2).to(dtype).to(device)[..., 0]
    w_strided = torch.randn(2 * D).to(device)[::2]
    got, _ = torch_rope.rms_norm_apply_qk(qt, k, w_strided, kw, cos, sin, positions)
    want = reference(qt, w_strided.float(), positions, D)
    torch.testing.assert_close(got.cpu().double(), want.to(dtype).double(), **tol)


def test_empty_inputs():
    cos, sin = tables(8, 16, "cpu")
    q = torch.empty(0, 4, 16)
    k = torch.randn(3, 2, 16)
    w = torch.ones(16)
    positions = torch.zeros(1, 1, dtype=torch.long)
    q_out, k_out = torch_rope.rms_norm_apply_qk(q, k, w, w, cos, sin, positions)
    assert q_out.shape == q.shape
    want = reference(k, w, positions, 16).float()
    torch.testing.assert_close(k_out, want, rtol=2e-5, atol=2e-5)


def test_matches_unfused_sequence_fp32():
    # The op is torch's RMSNorm followed by rope.apply_qk, in one pass.
    torch.manual_seed(2)
    q, k = torch.randn(2, 3, 4, 128), torch.randn(2, 3, 2, 128)
    qw, kw = torch.randn(128), torch.randn(128)
    cos, sin = tables(16, 128, "cpu")
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
    cos, sin = tables(4096, D, "cpu")
    positions = torch.randint(0, 4096, (S,)).view(S, 1)
    want = reference(x, w, positions, D, interleaved=False)
    ours, _ = torch_rope.rms_norm_apply_qk(x, x, w, w, cos, sin, positions, interleaved=False)
    hf = _hf_bf16(x, w, cos, sin, positions, 1e-6)
    err_ours = (ours.double() - want).abs()
    err_hf = (hf.double() - want).abs()
    assert err_ours.max() <= err_hf.max()
    assert err_ours.mean() <= err_hf.mean()


# ---- gradients ----------------------------------------------------------------------------------


@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "half_split"])
@pytest.mark.parametrize(
    "rotary_dim,offset,mrope",
    [(8, 0.0, None), (6, 1.0, None), (8, 0.5, ([1, 2, 1], False))],
    ids=["full", "partial_gemma", "mrope"],
)
def test_gradcheck(interleaved, rotary_dim, offset, mrope):
    torch.manual_seed(4)
    D = 8
    q = torch.randn(2, 3, 2, D, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 3, 1, D, dtype=torch.float64, requires_grad=True)
    qw = torch.randn(D, dtype=torch.float64, requires_grad=True)
    kw = torch.randn(D, dtype=torch.float64, requires_grad=True)
    cos, sin = tables(16, rotary_dim, "cpu", torch.float64)
    section, mi = mrope if mrope else (None, False)
    positions = torch.randint(0, 16, (3, 1, 3) if mrope else (3, 1))

    def f(q, k, qw, kw):
        return torch.ops.rope.rms_norm_apply_qk(
            q,
            k,
            qw,
            kw,
            cos,
            sin,
            positions,
            eps=0.1,
            weight_offset=offset,
            interleaved=interleaved,
            mrope_section=section,
            mrope_interleaved=mi,
        )

    assert torch.autograd.gradcheck(f, (q, k, qw, kw))
    # Double backward: the backward is a composite of differentiable ops.
    assert torch.autograd.gradgradcheck(f, (q, k, qw, kw))


def test_grad_of_one_output_only_and_dtype_of_weight_grad():
    q = torch.randn(2, 4, 16, requires_grad=True)
    k = torch.randn(2, 2, 16)
    qw = torch.randn(16, dtype=torch.bfloat16, requires_grad=True)
    kw = torch.randn(16)
    cos, sin = tables(8, 16, "cpu")
    q_out, k_out = torch_rope.rms_norm_apply_qk(
        q, k, qw, kw, cos, sin, torch.zeros(1, dtype=torch.long)
    )
    assert q_out.requires_grad and not k_out.requires_grad
    q_out.sum().backward()
    assert q.grad.shape == q.shape and qw.grad.dtype == torch.bfloat16


def test_forward_ad_is_refused():
    import torch.autograd.forward_ad as fwAD

    cos, sin = tables(8, 16, "cpu")
    q, k, w = torch.randn(2, 16), torch.randn(2, 16), torch.ones(16)
    with fwAD.dual_level():
        dq = fwAD.make_dual(q, torch.randn_like(q))
        with pytest.raises(RuntimeError, match="forward-mode automatic differentiation"):
            torch.ops.rope.rms_norm_apply_qk(dq, k, w, w, cos, sin, torch.arange(2))


# ---- bad inputs ---------------------------------------------------------------------------------


def _good(device="cpu"):
    torch.manual_seed(5)
    q, k = torch.randn(2, 4, 3, 16, device=device), torch.randn(2, 2, 3, 16, device=device)
    w = torch.ones(16, device=device)
    cos, sin = tables(8, 16, device)
    return dict(
        q=q,
        k=k,
        q_weight=w,
        k_weight=w.clone(),
        cos=cos,
        sin=sin,
        positions=torch.arange(3, device=device),
    )


BAD = [
    (
        "q_weight wrong shape",
        dict(q_weight=torch.ones(8)),
        {},
        r"q_weight must have shape \(head_dim,\) = \(16,\)",
    ),
    ("k_weight 2-D", dict(k_weight=torch.ones(1, 16)), {}, "k_weight must be 1-D"),
    (
        "q_weight integer",
        dict(q_weight=torch.ones(16, dtype=torch.long)),
        {},
        "q_weight must be a floating tensor",
    ),
    (
        "q_weight on meta",
        dict(q_weight=torch.ones(16, device="meta")),
        {},
        "q_weight and q must be on the same device",
    ),
    ("eps zero", {}, dict(eps=0.0), "eps must be a finite number > 0, got 0"),
    ("eps negative", {}, dict(eps=-1e-6), "eps must be a finite number > 0"),
    ("eps nan", {}, dict(eps=math.nan), "eps must be a finite number > 0"),
    # eps is added to mean(x^2) in float32 for float32/16-bit inputs: it must stay a normal float32
    # (1e-300 rounds to 0 there, and an all-zero row would give NaN).
    (
        "eps 0 in float32",
        {},
        dict(eps=1e-300),
        r"eps must be a normal float32 number, in \[1\.17549e-38, 3\.40282e\+38\], for Float "
        r"inputs .*got 1e-300",
    ),
    ("eps subnormal in float32", {}, dict(eps=1e-40), r"normal float32 number.*got 1e-40"),
    ("eps inf in float32", {}, dict(eps=1e39), r"normal float32 number.*got 1e\+39"),
    (
        "eps 0 in float32 for bfloat16",
        dict(q=torch.zeros(2, 4, 3, 16).bfloat16(), k=torch.zeros(2, 2, 3, 16).bfloat16()),
        dict(eps=1e-300),
        r"normal float32 number, .* for BFloat16 inputs",
    ),
    (
        "eps subnormal in float64",
        dict(q=torch.zeros(2, 4, 3, 16).double(), k=torch.zeros(2, 2, 3, 16).double()),
        dict(eps=1e-310),
        r"eps must be a normal float64 number, >= 2\.22507e-308 .*got 1e-310",
    ),
    ("offset inf", {}, dict(weight_offset=math.inf), "weight_offset must be finite"),
    ("position out of range", dict(positions=torch.tensor([0, 1, 8])), {}, "positions must be in"),
    ("head_dim mismatch", dict(k=torch.randn(2, 2, 3, 24)), {}, "same head_dim"),
    ("bad section", {}, dict(mrope_section=[1, 2]), "sum"),
]


@pytest.mark.parametrize("name,tensors,kwargs,match", BAD, ids=[b[0] for b in BAD])
def test_bad_inputs_raise_and_write_nothing(name, tensors, kwargs, match):
    args = _good()
    args.update(tensors)
    before = {n: t.clone() for n, t in args.items() if t.device.type != "meta"}
    with pytest.raises((RuntimeError, IndexError, ValueError), match=match):
        torch.ops.rope.rms_norm_apply_qk(*args.values(), **kwargs)
    for n, t in before.items():
        assert torch.equal(args[n], t), n
    # Meta rejects exactly what CPU rejects (the position range needs data: CPU only).
    if name not in ("position out of range", "q_weight on meta"):
        meta = {n: t.to("meta") for n, t in args.items()}
        with pytest.raises((RuntimeError, ValueError), match=match):
            torch.ops.rope.rms_norm_apply_qk(*meta.values(), **kwargs)


@pytest.mark.parametrize(
    "dtype,eps",
    [(torch.float32, 1.2e-38), (torch.bfloat16, 1.2e-38), (torch.float64, 1e-300)],
    ids=["float32", "bfloat16", "float64"],
)
def test_smallest_accepted_eps_keeps_a_zero_row_zero(dtype, eps):
    # The edge of the eps rule: an all-zero row is 0 * 1 / sqrt(eps), not NaN, through the
    # wrapper and its gradient (the backward recomputes the norm in the same math type).
    args = _good()
    q = torch.zeros(2, 4, 3, 16, dtype=dtype, requires_grad=True)
    k = torch.randn(2, 2, 3, 16, dtype=dtype, requires_grad=True)
    args.update(q=q, k=k)
    if dtype == torch.float64:
        args["cos"], args["sin"] = tables(8, 16, "cpu", torch.float64)
    q_out, k_out = torch_rope.rms_norm_apply_qk(*args.values(), eps=eps)
    assert torch.equal(q_out, torch.zeros_like(q_out))
    (q_out.sum() + k_out.sum()).backward()
    assert torch.isfinite(q.grad).all() and torch.isfinite(k.grad).all()


def test_meta_shapes():
    args = {n: t.to("meta") for n, t in _good().items()}
    q_out, k_out = torch.ops.rope.rms_norm_apply_qk(*args.values())
    assert q_out.shape == (2, 4, 3, 16) and k_out.shape == (2, 2, 3, 16) and q_out.is_meta


# ---- opcheck, compile, torch.func ---------------------------------------------------------------


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("mrope", [False, True])
def test_opcheck(device, mrope):
    args = _good(device)
    for t in ("q", "k", "q_weight", "k_weight"):
        args[t] = args[t].double().requires_grad_()
    args["cos"], args["sin"] = tables(8, 16, device, torch.float64)
    kwargs = dict(eps=1e-5, weight_offset=1.0, interleaved=False)
    if mrope:
        args["positions"] = torch.randint(0, 8, (3, 2), device=device)
        kwargs.update(mrope_section=[4, 4])
    torch.library.opcheck(torch.ops.rope.rms_norm_apply_qk.default, tuple(args.values()), kwargs)


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_compile_fullgraph(device):
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
    # Forward and backward through the fake kernel and the autograd formula.
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
    cos, sin = tables(8, 16, "cpu", torch.float64)
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
