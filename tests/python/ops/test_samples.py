# SPDX-License-Identifier: BSD-3-Clause
"""Every sample of samples.sample_inputs (every op family) through every check, as
pytorch/extension-cpp's tests do: the result against the float64 oracle (each family's ``check``),
gradients of the differentiable ops (the differentiated oracle in every dtype, gradcheck and
gradgradcheck in float64), torch.library.opcheck (schema, fake/meta kernels, autograd
registration, AOT dispatch), and torch.compile(fullgraph=True). A family appended to samples.py
runs here with no change to this file; only the coverage tests below name families (and
test_catalogue.py holds every overload of torch.ops.rope to a family)."""

import pytest
import references as ref
import torch
from helpers import TOLERANCES, cpu_and_cuda, needs_torch, same_bits
from samples import FAMILIES, FORMS, MLA_OPS, QK_FP8_OPS, ROPE_OPS, all_ops, sample_inputs
from torch.autograd import gradcheck, gradgradcheck

FLOAT_DTYPES = {torch.float64, torch.float32, torch.float16, torch.bfloat16}


def _names(requires_grad, keep=lambda s: True):
    return [s.name for s in sample_inputs("cpu", requires_grad) if keep(s)]


# (requires_grad, sample name) -> its family: a test builds that family's samples only, not the
# whole catalogue (a tenth of the time; about 25 ms a test over the file's 900 tests).
_FAMILY_OF = {
    (requires_grad, s.name): family
    for requires_grad in (False, True)
    for family, (_, builder) in FAMILIES.items()
    for s in builder("cpu", requires_grad)
}


def _sample(device, requires_grad, name):
    _, builder = FAMILIES[_FAMILY_OF[(requires_grad, name)]]
    matches = [s for s in builder(device, requires_grad) if s.name == name]
    assert len(matches) == 1, f"{name}: {len(matches)} samples of that name"
    return matches[0]


def _family(name):
    ops, builder = FAMILIES[name]
    return builder("cpu", False)


def test_every_family_has_samples_and_unique_names():
    samples = sample_inputs("cpu", False)
    assert {s.op for s in samples} == set(all_ops())
    names = _names(False)
    assert len(set(names)) == len(names), "sample names must be unique"
    assert set(_names(True)) <= set(names)
    for s in sample_inputs("cpu", True):
        assert s.differentiable and all(x.requires_grad for x in s.inputs), s.name


# ---- coverage of each family -----------------------------------------------------------------


def test_samples_cover_every_op_and_dtype():
    samples = _family("rope")
    assert {s.op for s in samples} == set(ROPE_OPS)
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


def test_multi_axis_samples_cover_every_op_and_layout():
    samples = [s for s in _family("rope") if s.mrope_section is not None]
    assert {s.op for s in samples} == set(ROPE_OPS)
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
    for op in ROPE_OPS:
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


def test_rms_norm_samples_cover_every_dtype_layout_and_form():
    samples = _family("rms_norm")
    assert {s.dtype for s in samples} == FLOAT_DTYPES
    assert {(s.interleaved, s.inverse) for s in samples} == {
        (True, False),
        (True, True),
        (False, False),
        (False, True),
    }
    assert {s.positions.dtype for s in samples} == {torch.int32, torch.int64}
    assert any(2 * s.cos.size(-1) < s.inputs[0].size(-1) for s in samples), "partial rotary"
    assert any(s.cos.dtype == torch.float64 and s.dtype != torch.float64 for s in samples)
    heads = {s.heads for s in samples}
    assert any(hq > hk > 1 for hq, hk in heads) and any(hq > hk == 1 for hq, hk in heads)
    assert any(s.weight_offset != 0 for s in samples), "Gemma's (1 + w)"
    assert any(s.inputs[2].dtype != s.dtype or s.inputs[3].dtype != s.dtype for s in samples)
    assert any(s.inputs[2].stride(-1) != 1 for s in samples), "a strided weight"
    assert any(x.stride(-1) != 1 for s in samples for x in s.inputs[:2]), "a last-dim stride"
    assert any(x.storage_offset() % 2 for s in samples for x in s.inputs[:2]), "misaligned"
    assert any(s.inputs[0].numel() == 0 for s in samples), "an empty q"
    assert any(not s.positions.is_contiguous() for s in samples), "strided positions"
    multi = [s for s in samples if s.mrope_section is not None]
    assert {s.mrope_interleaved for s in multi} == {False, True}
    assert {s.interleaved for s in multi} == {False, True}
    assert {len(s.mrope_section) for s in multi} == {3, 4}
    assert any(0 in s.mrope_section for s in multi), "an axis with no planes"
    float64 = [s for s in samples if s.dtype == torch.float64]  # the gradcheck set
    assert {(s.interleaved, s.inverse) for s in float64} >= {(True, False), (False, True)}
    assert any(s.mrope_section is not None for s in float64)
    assert any(s.weight_offset and 2 * s.cos.size(-1) < s.inputs[0].size(-1) for s in float64)


def test_kv_cache_samples_cover_every_dtype_cache_and_slot_kind():
    samples = _family("kv_cache")
    assert {s.dtype for s in samples} == FLOAT_DTYPES
    assert {s.interleaved for s in samples} == {False, True}
    assert {s.positions.dtype for s in samples} == {torch.int32, torch.int64}
    assert any(2 * s.cos.size(-1) < s.inputs[0].size(-1) for s in samples), "partial rotary"
    assert any(s.cos.dtype == torch.float64 and s.dtype != torch.float64 for s in samples)
    assert {s.k_cache.dim() for s in samples} == {3, 4}, "flat and paged"
    k_formats = {(s.dtype, s.k_cache.dtype) for s in samples}
    for dtype in FLOAT_DTYPES:
        assert (dtype, dtype) in k_formats, f"a {dtype} cache"
        assert any(s.dtype == dtype and s.has_fp8 for s in samples), f"{dtype} into float8"
    assert {s.k_cache.dtype for s in samples} >= set(ref.FP8_DTYPES)
    assert {s.v_cache.dtype for s in samples if s.v_cache is not None} >= set(ref.FP8_DTYPES)
    mixed = [s for s in samples if s.k_cache.dtype in ref.FP8_DTYPES and s.v_cache is not None]
    assert any(s.v_cache.dtype not in ref.FP8_DTYPES for s in mixed), "fp8 k, 16/32-bit v"
    scales = [x for s in samples for x in (s.k_scale, s.v_scale) if x is not None]
    assert any(isinstance(x, float) for x in scales), "a Python float scale"
    assert {x.dim() for x in scales if isinstance(x, torch.Tensor)} == {0, 1}, "0-d and (1,)"
    assert any(s.v_cache is None for s in samples), "no v"
    assert any((s.slot_mapping < 0).any() and (s.slot_mapping >= 0).any() for s in samples)
    assert any(s.slot_mapping.numel() and (s.slot_mapping < 0).all() for s in samples)
    assert any(s.inputs[0].size(0) == 0 for s in samples), "no tokens"
    assert any(not c.is_contiguous() for s in samples for c in s.written()), "strided caches"
    assert any(len(s.bases) == 1 and len(s.written()) == 2 for s in samples), "one buffer"
    assert any(x.stride(-1) != 1 for s in samples for x in s.inputs), "a last-dim stride"
    assert any(x.storage_offset() % 2 for s in samples for x in s.inputs), "misaligned"
    heads = {(s.inputs[0].size(1), s.inputs[1].size(1)) for s in samples}
    assert any(hq == hk for hq, hk in heads) and any(hq > hk > 1 for hq, hk in heads)
    assert any(hq > hk == 1 for hq, hk in heads)
    assert any(s.positions.size(-1) > 1 for s in samples), "per-head positions"
    assert any(not s.positions.is_contiguous() for s in samples), "strided positions"


def test_form_samples_cover_every_overload_and_dtype():
    samples = _family("forms")
    assert {(s.op, s.form) for s in samples} == {(op, f) for op in ROPE_OPS for f in FORMS}
    for op in ROPE_OPS:
        assert {s.dtype for s in samples if s.op == op} == FLOAT_DTYPES, op
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
    assert any(s.packed and s.packed["cu_seqlens"].dtype == torch.int32 for s in samples)
    assert any(s.angles.get("attention_factor", 1.0) != 1.0 for s in samples)


def _scales(samples, *names):
    return [x for s in samples for x in (getattr(s, n) for n in names) if x is not None]


def _scale_forms(scales):
    return {"float" if isinstance(x, float) else f"tensor_{x.dim()}d" for x in scales}


def test_qk_fp8_samples_cover_every_dtype_format_and_form():
    samples = _family("qk_fp8")
    assert {s.op for s in samples} == set(QK_FP8_OPS)
    for op in QK_FP8_OPS:
        mine = [s for s in samples if s.op == op]
        assert {s.dtype for s in mine} == FLOAT_DTYPES, op
        assert {s.fp8 for s in mine} == set(ref.FP8_DTYPES), op
        assert {s.interleaved for s in mine} == {False, True}, op
        assert {s.multiply_by_scale for s in mine} == {False, True}, op
    assert _scale_forms(_scales(samples, "q_scale", "k_scale")) == {
        "float",
        "tensor_0d",
        "tensor_1d",
    }
    assert any(s.q_scale is None for s in samples), "no scale (1)"
    assert any(2 * s.cos.size(-1) < s.inputs[0].size(-1) for s in samples), "partial rotary"
    assert any(s.q_nope is None and s.k_nope is None for s in samples), "no nope parts"
    assert any(s.q_nope is not None and s.k_nope is not None for s in samples)
    heads = {(s.inputs[0].size(1), s.inputs[1].size(1)) for s in samples}
    assert any(hq > hk > 1 for hq, hk in heads) and any(hq > hk == 1 for hq, hk in heads)
    assert any(s.positions.dim() == 2 and s.positions.size(-1) > 1 for s in samples), "per head"
    assert {s.positions.dtype for s in samples} == {torch.int32, torch.int64}
    multi = [s for s in samples if s.mrope_section is not None]
    assert {s.mrope_interleaved for s in multi} == {False, True}
    assert any(s.op == "apply_qk_fp8.out" for s in multi)
    assert any(not x.is_contiguous() for s in samples for x in s.inputs), "sliced or strided"
    assert any(s.inputs[0].size(0) == 0 for s in samples), "no tokens"


def test_mla_samples_cover_every_dtype_cache_and_layout():
    samples = _family("mla_cache")
    assert {s.op for s in samples} == set(MLA_OPS)
    assert {s.dtype for s in samples} == FLOAT_DTYPES
    assert {s.interleaved for s in samples} == {False, True}
    for dtype in FLOAT_DTYPES:
        assert any(s.dtype == dtype and s.kv_cache.dtype == dtype for s in samples), dtype
    assert {s.kv_cache.dtype for s in samples} >= set(ref.FP8_DTYPES)
    assert {s.q_dtype for s in samples} >= {None, *ref.FP8_DTYPES}, "float8 q of both formats"
    assert {s.multiply_by_scale for s in samples} == {False, True}
    assert _scale_forms(_scales(samples, "kv_scale", "v_scale", "q_scale")) == {
        "float",
        "tensor_0d",
        "tensor_1d",
    }
    assert any(s.kpe_cache is None for s in samples), "vLLM's one cache"
    assert any(s.kpe_cache is not None and len(s.bases) >= 2 for s in samples), "two caches"
    assert any(s.kpe_cache is not None and len(s.bases) == 1 for s in samples), "one buffer"
    assert {s.paged for s in samples} == {False, True}
    assert any(s.inputs[1].dim() == 3 and s.v is not None for s in samples), "GQA rows with v"
    assert any(s.v_cache is not None and s.v_cache.dtype in ref.FP8_DTYPES for s in samples)
    assert any(s.q_nope is None for s in samples) and any(s.q_nope is not None for s in samples)
    assert any((s.slot_mapping < 0).any() and (s.slot_mapping >= 0).any() for s in samples)
    assert any(s.slot_mapping.numel() and (s.slot_mapping < 0).all() for s in samples)
    assert {s.positions.dtype for s in samples} == {torch.int32, torch.int64}
    assert any(s.inputs[0].size(0) == 0 for s in samples), "no tokens"


def test_norm_cache_samples_cover_every_dtype_cache_and_form():
    samples = _family("norm_cache")
    assert {s.dtype for s in samples} == FLOAT_DTYPES
    assert {s.interleaved for s in samples} == {False, True}
    assert {s.positions.dtype for s in samples} == {torch.int32, torch.int64}
    assert any(2 * s.cos.size(-1) < s.inputs[0].size(-1) for s in samples), "partial rotary"
    assert {s.k_cache.dim() for s in samples} == {3, 4}, "flat and paged"
    for dtype in FLOAT_DTYPES:
        assert any(s.dtype == dtype and s.k_cache.dtype == dtype for s in samples), dtype
        assert any(s.dtype == dtype and s.has_fp8 for s in samples), f"{dtype} into float8"
    assert {s.k_cache.dtype for s in samples} >= set(ref.FP8_DTYPES)
    assert {s.v_cache.dtype for s in samples if s.v_cache is not None} >= set(ref.FP8_DTYPES)
    assert {s.q_dtype for s in samples} >= {None, *ref.FP8_DTYPES}, "float8 q of both formats"
    assert _scale_forms(_scales(samples, "k_scale", "v_scale")) == {
        "float",
        "tensor_0d",
        "tensor_1d",
    }
    assert any(s.v_cache is None for s in samples), "no v"
    assert any(s.weight_offset != 0 for s in samples) and any(s.eps != 1e-6 for s in samples)
    assert any(s.q_weight.dtype != s.dtype or s.k_weight.dtype != s.dtype for s in samples)
    assert any(s.q_weight.stride(-1) != 1 for s in samples), "a strided weight"
    assert any(len(s.bases) == 1 and len(s.written()) == 2 for s in samples), "one buffer"
    assert any(not c.is_contiguous() for s in samples for c in s.written()), "strided caches"
    assert any((s.slot_mapping < 0).any() and (s.slot_mapping >= 0).any() for s in samples)
    assert any(s.slot_mapping.numel() and (s.slot_mapping < 0).all() for s in samples)
    assert any(s.inputs[0].size(0) == 0 for s in samples), "no tokens"
    heads = {(s.inputs[0].size(1), s.inputs[1].size(1)) for s in samples}
    assert any(hq == hk for hq, hk in heads) and any(hq > hk > 1 for hq, hk in heads)
    assert any(hq > hk == 1 for hq, hk in heads)
    multi = [s for s in samples if s.mrope_section is not None]
    assert {s.mrope_interleaved for s in multi} == {False, True}
    assert any(not s.positions.is_contiguous() for s in multi), "axis-first positions"


# ---- correctness ------------------------------------------------------------------------------


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("name", _names(False), ids=str)
def test_sample_matches_oracle(name, device):
    sample = _sample(device, False, name)
    before = sample.snapshot()
    results = sample.call()
    sample.check(results, before)


# ---- gradients ----------------------------------------------------------------------------------


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("name", _names(True), ids=str)
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
        # A gradient is no more precise than the op's math: a float64 weight of a float32 call
        # (rms_norm_apply_qk) gets float32's tolerance.
        tolerance = max(TOLERANCES[grad.dtype], TOLERANCES[sample.dtype], key=lambda t: t["rtol"])
        torch.testing.assert_close(grad.cpu(), expected.to(grad.dtype), **tolerance)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("name", _names(True, lambda s: s.dtype == torch.float64), ids=str)
def test_sample_gradcheck(name, device):
    sample = _sample(device, True, name)
    assert gradcheck(sample.call, sample.inputs)
    assert gradgradcheck(sample.call, sample.inputs)


# ---- opcheck ------------------------------------------------------------------------------------
# Every sample runs opcheck's schema, autograd-registration and fake-tensor tests. Its fourth,
# test_aot_dispatch_dynamic (the op traced by AOTAutograd with every size and stride symbolic,
# then run against eager; with grad, the backward too), costs about 0.3 s a call, nearly all of
# opcheck's time, so it runs on a covering subset (168 of the 227 samples): for each overload and
# requires_grad, at least one sample of every input dtype and one of every structure (which
# arguments are tensors and of what rank, which are None, which are Python numbers). A sample
# left out differs from one in the subset only in sizes, strides, storage offsets and values, and
# still meets the fake-tensor test (its meta kernel's shapes and strides), the oracle, and
# torch.compile (aot_eager) or, with grad, the gradient checks below.
AOT_DYNAMIC = "test_aot_dispatch_dynamic"


def _opcheck_utils(sample):
    kwargs = dict(sample.opcheck_kwargs)
    utils = kwargs.pop("test_utils", torch.library._OPCHECK_DEFAULT_UTILS)
    return list(utils), kwargs


def _aot_keys(sample, requires_grad):
    """The two keys the AOT subset covers: (op, dtype) and (op, argument structure)."""
    args, kwargs = sample.op_args()
    values = list(args) + [kwargs[k] for k in sorted(kwargs)]

    def shape_of(v):
        if isinstance(v, torch.Tensor):
            return ("tensor", v.dim())
        if isinstance(v, (list, tuple)):
            return tuple(shape_of(x) for x in v)
        return None if v is None else type(v).__name__

    op = (requires_grad, str(sample.overload))
    return (op, "dtype", sample.dtype), (op, "structure", tuple(shape_of(v) for v in values))


def _aot_subset():
    """(requires_grad, name) of the samples test_aot_dispatch_dynamic runs on: a smallest set
    with every key of _aot_keys. Each sample joins a dtype key and a structure key, so that is a
    minimum edge cover of the bipartite graph of keys: a maximum matching (augmenting paths, in
    catalogue order), then, for each key it leaves out, that key's first sample."""
    edges = {}  # (dtype key, structure key) -> the first sample that has both
    for requires_grad in (False, True):
        for s in sample_inputs("cpu", requires_grad):
            if AOT_DYNAMIC in _opcheck_utils(s)[0]:
                edges.setdefault(_aot_keys(s, requires_grad), (requires_grad, s.name))
    neighbours = {}
    for dtype_key, structure_key in edges:
        neighbours.setdefault(dtype_key, []).append(structure_key)
    match = {}  # structure key -> dtype key

    def augment(dtype_key, seen):
        for structure_key in neighbours[dtype_key]:
            if structure_key not in seen:
                seen.add(structure_key)
                if structure_key not in match or augment(match[structure_key], seen):
                    match[structure_key] = dtype_key
                    return True
        return False

    for dtype_key in neighbours:
        augment(dtype_key, set())
    chosen = {edges[(d, st)] for st, d in match.items()}
    matched = set(match) | set(match.values())
    for (dtype_key, structure_key), sample_id in edges.items():
        for key in (dtype_key, structure_key):
            if key not in matched:
                matched.add(key)
                chosen.add(sample_id)
    return sorted(chosen)


AOT_SUBSET = _aot_subset()


def _opcheck_param(requires_grad, s):
    return pytest.param(
        requires_grad,
        s.name,
        id=f"{'grad' if requires_grad else 'no_grad'}-{s.name}",
        marks=[needs_torch(*s.opcheck_needs_torch)] if s.opcheck_needs_torch else [],
    )


OPCHECK_PARAMS = [
    _opcheck_param(requires_grad, s)
    for requires_grad in (False, True)
    for s in sample_inputs("cpu", requires_grad)
]
AOT_PARAMS = [
    _opcheck_param(requires_grad, s)
    for requires_grad in (False, True)
    for s in sample_inputs("cpu", requires_grad)
    if (requires_grad, s.name) in AOT_SUBSET
]


def test_aot_subset_covers_every_overload_dtype_and_structure():
    chosen = set(AOT_SUBSET)
    want, got = set(), set()
    for requires_grad in (False, True):
        for s in sample_inputs("cpu", requires_grad):
            if AOT_DYNAMIC not in _opcheck_utils(s)[0]:
                continue
            keys = _aot_keys(s, requires_grad)
            want.update(keys)
            if (requires_grad, s.name) in chosen:
                got.update(keys)
    assert got == want, sorted(want - got, key=str)
    every_overload = {
        (rg, str(s.overload)) for rg in (False, True) for s in sample_inputs("cpu", rg)
    }
    assert {(rg, str(_sample("cpu", rg, name).overload)) for rg, name in chosen} == every_overload
    assert len(chosen) < len(OPCHECK_PARAMS)  # a subset, or this split buys nothing


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("requires_grad,name", OPCHECK_PARAMS)
def test_sample_opcheck(requires_grad, name, device):
    """opcheck's schema, autograd-registration and fake-tensor tests (those the sample can run)."""
    sample = _sample(device, requires_grad, name)
    args, kwargs = sample.op_args()
    utils, opcheck_kwargs = _opcheck_utils(sample)
    utils = [u for u in utils if u != AOT_DYNAMIC]
    torch.library.opcheck(sample.overload, args, kwargs, test_utils=utils, **opcheck_kwargs)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("requires_grad,name", AOT_PARAMS)
def test_sample_opcheck_aot_dispatch_dynamic(requires_grad, name, device):
    sample = _sample(device, requires_grad, name)
    args, kwargs = sample.op_args()
    _, opcheck_kwargs = _opcheck_utils(sample)
    torch.library.opcheck(sample.overload, args, kwargs, test_utils=[AOT_DYNAMIC], **opcheck_kwargs)


# ---- torch.compile -------------------------------------------------------------------------------


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("name", _names(False), ids=str)
def test_sample_under_compile_fullgraph(name, device):
    # Two copies of the sample, same values and layouts: one eager, one compiled. The same
    # kernels run in both, so results (and apply_'s / out='s / the caches' writes) agree bit for
    # bit.
    torch._dynamo.reset()
    torch.manual_seed(1)
    eager = _sample(device, False, name)
    torch.manual_seed(1)
    compiled = _sample(device, False, name)
    want = eager.call()
    got = torch.compile(compiled.call, backend="aot_eager", fullgraph=True)(*compiled.inputs)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert same_bits(a, b)
    for x_compiled, x_eager in zip(compiled.inputs, eager.inputs):
        assert same_bits(x_compiled, x_eager), "the compiled call wrote its input differently"
    for w_compiled, w_eager in zip(compiled.written(), eager.written()):
        assert same_bits(w_compiled, w_eager), "the compiled call wrote differently"
