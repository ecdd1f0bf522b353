# SPDX-License-Identifier: BSD-3-Clause
"""A patched model runs wherever the unpatched one runs: positions past the tables.

transformers computes its angles per call, so an unpatched model runs at any position. The patched
one's tables start at the length the config declares and, in eager mode, grow (doubling) when a
call reaches past them; under torch.compile they stay as they are, and a position past them raises
rather than rotating by a wrong angle.
"""

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed")

import hf_models  # noqa: E402
from test_hf import OpCounter, generate, logits, rel_err  # noqa: E402

import torch_rope.hf  # noqa: E402


def all_tables(model):
    return [t for m in model.modules() if hasattr(m, "torch_rope") for t in m.torch_rope.values()]


def ids_of(length, seed=1):
    return torch.randint(2, 256, (1, length), generator=torch.Generator().manual_seed(seed))


# max_position_embeddings 64 (COMMON); gemma3 is gemma3_text (its sliding and full layers, q/k
# norms fused), phi3 longrope (its long factors past original_max_position_embeddings 16).
@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen3", "mistral", "gemma3", "phi3"])
def test_positions_past_max_position_embeddings_match_the_unpatched_model(name):
    reference = hf_models.build(name)
    model = torch_rope.hf.patch(copy.deepcopy(reference))
    assert reference.config.max_position_embeddings == 64
    ids = ids_of(150)
    mask = torch.ones_like(ids)
    assert rel_err(logits(model, ids, mask), logits(reference, ids, mask)) <= 1e-5
    # Generation that crosses the end of the tables (60 + 12 > 64) with a KV cache.
    prompt, mask = hf_models.batch(length=60)
    fresh = torch_rope.hf.patch(copy.deepcopy(reference))
    assert torch.equal(generate(fresh, prompt, mask), generate(reference, prompt, mask))


def qwen2_with_the_yarn_recipe():
    """Qwen2.5's model cards: rope_scaling yarn, factor 4, original_max_position_embeddings the
    pretraining length, and max_position_embeddings left at that length."""
    config = hf_models.config("qwen2")
    config.rope_parameters = {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 64,
        "rope_theta": 1e6,
    }
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation="eager", dtype=torch.float32
    ).eval()


def test_the_yarn_recipe_serves_its_scaled_length_from_the_start():
    reference = qwen2_with_the_yarn_recipe()
    model = torch_rope.hf.patch(copy.deepcopy(reference))
    # The tables cover what the scaling declares, factor * original, before any call.
    assert {t.max_seq_len for t in all_tables(model)} == {256}
    ids = ids_of(200)
    mask = torch.ones_like(ids)
    assert rel_err(logits(model, ids, mask), logits(reference, ids, mask)) <= 1e-5


# Gemma 3 with dynamic NTK on its full layers (the sliding ones plain), or on both: the fused
# q/k-norm path (rms_norm_apply_qk) runs past the original length as the unfused one does.
@pytest.mark.parametrize("sliding", ["default", "dynamic"])
def test_gemma3_dynamic_runs_past_the_original_length_on_the_fused_norm_path(sliding):
    config = hf_models.config("gemma3")
    config.max_position_embeddings = 16
    config.rope_parameters = {
        "sliding_attention": {"rope_type": sliding, "rope_theta": 10000.0},
        "full_attention": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e6},
    }
    if sliding == "dynamic":
        config.rope_parameters["sliding_attention"]["factor"] = 2.0
    torch.manual_seed(0)
    reference = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation="eager", dtype=torch.float32
    ).eval()
    model = torch_rope.hf.patch(copy.deepcopy(reference))
    for length in (40, 8, 40):  # grow, reset, grow again
        ids = ids_of(length)
        mask = torch.ones_like(ids)
        with OpCounter() as counter:
            got = logits(model, ids, mask)
        assert counter.counts.get("rope.rms_norm_apply_qk", 0) == config.num_hidden_layers
        assert rel_err(got, logits(reference, ids, mask)) <= 1e-5, length


def test_tables_grow_by_doubling_so_that_growth_is_rare():
    model = torch_rope.hf.patch(hf_models.build("llama"))  # max_position_embeddings = 64
    (tables,) = all_tables(model)
    assert tables.max_seq_len == 64
    logits(model, ids_of(70), torch.ones(1, 70, dtype=torch.long))
    assert tables.max_seq_len == 128  # doubled, not 70
    grown = tables.cos
    for length in (100, 128):
        logits(model, ids_of(length), torch.ones(1, length, dtype=torch.long))
    assert tables.cos is grown  # no rebuild while the positions fit
    logits(model, ids_of(300), torch.ones(1, 300, dtype=torch.long))
    assert tables.max_seq_len == 300  # past twice the length: as long as the call needs


def test_max_seq_len_sizes_the_tables_up_front():
    model = torch_rope.hf.patch(hf_models.build("llama"), max_seq_len=512)
    assert {t.max_seq_len for t in all_tables(model)} == {512}


def test_under_torch_compile_the_tables_do_not_grow_and_a_position_past_them_raises():
    """No host read of the positions in a compiled graph (fullgraph holds): a position past the
    tables raises the op's IndexError, never a wrong angle; max_seq_len sizes them for compile."""
    model = torch_rope.hf.patch(hf_models.build("llama"))
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    ids = ids_of(70)
    with torch.no_grad(), pytest.raises(IndexError, match="max_seq_len"):
        compiled(input_ids=ids)
    assert {t.max_seq_len for t in all_tables(model)} == {64}
    reference = hf_models.build("llama")
    sized = torch_rope.hf.patch(copy.deepcopy(reference), max_seq_len=128)
    torch._dynamo.reset()
    compiled = torch.compile(sized, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        got = compiled(input_ids=ids).logits
    assert rel_err(got, logits(reference, ids, torch.ones_like(ids))) <= 1e-5
