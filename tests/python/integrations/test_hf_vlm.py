# SPDX-License-Identifier: BSD-3-Clause
"""torch_rope.hf.patch on vision-language models: the text tower's multi-axis (M-RoPE) positions
and the vision tower's 2-D RoPE, on tiny random-weight models run with an image.

Each model gets one image per row (4x6 and 6x4 patches, the second row left-padded), so the text
tower's temporal/height/width position axes differ over the image tokens and the vision tower's
rows and columns differ. For each type: fp32 logits of the patched model match the unpatched
one, greedy generation with a KV cache gives the same tokens, rope::apply_qk runs exactly once in
every text decoder layer and every vision block (and HF's cos/sin never run), the wrong plane to
axis assignment or swapped vision axes move the logits, and in bf16 the patched model is no
further from the fp32 logits than 1.5x HF's own bf16 model.
"""

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed")

import hf_models  # noqa: E402
from test_hf import HFRotations, OpCounter, rel_err, rope_calls  # noqa: E402

import torch_rope  # noqa: E402
import torch_rope.hf  # noqa: E402

FAST = ["qwen3_vl"]
ALL = [pytest.param(n) for n in FAST] + [
    pytest.param(n, marks=pytest.mark.slow) for n in hf_models.VLM if n not in FAST
]


def logits(model, inputs):
    with torch.no_grad():
        return model(**inputs).logits


def vision_states(model, inputs):
    """The vision tower's last hidden states (before the merger): what its RoPE moves most."""
    with torch.no_grad():
        pixels = inputs["pixel_values"]
        if model.config.model_type == "paddleocr_vl":  # its model hands the tower (1, N, ...)
            pixels = pixels.unsqueeze(0)
        out = model.model.visual(pixels, grid_thw=inputs["image_grid_thw"])
    return out.last_hidden_state


def vision_rotary(model):
    (rotary,) = [
        m
        for m in model.model.visual.modules()
        if type(m).__name__.endswith("VisionRotaryEmbedding")
    ]
    return rotary


def generate(model, inputs, new_tokens=4):
    with torch.no_grad():
        return model.generate(
            **inputs, max_new_tokens=new_tokens, do_sample=False, pad_token_id=0, use_cache=True
        )


def towers(model):
    """(text attention layers, vision attention layers) of a tiny VLM (Qwen3.5's linear-attention
    layers, which do not rotate, have no self_attn)."""
    layers = model.model.language_model.layers
    text = [layer.self_attn for layer in layers if hasattr(layer, "self_attn")]
    vision = [m for m in model.model.visual.modules() if type(m).__name__.endswith("Attention")]
    return text, vision


class PerLayer:
    """torch_rope rotations (test_hf.rope_calls) made inside each of ``layers``, per forward."""

    def __init__(self, counter, layers, read=rope_calls):
        self.calls = {id(layer): [] for layer in layers}
        self.read = read
        self.handles = []
        for layer in layers:
            self.handles.append(layer.register_forward_pre_hook(self._before))
            self.handles.append(layer.register_forward_hook(self._after))
        self.counter, self._start = counter, {}

    def _before(self, layer, args):
        self._start[id(layer)] = self.read(self.counter)

    def _after(self, layer, args, output):
        self.calls[id(layer)].append(self.read(self.counter) - self._start[id(layer)])

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()


@pytest.mark.parametrize("name", ALL)
def test_patched_vlm_matches_unpatched(name):
    reference = hf_models.build_vlm(name)
    model = copy.deepcopy(reference)
    inputs = hf_models.vlm_batch(reference.config)
    # The image tokens' three axes really differ (HF's own position ids of this batch).
    token_types = {k: v for k, v in inputs.items() if k == "mm_token_type_ids"}
    axes, _ = reference.model.get_rope_index(
        inputs["input_ids"],
        image_grid_thw=inputs["image_grid_thw"],
        attention_mask=inputs["attention_mask"],
        **token_types,
    )
    image = inputs["input_ids"] == hf_models.IMAGE
    assert not torch.equal(axes[1][image], axes[2][image])
    assert not torch.equal(axes[0][image], axes[1][image])
    want = logits(reference, inputs)
    want_vision = vision_states(reference, inputs)

    assert torch_rope.hf.patch(model) is model
    assert model.state_dict().keys() == reference.state_dict().keys()
    text, vision = towers(model)
    with OpCounter() as counter, PerLayer(counter, text + vision) as per_layer:
        got = logits(model, inputs)
    # One rotation in every text decoder layer (Qwen3-VL: rms_norm_apply_qk, its q/k norms fused)
    # and one apply_qk in every vision block; HF's rotary modules
    # (text and vision) computed no cos/sin.
    assert all(calls == [1] for calls in per_layer.calls.values()), per_layer.calls
    assert rope_calls(counter) == len(text) + len(vision)
    assert counter.counts.get("aten.cos", 0) == 0 and counter.counts.get("aten.sin", 0) == 0
    assert rel_err(got, want) <= 1e-5, rel_err(got, want)
    got_vision = vision_states(model, inputs)
    assert rel_err(got_vision, want_vision) <= 1e-5, rel_err(got_vision, want_vision)

    # Greedy generation with a KV cache (the image in the prompt, a left-padded row): same tokens.
    want_tokens = generate(reference, inputs)
    with OpCounter() as counter, PerLayer(counter, text + vision) as per_layer:
        got_tokens = generate(model, inputs)
    assert torch.equal(got_tokens, want_tokens), (got_tokens, want_tokens)
    # The prompt and then each new token but the last, in every text layer; the image once.
    assert all(per_layer.calls[id(layer)] == [1] * 4 for layer in text), per_layer.calls
    assert all(per_layer.calls[id(layer)] == [1] for layer in vision), per_layer.calls

    with OpCounter() as counter:
        logits(reference, inputs)
    assert rope_calls(counter) == 0


@pytest.mark.parametrize("name", ALL)
def test_wrong_axes_move_the_logits(name):
    """Negative controls: the other plane-to-axis rule in the text tower, and the vision tower's
    rows and columns swapped, must each move the logits."""
    model = torch_rope.hf.patch(hf_models.build_vlm(name))
    inputs = hf_models.vlm_batch(model.config)
    right = logits(model, inputs)
    # One table for the model, or one per layer type (Cohere Compass).
    tables = model.model.language_model.rotary_emb.torch_rope.values()
    for table in tables:
        table.mrope_interleaved = not table.mrope_interleaved
    assert rel_err(logits(model, inputs), right) > 1e-3
    for table in tables:
        table.mrope_interleaved = not table.mrope_interleaved
    assert torch.equal(logits(model, inputs), right)

    right_vision = vision_states(model, inputs)
    rotary = vision_rotary(model)
    patched = rotary.forward
    rotary.forward = lambda x, position_ids: patched(x, position_ids.flip(-1))
    assert rel_err(vision_states(model, inputs), right_vision) > 1e-3
    assert rel_err(logits(model, inputs), right) > 1e-5  # the fp32 tolerance of the match test


@pytest.mark.parametrize("name", ALL)
def test_vlm_bfloat16_error_within_hf_own(name):
    """In bf16 the patched model is at most 1.5x as far from the fp32 logits as HF's bf16 is."""
    fp32 = hf_models.build_vlm(name)
    inputs = hf_models.vlm_batch(fp32.config)
    want = logits(fp32, inputs).double()
    hf_bf16 = copy.deepcopy(fp32).to(torch.bfloat16)
    ours_bf16 = torch_rope.hf.patch(copy.deepcopy(fp32)).to(torch.bfloat16)
    tables = ours_bf16.model.language_model.rotary_emb.torch_rope.values()
    assert all(table.cos.dtype == torch.float32 for table in tables)
    assert vision_rotary(ours_bf16).torch_rope.cos.dtype == torch.float32
    bf16_inputs = dict(inputs, pixel_values=inputs["pixel_values"].to(torch.bfloat16))
    hf_err = (logits(hf_bf16, bf16_inputs).double() - want).abs().max().item()
    our_err = (logits(ours_bf16, bf16_inputs).double() - want).abs().max().item()
    assert our_err <= 1.5 * hf_err, (our_err, hf_err)


def test_unpatch_restores_a_vlm_exactly():
    model = hf_models.build_vlm("qwen3_vl")
    inputs = hf_models.vlm_batch(model.config)
    want = logits(model, inputs)
    torch_rope.hf.patch(model)
    assert hasattr(model.model.visual.rotary_pos_emb, "torch_rope")
    torch_rope.hf.unpatch(model)
    assert not torch_rope.hf.is_patched(model)
    assert all("forward" not in vars(m) for m in model.modules())
    assert not any(
        hasattr(m, "torch_rope") or hasattr(m, "_torch_rope_axes") for m in model.modules()
    )
    with OpCounter() as counter:
        got = logits(model, inputs)
    assert rope_calls(counter) == 0
    assert torch.equal(got, want)


def test_vision_self_check_refuses_a_different_vision_rotation(monkeypatch):
    """If a vision tower rotated differently (here: GPT-J pairs), patch refuses the whole model
    and leaves it untouched, text tower included."""
    model = hf_models.build_vlm("qwen2_vl")
    module_globals = type(model.model.visual.blocks[0].attn).forward.__globals__

    def pairs_apply(q, k, cos, sin):
        def rot(x):
            x1, x2 = x[..., ::2], x[..., 1::2]
            c, s = cos.unsqueeze(-2)[..., ::2], sin.unsqueeze(-2)[..., ::2]
            return torch.stack([x1 * c - x2 * s, x1 * s + x2 * c], -1).flatten(-2)

        return rot(q), rot(k)

    monkeypatch.setitem(module_globals, "apply_rotary_pos_emb_vision", pairs_apply)
    with pytest.raises(NotImplementedError, match="2-D RoPE"):
        torch_rope.hf.patch(model)
    assert not torch_rope.hf.is_patched(model)
    assert all("forward" not in vars(m) for m in model.modules())
    assert not any(hasattr(m, "torch_rope") for m in model.modules())


def test_vlm_type_not_yet_supported_is_refused_by_name():
    config = transformers.AutoConfig.for_model("qwen2_5_omni")
    assert config.model_type not in torch_rope.hf.SUPPORTED_MODEL_TYPES
    model = torch.nn.Module()
    model.config = config
    with pytest.raises(NotImplementedError, match=r"model type 'qwen2_5_omni' is not supported"):
        torch_rope.hf.patch(model)


# ---- vision-language models with a 1-D text RoPE (hf_models.VISION_VLM) ----------------------

VISION_VLM = [pytest.param(n, marks=pytest.mark.slow) for n in hf_models.VISION_VLM]


def rotaries(model, name):
    """(text rotary module, vision rotary module) of the model ``name`` of hf_models.VISION_VLM;
    the text one None for a text tower without RoPE (hf_models.NO_TEXT_ROPE)."""
    found = [m for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding")]
    text = [m for m in found if not type(m).__name__.endswith("VisionRotaryEmbedding")]
    vision = [m for m in found if type(m).__name__.endswith("VisionRotaryEmbedding")]
    assert len(text) == (name not in hf_models.NO_TEXT_ROPE) and len(vision) == 1
    return (text or [None])[0], vision[0]


@pytest.mark.parametrize("name", VISION_VLM)
def test_patched_vision_tower_vlm_matches_unpatched(name, monkeypatch):
    """As test_patched_vlm_matches_unpatched, for a VLM whose text tower has 1-D positions: fp32
    logits and vision states, greedy generation with a KV cache (the image in the prompt, a
    left-padded row), one rotation in every vision layer and in every text layer that the
    unpatched model rotates in (none in a NoPE layer), no HF cos/sin."""
    reference, inputs, hf_text, _, vision_states = hf_models.build_vision_vlm(name)
    model, _, text, vision, _ = hf_models.build_vision_vlm(name)  # the same weights (same seed)
    hf_rotations = HFRotations(monkeypatch, reference)
    with PerLayer(hf_rotations, hf_text, read=lambda r: r.calls) as hf_per_layer:
        want = logits(reference, inputs)
    rotating = [calls == [1] for calls in hf_per_layer.calls.values()]
    if name in hf_models.NO_TEXT_ROPE:  # no text layer rotates, and the model no text q/k at all
        assert not hf_text and hf_rotations.calls == 0
    else:
        assert any(rotating) and all(c in ([0], [1]) for c in hf_per_layer.calls.values())
    want_vision = vision_states(reference, inputs)
    assert rel_err(logits(model, inputs), want) == 0

    assert torch_rope.hf.patch(model) is model
    assert model.state_dict().keys() == reference.state_dict().keys()
    text = [layer for layer, rotates in zip(text, rotating) if rotates]
    with OpCounter() as counter, PerLayer(counter, text + vision) as per_layer:
        got = logits(model, inputs)
    assert all(calls == [1] for calls in per_layer.calls.values()), per_layer.calls
    assert rope_calls(counter) == len(text) + len(vision)
    assert counter.counts.get("aten.cos", 0) == 0 and counter.counts.get("aten.sin", 0) == 0
    assert rel_err(got, want) <= 1e-5, rel_err(got, want)
    got_vision = vision_states(model, inputs)
    assert rel_err(got_vision, want_vision) <= 1e-5, rel_err(got_vision, want_vision)

    want_tokens = generate(reference, inputs)
    with OpCounter() as counter, PerLayer(counter, text + vision) as per_layer:
        got_tokens = generate(model, inputs)
    assert torch.equal(got_tokens, want_tokens), (got_tokens, want_tokens)
    assert all(per_layer.calls[id(layer)] == [1] * 4 for layer in text), per_layer.calls
    assert all(per_layer.calls[id(layer)] == [1] for layer in vision), per_layer.calls


@pytest.mark.parametrize("name", VISION_VLM)
def test_vision_tower_vlm_wrong_layout_or_axes_move_the_logits(name):
    """Negative controls: the other pair layout in the text tower, and the vision tower's rows and
    columns swapped, must each move the output."""
    model, inputs, _, _, vision_states = hf_models.build_vision_vlm(name)
    torch_rope.hf.patch(model)
    right, right_vision = logits(model, inputs), vision_states(model, inputs)
    text_rotary, vision_rotary = rotaries(model, name)
    if text_rotary is not None:  # (hf_models.NO_TEXT_ROPE: no text RoPE to get wrong)
        for tables in text_rotary.torch_rope.values():
            tables.interleaved = not tables.interleaved
        assert rel_err(logits(model, inputs), right) > 1e-3
        for tables in text_rotary.torch_rope.values():
            tables.interleaved = not tables.interleaved
        assert torch.equal(logits(model, inputs), right)

    patched = vision_rotary.forward
    if name == "llama4":  # no position ids come in: the positions are the one image size's
        positions = patched(None).positions
        vision_rotary.forward = lambda x: patched(x, positions.flip(-1))
    else:
        vision_rotary.forward = lambda x, position_ids: patched(x, position_ids.flip(-1))
    assert rel_err(vision_states(model, inputs), right_vision) > 1e-3
    assert rel_err(logits(model, inputs), right) > 1e-5  # the fp32 tolerance of the match test


def to_bfloat16(model):
    """``model`` cast to bf16 as transformers loads it in bf16: the weights its classes keep in
    float32 (``_keep_in_fp32_modules_strict``: Inkling2's MoE router, which computes in float32
    and fails on a bf16 weight) stay float32, matched as transformers' loading matches them."""
    from transformers.core_model_loading import build_glob_alternation

    plan = model._get_dtype_plan(torch.bfloat16)
    model.to(torch.bfloat16)
    if plan:
        kept, _, _ = build_glob_alternation(list(plan))
        for name, tensor in model.state_dict(keep_vars=True).items():
            if kept.search(name):
                tensor.data = tensor.data.float()
    return model


@pytest.mark.parametrize("name", VISION_VLM)
def test_vision_tower_vlm_bfloat16_error_within_hf_own(name):
    fp32, inputs, _, _, _ = hf_models.build_vision_vlm(name)
    want = logits(fp32, inputs).double()
    hf_bf16 = to_bfloat16(copy.deepcopy(fp32))
    ours_bf16 = to_bfloat16(torch_rope.hf.patch(copy.deepcopy(fp32)))
    text_rotary, vision_rotary = rotaries(ours_bf16, name)
    if text_rotary is not None:
        assert all(t.cos.dtype == torch.float32 for t in text_rotary.torch_rope.values())
    assert vision_rotary.torch_rope.cos.dtype == torch.float32
    bf16_inputs = dict(inputs, pixel_values=inputs["pixel_values"].to(torch.bfloat16))
    hf_err = (logits(hf_bf16, bf16_inputs).double() - want).abs().max().item()
    our_err = (logits(ours_bf16, bf16_inputs).double() - want).abs().max().item()
    assert our_err <= 1.5 * hf_err, (our_err, hf_err)


@pytest.mark.slow
def test_unpatch_restores_a_vlm_without_text_rope_and_one_with_is_refused():
    """GLM-5-Next: only its vision tower is patched, and unpatch restores it bit for bit; had its
    text tower a rotary module after all, patch would refuse the model and leave it untouched."""
    model, inputs, _, _, _ = hf_models.build_vision_vlm("glm5_next")
    want = logits(model, inputs)
    torch_rope.hf.patch(model)
    assert [type(m).__name__ for m in model.modules() if hasattr(m, "torch_rope")] == [
        "Glm5NextVisionRotaryEmbedding"
    ]
    torch_rope.hf.unpatch(model)
    assert not torch_rope.hf.is_patched(model)
    assert all("forward" not in vars(m) for m in model.modules())
    assert not any(hasattr(m, "torch_rope") for m in model.modules())
    with OpCounter() as counter:
        got = logits(model, inputs)
    assert rope_calls(counter) == 0
    assert torch.equal(got, want)

    text_rotary, _ = rotaries(hf_models.build_vision_vlm("exaone4_5")[0], "exaone4_5")
    model.model.language_model.add_module("rotary_emb", text_rotary)
    with pytest.raises(NotImplementedError, match="vision tower alone"):
        torch_rope.hf.patch(model)
    assert not torch_rope.hf.is_patched(model)
    assert all("forward" not in vars(m) for m in model.modules())
    assert not any(hasattr(m, "torch_rope") for m in model.modules())


@pytest.mark.slow
def test_llama4_vision_self_check_refuses_a_different_vision_rotation(monkeypatch):
    """Llama 4's vision layers are self-checked too: had its vision rotation turned by minus the
    angle, patch would refuse the whole model and leave it untouched."""
    model, _, text, vision, _ = hf_models.build_vision_vlm("llama4")
    assert text and len(vision) == model.config.vision_config.num_hidden_layers
    module_globals = type(vision[0]).forward.__globals__
    original = module_globals["vision_apply_rotary_emb"]

    def turned_back(query, key, freqs_ci):
        return original(query, key, freqs_ci=freqs_ci.conj())

    monkeypatch.setitem(module_globals, "vision_apply_rotary_emb", turned_back)
    with pytest.raises(NotImplementedError, match="2-D RoPE"):
        torch_rope.hf.patch(model)
    assert not torch_rope.hf.is_patched(model)
    assert all("forward" not in vars(m) for m in model.modules())
    assert not any(hasattr(m, "torch_rope") for m in model.modules())


# ---- a text tower whose two position axes alternate plane by plane (NeoMME) -------------------


def two_axis_positions(ids):
    """(2, B, S) row and column positions, as NeoMME's processor gives a document image's
    tokens: the two axes differ on most tokens."""
    steps = torch.arange(ids.size(1))
    axes = torch.stack([steps // 3, (steps * 5 + 1) % 7])
    return axes.unsqueeze(1).expand(2, ids.size(0), -1)


@pytest.mark.slow
@pytest.mark.parametrize("tables", [True, False], ids=["tables", "table_free"])
def test_alternating_text_axes_match_unpatched_and_each_wrong_rule_moves_the_output(tables):
    """NeoMME at two-axis positions that differ: the patched encoder's last hidden states match
    the unpatched one's (tables or table-free), one rotation in every layer and no HF cos/sin;
    the rule without alternation (one run of planes per axis) and the row and column swapped
    each move them."""
    name = "base:neomme"
    reference = hf_models.built(name)
    model = torch_rope.hf.patch(copy.deepcopy(reference), tables=tables)
    ids, mask = hf_models.batch_for(name)
    positions = two_axis_positions(ids)

    def run(m, position_ids):
        with torch.no_grad():
            return m(input_ids=ids, attention_mask=mask, position_ids=position_ids)[0]

    want = run(reference, positions)
    # The second axis moves HF's own output (with 1-D positions both axes read the first).
    assert rel_err(run(reference, positions[0]), want) > 1e-3
    layers = [m for m in model.modules() if type(m).__name__ == "NeoMMEAttention"]
    with OpCounter() as counter, PerLayer(counter, layers) as per_layer:
        got = run(model, positions)
    assert all(calls == [1] for calls in per_layer.calls.values()), per_layer.calls
    if tables:
        assert counter.counts.get("aten.cos", 0) == 0 and counter.counts.get("aten.sin", 0) == 0
    assert rel_err(got, want) <= 1e-5, rel_err(got, want)

    found = list(model.rotary_emb.torch_rope.values())
    assert len(found) == 2 and all(t.alternating for t in found)
    for t in found:
        t.alternating = False
    assert rel_err(run(model, positions), want) > 1e-3
    for t in found:
        t.alternating = True
    assert torch.equal(run(model, positions), got)

    patched = model.rotary_emb.forward

    def swapped(x, position_ids, layer_type=None):
        axes, t = patched(x, position_ids, layer_type)
        return axes.flip(-1), t

    model.rotary_emb.forward = swapped
    assert rel_err(run(model, positions), want) > 1e-3


@pytest.mark.slow
def test_alternating_text_axes_self_check_refuses_a_model_with_runs_of_planes(monkeypatch):
    """Had NeoMME's rotary module dealt its planes to the axes in runs (the row's first, then the
    column's, as Qwen2-VL's sections do) instead of alternating them, the self-check, whose probe
    gives the two axes different positions, would refuse the model and leave it untouched."""
    model = hf_models.built("base:neomme")
    rotary = model.rotary_emb

    def runs(self, freq):
        half = freq.shape[-1] // 2
        angles = torch.cat([freq[0][..., :half], freq[1][..., half:]], dim=-1)
        return torch.cat([angles, angles], dim=-1)

    monkeypatch.setattr(type(rotary), "recomposition_frequencies", runs)
    with pytest.raises(NotImplementedError, match="disagrees with the unpatched"):
        torch_rope.hf.patch(model)
    assert not torch_rope.hf.is_patched(model)
    assert all("forward" not in vars(m) for m in model.modules())
    assert not any(hasattr(m, "torch_rope") for m in model.modules())
