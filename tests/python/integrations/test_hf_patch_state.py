# SPDX-License-Identifier: BSD-3-Clause
"""torch_rope.hf.patch and the state a model is in when it is patched: the self-check must run
on what the patched model will run, whatever state the model is handed in.

* A model on the meta device has no weights to run the self-check with: patch refuses it (it used
  to skip every check, and a GPT-J-pair model such as Cohere kept rotate_half, silently wrong).
* A model in training mode, with attention dropout, is checked in eval mode (it used to compare two
  forwards dropped differently, and refused the model), and is handed back in the modes it had.
* A module whose forward patch replaces, with a forward set on the instance (an ad-hoc position
  interpolation, a wrapper), is refused, naming it: patch used to replace that forward and check
  the class's, and the patched model was silently off. The same change made in a subclass is
  refused by the self-check.
"""

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed")

import hf_models  # noqa: E402
from test_hf import logits, rel_err  # noqa: E402

import torch_rope.hf  # noqa: E402


def assert_untouched(model):
    assert not torch_rope.hf.is_patched(model)
    assert all("forward" not in vars(m) for m in model.modules())
    assert not any(hasattr(m, "torch_rope") for m in model.modules())


# Cohere rotates GPT-J pairs, which only the self-check finds; llama rotate_half; gptj has no
# rotary module (a family of its own).
@pytest.mark.parametrize("model_type", ["cohere", "llama", "gptj"])
def test_a_model_on_the_meta_device_is_refused(model_type):
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_models.tiny_config(model_type))
    with pytest.raises(ValueError, match="meta device.*patch after the weights are materialised"):
        torch_rope.hf.patch(model)
    assert_untouched(model)


def test_a_model_with_one_tensor_on_the_meta_device_is_refused_naming_it():
    model = hf_models.build("llama")
    model.lm_head.to("meta")
    with pytest.raises(ValueError, match=r"lm_head\.weight"):
        torch_rope.hf.patch(model)
    assert_untouched(model)


# The config field of each model's attention dropout (RoFormer's default hidden dropout is on too).
DROPOUT = {
    "llama": ("attention_dropout",),
    "qwen3": ("attention_dropout",),  # its fused q/k norms are self-checked too
    "tiny:gptj": ("attn_pdrop", "resid_pdrop", "embd_pdrop"),
    "tiny:roformer": ("attention_probs_dropout_prob", "hidden_dropout_prob"),
}


@pytest.mark.parametrize("name", list(DROPOUT))
def test_a_model_in_training_mode_with_dropout_is_checked_in_eval_mode(name):
    """The self-check runs its two forwards in eval mode (one dropout mask each would differ), then
    hands the model back in the modes it had, one by one, and the global RNG untouched."""
    config = hf_models.config(name)
    for field in DROPOUT[name]:
        setattr(config, field, 0.5)
    torch.manual_seed(0)
    reference = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation="eager", dtype=torch.float32
    )
    reference.train()
    reference.get_output_embeddings().eval()  # a mixed state, to be kept as it is
    model = copy.deepcopy(reference)
    modes = {name: m.training for name, m in model.named_modules()}
    rng = torch.get_rng_state()

    torch_rope.hf.patch(model)

    assert torch_rope.hf.is_patched(model)
    assert {name: m.training for name, m in model.named_modules() if name in modes} == modes
    assert torch.equal(torch.get_rng_state(), rng)
    ids, mask = hf_models.batch()
    # Training mode: the same dropout masks from the same seed, so the same loss.
    losses = []
    for m in (reference, model):
        torch.manual_seed(5)
        losses.append(m(input_ids=ids, attention_mask=mask, labels=ids).loss)
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-6)
    assert rel_err(logits(model.eval(), ids, mask), logits(reference.eval(), ids, mask)) <= 1e-5


def _halved_positions(rotary):
    """An ad-hoc position interpolation, set on the rotary module's instance."""
    original = rotary.forward
    rotary.forward = lambda x, position_ids: original(x, position_ids / 2)
    return rotary.forward


def _scaled_output(attention):
    original = attention.forward

    def scaled(*args, **kwargs):
        output, weights = original(*args, **kwargs)
        return 2 * output, weights

    attention.forward = scaled
    return scaled


@pytest.mark.parametrize(
    "where, change",
    [
        ("model.rotary_emb", _halved_positions),
        ("model.layers.1.self_attn", _scaled_output),
    ],
)
def test_a_forward_set_on_the_instance_is_refused_naming_the_module(where, change):
    reference = hf_models.build("llama")
    model = copy.deepcopy(reference)
    module = model.get_submodule(where)
    changed = change(module)
    ids, mask = hf_models.batch()
    want = logits(model, ids, mask)
    assert rel_err(want, logits(reference, ids, mask)) > 1e-3  # the change shows

    with pytest.raises(NotImplementedError, match=rf"'{where}' has a forward set on the instance"):
        torch_rope.hf.patch(model)

    # Nothing patched, the instance's forward kept: the model computes what it did.
    assert not torch_rope.hf.is_patched(model)
    assert vars(module)["forward"] is changed
    assert not any(hasattr(m, "torch_rope") for m in model.modules())
    assert torch.equal(logits(model, ids, mask), want)


def test_a_gptj_attention_layer_with_a_forward_set_on_the_instance_is_refused():
    model = hf_models.build("tiny:gptj")
    _scaled_output(model.transformer.h[0].attn)
    with pytest.raises(NotImplementedError, match=r"'transformer\.h\.0\.attn' has a forward set"):
        torch_rope.hf.patch(model)
    assert not torch_rope.hf.is_patched(model)
    assert all("forward" not in vars(m) for m in model.transformer.h[1:].modules())


def test_the_same_change_in_a_subclass_is_refused_by_the_self_check():
    model = hf_models.build("llama")
    rotary = model.model.rotary_emb

    class HalvedLlamaRotaryEmbedding(type(rotary)):
        def forward(self, x, position_ids):
            return super().forward(x, position_ids / 2)

    rotary.__class__ = HalvedLlamaRotaryEmbedding
    with pytest.raises(NotImplementedError, match="rotates q/k differently"):
        torch_rope.hf.patch(model)
    assert_untouched(model)
