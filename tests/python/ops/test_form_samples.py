# SPDX-License-Identifier: BSD-3-Clause
"""Every sample of samples.form_sample_inputs (the frequency and packed-sequence forms: every
overload) through every check of test_samples.py: the result against the float64 oracle,
gradients (the differentiated oracle in every dtype, gradcheck and gradgradcheck in float64),
torch.library.opcheck, and torch.compile(fullgraph=True)."""

import pytest
import torch
from helpers import TOLERANCES, cpu_and_cuda
from samples import FORMS, ROPE_OPS, form_sample_ids, form_sample_inputs
from torch.autograd import gradcheck, gradgradcheck


def _names(requires_grad, keep=lambda s: True):
    return [s.name for s in form_sample_inputs("cpu", requires_grad) if keep(s)]


def _sample(device, requires_grad, name):
    matches = [s for s in form_sample_inputs(device, requires_grad) if s.name == name]
    assert len(matches) == 1, f"{name}: {len(matches)} samples of that name"
    return matches[0]


def test_form_samples_cover_every_overload_and_dtype():
    samples = form_sample_inputs("cpu", False)
    assert {(s.op, s.form) for s in samples} == {(op, f) for op in ROPE_OPS for f in FORMS}
    for op in ROPE_OPS:
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
    assert any(s.mrope_section is not None for s in samples)
    assert any(s.packed and s.packed["cp_size"] > 1 for s in samples)
    assert any(s.packed and s.packed["seq_offsets"] is not None for s in samples)
    assert any(s.positions is not None and int(s.positions.max()) > 2**32 for s in samples)
    names = form_sample_ids(False)
    assert len(set(names)) == len(names), "sample names must be unique"


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("name", _names(False))
def test_form_sample_matches_oracle(name, device):
    sample = _sample(device, False, name)
    want = sample.expected()
    before = [x.clone() for x in sample.inputs]
    results = sample.call()
    half = (sample.angles["freqs"].numel() if "freqs" in sample.angles
            else sample.angles["cos"].size(-1))  # fmt: skip
    for out, x_before, expected in zip(results, before, want):
        assert out.shape == x_before.shape and out.dtype == x_before.dtype
        torch.testing.assert_close(out.cpu(), expected.to(out.dtype), **TOLERANCES[out.dtype])
        assert torch.equal(out[..., 2 * half :], x_before[..., 2 * half :])
    if sample.op == "apply_":
        assert results[0] is sample.inputs[0]
    elif sample.op == "apply.out":
        assert results[0] is sample.out
    if sample.op != "apply_":
        for x, x_before in zip(sample.inputs, before):
            assert torch.equal(x, x_before), f"{sample.op} modified its input"


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("name", _names(True))
def test_form_sample_gradient_matches_differentiated_oracle(name, device):
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
def test_form_sample_gradcheck(name, device):
    sample = _sample(device, True, name)
    assert gradcheck(sample.call, sample.inputs)
    assert gradgradcheck(sample.call, sample.inputs)


OPCHECK_PARAMS = [
    pytest.param(requires_grad, name, id=f"{'grad' if requires_grad else 'no_grad'}-{name}")
    for requires_grad in (False, True)
    for name in _names(requires_grad)
]


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("requires_grad,name", OPCHECK_PARAMS)
def test_form_sample_opcheck(requires_grad, name, device):
    sample = _sample(device, requires_grad, name)
    args, kwargs = sample.op_args()
    torch.library.opcheck(sample.overload, args, kwargs)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("name", _names(False))
def test_form_sample_under_compile_fullgraph(name, device):
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
        assert torch.equal(x_compiled, x_eager)
    if compiled.op == "apply.out":
        assert torch.equal(compiled.out, eager.out)
