# SPDX-License-Identifier: BSD-3-Clause
"""torch_rope.diffusers.patch on every supported model class, each built tiny from its own config
(tests/python/support/diffusers_models.py) and run for one denoising forward.

* fp32: the patched model's output matches the unpatched one's within 1e-5 (relative to the
  output's largest magnitude where that is over 1), except for the classes in :data:`FP64_RULE`,
  where diffusers computes its angles in float32 at positions large enough for that to show:
  there both fp32 outputs are compared with the unpatched model run in float64, and ours must be
  no further from it than diffusers' own.
* Classes in :data:`ROUNDED_QK` round the rotated q and k to bf16 whatever the model's dtype:
  their fp32 outputs are compared with that rounding lifted on both sides (:class:`NoBf16Rounding`),
  within 1e-5; with it kept, ours must be nearer diffusers' rounded output than its unrounded one
  (so the rounding is there).
* Proof of what ran (a TorchDispatchMode below autograd): ``rope::apply`` in every patched
  attention module on every call, and no cos/sin built inside a RoPE or attention module from the
  second forward on (the unpatched model builds them: the same count is checked to be non-zero
  there, so the check can fail).
* The other instance (the unpatched original) is untouched, and unpatch gives the exact
  unpatched output back.
* bf16: the error against the float64 reference is at most 1.5x diffusers' own. Both models are
  cast with ``model.to(torch.bfloat16)`` and then every RoPE module of the *unpatched* model is
  put back to float32, as ``from_pretrained(torch_dtype=...)`` does for Wan's
  ``_keep_in_fp32_modules``: a plain ``.to(bf16)`` would round diffusers' own ``inv_freq`` and
  table buffers to bf16 and make its error look worse than it is. Our tables stay float32 under
  any cast. Classes in :data:`KEEP_FP32_MODULES` keep their ``_keep_in_fp32_modules`` in float32
  in both models, as ``from_pretrained`` does.
"""

import copy
import inspect

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

pytest.importorskip("diffusers", reason="diffusers is not installed")

import diffusers_models as dm  # noqa: E402

import torch_rope.diffusers as trd  # noqa: E402
from torch_rope._patching import record as records  # noqa: E402

SUPPORTED = list(trd.SUPPORTED_MODEL_CLASSES)
RECIPES = dm.recipes(SUPPORTED)

#: Classes whose fp32 comparison is against a float64 reference (see the module docstring), with
#: why.
FP64_RULE = {
    "LTXVideoTransformer3DModel": (
        "diffusers computes LTX-Video's angles f * (2c - 1) in float32, with f up to "
        "theta * pi / 2 = 1.6e4 rad: about 1e-3 rad of rounding, which float64 tables do not have"
    ),
}

#: Classes whose processors round the rotated q and k to bf16 whatever the model's dtype, with
#: why their fp32 comparison lifts that rounding (see the module docstring).
ROUNDED_QK = {
    "Kandinsky5Transformer3DModel": (
        "its processors round the rotated q and k to bfloat16 (2 ** -8 relative): a float32 "
        "rounding difference before that (float64 tables against float32 angles) flips one now "
        "and then, which says nothing of the rotation"
    ),
}


class NoBf16Rounding(TorchFunctionMode):
    """``Tensor.to(torch.bfloat16)`` a no-op (an fp32 model has no other cast to bf16)."""

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.to and (
            torch.bfloat16 in args or kwargs.get("dtype") is torch.bfloat16
        ):
            return args[0]
        return func(*args, **kwargs)


TRIG = ("aten.cos", "aten.sin", "aten.polar")


class RopeCounter(TorchDispatchMode):
    """Counts rope ops and trig ops, each attributed to the innermost attention or RoPE module
    running (forward hooks keep the stack), and the calls of each attention module that were
    handed a RoPE (an argument named like one, not None) or compute one."""

    def __init__(self, model):
        super().__init__()
        self.stack = [None]
        self.ops = {}
        self.calls = {}
        self.handles = []
        for module in model.modules():
            if hasattr(module, "processor") or hasattr(module, "torch_rope") or _is_rope(module):
                self.handles.append(module.register_forward_pre_hook(self._enter, with_kwargs=True))
                self.handles.append(module.register_forward_hook(self._leave))

    def _enter(self, module, args, kwargs):
        self.stack.append(module)
        if _handed_rope(module, args, kwargs) or _owns_rope(module):
            self.calls[module] = self.calls.get(module, 0) + 1

    def _leave(self, module, args, output):
        self.stack.pop()

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        name = str(func.overloadpacket)
        if name.startswith("rope.") or name in TRIG:
            key = (self.stack[-1], "rope" if name.startswith("rope.") else "trig")
            self.ops[key] = self.ops.get(key, 0) + 1
        return func(*args, **(kwargs or {}))

    def count(self, kind, modules=None, inside=False):
        """The ops of ``kind`` run inside ``modules`` (any attention or RoPE module: ``inside``;
        anywhere: neither)."""
        return sum(
            n
            for (m, k), n in self.ops.items()
            if k == kind and (modules is None or m in modules) and (not inside or m is not None)
        )

    def remove(self):
        for handle in self.handles:
            handle.remove()


def _handed_rope(module, args, kwargs):
    try:
        signature = inspect.signature(module.forward)
        bound = dict(signature.bind_partial(*args, **kwargs).arguments)
    except (TypeError, ValueError):
        signature, bound = None, dict(kwargs)
    for parameter in signature.parameters.values() if signature else ():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            bound.update(bound.pop(parameter.name, None) or {})
    return any(
        value is not None and any(k in name for k in ("rotary", "rope", "freqs", "position_emb"))
        for name, value in bound.items()
    )


def _owns_rope(module):
    """An attention module that computes its RoPE itself (SAME's)."""
    return hasattr(module, "processor") and any(hasattr(m, "torch_rope") for m in module.modules())


def _is_rope(module):
    name = type(module).__name__.lower()
    return any(k in name for k in ("rope", "rotary", "posembed", "embednd"))


def run(model, inputs):
    with torch.no_grad():
        return dm.flat(model(**inputs))


def patched_attention(model):
    """Every attention module a patch installed a processor on (wrappers: their nets')."""
    found = []
    for module in model.modules():
        record = records.attached(module)
        if record is not None:
            found.extend(record.attention)
    return found


def counted_run(model, inputs):
    counter = RopeCounter(model)
    try:
        with counter:
            out = run(model, inputs)
    finally:
        counter.remove()
    return out, counter


def close_fp32(want, got):
    scale = max(1.0, want.abs().max().item())
    return (want - got).abs().max().item() <= 1e-5 * scale


@pytest.mark.parametrize("name", RECIPES)
def test_patched_forward_matches_unpatched(name):
    model, inputs = dm.build(name)
    want = run(model, inputs)
    patched = trd.patch(copy.deepcopy(model))
    assert trd.is_patched(patched) and not trd.is_patched(model)
    first = run(patched, inputs)  # the first call may grow the tables
    got, counter = counted_run(patched, inputs)
    assert torch.equal(first, got)
    if name.split(":")[0] in FP64_RULE:
        reference = dm.float64_output(model, inputs)
        ours, theirs = (got - reference).abs().max(), (want - reference).abs().max()
        assert ours <= theirs, (name, ours.item(), theirs.item())
    elif name.split(":")[0] in ROUNDED_QK:
        with NoBf16Rounding():
            unrounded_want, unrounded_got = run(model, inputs), run(patched, inputs)
        assert close_fp32(unrounded_want, unrounded_got), (
            name,
            (unrounded_want - unrounded_got).abs().max().item(),
        )
        assert (got - want).norm() < (got - unrounded_want).norm(), name
    else:
        assert close_fp32(want, got), (name, (want - got).abs().max().item())

    # Our op in every patched attention module, on every call; no trig where RoPE happens.
    attention = patched_attention(patched)
    assert attention, name
    ran = [m for m in attention if counter.calls.get(m)]
    assert ran, name
    for module in ran:
        assert counter.count("rope", {module}) >= counter.calls[module], (name, module)
    assert counter.count("trig", inside=True) == 0, (name, counter.ops)

    # The original instance is untouched; unpatch restores the exact output.
    assert torch.equal(run(model, inputs), want)
    trd.unpatch(patched)
    assert not trd.is_patched(patched)
    assert not any(
        hasattr(m, "torch_rope") or hasattr(m, "torch_rope_tables") for m in patched.modules()
    )
    assert torch.equal(run(patched, inputs), want)


def _keep_rope_fp32(model):
    for module in model.modules():
        if _is_rope(module):
            module.float()
    return model


#: Classes whose bf16 forward needs their ``_keep_in_fp32_modules`` in float32, as
#: ``from_pretrained(torch_dtype=...)`` keeps them (a plain ``.to(bf16)`` fails), with why; both
#: models get them so.
KEEP_FP32_MODULES = {
    "Kandinsky5Transformer3DModel": (
        "its time embeddings cast the timestep to float32 before their linear layers"
    ),
}


def _to_bf16(model, name):
    model = model.to(torch.bfloat16)
    if name.split(":")[0] in KEEP_FP32_MODULES:
        keep = type(model)._keep_in_fp32_modules
        for module_name, module in model.named_modules():
            if any(k in module_name for k in keep):  # diffusers' rule: a substring of the name
                module.float()
    return model


@pytest.mark.parametrize("name", RECIPES)
def test_bf16_error_is_at_most_diffusers_own(name):
    model, inputs = dm.build(name)
    reference = dm.float64_output(model, inputs)
    bf16_inputs = dm.cast_inputs(inputs, torch.bfloat16)
    theirs_model = _keep_rope_fp32(_to_bf16(copy.deepcopy(model), name))
    ours_model = _to_bf16(trd.patch(copy.deepcopy(model)), name)
    theirs = run(theirs_model, bf16_inputs).double()
    ours = run(ours_model, bf16_inputs).double()

    def error(out):
        return ((out - reference).norm() / reference.norm()).item()

    assert error(ours) <= 1.5 * error(theirs), (name, error(ours), error(theirs))


def test_the_counter_sees_the_trig_diffusers_builds_per_call():
    """FLUX's RoPE module computes cos/sin every forward: the counter that finds none in the
    patched models finds them in the unpatched one."""
    model, inputs = dm.build("FluxTransformer2DModel")
    _, counter = counted_run(model, inputs)
    assert counter.count("trig", inside=True) > 0
