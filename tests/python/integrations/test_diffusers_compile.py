# SPDX-License-Identifier: BSD-3-Clause
"""A patched diffusers model under torch.compile, and in a training step.

* ``torch.compile(fullgraph=True)`` of a patched model, one per family that tables its integer
  positions up front (FLUX's ids, the Wan and HunyuanVideo grids, Qwen-Image's centred grid,
  ACE-Step's function-built RoPE): the compiled model matches the eager unpatched one, and its
  graph holds the rope op and no cos/sin. FLUX compiles with inductor; the others with
  ``aot_eager`` (Dynamo and AOTAutograd, the part the patch touches, at a fraction of the time).
  Qwen-Image is also compiled right after patch, before any eager call: its tables cover the
  negative positions of centred grids from the start.
* One training step (loss over the output, backward) patched and unpatched: every parameter's
  gradient matches, one model per pair layout and family.
"""

import copy

import pytest
import torch

pytest.importorskip("diffusers", reason="diffusers is not installed")

import diffusers_models as dm  # noqa: E402
from test_diffusers import run  # noqa: E402

import torch_rope.diffusers as trd  # noqa: E402

COMPILED = {
    "FluxTransformer2DModel": "inductor",
    "WanTransformer3DModel": "aot_eager",
    "HunyuanVideoTransformer3DModel": "aot_eager",
    "QwenImageTransformer2DModel": "aot_eager",
    "AceStepTransformer1DModel": "aot_eager",
    "AllegroTransformer3DModel": "aot_eager",
}


class _Graphs:
    """A backend that records the ops of every graph Dynamo hands it, each with the modules it
    ran in (``nn_module_stack``), then runs ``backend``."""

    def __init__(self, backend):
        self.backend = backend
        self.ops = []

    def __call__(self, graph, example_inputs):
        for node in graph.graph.nodes:
            if node.op in ("call_function", "call_method"):
                stack = node.meta.get("nn_module_stack", {}).values()
                modules = " ".join(str(t) for _, t in stack)
                name = f"{node.target} {getattr(node.target, '__name__', '')}"
                self.ops.append((name, modules))
        if self.backend == "inductor":
            from torch._inductor.compile_fx import compile_fx

            return compile_fx(graph, example_inputs)
        from torch._dynamo.backends.debugging import aot_eager

        return aot_eager(graph, example_inputs)


@pytest.mark.parametrize("name", list(COMPILED))
def test_compiled_patched_model_matches_eager_unpatched(name):
    torch._dynamo.reset()
    model, inputs = dm.build(name)
    want = run(model, inputs)
    patched = trd.patch(copy.deepcopy(model))
    run(patched, inputs)  # eager first: the tables grow to the positions this input needs
    graphs = _Graphs(COMPILED[name])
    compiled = torch.compile(patched, fullgraph=True, backend=graphs)
    got = run(compiled, inputs)
    assert (got - want).abs().max().item() <= 1e-5 * max(1.0, want.abs().max().item()), name
    assert any("rope.apply" in op for op, _ in graphs.ops), graphs.ops
    assert _trig(graphs), "the graph lost the timestep embedding's sinusoids: the check is blind"
    assert not _trig(graphs, in_rope=True), _trig(graphs, in_rope=True)


def test_a_centred_grid_model_compiled_right_after_patch_runs_at_once():
    """Qwen-Image's centred grids have negative positions, which tables grown on an eager call
    used to be the only way to cover: compiled at once, the first call raised in the op."""
    torch._dynamo.reset()
    model, inputs = dm.build("QwenImageTransformer2DModel")
    want = run(model, inputs)
    compiled = torch.compile(trd.patch(copy.deepcopy(model)), fullgraph=True, backend="aot_eager")
    got = run(compiled, inputs)
    assert (got - want).abs().max().item() <= 1e-5 * max(1.0, want.abs().max().item())


_ROPE_SITES = ("Rotary", "Rope", "PosEmbed", "Attention")


def _trig(graphs, in_rope=False):
    """The graphs' cos/sin ops (``in_rope``: those inside a RoPE or attention module)."""
    found = [(op, m) for op, m in graphs.ops if op.split()[-1] in ("cos", "sin", "polar")]
    if in_rope:
        found = [(op, m) for op, m in found if any(k in m for k in _ROPE_SITES)]
    return found


def test_the_graph_check_sees_the_trig_of_an_unpatched_model():
    torch._dynamo.reset()
    model, inputs = dm.build("FluxTransformer2DModel")
    graphs = _Graphs("aot_eager")
    run(torch.compile(model, fullgraph=True, backend=graphs), inputs)
    assert _trig(graphs, in_rope=True)


TRAINED = [
    "FluxTransformer2DModel",  # GPT-J pairs, ids
    "WanTransformer3DModel",  # pairs, a nested rotation function
    "CosmosTransformer3DModel",  # halves, coordinate tables for its frame rate
    "QwenImageTransformer2DModel",  # complex pairs, negative positions
    "AceStepTransformer1DModel",  # halves, RoPE built in the model's forward
]


def _gradients(model, inputs):
    model.zero_grad()
    output = dm.flat(model(**inputs))
    (output.square().mean()).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", TRAINED)
def test_training_step_gradients_match(name):
    model, inputs = dm.build(name)
    want = _gradients(model, inputs)
    patched = trd.patch(copy.deepcopy(model))
    got = _gradients(patched, inputs)
    assert want.keys() == got.keys() and want
    for key in want:
        scale = max(1.0, want[key].abs().max().item())
        assert (want[key] - got[key]).abs().max().item() <= 1e-5 * scale, (name, key)
