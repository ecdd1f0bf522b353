# SPDX-License-Identifier: BSD-3-Clause
"""torch_rope.hf against the real transformers library, on tiny random-weight models.

For each model the patched copy must match the unpatched one (fp32 logits to 1e-5 relative,
identical greedy tokens with a KV cache and a left-padded row; a base model without an LM head,
hf_models.BASE, its last hidden states), the patched path must really run
(a dispatcher-level counter of rope::apply_qk, and no HF cos/sin computed), the wrong layout must
move the logits (negative control), and in bf16 its error against fp32 must stay within 1.5x of
HF's own bf16 error.
"""

import contextlib
import copy
import os
import re
import types

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

transformers = pytest.importorskip("transformers", reason="transformers is not installed")

import hf_models  # noqa: E402
from helpers import subprocess_env  # noqa: E402

import torch_rope  # noqa: E402
import torch_rope.hf  # noqa: E402

# A fast subset runs on every test run; the rest (about 2-4 s each) is marked slow. Cohere 2:
# GPT-J pairs in its sliding layers, no RoPE in its full ones; DeepSeek-V3: MLA's rotary slice.
FAST = ["llama", "gpt_neox", "gemma3", "tiny:cohere2", "tiny:deepseek_v3"]
SLOW = [
    "llama-linear",
    "llama-dynamic",
    "llama-yarn",
    "llama-llama3",
    "llama-longrope",
    "llama-proportional",
    "qwen2",
    "qwen3",
    "mistral",
    "phi3",
    "gemma",
    "gemma2",
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
    "olmo2",
    "granite",
    "starcoder2",
    *hf_models.GENERIC,
    *(f"tiny:{t}" for t in hf_models.TINY if f"tiny:{t}" not in FAST),
    "roformer-rotary_value",
    *(f"base:{t}" for t in hf_models.BASE),
    *(f"text:{t}" for t in hf_models.TEXT),
    *(f"image_text:{t}" for t in hf_models.IMAGE_TEXT),
    # The VLM types' text towers on their own (AutoModel of the text config test_hf_vlm.py uses;
    # PaddleOCR-VL's and Qwen2.5-Omni's text models are no AutoModel types).
    *(f"vlm_text:{t}" for t in hf_models.VLM if t not in ("paddleocr_vl", "qwen2_5_omni_thinker")),
]
ALL = [pytest.param(n) for n in FAST] + [pytest.param(n, marks=pytest.mark.slow) for n in SLOW]


class OpCounter(TorchDispatchMode):
    """Counts operators as the dispatcher sees them (below autograd): proof of what ran."""

    def __init__(self):
        super().__init__()
        self.counts = {}

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        name = str(func.overloadpacket)
        self.counts[name] = self.counts.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def logits(model, ids, mask):
    """The logits, or the last hidden states of a base model (no LM head: an encoder). An
    encoder-decoder's base model gets the same tokens as decoder inputs too: its last hidden
    states are the decoder's, which read the encoder's through cross-attention, so both stacks'
    rotations count. ``ids`` may be the dict of the model's inputs (hf_models.batch_for: Dia's
    decoder reads audio codes, Moonshine Streaming's encoder audio samples, Voxtral Realtime's
    text decoder a time conditioning, hf_models.FEATURES' models audio or a time series)."""
    inputs = dict(input_ids=ids, attention_mask=mask)
    if isinstance(ids, dict):
        # Audio samples (a time conditioning) in the model's dtype: a bf16 model reads bf16.
        inputs = {k: v.to(model.dtype) if v.is_floating_point() else v for k, v in ids.items()}
    elif getattr(model.config, "is_encoder_decoder", False):
        inputs.update(decoder_input_ids=ids, decoder_attention_mask=mask)
    with torch.no_grad():
        out = model(**inputs)
    if out.get("text_outputs") is not None and out.get("audio_outputs") is not None:
        # A contrastive pair of towers (PE Audio): its audio-text similarities are one number per
        # pair of rows (and 0 at its initial logit scale); both towers' last hidden states instead,
        # side by side along the sequence.
        towers = (out.text_outputs, out.audio_outputs)
        return torch.cat([tower.last_hidden_state for tower in towers], dim=1)
    if out.get("speaker_logits") is not None:
        # An ASR encoder beside a diarization model (Nemotron 3.5 Transcribe's audio model): its
        # states see the speaker logits only through a threshold (which speakers are active), so
        # the logits too, after the states along the sequence, zero-padded to their width.
        states, speakers = out.last_hidden_state, out.speaker_logits
        speakers = torch.nn.functional.pad(speakers, (0, states.size(-1) - speakers.size(-1)))
        return torch.cat([states, speakers], dim=1)
    # An audio codec's output is its audio (or its encoder's latents).
    keys = ("logits", "audio_values", "last_hidden_state", "latents")
    return next(out[key] for key in keys if out.get(key) is not None)


def rel_err(got, want):
    return ((got.double() - want.double()).abs().max() / want.double().abs().max()).item()


def generate(model, ids, mask, new_tokens=12):
    with torch.no_grad():
        return model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
            use_cache=True,
        )


def n_attention_layers(model):
    return model.config.get_text_config().num_hidden_layers


# transformers' own q/k rotations: apply_rotary_pos_emb, its GPT-J-pair twin (DeepSeek's MLA),
# and the complex-number form (Llama 4, DeepSeek-V2).
ROTATION_FUNCTIONS = ("apply_rotary_pos_emb", "apply_rotary_pos_emb_interleave", "apply_rotary_emb")
# A rotation that is a static method of the attention class (RoFormer's): it rotates q and k, and
# v too when given (config.rotary_value), which torch_rope rotates in a call of its own.
ROTATION_METHODS = ("apply_rotary_position_embeddings",)


class HFRotations:
    """Counts the calls of transformers' own rotation functions (:data:`ROTATION_FUNCTIONS`), in
    every modeling module that ``model``'s modules come from: how many times the unpatched model
    rotates q/k."""

    def __init__(self, monkeypatch, model):
        self.calls = 0
        for module in model.modules():
            module_globals = getattr(type(module).forward, "__globals__", {})
            for name in ROTATION_FUNCTIONS:
                function = module_globals.get(name)
                if callable(function) and not hasattr(function, "counted"):
                    monkeypatch.setitem(module_globals, name, self._counting(function))
            for name in ROTATION_METHODS:
                function = vars(type(module)).get(name)
                if isinstance(function, staticmethod) and not hasattr(function, "counted"):
                    counting = staticmethod(self._counting(function.__func__, rotates_value=True))
                    counting.counted = True
                    monkeypatch.setattr(type(module), name, counting)

    def _counting(self, function, rotates_value=False):
        def counting(*args, **kwargs):
            # q and k together are one rotation; a v (RoFormer's fourth argument), another.
            self.calls += 1 + (rotates_value and (len(args) > 3 or "value_layer" in kwargs))
            return function(*args, **kwargs)

        counting.counted = True
        return counting


@contextlib.contextmanager
def growth_in(model, names, read):
    """A dict, for each named submodule of ``model``, of how much ``read()`` grew while that
    submodule ran, in the forwards under this context."""
    modules = dict(model.named_modules())
    grown, start, handles = dict.fromkeys(names, 0), {}, []
    for name in names:

        def before(module, args, name=name):
            start[name] = read()

        def after(module, args, output, name=name):
            grown[name] += read() - start[name]

        handles.append(modules[name].register_forward_pre_hook(before))
        handles.append(modules[name].register_forward_hook(after))
    try:
        yield grown
    finally:
        for handle in handles:
            handle.remove()


def per_layer(model, names, read, ids, mask):
    """One forward of ``model``: its logits and, for each named submodule, how much ``read()``
    grew while that submodule ran."""
    with growth_in(model, names, read) as grown:
        out = logits(model, ids, mask)
    return out, grown


ROTATIONS = ("rope.apply_qk", "rope.apply", "rope.rms_norm_apply_qk")


def rope_calls(counter):
    """torch_rope rotations an OpCounter saw: q and k together (with their per-head norms fused
    in, for Qwen3-style layers), or one tensor a call (Gemma 4)."""
    return sum(counter.counts.get(name, 0) for name in ROTATIONS)


def trig(counter):
    """The cos and sin an OpCounter saw."""
    return counter.counts.get("aten.cos", 0) + counter.counts.get("aten.sin", 0)


def patched_layer_names(model):
    patched = {id(m) for m in model._torch_rope_patch.attention}
    return [name for name, m in model.named_modules() if id(m) in patched]


@pytest.mark.parametrize("name", ALL)
def test_patched_model_matches_unpatched(name, monkeypatch):
    reference = hf_models.built(name)
    model = copy.deepcopy(reference)
    ids, mask = hf_models.batch_for(name)

    assert torch_rope.hf.patch(model) is model
    assert torch_rope.hf.is_patched(model) and not torch_rope.hf.is_patched(reference)
    assert model.state_dict().keys() == reference.state_dict().keys()

    # Each patched layer calls rope::apply_qk exactly as often as the unpatched one rotates (once;
    # never in a NoPE layer), some layer rotates, and HF's rotary never computed cos/sin: the
    # patched model computes only the cos/sin the unpatched one computes outside its rotary
    # modules (none in a text model; an audio codec's Snake activations, sin(a x)^2).
    layers = patched_layer_names(model)
    hf_rotations = HFRotations(monkeypatch, reference)
    rotaries = [n for n, m in model.named_modules() if hasattr(m, "torch_rope")]
    with (
        OpCounter() as hf_counter,
        growth_in(reference, rotaries, lambda: trig(hf_counter)) as rotary_trig,
    ):
        want, hf_calls = per_layer(reference, layers, lambda: hf_rotations.calls, ids, mask)
    with OpCounter() as counter:
        got, our_calls = per_layer(model, layers, lambda: rope_calls(counter), ids, mask)
    assert our_calls == hf_calls and sum(hf_calls.values()) > 0, (our_calls, hf_calls)
    assert rope_calls(counter) == sum(hf_calls.values())
    assert trig(counter) == trig(hf_counter) - sum(rotary_trig.values()), trig(counter)
    assert rel_err(got, want) <= 1e-5, rel_err(got, want)

    # Greedy generation with a KV cache, the second row left-padded: identical tokens. A base
    # model (hf_models.BASE: an encoder or embedding model; a VLM's text tower on its own) has no
    # LM head to generate with; its hidden states above are the whole check.
    if reference.can_generate():
        want_tokens = generate(reference, ids, mask)
        with OpCounter() as counter:
            got_tokens = generate(model, ids, mask)
        assert rope_calls(counter) >= 12 * sum(hf_calls.values())
        assert torch.equal(got_tokens, want_tokens), (got_tokens, want_tokens)
    else:
        assert name.startswith(("base:", "vlm_text:")), name

    # The unpatched reference never touched our op.
    with OpCounter() as counter:
        logits(reference, ids, mask)
    assert counter.counts.get("rope.apply_qk", 0) == 0


@pytest.mark.parametrize("name", ALL)
def test_wrong_layout_moves_the_logits(name):
    """Negative control: the same patch with the other pair layout must be visibly wrong."""
    model = torch_rope.hf.patch(hf_models.built(name))
    ids, mask = hf_models.batch_for(name)
    right = logits(model, ids, mask)
    for rotary in (m for m in model.modules() if hasattr(m, "torch_rope")):
        for tables in rotary.torch_rope.values():
            tables.interleaved = not tables.interleaved
    wrong = logits(model, ids, mask)
    assert rel_err(wrong, right) > 1e-3


# DSA models: (the MLA's pair layout, the indexer's), GPT-J pairs True, as their modeling files
# rotate: DeepSeek-V3.2 and A.X K2 with apply_rotary_pos_emb_interleave in the MLA and
# apply_rotary_pos_emb (rotate_half) in the indexer; GLM-MoE-DSA and dots.3-note with the
# interleaved one in both; HY V4 with rotate_half in both.
DSA = {
    "tiny:deepseek_v32": (True, False),
    "tiny:axk2": (True, False),
    "tiny:glm_moe_dsa": (True, True),
    "tiny:dots3_note_text": (True, True),
    "tiny:hy_v4": (False, False),
}


def _indexer_forwards(model):
    """The patched forwards of the rotating modules inside attention layers (the DSA indexers)."""
    from torch_rope.hf import inner_rotations

    return {
        name: module
        for name, module in model.named_modules()
        if getattr(vars(module).get("forward"), "func", None) is inner_rotations.patched_forward
    }


@pytest.mark.parametrize("name", list(DSA))
def test_a_dsa_indexer_rotates_in_its_own_layout_and_moves_the_logits(name):
    """A DSA indexer inside each indexed attention layer rotates its own q/k with the layer's
    positions, in a pair layout found apart from the MLA's: both as the modeling file rotates.
    Negative control: the indexer alone turned the other way moves the logits (its top-4 choice
    of keys changes), so a wrong indexer rotation could not pass the fp32 check."""
    import functools

    reference = hf_models.built(name)
    model = torch_rope.hf.patch(copy.deepcopy(reference))
    mla, indexer = DSA[name]
    (rotary,) = [m for m in model.modules() if hasattr(m, "torch_rope")]
    assert {t.interleaved for t in rotary.torch_rope.values()} == {mla}
    indexers = _indexer_forwards(model)
    assert indexers and all(type(m).__name__.endswith("Indexer") for m in indexers.values())
    held = [n for n, m in reference.named_modules() if type(m).__name__.endswith("Indexer")]
    assert sorted(indexers) == sorted(held)
    for module in indexers.values():
        assert module.forward.args[1] == (indexer, False)
    ids, mask = hf_models.batch_for(name)
    right = logits(model, ids, mask)
    assert rel_err(right, logits(reference, ids, mask)) <= 1e-5
    for module in indexers.values():
        forward = module.forward
        module.forward = functools.partial(forward.func, module, (not indexer, False))
    wrong = logits(model, ids, mask)
    assert rel_err(wrong, right) > 1e-3
    torch_rope.hf.unpatch(model)
    assert not any("forward" in vars(m) for m in model.modules())
    assert torch.equal(logits(model, ids, mask), logits(reference, ids, mask))
    # Table-free, the indexer's rotation too runs the ops' frequency form.
    table_free = torch_rope.hf.patch(copy.deepcopy(reference), tables=False)
    assert _indexer_forwards(table_free).keys() == indexers.keys()
    assert rel_err(logits(table_free, ids, mask), logits(reference, ids, mask)) <= 1e-5


def test_an_indexer_that_rotates_otherwise_is_refused(monkeypatch):
    """The indexer's own check can fail: an indexer that turns its q/k by twice the angle (no
    pair layout of torch_rope's does) refuses the model, and nothing stays patched."""
    from transformers.models.deepseek_v32 import modeling_deepseek_v32 as modeling

    model = hf_models.built("tiny:deepseek_v32")
    hf_rotate = modeling.apply_rotary_pos_emb

    def twice_the_angle(q, k, cos, sin, unsqueeze_dim=1):
        return hf_rotate(q, k, cos * cos - sin * sin, 2 * sin * cos, unsqueeze_dim)

    monkeypatch.setattr(modeling, "apply_rotary_pos_emb", twice_the_angle)
    with pytest.raises(NotImplementedError) as refused:
        torch_rope.hf.patch(model)
    assert "DeepseekV32Indexer" in str(refused.value.__cause__)
    assert not torch_rope.hf.is_patched(model)
    assert not any("forward" in vars(m) or hasattr(m, "torch_rope") for m in model.modules())


_CONVOLUTIONS = (
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
)


def _bf16_convolutions_in_float32(monkeypatch):
    """bfloat16 convolutions computed from the same bfloat16 inputs and weights in float32 and
    rounded once to bfloat16: what a bfloat16 convolution computes where oneDNN has a bfloat16
    kernel (float32 accumulation), instead of the slow reference kernels (_slow_conv2d_forward,
    slow_conv_transpose2d) PyTorch falls back to on a CPU without AVX-512 (bfloat16 Mimi decoder,
    one forward: 8.7 s there, 0.6 s in float32; the codecs' tests took 25-48 s each on the 2-core
    VM, 1-3 s so). The RoPE runs as before, and HF's model and ours get the same convolutions:
    measured on the codecs and PE Audio, HF's median error moved by 0.85-1.06x and ours / HF's
    stayed within 0.96-1.12 with the slow kernels, 0.97-1.02 with these."""
    for name in _CONVOLUTIONS:
        convolve = getattr(torch.nn.functional, name)

        def in_float32(input, weight, bias=None, *args, convolve=convolve, **kwargs):
            if input.dtype != torch.bfloat16:
                return convolve(input, weight, bias, *args, **kwargs)
            bias = None if bias is None else bias.float()
            out = convolve(input.float(), weight.float(), bias, *args, **kwargs)
            return out.to(torch.bfloat16)

        monkeypatch.setattr(torch.nn.functional, name, in_float32)


@pytest.mark.parametrize("name", ALL)
def test_bfloat16_error_within_hf_own(name, monkeypatch):
    """In bf16 the patched model is at most 1.5x as far from the fp32 logits as HF's bf16 is.

    Measured as the median over token positions of each position's largest logit error. Not the
    largest error overall: in a mixture-of-experts model a router's top-k near-tie can flip one
    token to another expert under bf16 rounding noise, which moves that token's logits by 20-40x
    the rounding error, for HF's own bf16 path as for ours, depending only on the seed (measured:
    MiniMax-M3 flips with the unpatched norms at one seed and with the fused ones at another). A
    precision loss (tables rounded to bf16, a second rounding) raises every position's error and
    moves the median; an error at some positions only is caught by the fp32 test at 1e-5. Both
    models' convolutions (the audio codecs') run as _bf16_convolutions_in_float32 says."""
    _bf16_convolutions_in_float32(monkeypatch)
    fp32 = hf_models.built(name)
    ids, mask = hf_models.batch_for(name)
    want = logits(fp32, ids, mask).double()
    hf_bf16 = copy.deepcopy(fp32).to(torch.bfloat16)
    ours_bf16 = torch_rope.hf.patch(copy.deepcopy(fp32)).to(torch.bfloat16)
    for rotary in (m for m in ours_bf16.modules() if hasattr(m, "torch_rope")):
        for tables in rotary.torch_rope.values():
            assert tables.cos.dtype == torch.float32  # the cast kept our tables exact
    hf_err = (logits(hf_bf16, ids, mask).double() - want).abs().amax(-1).median().item()
    our_err = (logits(ours_bf16, ids, mask).double() - want).abs().amax(-1).median().item()
    assert our_err <= 1.5 * hf_err, (our_err, hf_err)


# qwen3: its q/k norms were deferred too; gptj: no rotary module, the tables on its base model;
# roformer: the tables on its sinusoid module, a rotation method bound to each layer.
@pytest.mark.parametrize(
    "name", ["llama", "qwen3", "tiny:gptj", pytest.param("tiny:roformer", marks=pytest.mark.slow)]
)
def test_unpatch_restores_the_model_exactly(name):
    model = hf_models.build(name)
    ids, mask = hf_models.batch()
    want = logits(model, ids, mask)
    torch_rope.hf.patch(model)
    holders = [m for m in model.modules() if hasattr(m, "torch_rope")]
    assert len(holders) == 1
    if hasattr(model, "model"):  # a rotary module: its forward hands on positions
        assert holders == [model.model.rotary_emb] and "forward" in vars(holders[0])
    torch_rope.hf.unpatch(model)
    assert not torch_rope.hf.is_patched(model)
    assert not any(hasattr(m, "torch_rope") for m in model.modules())
    assert all("forward" not in vars(m) for m in model.modules())
    assert all("apply_rotary_position_embeddings" not in vars(m) for m in model.modules())
    assert not any(hasattr(m, "_torch_rope_qk_norm") for m in model.modules())
    with OpCounter() as counter:
        got = logits(model, ids, mask)
    assert rope_calls(counter) == 0
    assert torch.equal(got, want)


# Granite SWA holds a rotary module per RoPE theta side by side (and an unused one at the global
# theta), its forward handing each layer its theta's cos/sin (the tiny config: 1e4, then 1e6);
# Granite-MoE SWA, built alike, is in ALL.
def test_rotary_modules_side_by_side_are_each_patched_and_train_compile_unpatch():
    reference = hf_models.build("tiny:granite_swa")
    model = torch_rope.hf.patch(copy.deepcopy(reference))
    rotaries = [m for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding")]
    assert len(rotaries) == 3 and all("forward" in vars(r) for r in rotaries)
    thetas = [r.torch_rope["all"].theta for r in rotaries]
    assert thetas == [r.config.rope_parameters["rope_theta"] for r in rotaries]
    assert set(thetas) == {1e4, 1e6}
    ids, mask = hf_models.batch()
    want = logits(model, ids, mask)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        got = compiled(input_ids=ids, attention_mask=mask).logits
    assert rel_err(got, want) <= 1e-6
    trained = copy.deepcopy(reference)
    for m in (trained, model):
        m.train()
        torch.manual_seed(0)
        m(input_ids=ids, attention_mask=mask, labels=ids).loss.backward()
    for (p_name, p), q in zip(trained.named_parameters(), model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=p_name)
    torch_rope.hf.unpatch(model.eval())
    assert not any(hasattr(m, "torch_rope") or "forward" in vars(m) for m in model.modules())
    with OpCounter() as counter:
        got = logits(model, ids, mask)
    assert rope_calls(counter) == 0
    assert torch.equal(got, logits(reference, ids, mask))


# Gemma 4's configs (and EmbeddingGemma 2's) give the full layers heads twice as wide as the
# sliding ones (per_layer_config): transformers builds each layer type's frequencies from that
# type's config, and so must patch (the tiny configs keep the ratio, hf_models._layer_overrides).
PER_LAYER_HEADS = [
    "tiny:gemma4",
    "tiny:gemma4_text",
    "tiny:gemma4_unified",
    "tiny:gemma4_unified_text",
    "base:embedding_gemma2",
    "base:embedding_gemma2_text",
]


@pytest.mark.parametrize("name", PER_LAYER_HEADS)
def test_a_model_with_per_layer_head_dims_gets_tables_of_each_layer_types_width(name):
    reference = hf_models.build(name)
    config = reference.config.get_text_config()
    assert config.is_heterogeneous
    heads = {t: config.per_layer_config[t].head_dim for t in set(config.layer_types)}
    assert len(set(heads.values())) == 2, heads
    model = torch_rope.hf.patch(copy.deepcopy(reference))
    (rotary,) = [m for m in model.modules() if hasattr(m, "torch_rope")]
    for layer_type, head_dim in heads.items():
        # transformers' own frequencies of that layer type: one per plane it rotates.
        planes = getattr(rotary, f"{layer_type}_inv_freq").numel()
        assert rotary.torch_rope[layer_type].rotary_dim == 2 * planes
        assert planes <= head_dim // 2
    ids, mask = hf_models.batch_for(name)
    assert rel_err(logits(model, ids, mask), logits(reference, ids, mask)) <= 1e-5


# ---- fused per-head QK-RMSNorm + RoPE (rope::rms_norm_apply_qk) ------------------------------

# Attention layers that RMS-normalise each head of q and k right before RoPE: Qwen's w * x_hat,
# Gemma's (1 + w) * x_hat. Llama has no q/k norm; OLMo 2 normalises across heads (not fusable).
FUSED = ["qwen3", "qwen3_moe", "gemma3", pytest.param("tiny:gemma3", marks=pytest.mark.slow)]


@pytest.mark.parametrize("name", FUSED)
def test_per_head_qk_norm_is_fused_into_rope(name, monkeypatch):
    """One rope::rms_norm_apply_qk per layer replaces q_norm, k_norm and apply_qk: the norms'
    own forwards never run, and the logits match the unpatched model."""
    reference = hf_models.build(name)
    model = torch_rope.hf.patch(copy.deepcopy(reference))
    ids, mask = hf_models.batch()
    norms = [m for n, m in model.named_modules() if n.endswith(("q_norm", "k_norm"))]
    assert norms
    ran = []
    for norm_class in {type(norm) for norm in norms}:
        original = norm_class.forward

        def recording(self, x, original=original):
            ran.append(self)
            return original(self, x)

        monkeypatch.setattr(norm_class, "forward", recording)
    with OpCounter() as counter:
        got = logits(model, ids, mask)
    # The q/k norms' deferred forwards (instance attributes) ran, never their classes' ones.
    assert not any(any(m is norm for norm in norms) for m in ran)
    layers = n_attention_layers(model)
    assert counter.counts.get("rope.rms_norm_apply_qk", 0) == layers, counter.counts
    assert counter.counts.get("rope.apply_qk", 0) == 0
    monkeypatch.undo()
    assert rel_err(got, logits(reference, ids, mask)) <= 1e-5


@pytest.mark.parametrize("name", ["llama", "olmo2"])
def test_layers_without_per_head_qk_norm_stay_unfused(name):
    model = torch_rope.hf.patch(hf_models.build(name))
    ids, mask = hf_models.batch()
    with OpCounter() as counter:
        logits(model, ids, mask)
    assert counter.counts.get("rope.rms_norm_apply_qk", 0) == 0
    assert counter.counts.get("rope.apply_qk", 0) == n_attention_layers(model)


def test_a_norm_the_fused_op_does_not_compute_stays_unfused():
    """A q/k norm that subtracts the mean (LayerNorm-like) fails the probe: the layer keeps
    calling its norms and apply_qk."""
    model = hf_models.build("qwen3")
    for attention in (m for m in model.modules() if hasattr(m, "q_norm")):
        for name in ("q_norm", "k_norm"):
            norm = getattr(attention, name)
            layer_norm = torch.nn.LayerNorm(norm.weight.shape, eps=norm.variance_epsilon)
            layer_norm.variance_epsilon = norm.variance_epsilon
            setattr(attention, name, layer_norm)
    ids, mask = hf_models.batch()
    want = logits(model, ids, mask)
    torch_rope.hf.patch(model)
    with OpCounter() as counter:
        got = logits(model, ids, mask)
    assert counter.counts.get("rope.rms_norm_apply_qk", 0) == 0
    assert counter.counts.get("rope.apply_qk", 0) == n_attention_layers(model)
    assert rel_err(got, want) <= 1e-5


def test_a_layer_that_disagrees_once_fused_stays_unfused(monkeypatch):
    """The fused layer is self-checked against the unpatched one; a layer whose norms' output is
    used for something else as well (here: q scaled between norm and RoPE) keeps the unfused
    path instead of a silently different result."""
    model = hf_models.build("qwen3")
    ids, mask = hf_models.batch()
    for attention in (m for m in model.modules() if hasattr(m, "q_norm")):
        norm = attention.q_norm
        original = type(norm).forward
        norm.forward = lambda x, norm=norm, original=original: 2.0 * original(norm, x)
    want = logits(model, ids, mask)
    torch_rope.hf.patch(model)
    with OpCounter() as counter:
        got = logits(model, ids, mask)
    assert counter.counts.get("rope.rms_norm_apply_qk", 0) == 0
    assert rel_err(got, want) <= 1e-5


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    """transformers' Qwen3 rotation, under the name patch() looks for in a forward's globals."""
    from transformers.models.qwen3 import modeling_qwen3

    return modeling_qwen3.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)


class NormAfterRopeAttention(torch.nn.Module):
    """A Qwen3 attention layer that normalises q and k AFTER RoPE (test_hf's own variant)."""

    def forward(self, hidden_states, position_embeddings: tuple, attention_mask=None, **kwargs):
        from transformers.models.qwen3 import modeling_qwen3

        shape = (*hidden_states.shape[:-1], -1, self.head_dim)
        q = self.q_proj(hidden_states).view(shape).transpose(1, 2)
        k = self.k_proj(hidden_states).view(shape).transpose(1, 2)
        v = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        cos, sin = position_embeddings
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        q, k = self.q_norm(q), self.k_norm(k)
        out, weights = modeling_qwen3.eager_attention_forward(
            self, q, k, v, attention_mask, scaling=self.scaling, dropout=0.0
        )
        return self.o_proj(out.reshape(*hidden_states.shape[:-1], -1)), weights


def test_a_layer_that_normalises_after_rope_stays_unfused():
    """Fresh norms have uniform weights, with which RoPE-then-norm equals norm-then-RoPE; the
    fused layer's self-check runs with random norm weights, so the order shows and the layer keeps
    its own norms (and the weights are restored)."""
    model = hf_models.build("qwen3")
    for layer in model.model.layers:
        attention = layer.self_attn
        attention.__class__ = type(
            "Qwen3NormAfterRope", (type(attention),), {"forward": NormAfterRopeAttention.forward}
        )
        assert torch.all(attention.q_norm.weight == 1)
    reference = copy.deepcopy(model)
    ids, mask = hf_models.batch()
    torch_rope.hf.patch(model, max_seq_len=64)
    assert all(torch.all(layer.self_attn.q_norm.weight == 1) for layer in model.model.layers)
    # Trained (non-uniform) norm weights, in both copies: the patched one must still agree.
    for m in (model, reference):
        g = torch.Generator().manual_seed(3)
        for name, p in m.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                p.data = 1 + 0.5 * torch.randn(p.shape, generator=g)
    with OpCounter() as counter:
        got = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    assert counter.counts.get("rope.rms_norm_apply_qk", 0) == 0
    assert counter.counts.get("rope.apply_qk", 0) == n_attention_layers(model)
    want = reference(input_ids=ids, attention_mask=mask, use_cache=False).logits
    assert rel_err(got.detach(), want.detach()) <= 1e-5


def test_fused_layer_called_without_position_embeddings_raises():
    model = torch_rope.hf.patch(hf_models.build("qwen3"))
    attention = model.model.layers[0].self_attn
    hidden = torch.randn(1, 4, model.config.hidden_size)
    with pytest.raises(RuntimeError, match="position_embeddings=None"):
        attention(hidden_states=hidden, position_embeddings=None, attention_mask=None)


def test_fused_qk_norm_compiles_fullgraph_and_trains():
    reference = hf_models.build("qwen3")
    model = torch_rope.hf.patch(copy.deepcopy(reference))
    ids, mask = hf_models.batch()
    want = logits(model, ids, mask)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        got = compiled(input_ids=ids, attention_mask=mask).logits
    assert rel_err(got, want) <= 1e-6
    # Gradients through the fused op reach q_norm's and k_norm's weights as HF's do.
    for m in (reference, compiled):
        m.train()
        m(input_ids=ids, attention_mask=mask, labels=ids).loss.backward()
    grads = dict(reference.named_parameters())
    for name, p in model.named_parameters():
        if name.endswith(("q_norm.weight", "k_norm.weight")):
            torch.testing.assert_close(p.grad, grads[name].grad, rtol=1e-4, atol=1e-6, msg=name)


def test_patch_is_per_instance():
    """Patching one model binds new forwards to its modules only, never to their classes."""
    patched, other = hf_models.build("llama"), hf_models.build("llama")
    classes_before = {type(m): type(m).forward for m in other.modules()}
    torch_rope.hf.patch(patched)
    assert {type(m): type(m).forward for m in other.modules()} == classes_before
    ids, mask = hf_models.batch()
    with OpCounter() as counter:
        logits(other, ids, mask)
    assert counter.counts.get("rope.apply_qk", 0) == 0
    with OpCounter() as counter:
        logits(patched, ids, mask)
    assert counter.counts["rope.apply_qk"] == 2


SAVED_WHOLE = {
    "fast": [("llama", "rope.apply_qk", 2), ("qwen3", "rope.rms_norm_apply_qk", 2)],
    # GPT-J family: q and k apart (one rope.apply each), in each of the 2 layers.
    "slow": [("tiny:codegen", "rope.apply", 4)],
}

_LOAD_SAVED = """
import sys, torch, torch_rope, torch_rope.hf, hf_models
sys.path.insert(0, {here!r})
from test_hf import OpCounter, logits
for name, path, op, calls in {cases!r}:
    saved = torch.load(path, weights_only=False)
    model, ids, mask = saved['model'], *hf_models.batch()
    assert torch_rope.hf.is_patched(model), name
    with OpCounter() as counter:
        got = logits(model, ids, mask)
    assert counter.counts[op] == calls, (name, counter.counts)
    assert torch.equal(got, saved['logits']), name
    torch_rope.hf.unpatch(model)
    assert all('forward' not in vars(m) for m in model.modules()), name
    print('ok', name)
"""


@pytest.mark.parametrize("group", ["fast", pytest.param("slow", marks=pytest.mark.slow)])
def test_patched_model_saved_whole_loads_patched_in_a_new_process(tmp_path, group):
    """torch.save(model) of a patched model; a fresh interpreter (which has never patched
    anything) loads it, and it still runs its rope op and gives the same logits. The models of a
    group share that interpreter (its start, torch and transformers imported, is most of the
    cost), each loaded and checked in turn, each failure naming its model."""
    import subprocess
    import sys

    cases = []
    for name, op, calls in SAVED_WHOLE[group]:
        model = torch_rope.hf.patch(hf_models.build(name))
        ids, mask = hf_models.batch()
        path = str(tmp_path / f"{name.replace(':', '_')}.pt")
        torch.save({"model": model, "logits": logits(model, ids, mask)}, path)
        cases.append((name, path, op, calls))
    code = _LOAD_SAVED.format(here=os.path.dirname(os.path.abspath(__file__)), cases=cases)
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=subprocess_env(with_test_modules=True),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == [w for name, *_ in cases for w in ("ok", name)], out.stdout


def test_patch_twice_is_a_no_op_and_unpatch_of_unpatched_too():
    model = hf_models.build("llama")
    assert torch_rope.hf.unpatch(model) is model
    torch_rope.hf.patch(model)
    tables = model.model.rotary_emb.torch_rope
    torch_rope.hf.patch(model)
    assert model.model.rotary_emb.torch_rope is tables


def test_every_supported_model_type_is_tested_here():
    """Here, or in test_hf_vlm.py for the vision-language models (test_hf_vision_tower.py for
    the vision towers on their own)."""
    tested = {hf_models.config(n).get_text_config().model_type for n in SLOW if n[:5] == "text:"}
    tested |= {hf_models.config(n).model_type for n in FAST + SLOW if n[:5] != "text:"}
    tested |= {hf_models.vlm_config(n).model_type for n in hf_models.VLM}
    tested |= {hf_models.vision_vlm_config(n).model_type for n in hf_models.VISION_VLM}
    tested |= {hf_models.vision_tower_config(n).model_type for n in hf_models.VISION_TOWERS}
    assert set(torch_rope.hf.SUPPORTED_MODEL_TYPES) == tested


def test_unknown_architecture_is_refused():
    """A refused type (Jamba: its attention layers use no RoPE) raises with its reason, naming
    the type, and leaves the model untouched."""
    model = transformers.AutoModelForCausalLM.from_config(hf_models.tiny_config("jamba"))
    reason = re.escape(torch_rope.hf._REFUSED["jamba"])
    refusal = rf"model type 'jamba' is not supported: {reason}"
    with pytest.raises(NotImplementedError, match=refusal):
        torch_rope.hf.patch(model)
    assert not torch_rope.hf.is_patched(model)
    assert all("forward" not in vars(m) for m in model.modules())


def test_every_rotary_model_type_is_supported_or_refused_with_a_reason():
    """Every model type of this transformers whose modeling code uses RoPE (a causal LM, or a
    base model: encoder, embedding, vision-language, vision or audio model) is either supported
    (and tested here) or refused by name with a reason; none is left unaccounted."""
    found = set(hf_models.rotary_model_types()) | set(hf_models.rotary_base_model_types())
    supported, refused = set(torch_rope.hf.SUPPORTED_MODEL_TYPES), torch_rope.hf._REFUSED
    assert not found - supported - set(refused), sorted(found - supported - set(refused))
    assert not supported & set(refused)
    assert set(refused) <= found, sorted(set(refused) - found)  # no stale refusal
    assert all(reason.strip() for reason in refused.values())


def test_docs_list_every_rotary_model_type_with_its_status():
    """docs/hf_models.md's table says what torch_rope.hf does, type by type."""
    path = os.path.join(os.path.dirname(__file__), "..", "..", "..", "docs", "hf_models.md")
    with open(path, encoding="utf-8") as f:
        rows = re.findall(r"^\| `([\w-]+)` \| (supported|refused) \| (.*?) \|$", f.read(), re.M)
    table = {t: (status, reason) for t, status, reason in rows}
    want = {t: ("supported", "") for t in torch_rope.hf.SUPPORTED_MODEL_TYPES}
    want.update((t, ("refused", r)) for t, r in torch_rope.hf._REFUSED.items())
    assert table == want


def test_not_a_transformers_model_is_refused():
    with pytest.raises(TypeError, match="PreTrainedModel"):
        torch_rope.hf.patch(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("model_type", ["cohere", "glm"])  # GPT-J pairs; GLM: partial rotary
def test_dynamic_tables_regrown_past_the_original_length_keep_the_pair_layout(model_type):
    """Dynamic NTK scaling rebuilds the tables when a sequence outgrows the original length, and
    again when a short one follows: the rebuilt tables must keep the layout the self-check found
    (they once fell back to rotate_half, silently off by 1e-2 in a GPT-J-pair model)."""
    config = hf_models.tiny_config(model_type)
    config.rope_parameters = dict(config.rope_parameters, rope_type="dynamic", factor=2.0)
    config.max_position_embeddings = 16
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation="eager", dtype=torch.float32
    ).eval()
    reference = copy.deepcopy(model)
    torch_rope.hf.patch(model, max_seq_len=64)
    ids = torch.randint(2, 256, (1, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for length in (40, 8, 40):  # grow, reset, grow again
            want = reference(ids[:, :length]).logits
            assert rel_err(model(ids[:, :length]).logits, want) < 1e-5, length


def test_tables_follow_the_model_to_another_dtype_and_stay_float32():
    model = torch_rope.hf.patch(hf_models.build("gemma3"))
    model.to(torch.float16)
    tables = model.model.rotary_emb.torch_rope
    assert set(tables.keys()) == {"sliding_attention", "full_attention"}
    assert all(t.cos.dtype == torch.float32 for t in tables.values())
    # Sliding layers plain theta 1e4, full layers theta 1e6 with linear factor 8.
    assert tables["full_attention"].scaling["rope_type"] == "linear"
    assert tables["sliding_attention"].theta == 10000.0


# gptj: its attention layers' forwards are torch_rope's own (python/torch_rope/hf/families/gptj.py).
@pytest.mark.parametrize("name", ["llama", pytest.param("tiny:gptj", marks=pytest.mark.slow)])
def test_patched_model_compiles_fullgraph(name):
    model = torch_rope.hf.patch(hf_models.build(name))
    ids, mask = hf_models.batch()
    want = logits(model, ids, mask)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        got = compiled(input_ids=ids, attention_mask=mask).logits
    assert rel_err(got, want) <= 1e-6


@pytest.mark.slow
def test_patched_model_compiles_with_inductor():
    model = torch_rope.hf.patch(hf_models.build("phi3"))  # longrope: the switch is traced too
    ids, mask = hf_models.batch(length=20)
    want = logits(model, ids, mask)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        got = compiled(input_ids=ids, attention_mask=mask).logits
    assert rel_err(got, want) <= 1e-5


def test_training_step_gradients_match():
    reference = hf_models.build("qwen3")
    model = torch_rope.hf.patch(copy.deepcopy(reference))
    ids, mask = hf_models.batch()
    for m in (reference, model):
        m.train()
        m(input_ids=ids, attention_mask=mask, labels=ids).loss.backward()
    for (name, p), q in zip(reference.named_parameters(), model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)


# ---- apply_rotary_pos_emb: HF's signature and results -------------------------------------


def hf_cos_sin(batch, seq, rotary_dim, dtype, theta=10000.0):
    inv = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    pos = torch.randint(0, 100, (batch, seq)).double()
    emb = torch.cat([pos[..., None] * inv] * 2, dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float16], ids=lambda d: str(d)[6:]
)
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_apply_rotary_pos_emb_matches_transformers(dtype, layout):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf_apply

    cos, sin = hf_cos_sin(2, 7, 32, dtype)
    shape = (2, 4, 7, 32) if layout == "bhsd" else (2, 7, 4, 32)
    unsqueeze_dim = 1 if layout == "bhsd" else 2
    q = torch.randn(shape).to(dtype)
    k = torch.randn(shape[:2] + (2,) + shape[3:] if layout == "bshd" else (2, 2, 7, 32)).to(dtype)
    want_q, want_k = hf_apply(q.double(), k.double(), cos.double(), sin.double(), unsqueeze_dim)
    got_q, got_k = torch_rope.hf.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(got_q.double(), want_q, **tol)
    torch.testing.assert_close(got_k.double(), want_k, **tol)
    assert got_q.dtype == dtype and got_k.dtype == dtype


def test_apply_rotary_pos_emb_partial_rotary_matches_gpt_neox():
    from transformers.models.gpt_neox.modeling_gpt_neox import apply_rotary_pos_emb as hf_apply

    cos, sin = hf_cos_sin(2, 5, 8, torch.float32)  # R = 8 < head_dim = 32
    q, k = torch.randn(2, 4, 5, 32), torch.randn(2, 4, 5, 32)
    want = hf_apply(q, k, cos, sin)
    got = torch_rope.hf.apply_rotary_pos_emb(q, k, cos, sin)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=lambda d: str(d)[6:])
def test_apply_rotary_pos_emb_never_copies_q_or_k(dtype):
    """q and k (strided slices of a fused qkv) reach the kernel as they are; 16-bit cos/sin are
    upcast once (one copy each), float32 cos/sin not at all."""
    cos, sin = hf_cos_sin(2, 6, 16, dtype)
    qkv = torch.randn(2, 6, 3, 4, 16).to(dtype)
    q, k = qkv[:, :, 0].transpose(1, 2), qkv[:, :, 1].transpose(1, 2)
    with OpCounter() as counter:
        torch_rope.hf.apply_rotary_pos_emb(q, k, cos, sin)
    copies = {
        n: c
        for n, c in counter.counts.items()
        if n
        in (
            "aten._to_copy",
            "aten.clone",
            "aten.copy_",
            "aten.contiguous",
            "aten.cat",
            "aten.mul",
            "aten.add",
        )
    }
    assert copies == ({} if dtype == torch.float32 else {"aten._to_copy": 2}), counter.counts
    assert counter.counts["rope.apply_qk"] == 1


def test_importing_torch_rope_does_not_import_transformers():
    import subprocess
    import sys

    code = (
        "import sys, torch_rope, torch_rope.hf, torch_rope.torchtune; "
        "print('transformers' in sys.modules, 'torchtune' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env()
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"], out


def test_self_check_refuses_a_model_whose_rotation_differs(monkeypatch):
    """If a supported model type ever rotated differently, patch would refuse it."""
    model = hf_models.build("llama")
    attention = model.model.layers[0].self_attn
    module_globals = type(attention).forward.__globals__

    def interleaved_apply(q, k, cos, sin, unsqueeze_dim=1):
        def rot(x):  # GPT-J pairs instead of rotate_half
            x1, x2 = x[..., ::2], x[..., 1::2]
            c = cos.unsqueeze(unsqueeze_dim)[..., ::2]
            s = sin.unsqueeze(unsqueeze_dim)[..., ::2]
            return torch.stack([x1 * c - x2 * s, x1 * s + x2 * c], -1).flatten(-2)

        return rot(q), rot(k)

    monkeypatch.setitem(module_globals, "apply_rotary_pos_emb", interleaved_apply)
    with pytest.raises(NotImplementedError, match="rotates q/k differently"):
        torch_rope.hf.patch(model)
    assert not torch_rope.hf.is_patched(model)
    assert all("forward" not in vars(m) for m in model.modules())
    assert not hasattr(model.model.rotary_emb, "torch_rope")


@pytest.mark.parametrize("model_type", ["gptj", "codegen"])
def test_self_check_refuses_a_gptj_family_layer_whose_rotation_differs(model_type, monkeypatch):
    """The GPT-J family's layers are self-checked too: if their rotation ever changed (here:
    turned by minus the angle), patch would refuse and leave nothing patched."""
    model = hf_models.build(f"tiny:{model_type}")
    module_globals = type(model.transformer.h[0].attn).forward.__globals__
    original = module_globals["apply_rotary_pos_emb"]

    def turned_back(tensor, sin, cos):
        return original(tensor, -sin, cos)

    monkeypatch.setitem(module_globals, "apply_rotary_pos_emb", turned_back)
    with pytest.raises(NotImplementedError, match="rotates q/k differently"):
        torch_rope.hf.patch(model)
    assert not torch_rope.hf.is_patched(model)
    assert all("forward" not in vars(m) for m in model.modules())
    assert not any(hasattr(m, "torch_rope") for m in model.modules())


@pytest.mark.parametrize("name", ["tiny:roformer", "roformer-rotary_value"])
def test_self_check_refuses_a_roformer_layer_whose_rotation_differs(name, monkeypatch):
    """RoFormer's layers are self-checked too: had its rotation method turned by minus the angle,
    patch would refuse and leave nothing patched."""
    model = hf_models.build(name)
    attention_class = type(model.roformer.encoder.layer[0].attention.self)
    original = attention_class.apply_rotary_position_embeddings

    def turned_back(sinusoidal_pos, *tensors):
        sin, cos = sinusoidal_pos.chunk(2, dim=-1)
        return original(torch.cat([-sin, cos], dim=-1), *tensors)

    turned = staticmethod(turned_back)
    monkeypatch.setattr(attention_class, "apply_rotary_position_embeddings", turned)
    with pytest.raises(NotImplementedError, match="rotates q/k differently"):
        torch_rope.hf.patch(model)
    assert not torch_rope.hf.is_patched(model)
    assert all("forward" not in vars(m) for m in model.modules())
    assert all("apply_rotary_position_embeddings" not in vars(m) for m in model.modules())
    assert not any(hasattr(m, "torch_rope") for m in model.modules())


def test_self_check_runs_the_layer_so_a_layer_that_casts_cos_sin_is_refused(monkeypatch):
    """A layer that transforms cos/sin before rotating would pass a check of the rotation
    function alone and fail at its first patched forward; patch runs the layer and refuses."""
    model = hf_models.build("llama")
    attention_class = type(model.model.layers[0].self_attn)
    original = attention_class.forward

    def casting_forward(self, hidden_states, position_embeddings, attention_mask=None, **kw):
        apply_rotary_pos_emb  # noqa: B018, F821  (resolved in the modeling module's globals)
        cos, sin = position_embeddings
        cast = (cos.to(hidden_states.dtype), sin.to(hidden_states.dtype))
        return original(self, hidden_states, cast, attention_mask, **kw)

    # Defined over the modeling module's globals, as a layer of that module would be.
    forward = types.FunctionType(
        casting_forward.__code__,
        original.__globals__,
        "forward",
        casting_forward.__defaults__,
        casting_forward.__closure__,
    )
    monkeypatch.setattr(attention_class, "forward", forward)
    inputs = torch.randint(2, 256, (1, 6))
    with torch.no_grad():
        before = model(inputs).logits  # the layer works unpatched
    with pytest.raises(NotImplementedError, match="disagrees with the unpatched one"):
        torch_rope.hf.patch(model)
    assert not torch_rope.hf.is_patched(model)
    assert all("forward" not in vars(m) for m in model.modules())
    assert not hasattr(model.model.rotary_emb, "torch_rope")
    with torch.no_grad():
        assert torch.equal(model(inputs).logits, before)


def test_patch_sees_names_rebound_in_the_modeling_module_since_an_earlier_patch(monkeypatch):
    """Another patcher (or transformers' hub-kernel swap) may rebind a modeling module's global
    after a first model was patched; a model patched after that must see the new binding."""
    first = torch_rope.hf.patch(hf_models.build("llama"))
    with torch.no_grad():
        first(torch.randint(2, 256, (1, 6)))  # its patched forwards are built and used
    second = hf_models.build("llama")
    second.config._attn_implementation = "eager"  # the layer then calls eager_attention_forward
    module_globals = type(second.model.layers[0].self_attn).forward.__globals__
    original = module_globals["eager_attention_forward"]
    calls = []

    def counting_attention(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setitem(module_globals, "eager_attention_forward", counting_attention)
    torch_rope.hf.patch(second)
    calls.clear()  # the patch's self-check ran the layer too
    with torch.no_grad():
        second(torch.randint(2, 256, (1, 6)))
    assert len(calls) == second.config.num_hidden_layers
    torch_rope.hf.unpatch(first)
    torch_rope.hf.unpatch(second)
