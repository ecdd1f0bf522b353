# SPDX-License-Identifier: BSD-3-Clause
"""The test catalogue holds itself to the library: every overload of every ``torch.ops.rope`` op
belongs to a family of each of the three shared catalogues, the samples (samples.py, run through
every check by test_samples.py), the bad calls (test_errors.py) and the fuzzing (test_fuzz.py).
An op or overload added to the library without its blocks fails here, by name."""

import pytest
import test_errors
import test_fuzz
import torch
from samples import FAMILIES, sample_inputs

import torch_rope  # noqa: F401  (registers torch.ops.rope)


def _overloads():
    """Every overload of every op of the rope namespace, as torch lists them."""
    names = []
    for op_name in dir(torch.ops.rope):
        packet = getattr(torch.ops.rope, op_name)
        if callable(getattr(packet, "overloads", None)):  # an op packet
            names += [f"rope.{op_name}.{overload}" for overload in packet.overloads()]
    return sorted(names)


def _name(overload) -> str:
    op = str(overload._schema.name).replace("::", ".")
    return f"{op}.{overload._overloadname or 'default'}"


def _sampled():
    return {_name(s.overload) for s in sample_inputs("cpu", False)}


def _refused():
    return {
        _name(family.overloads[op])
        for family in test_errors.CATALOGUE.values()
        for bad in family.cases.values()
        for op in bad.ops or family.ops
    }


def _fuzzed():
    return {_name(o) for overloads in test_fuzz.FUZZED.values() for o in overloads}


def test_the_namespace_is_listed():
    overloads = _overloads()
    assert "rope.apply.default" in overloads and "rope.apply_qk_fp8.out" in overloads
    assert all(name.count(".") == 2 for name in overloads)


@pytest.mark.parametrize(
    "catalogue,covered",
    [("samples.py", _sampled), ("test_errors.py", _refused), ("test_fuzz.py", _fuzzed)],
    ids=["samples", "bad_calls", "fuzz"],
)
def test_every_overload_is_in_every_catalogue(catalogue, covered):
    have = covered()
    missing = [name for name in _overloads() if name not in have]
    assert not missing, (
        f"overloads of torch.ops.rope with no family in {catalogue}: {', '.join(missing)} "
        f"(append a block for each: docs/testing.md, 'Adding an op')"
    )
    unknown = sorted(have - set(_overloads()))
    assert not unknown, f"{catalogue} names overloads torch.ops.rope does not have: {unknown}"


def test_every_sample_family_has_its_ops_samples():
    for name, (ops, builder) in FAMILIES.items():
        assert {s.op for s in builder("cpu", False)} == set(ops), name
