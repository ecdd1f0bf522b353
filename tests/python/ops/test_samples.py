# SPDX-License-Identifier: BSD-3-Clause
"""Every sample of samples.sample_inputs through every check, as pytorch/extension-cpp's tests do:
the result against the float64 oracle, gradients (the differentiated oracle in every dtype,
gradcheck and gradgradcheck in float64), torch.library.opcheck (schema, fake/meta kernels,
autograd registration, AOT dispatch), and torch.compile(fullgraph=True)."""

import pytest
import torch
from helpers import TOLERANCES, cpu_and_cuda
from samples import OPS, sample_inputs
from torch.autograd import gradcheck, gradgradcheck


def _names(requires_grad, keep=lambda s: True):
    return [s.name for s in sample_inputs("cpu", requires_grad) if keep(s)]


def _sample(device, requires_grad, name):
    matches = [s for s in sample_inputs(device, requires_grad) if s.name == name]
    assert len(matches) == 1, f"{name}: {len(matches)} samples of that name"
    return matches[0]


def test_samples_cover_every_op_and_dtype():
    samples = sample_inputs("cpu", False)
    assert {s.op for s in samples} == set(OPS)
    for op in OPS:
        assert {s.dtype for s in samples if s.op == op} == {
            torch.float64,
            torch.float32,
            torch.float16,
            torch.bfloat16,
        }, op
        assert {(s.interleaved, s.inverse) for s in samples if s.op == op} == {
            (True, False),
            (True, True),
            (False, False),
            (False, True),
        }, op
    names = _names(False)
    assert len(set(names)) == len(names), "sample names must be unique"


def test_multi_axis_samples_cover_every_op_and_layout():
    samples = [s for s in sample_inputs("cpu", False) if s.mrope_section is not None]
    assert {s.op for s in samples} == set(OPS)
    assert {s.dtype for s in samples} == {
        torch.float64,
        torch.float32,
        torch.float16,
        torch.bfloat16,
    }
    # Both section layouts against both pair layouts, and each op meets every one of the four
    # flags on both sides.
    assert {(s.interleaved, s.mrope_interleaved) for s in samples} == {
        (True, False),
        (True, True),
        (False, False),
        (False, True),
    }
    for op in OPS:
        mine = [s for s in samples if s.op == op]
        assert {s.mrope_interleaved for s in mine} == {False, True}, op
        assert {s.interleaved for s in mine} == {False, True}, op
        assert {s.inverse for s in mine} == {False, True}, op
    assert {len(s.mrope_section) for s in samples} == {1, 2, 3, 4}
    assert {s.positions.dtype for s in samples} == {torch.int32, torch.int64}
    assert any(0 in s.mrope_section for s in samples), "an axis with no planes"
    assert any(2 * s.cos.size(-1) < s.inputs[0].size(-1) for s in samples), "partial rotary"
    assert any(s.cos.dtype == torch.float64 and s.dtype != torch.float64 for s in samples)
    assert any(not s.positions.is_contiguous() for s in samples), "axis-first positions"
    assert any(s.inputs[0].stride(-1) != 1 for s in samples), "a last-dim-strided x"
    # The documented positions shapes: (S, A), (B, 1, S, A), (B, S, 1, A), (T, 1, A).
    shapes = {(s.inputs[0].dim(), tuple(s.positions.shape[:-1])) for s in samples}
    assert (4, (3,)) in shapes, "(S, A) for (B, H, S, D)"
    assert any(n == 3 and len(p) == 2 and p[1] == 1 for n, p in shapes), "(T, 1, A) packed"
    assert any(s.positions.dim() == 4 and s.positions.size(1) == 1 for s in samples)
    assert any(s.positions.dim() == 4 and s.positions.size(2) == 1 for s in samples)
    for s in samples:
        assert s.positions.size(-1) == len(s.mrope_section), s.name


# ---- correctness ------------------------------------------------------------------------------


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("name", _names(False))
def test_sample_matches_oracle(name, device):
    sample = _sample(device, False, name)
    want = sample.expected()
    before = [x.clone() for x in sample.inputs]
    rotary_dim = 2 * sample.cos.size(-1)

    results = sample.call()

    for out, x_before, expected in zip(results, before, want):
        assert out.shape == x_before.shape and out.dtype == x_before.dtype
        assert out.device == x_before.device
        torch.testing.assert_close(out.cpu(), expected.to(out.dtype), **TOLERANCES[out.dtype])
        assert torch.equal(out[..., rotary_dim:], x_before[..., rotary_dim:]), (
            "pass-through features changed"
        )
    if sample.op == "apply_":
        assert results[0] is sample.inputs[0], "apply_ must return x itself"
    elif sample.op == "apply.out":
        assert results[0] is sample.out, "apply(..., out=) must return out"
    else:
        assert all(out.is_contiguous() for out in results)
    if sample.op != "apply_":
        for x, x_before in zip(sample.inputs, before):
            assert torch.equal(x, x_before), f"{sample.op} modified its input"


# ---- gradients ----------------------------------------------------------------------------------


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("name", _names(True))
def test_sample_gradient_matches_differentiated_oracle(name, device):
    sample = _sample(device, True, name)
    results = sample.call()
    grads_out = [torch.randn(out.shape, dtype=torch.float64).to(out) for out in results]
    got = torch.autograd.grad(results, sample.inputs, grads_out)

    leaves = [x.detach().cpu().double().requires_grad_() for x in sample.inputs]
    want = torch.autograd.grad(
        sample.expected(tuple(leaves)), leaves, [g.cpu().double() for g in grads_out]
    )
    for grad, expected, x in zip(got, want, sample.inputs):
        assert grad.dtype == x.dtype and grad.device == x.device
        torch.testing.assert_close(grad.cpu(), expected.to(grad.dtype), **TOLERANCES[grad.dtype])


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("name", _names(True, lambda s: s.dtype == torch.float64))
def test_sample_gradcheck(name, device):
    sample = _sample(device, True, name)
    assert gradcheck(sample.call, sample.inputs)
    assert gradgradcheck(sample.call, sample.inputs)


# ---- opcheck ------------------------------------------------------------------------------------

OPCHECK_PARAMS = [
    pytest.param(requires_grad, name, id=f"{'grad' if requires_grad else 'no_grad'}-{name}")
    for requires_grad in (False, True)
    for name in _names(requires_grad)
]


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("requires_grad,name", OPCHECK_PARAMS)
def test_sample_opcheck(requires_grad, name, device):
    sample = _sample(device, requires_grad, name)
    args, kwargs = sample.op_args()
    torch.library.opcheck(sample.overload, args, kwargs)


# ---- torch.compile -------------------------------------------------------------------------------


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("name", _names(False))
def test_sample_under_compile_fullgraph(name, device):
    # Two copies of the sample, same values and layouts: one eager, one compiled. The same
    # kernels run in both, so results (and apply_'s / out='s writes) agree bit for bit.
    torch._dynamo.reset()
    torch.manual_seed(1)
    eager = _sample(device, False, name)
    torch.manual_seed(1)
    compiled = _sample(device, False, name)
    want = eager.call()
    got = torch.compile(compiled.call, backend="aot_eager", fullgraph=True)(*compiled.inputs)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    for x_compiled, x_eager in zip(compiled.inputs, eager.inputs):
        assert torch.equal(x_compiled, x_eager), "the compiled call wrote its input differently"
    if compiled.op == "apply.out":
        assert torch.equal(compiled.out, eager.out), "the compiled call did not write out"
