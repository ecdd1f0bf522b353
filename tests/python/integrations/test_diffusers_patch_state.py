# SPDX-License-Identifier: BSD-3-Clause
"""torch_rope.diffusers.patch and the state a model is in when it is patched, or gets into after.

* A RoPE module with a forward set on the instance (a wrapper that swaps FLUX's axes, any
  wrapper) is refused, naming it: patch used to replace that forward and check the class's, so the
  patched model was silently off.
"""

import copy

import pytest
import torch

pytest.importorskip("diffusers", reason="diffusers is not installed")

import diffusers_models as dm  # noqa: E402
from test_diffusers import run  # noqa: E402

import torch_rope.diffusers as trd  # noqa: E402


def _swapped_axes(rope):
    """FLUX's ids with the row and column axes swapped, set on the RoPE module's instance."""
    original = rope.forward
    rope.forward = lambda ids: original(ids[:, [0, 2, 1]])
    return rope.forward


def _wrapped(rope):
    """A wrapper that changes nothing: refused all the same (patch cannot see what it does)."""
    original = rope.forward
    rope.forward = lambda hidden_states: original(hidden_states)
    return rope.forward


@pytest.mark.parametrize(
    "name, where, change, shows",
    [
        ("FluxTransformer2DModel", "pos_embed", _swapped_axes, True),
        ("WanTransformer3DModel", "rope", _wrapped, False),
    ],
)
def test_a_rope_module_with_a_forward_set_on_the_instance_is_refused(name, where, change, shows):
    reference, inputs = dm.build(name)
    model = copy.deepcopy(reference)
    changed = change(model.get_submodule(where))
    want = run(model, inputs)
    assert (not torch.equal(want, run(reference, inputs))) == shows

    with pytest.raises(NotImplementedError, match=rf"'{where}' has a forward set on the instance"):
        trd.patch(model)

    assert not trd.is_patched(model)
    assert vars(model.get_submodule(where))["forward"] is changed
    assert not any(hasattr(m, "torch_rope") for m in model.modules())
    assert torch.equal(run(model, inputs), want)
