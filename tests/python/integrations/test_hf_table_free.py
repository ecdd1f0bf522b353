# SPDX-License-Identifier: BSD-3-Clause
"""hf.patch(model, tables=False): the text RoPE table-free. Every patched rotary module holds
only float64 frequencies (no cos/sin tables, nothing per position), the patched model
matches the unpatched one as the tabled patch does, past max_position_embeddings too (nothing to
grow), through generate's KV-cache decode, with every scaling variant the test models carry and
with q/k norms (kept unfused: the fused norm op has no frequency form); multi-axis (M-RoPE) text
towers too, with an image. The families without a rotary module (GPT-J, CodeGen, RoFormer) have
no table-free form: they keep tables, with a warning that says so."""

import copy
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed")

import hf_models  # noqa: E402
from test_hf import generate, logits, rel_err  # noqa: E402

import torch_rope  # noqa: E402
import torch_rope.hf  # noqa: E402


def rope_modules(model):
    """The text tables modules of a patched model (a vision tower's axial tables are not)."""
    return [
        t
        for m in model.modules()
        if isinstance(getattr(m, "torch_rope", None), torch.nn.ModuleDict)
        for t in m.torch_rope.values()
        if isinstance(t, torch_rope.RotaryPositionalEmbedding)
    ]


def ids_of(length, seed=1):
    return torch.randint(2, 256, (1, length), generator=torch.Generator().manual_seed(seed))


# max_position_embeddings 64; qwen3 has q/k norms, gemma3 (gemma3_text) sliding and full layers
# with their own bases, phi3 LongRoPE (long factors past original_max_position_embeddings 16),
# and llama with each scaling variant of hf_models.LLAMA_SCALINGS (YaRN's attention factor,
# dynamic NTK re-evaluated as generation outgrows max_position_embeddings 16, ...).
@pytest.mark.parametrize(
    "name", ["qwen3", "gemma3", "phi3"] + [f"llama-{v}" for v in hf_models.LLAMA_SCALINGS]
)
def test_the_table_free_patch_matches_the_unpatched_model(name):
    reference = hf_models.build(name)
    model = torch_rope.hf.patch(copy.deepcopy(reference), tables=False)
    modules = rope_modules(model)
    assert modules and all(not m.tables for m in modules)
    for m in modules:
        floating = {n: b for n, b in m.named_buffers() if b.is_floating_point()}
        assert set(floating) <= {"freqs", "long_freqs"}, floating.keys()
        assert all(b.dtype == torch.float64 for b in floating.values())
    ids = ids_of(150)  # past max_position_embeddings (64): nothing grows
    mask = torch.ones_like(ids)
    assert rel_err(logits(model, ids, mask), logits(reference, ids, mask)) <= 1e-5
    assert all(not m.tables for m in rope_modules(model))
    short = ids_of(20, seed=2)
    short_mask = torch.ones_like(short)
    assert torch.equal(generate(model, short, short_mask), generate(reference, short, short_mask))


def test_the_table_free_patch_and_the_tabled_one_agree():
    reference = hf_models.build("llama")
    tabled = torch_rope.hf.patch(copy.deepcopy(reference))
    free = torch_rope.hf.patch(copy.deepcopy(reference), tables=False)
    ids = ids_of(60)
    mask = torch.ones_like(ids)
    # Both rotate by cos/sin of the same float64 angle p * f (the tables rounded to float32 once,
    # the table-free path within an ulp of the pair): the logits agree to float32 precision.
    assert rel_err(logits(free, ids, mask), logits(tabled, ids, mask)) <= 1e-6


def test_tables_must_be_a_bool():
    with pytest.raises(TypeError, match="tables must be a bool"):
        torch_rope.hf.patch(hf_models.build("llama"), tables="no")


# Every multi-axis text tower the tests build: the vision-language models, run with an image (the
# three position axes differ over its tokens), and Qwen 3.5's text models on their own.
@pytest.mark.parametrize("name", hf_models.VLM)
def test_the_table_free_patch_of_a_vision_language_model_matches_the_unpatched_one(name):
    reference = hf_models.build_vlm(name)
    inputs = hf_models.vlm_batch(reference.config)
    model = torch_rope.hf.patch(copy.deepcopy(reference), tables=False)
    modules = rope_modules(model)
    assert modules and all(not m.tables and m.mrope_section for m in modules)
    with torch.no_grad():
        got, want = model(**inputs).logits, reference(**inputs).logits
    assert rel_err(got, want) <= 1e-5


@pytest.mark.parametrize("name", ["tiny:qwen3_5_text", "tiny:qwen3_5_moe_text"])
def test_the_table_free_patch_of_a_multi_axis_text_model_matches_the_unpatched_one(name):
    reference = hf_models.build(name)
    model = torch_rope.hf.patch(copy.deepcopy(reference), tables=False)
    modules = rope_modules(model)
    assert modules and all(not m.tables and m.mrope_section for m in modules)
    ids, mask = hf_models.batch()
    assert rel_err(logits(model, ids, mask), logits(reference, ids, mask)) <= 1e-5


@pytest.mark.parametrize("name", ["tiny:gptj", "tiny:codegen", "tiny:roformer"])
def test_a_family_without_a_table_free_form_keeps_tables_and_says_so(name):
    reference = hf_models.build(name)
    with pytest.warns(UserWarning, match="tables=False is not available"):
        model = torch_rope.hf.patch(copy.deepcopy(reference), tables=False)
    assert torch_rope.hf.is_patched(model)
    modules = rope_modules(model)
    assert modules and all(m.tables for m in modules)
    ids, mask = hf_models.batch()
    assert rel_err(logits(model, ids, mask), logits(reference, ids, mask)) <= 1e-5


def test_the_table_free_patch_of_a_model_with_a_rotary_module_warns_nothing():
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        torch_rope.hf.patch(hf_models.build("llama"), tables=False)
