# SPDX-License-Identifier: BSD-3-Clause
"""torch_rope.hf.patch on vision towers loaded on their own (``qwen2_5_vl_vision`` ...: model
types of their own in transformers, image encoders with only the vision rotary module).

Each tower is built tiny from its own default config (hf_models.build_vision_tower) and run on two
images of 4x6 and 6x4 patches, so the patches' rows and columns differ. For each type: the patched
tower's outputs (last hidden states, and the merger's pooled output where it has one) match the
unpatched tower's in fp32, rope::apply_qk runs exactly once in every vision block (and HF's
cos/sin never run), the wrong pair layout and swapped rows and columns each move the output, and
in bf16 the patched tower is no further from the fp32 output than 1.5x HF's own bf16 tower.
"""

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed")

import hf_models  # noqa: E402
from test_hf import OpCounter, rel_err, rope_calls  # noqa: E402
from test_hf_vlm import PerLayer  # noqa: E402

import torch_rope.hf  # noqa: E402
from torch_rope.hf.model_parts import calls_hf_apply, rotary_modules  # noqa: E402

FAST = ["qwen3_vl_vision", "glm4v_vision", "video_llama_3_vision"]
ALL = [pytest.param(n) for n in FAST] + [
    pytest.param(n, marks=pytest.mark.slow) for n in hf_models.VISION_TOWERS if n not in FAST
]


def outputs(model, inputs):
    """The tower's output tensors by name: last_hidden_state and, where the tower merges
    patches, pooler_output."""
    with torch.no_grad():
        out = model(**inputs)
    return {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}


def vision_blocks(model):
    names = ("apply_rotary_pos_emb_vision", "apply_rotary_pos_emb")  # Pixtral's: the latter
    return [m for m in model.modules() if calls_hf_apply(m, names)]


def vision_rotary(model):
    (rotary,) = [m for m in model.modules() if type(m).__name__.endswith("VisionRotaryEmbedding")]
    return rotary


@pytest.mark.parametrize("name", ALL)
def test_patched_vision_tower_matches_unpatched(name):
    reference, inputs = hf_models.build_vision_tower(name)
    model = copy.deepcopy(reference)
    want = outputs(reference, inputs)
    assert "last_hidden_state" in want

    assert torch_rope.hf.patch(model) is model
    assert model.state_dict().keys() == reference.state_dict().keys()
    blocks = vision_blocks(model)
    assert blocks
    with OpCounter() as counter, PerLayer(counter, blocks) as per_block:
        got = outputs(model, inputs)
    # One apply_qk in every vision block; HF's vision rotary module computed no cos/sin.
    assert all(calls == [1] for calls in per_block.calls.values()), per_block.calls
    assert rope_calls(counter) == len(blocks)
    assert counter.counts.get("aten.cos", 0) == 0 and counter.counts.get("aten.sin", 0) == 0
    assert got.keys() == want.keys()
    for key in want:
        assert rel_err(got[key], want[key]) <= 1e-5, (key, rel_err(got[key], want[key]))

    with OpCounter() as counter:
        outputs(reference, inputs)
    assert rope_calls(counter) == 0


@pytest.mark.parametrize("name", ALL)
def test_vision_tower_wrong_layout_or_axes_move_the_output(name):
    """Negative controls: the other pair layout (GPT-J pairs instead of rotate_half, or back),
    and rows and columns swapped, must each move the output."""
    model, inputs = hf_models.build_vision_tower(name)
    torch_rope.hf.patch(model)
    right = outputs(model, inputs)["last_hidden_state"]
    tables = vision_rotary(model).torch_rope
    tables.interleaved = not tables.interleaved
    assert rel_err(outputs(model, inputs)["last_hidden_state"], right) > 1e-3
    tables.interleaved = not tables.interleaved
    assert torch.equal(outputs(model, inputs)["last_hidden_state"], right)

    rotary = vision_rotary(model)
    patched = rotary.forward
    rotary.forward = lambda x, position_ids: patched(x, position_ids.flip(-1))
    assert rel_err(outputs(model, inputs)["last_hidden_state"], right) > 1e-3


@pytest.mark.parametrize("name", ALL)
def test_vision_tower_bfloat16_error_within_hf_own(name):
    """In bf16 each output of the patched tower is at most 1.5x as far from the fp32 output as
    HF's bf16 tower's is."""
    fp32, inputs = hf_models.build_vision_tower(name)
    want = outputs(fp32, inputs)
    hf_bf16 = copy.deepcopy(fp32).to(torch.bfloat16)
    ours_bf16 = torch_rope.hf.patch(copy.deepcopy(fp32)).to(torch.bfloat16)
    assert vision_rotary(ours_bf16).torch_rope.cos.dtype == torch.float32
    bf16_inputs = {k: v.bfloat16() if v.is_floating_point() else v for k, v in inputs.items()}
    hf_out, our_out = outputs(hf_bf16, bf16_inputs), outputs(ours_bf16, bf16_inputs)
    for key in want:
        hf_err = (hf_out[key].double() - want[key].double()).abs().max().item()
        our_err = (our_out[key].double() - want[key].double()).abs().max().item()
        assert our_err <= 1.5 * hf_err, (key, our_err, hf_err)


def test_unpatch_restores_a_vision_tower_exactly():
    model, inputs = hf_models.build_vision_tower("qwen3_vl_vision")
    want = outputs(model, inputs)["last_hidden_state"]
    torch_rope.hf.patch(model)
    assert torch_rope.hf.is_patched(model)
    torch_rope.hf.unpatch(model)
    assert not torch_rope.hf.is_patched(model)
    assert all("forward" not in vars(m) for m in model.modules())
    assert not any(hasattr(m, "torch_rope") for m in model.modules())
    with OpCounter() as counter:
        got = outputs(model, inputs)["last_hidden_state"]
    assert rope_calls(counter) == 0
    assert torch.equal(got, want)


def test_vision_tower_type_with_a_text_rotary_is_refused():
    """A model of a vision-tower type that also had a text rotary module would keep that RoPE
    unpatched: patch refuses it and leaves it untouched."""
    model, _ = hf_models.build_vision_tower("qwen3_vl_vision")
    text = hf_models.build_vision_vlm("exaone4_5")[0]
    (text_rotary,) = rotary_modules(text)
    model.add_module("text_rotary_emb", text_rotary)
    with pytest.raises(NotImplementedError, match="vision tower alone"):
        torch_rope.hf.patch(model)
    assert not torch_rope.hf.is_patched(model)
    assert all("forward" not in vars(m) for m in model.modules())


#: The towers whose axes alternate plane by plane (Kimi-K2.5's), not one run of planes per axis.
ALTERNATING = ["kimi_k25_vision"]


def alternating_reference(q, k, cos, sin):
    """Kimi-K2.5's vision rotation, written from its definition: rotate_half over the head, plane
    ``p`` turning by the column for even ``p`` and by the row for odd ``p``, at frequency
    ``theta^(-2 (p // 2) / (D / 2))``; ``cos``/``sin`` here are the (N, 2) (row, column) patch
    positions and the tables (unused: the angles are computed afresh in float64)."""
    positions, d = cos, q.shape[-1]
    p = torch.arange(d // 2, dtype=torch.float64)
    freq = 10000.0 ** (-2 * (p // 2) / (d // 2))
    axis = torch.where(p % 2 == 0, 1, 0)  # even planes: the column
    angle = positions[:, axis].double() * freq  # (N, D/2)
    c, s = angle.cos()[:, None, :], angle.sin()[:, None, :]

    def turn(x):
        x1, x2 = x[..., : d // 2].double(), x[..., d // 2 :].double()
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1).to(x.dtype)

    return turn(q), turn(k)


@pytest.mark.parametrize("name", ALTERNATING)
def test_alternating_axes_match_a_reference_and_each_wrong_rule_moves_the_output(name, monkeypatch):
    """The patched tower's rotation is that of the plane-by-plane rule written here (not HF's
    code): swapped in for torch_rope's, it gives the same output. The rule without alternation
    (one run of planes per axis, as Qwen2-VL's towers) and the row on the even planes instead of
    the column each move the output."""
    from torch_rope.hf.families import axial_vision

    reference, inputs = hf_models.build_vision_tower(name)
    assert reference.config.rope_parameters["rope_theta"] == 10000.0  # alternating_reference's
    model = torch_rope.hf.patch(copy.deepcopy(reference))
    right = outputs(model, inputs)["last_hidden_state"]
    tables = vision_rotary(model).torch_rope
    assert tables.alternating and tables.column_first
    assert rel_err(right, outputs(reference, inputs)["last_hidden_state"]) <= 1e-5

    namespace = {}
    for block in vision_blocks(model):
        forward = axial_vision.FORWARDS.forward(type(block))
        namespace[id(forward.__globals__)] = forward.__globals__
    for module_globals in namespace.values():
        monkeypatch.setitem(module_globals, axial_vision.HF_VISION_NAME, alternating_reference)
    assert rel_err(outputs(model, inputs)["last_hidden_state"], right) <= 1e-5
    monkeypatch.undo()
    assert torch.equal(outputs(model, inputs)["last_hidden_state"], right)

    for flag in ("alternating", "column_first"):
        setattr(tables, flag, not getattr(tables, flag))
        assert rel_err(outputs(model, inputs)["last_hidden_state"], right) > 1e-3, flag
        setattr(tables, flag, not getattr(tables, flag))
    assert torch.equal(outputs(model, inputs)["last_hidden_state"], right)


@pytest.mark.parametrize("name", ALTERNATING)
def test_alternating_tower_without_the_rule_is_refused_by_the_self_check(name, monkeypatch):
    """Registered as an axial tower with one run of planes per axis, the tower fails the
    self-check: patch refuses it and leaves it untouched."""
    from torch_rope.hf.registry import REGISTRY

    row = REGISTRY.rows[name]
    monkeypatch.setitem(
        REGISTRY.rows, name, row._replace(vision=row.vision._replace(alternating=False))
    )
    model, _ = hf_models.build_vision_tower(name)
    with pytest.raises(NotImplementedError, match="2-D RoPE"):
        torch_rope.hf.patch(model)
    assert not torch_rope.hf.is_patched(model)
    assert all("forward" not in vars(m) for m in model.modules())
    assert not any(hasattr(m, "torch_rope") for m in model.modules())
