# SPDX-License-Identifier: BSD-3-Clause
"""A patched model trains under activation checkpointing as the unpatched one does.

``model.activation_checkpointing_enable()`` (transformers 5's name for the deprecated
``gradient_checkpointing_enable``), with ``use_reentrant=False``, its default, recomputes each
decoder layer's forward during backward: the patched layers' rotations run twice, and their
backward must see the recomputed tensors.
"""

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed")

import hf_models  # noqa: E402

import torch_rope.hf  # noqa: E402


@pytest.mark.parametrize(
    "name",
    [
        "llama",  # rope.apply_qk, rotate_half
        "tiny:cohere",  # rope.apply_qk, GPT-J pairs
        "phi3",  # rope.apply_qk, partial rotary, fused qkv
        "qwen3",  # the fused q/k norms: rope.rms_norm_apply_qk
        "gemma3",  # the same, Gemma's (1 + w), sliding and full layers
        "tiny:gptj",  # no rotary module: rope.apply on q and k apart
    ],
)
def test_patched_model_trains_under_activation_checkpointing(name):
    reference = hf_models.build(name)
    model = torch_rope.hf.patch(copy.deepcopy(reference))
    ids, mask = hf_models.batch()
    attention = type(model._torch_rope_patch.attention[0])
    calls = []
    for m in (reference, model):
        m.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        m.train()
        hooks = [
            layer.register_forward_hook(lambda *_: calls.append(1))
            for layer in m.modules()
            if isinstance(layer, attention)
        ]
        m(input_ids=ids, attention_mask=mask, labels=ids).loss.backward()
        for hook in hooks:
            hook.remove()
    # Each attention layer ran twice in each model: its forward, and its recomputation.
    assert len(calls) == 2 * 2 * len(model._torch_rope_patch.attention)
    grads = dict(reference.named_parameters())
    for name_, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[name_].grad, rtol=1e-4, atol=1e-6, msg=name_)
