# SPDX-License-Identifier: BSD-3-Clause
"""The ops that write a tensor (x of apply_, out of apply.out, k_cache and v_cache of
apply_qk_cache) bump its version counter as a native in-place op does: once per call, with
gradients recorded, under torch.no_grad() and under torch.inference_mode() (a normal tensor
written there, e.g. a KV cache allocated outside it). So a tensor saved for backward and then
overwritten by one of them makes backward raise, as it does after a native in-place op, instead
of returning a stale gradient. Inference tensors have no version counter; writing them stays
allowed."""

import contextlib

import pytest
import torch
from helpers import cpu_and_cuda, make_tables

import torch_rope

MAX_SEQ_LEN = 16
MODES = {
    "grad": contextlib.nullcontext,
    "no_grad": torch.no_grad,
    "inference_mode": torch.inference_mode,
}


def _tables(device):
    return make_tables(MAX_SEQ_LEN, 8, device)


def _write_apply_(device):
    """apply_ into a (3, 8) tensor: (the written tensor, a call that writes it)."""
    cos, sin = _tables(device)
    x = torch.randn(3, 8, device=device)
    return [x], lambda: torch_rope.apply_(x, cos, sin, torch.arange(3, device=device))


def _write_apply_out(device):
    cos, sin = _tables(device)
    x, out = torch.randn(3, 8, device=device), torch.empty(3, 8, device=device)
    return [out], lambda: torch_rope.apply(x, cos, sin, torch.arange(3, device=device), out=out)


def _write_apply_qk_cache(device):
    cos, sin = _tables(device)
    q, k, v = (torch.randn(2, h, 8, device=device) for h in (4, 2, 2))
    k_cache, v_cache = torch.zeros(6, 2, 8, device=device), torch.zeros(6, 2, 8, device=device)
    positions = torch.tensor([[3], [5]], device=device)
    slots = torch.tensor([1, 4], device=device)
    return [k_cache, v_cache], lambda: torch_rope.apply_qk_cache(
        q, k, v, cos, sin, positions, k_cache, v_cache, slots
    )


def _write_k_only_cache(device):
    cos, sin = _tables(device)
    q, k = torch.randn(2, 4, 8, device=device), torch.randn(2, 2, 8, device=device)
    k_cache = torch.zeros(6, 2, 8, device=device)
    positions, slots = torch.tensor([[3], [5]], device=device), torch.tensor([1, 4], device=device)
    return [k_cache], lambda: torch_rope.apply_qk_cache(
        q, k, None, cos, sin, positions, k_cache, None, slots
    )


WRITERS = {
    "apply_": _write_apply_,
    "apply.out": _write_apply_out,
    "apply_qk_cache": _write_apply_qk_cache,
    "apply_qk_cache_k_only": _write_k_only_cache,
}


def _native_bump(mode) -> int:
    """How much one native in-place op (mul_) moves a normal tensor's version in this mode."""
    t = torch.zeros(3)
    before = t._version
    with MODES[mode]():
        t.mul_(2)
    return t._version - before


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("op", list(WRITERS))
def test_a_write_bumps_the_version_as_a_native_inplace_op(op, mode, device):
    written, write = WRITERS[op](device)
    before = [t._version for t in written]
    with MODES[mode]():
        write()
    want = _native_bump(mode)
    assert want == 1  # the reference itself: one bump per native in-place op in every mode
    assert [t._version - b for t, b in zip(written, before)] == [want] * len(written)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("op", list(WRITERS))
def test_overwriting_a_tensor_saved_for_backward_makes_backward_raise(op, mode, device):
    # (t * c).sum() saves t for c's gradient; every tensor the op writes is saved that way first.
    written, write = WRITERS[op](device)
    losses = []
    for t in written:
        c = torch.randn(t.shape, device=device, requires_grad=True)
        losses.append((t * c).sum())
    with MODES[mode]():
        write()
    for loss in losses:
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            loss.backward()


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("op", list(WRITERS))
def test_inference_tensors_are_still_written_in_inference_mode(op, device):
    with torch.inference_mode():
        written, write = WRITERS[op](device)
        before = [t.clone() for t in written]
        write()
    assert all(t.is_inference() for t in written)
    assert any(not torch.equal(t, b) for t, b in zip(written, before))
