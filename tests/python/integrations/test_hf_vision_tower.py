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
