# SPDX-License-Identifier: BSD-3-Clause
"""torch_rope.compat's FlashInfer table-free entry points (apply_rope, apply_rope_pos_ids,
apply_llama31_rope, apply_llama31_rope_pos_ids and their _inplace variants), against a float64
reference written here from FlashInfer's documented semantics (never torch_rope itself):

* q ``(nnz, Hq, D)``, k ``(nnz, Hk, D)``; the first ``rotary_dim`` (default D) features of each
  head rotate, the rest pass through; ``interleave=False`` rotates ``(k, k + R/2)``, ``True``
  ``(2k, 2k + 1)``.
* Plane ``j`` turns by ``position * f_j`` with ``f_j = rope_theta^(-2j/R)`` and
  ``f_j' = (1 - s_j) f_j / rope_scale + s_j f_j``, ``s_j = clamp(f_j A + B, 0, 1)``: ``A = B = 0``
  for apply_rope (rope_scale divides the frequency), ``A = old_context_len / (2 pi (high - low))``,
  ``B = -1 / (high / low - 1)`` for the Llama 3.1 ops.
* Positions: ``offsets[b] + (t - indptr[b])`` for row ``t`` of sequence ``b``, or ``pos_ids[t]``.
* The plain names return ``(q_rope, k_rope)`` and leave q and k alone; ``_inplace`` writes q and k
  and returns None.
"""

import inspect
import math

import pytest
import torch
from helpers import TOLERANCES, cpu_and_cuda, dtype_id

import torch_rope.compat as compat

DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
LAYOUTS = pytest.mark.parametrize("interleave", [False, True], ids=["half_split", "adjacent"])
INPLACE = pytest.mark.parametrize("inplace", [False, True], ids=["out_of_place", "inplace"])


def frequencies(rotary_dim, rope_theta, rope_scale, llama31=None):
    """FlashInfer's per-plane frequency, in float64. ``llama31``: (low, high, old_context_len)."""
    out = []
    for j in range(rotary_dim // 2):
        f = rope_theta ** (-2.0 * j / rotary_dim)
        a = b = 0.0
        if llama31 is not None:
            low, high, old = llama31
            a = old / (2 * math.pi * (high - low))
            b = -1.0 / (high / low - 1)
        s = min(max(f * a + b, 0.0), 1.0)
        out.append((1 - s) * f / rope_scale + s * f)
    return torch.tensor(out, dtype=torch.float64)


def rotate(x, positions, freqs, interleave):
    """x (nnz, H, D) float64 at positions (nnz,), planes of the first 2 len(freqs) features."""
    x = x.detach().cpu().double().clone()
    angle = positions.cpu().double().view(-1, 1, 1) * freqs.view(1, 1, -1)  # (nnz, 1, R/2)
    c, s = torch.cos(angle), torch.sin(angle)
    half = freqs.numel()
    if interleave:
        ia, ib = torch.arange(0, 2 * half, 2), torch.arange(1, 2 * half, 2)
    else:
        ia, ib = torch.arange(half), torch.arange(half, 2 * half)
    xa, xb = x[..., ia].clone(), x[..., ib].clone()
    x[..., ia] = xa * c - xb * s
    x[..., ib] = xa * s + xb * c
    return x


def ragged_positions(indptr, offsets):
    ip, off = indptr.tolist(), offsets.tolist()
    rows = [(b, t) for b in range(len(off)) for t in range(ip[b], ip[b + 1])]
    return torch.tensor([off[b] + t - ip[b] for b, t in rows])


def assert_close_to(got, want):
    torch.testing.assert_close(got.cpu(), want.to(got.dtype), **TOLERANCES[got.dtype])


def run(name, inplace, q, k, *args, **kw):
    """Call ``name`` or ``name_inplace``; return the rotated (q, k) after checking the return
    convention (new tensors and inputs untouched, or None and inputs written)."""
    if inplace:
        assert getattr(compat, name + "_inplace")(q, k, *args, **kw) is None
        return q, k
    q0, k0 = q.clone(), k.clone()
    q_rope, k_rope = getattr(compat, name)(q, k, *args, **kw)
    assert q_rope.data_ptr() != q.data_ptr() and k_rope.data_ptr() != k.data_ptr()
    assert torch.equal(q, q0) and torch.equal(k, k0)
    assert q_rope.shape == q.shape and k_rope.shape == k.shape and q_rope.dtype == q.dtype
    return q_rope, k_rope


INDPTR = [0, 3, 3, 4, 9]  # four sequences, one of them empty, one of length 1
OFFSETS = [0, 5, 2, 17]


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@LAYOUTS
@INPLACE
@pytest.mark.parametrize("rotary_dim", [None, 10], ids=["full", "partial"])
@pytest.mark.parametrize("rope_scale,rope_theta", [(1, 1e4), (4.0, 5e5)], ids=["plain", "scaled"])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
def test_apply_rope(
    dtype, interleave, inplace, rotary_dim, rope_scale, rope_theta, index_dtype, device
):
    q = torch.randn(9, 4, 16, dtype=dtype, device=device)
    k = torch.randn(9, 2, 16, dtype=dtype, device=device)  # GQA: fewer key heads
    indptr = torch.tensor(INDPTR, dtype=index_dtype, device=device)
    offsets = torch.tensor(OFFSETS, dtype=index_dtype, device=device)
    freqs = frequencies(rotary_dim or 16, rope_theta, rope_scale)
    positions = ragged_positions(indptr, offsets)
    want_q, want_k = (rotate(t, positions, freqs, interleave) for t in (q, k))
    got_q, got_k = run("apply_rope", inplace, q, k, indptr, offsets, rotary_dim, interleave,
                       rope_scale, rope_theta)  # fmt: skip
    assert_close_to(got_q, want_q)
    assert_close_to(got_k, want_k)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@LAYOUTS
@INPLACE
@pytest.mark.parametrize("rotary_dim", [None, 8], ids=["full", "partial"])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
def test_apply_rope_pos_ids(dtype, interleave, inplace, rotary_dim, index_dtype, device):
    q = torch.randn(6, 3, 16, dtype=dtype, device=device)
    k = torch.randn(6, 1, 16, dtype=dtype, device=device)
    pos_ids = torch.tensor([7, 0, 3, 3, 1000, 65], dtype=index_dtype, device=device)
    freqs = frequencies(rotary_dim or 16, 1e4, 2.0)
    want_q, want_k = (rotate(t, pos_ids, freqs, interleave) for t in (q, k))
    got_q, got_k = run("apply_rope_pos_ids", inplace, q, k, pos_ids, rotary_dim=rotary_dim,
                       interleave=interleave, rope_scale=2.0)  # fmt: skip
    assert_close_to(got_q, want_q)
    assert_close_to(got_k, want_k)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@LAYOUTS
@INPLACE
@pytest.mark.parametrize("pos_ids", [False, True], ids=["indptr", "pos_ids"])
def test_apply_llama31_rope(dtype, interleave, inplace, pos_ids, device):
    # R = 16 with theta 5e5 and the defaults (scale 8, low 1, high 4, old 8192): planes 0-3 keep
    # their frequency, plane 4 is smoothed, planes 5-7 are divided by 8.
    q = torch.randn(9, 2, 16, dtype=dtype, device=device)
    k = torch.randn(9, 2, 16, dtype=dtype, device=device)
    freqs = frequencies(16, 5e5, 8.0, llama31=(1.0, 4.0, 8192))
    if pos_ids:
        positions = torch.tensor([0, 1, 2, 9, 4000, 8191, 8192, 70000, 5], device=device)
        args = (positions,)
    else:
        indptr = torch.tensor(INDPTR, device=device)
        offsets = torch.tensor([0, 5, 2, 30000], device=device)
        positions = ragged_positions(indptr, offsets)
        args = (indptr, offsets)
    want_q, want_k = (rotate(t, positions, freqs, interleave) for t in (q, k))
    name = "apply_llama31_rope_pos_ids" if pos_ids else "apply_llama31_rope"
    got_q, got_k = run(name, inplace, q, k, *args, interleave=interleave)
    assert_close_to(got_q, want_q)
    assert_close_to(got_k, want_k)


def test_llama31_parameters_are_used():
    # Non-default factors and context length, partial rotary; a wrapper that ignored any of them
    # (or read rope_scale as a multiplier) gives other angles.
    q = torch.randn(5, 1, 32, dtype=torch.float64)
    k = torch.randn(5, 1, 32, dtype=torch.float64)
    pos_ids = torch.tensor([3, 100, 2000, 50000, 7])
    for low, high, old, scale in [(1.0, 4.0, 8192, 8.0), (2.0, 3.0, 1024, 16.0), (1, 8, 200, 2)]:
        kw = dict(rotary_dim=24, rope_scale=scale, rope_theta=1e5, low_freq_factor=low,
                  high_freq_factor=high, old_context_len=old)  # fmt: skip
        freqs = frequencies(24, 1e5, float(scale), llama31=(float(low), float(high), old))
        q_rope, k_rope = compat.apply_llama31_rope_pos_ids(q, k, pos_ids, **kw)
        # 1e-10: an ulp of a float64 frequency (two pow routes) times position 50000.
        torch.testing.assert_close(q_rope, rotate(q, pos_ids, freqs, False), rtol=0, atol=1e-10)
        torch.testing.assert_close(k_rope, rotate(k, pos_ids, freqs, False), rtol=0, atol=1e-10)
        torch.testing.assert_close(q_rope[..., 24:], q[..., 24:], rtol=0, atol=0)


def test_rope_scale_divides_positions_worked_example():
    # One plane, theta irrelevant (f_0 = 1): rope_scale 4 turns position 8 by 8 / 4 = 2 radians.
    q = torch.tensor([[[1.0, 0.0]]], dtype=torch.float64)
    k = q.clone()
    q_rope, _ = compat.apply_rope_pos_ids(q, k, torch.tensor([8]), rope_scale=4)
    torch.testing.assert_close(q_rope.view(2), torch.tensor([math.cos(2.0), math.sin(2.0)],
                                                            dtype=torch.float64))  # fmt: skip


def test_out_of_place_is_differentiable():
    # FlashInfer has no backward; these wrappers do (the inverse rotation), which the reference
    # differentiated agrees with.
    q = torch.randn(4, 2, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(4, 1, 8, dtype=torch.float64, requires_grad=True)
    pos_ids = torch.tensor([0, 5, 9, 2])
    gq, gk = torch.randn_like(q), torch.randn_like(k)
    q_rope, k_rope = compat.apply_rope_pos_ids(q, k, pos_ids)
    got = torch.autograd.grad((q_rope, k_rope), (q, k), (gq, gk))
    freqs = frequencies(8, 1e4, 1.0)
    want_q, want_k = (rotate(t, pos_ids, freqs, False) for t in (q, k))
    q0, k0 = q.detach().requires_grad_(), k.detach().requires_grad_()

    def ref(t):  # the reference again, differentiable this time
        angle = pos_ids.double().view(-1, 1, 1) * freqs
        a, b = t[..., :4], t[..., 4:]
        return torch.cat([a * angle.cos() - b * angle.sin(), a * angle.sin() + b * angle.cos()], -1)

    torch.testing.assert_close(ref(q0), want_q)
    want = torch.autograd.grad((ref(q0), ref(k0)), (q0, k0), (gq, gk))
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])


def _bad(name, **overrides):
    def call():
        q = overrides.pop("q", None)
        q = torch.randn(9, 2, 16) if q is None else q
        k = overrides.pop("k", None)
        k = torch.randn(9, 1, 16) if k is None else k
        if "pos_ids" in name:
            args = (overrides.pop("pos_ids", torch.arange(9)),)
        else:
            args = (
                overrides.pop("indptr", torch.tensor(INDPTR)),
                overrides.pop("offsets", torch.tensor(OFFSETS)),
            )
        before = (q.clone(), k.clone())
        try:
            getattr(compat, name)(q, k, *args, **overrides)
        finally:
            # Nothing written, whichever check refused the call.
            assert torch.equal(q, before[0]) and torch.equal(k, before[1])

    return call


@pytest.mark.parametrize(
    "call,match",
    [
        (_bad("apply_rope_inplace", q=torch.randn(9, 32)), "q must be"),
        (_bad("apply_rope_inplace", k=torch.randn(8, 1, 16)), "k must be"),
        (_bad("apply_rope_inplace", k=torch.randn(9, 1, 8)), "k must be"),
        (_bad("apply_rope_inplace", rotary_dim=18), "rotary_dim"),
        (_bad("apply_rope_inplace", rotary_dim=7), "rotary_dim"),
        (_bad("apply_rope_inplace", indptr=torch.tensor([0, 3, 3, 4, 8])), r"indptr\[-1\]"),
        (_bad("apply_rope_inplace", offsets=torch.tensor([0, 1])), "offsets"),
        (_bad("apply_rope_inplace", offsets=torch.tensor([0, -9, 0, 0])), "offset|position"),
        (_bad("apply_rope_pos_ids_inplace", pos_ids=torch.arange(8)), "pos_ids"),
        (_bad("apply_rope_pos_ids_inplace", pos_ids=torch.arange(9.0)), "pos_ids"),
        (_bad("apply_rope_pos_ids_inplace", pos_ids=-torch.arange(9)), "pos_ids must be >= 0"),
        (_bad("apply_rope_pos_ids_inplace", rope_scale=0.0), "rope_scale|factor"),
        (_bad("apply_llama31_rope_inplace", low_freq_factor=4), "freq_factor"),
    ],
    ids=[
        "q_2d",
        "k_other_nnz",
        "k_other_head_dim",
        "rotary_dim_over_head_dim",
        "rotary_dim_odd",
        "indptr_wrong_end",
        "offsets_wrong_length",
        "negative_position",
        "pos_ids_wrong_length",
        "pos_ids_float",
        "pos_ids_negative",
        "rope_scale_zero",
        "llama31_high_equals_low",
    ],
)
def test_bad_arguments(call, match):
    with pytest.raises((ValueError, TypeError, RuntimeError, IndexError), match=match):
        call()


# The peers' parameter lists (FlashInfer 0.7.2.post1, inspect.signature; docs peer_semantics 1.0):
# every parameter positional-or-keyword, these defaults.
_RAGGED = ["q", "k", "indptr", "offsets"]
_POS_IDS = ["q", "k", "pos_ids"]
_ROPE = [("rotary_dim", None), ("interleave", False), ("rope_scale", 1), ("rope_theta", 1e4)]
_LLAMA31 = [
    ("rotary_dim", None),
    ("interleave", False),
    ("rope_scale", 8),
    ("rope_theta", 5e5),
    ("low_freq_factor", 1),
    ("high_freq_factor", 4),
    ("old_context_len", 8192),
]
SIGNATURES = {
    "apply_rope": (_RAGGED, _ROPE),
    "apply_rope_pos_ids": (_POS_IDS, _ROPE),
    "apply_llama31_rope": (_RAGGED, _LLAMA31),
    "apply_llama31_rope_pos_ids": (_POS_IDS, _LLAMA31),
}


@pytest.mark.parametrize("name", sorted(SIGNATURES))
@pytest.mark.parametrize("suffix", ["", "_inplace"])
def test_signatures_are_flashinfers(name, suffix):
    required, defaults = SIGNATURES[name]
    params = list(inspect.signature(getattr(compat, name + suffix)).parameters.values())
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params)
    want = [(n, inspect.Parameter.empty) for n in required] + defaults
    assert [(p.name, p.default) for p in params] == want
    assert name + suffix in compat.__all__


def test_frequencies_first_built_under_inference_mode_still_train():
    # The frequencies are built once per parameter set; a first call under inference_mode must
    # not leave an inference tensor that a later differentiable call saves for backward.
    q = torch.randn(3, 1, 8, dtype=torch.float64)
    with torch.inference_mode():
        compat.apply_rope_pos_ids(q, q, torch.arange(3), rope_theta=12345.0)
    q.requires_grad_()
    q_rope, _ = compat.apply_rope_pos_ids(q, q.detach(), torch.arange(3), rope_theta=12345.0)
    (grad,) = torch.autograd.grad(q_rope.sum(), q)
    assert grad.shape == q.shape


def test_compile_fullgraph():
    # The frequencies are a traced constant (their builder is C++): no graph break.
    q, k = torch.randn(9, 2, 16), torch.randn(9, 1, 16)
    indptr, offsets = torch.tensor(INDPTR), torch.tensor(OFFSETS)

    def call():
        return compat.apply_llama31_rope(q, k, indptr, offsets, rotary_dim=12, interleave=True)

    torch._dynamo.reset()
    got = torch.compile(call, fullgraph=True)()
    want = call()
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])
