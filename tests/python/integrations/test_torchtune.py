# SPDX-License-Identifier: BSD-3-Clause
"""torch_rope.torchtune drop-ins against the real torchtune: the modules, then whole Llama models
(training step with autograd, KV-cache generation) with the drop-in assigned to every layer."""

import copy

import pytest
import torch

torchtune = pytest.importorskip("torchtune", reason="torchtune is not installed")

from helpers import assert_matches_reference  # noqa: E402
from torchtune.models.llama3 import llama3  # noqa: E402
from torchtune.models.llama3_1 import llama3_1  # noqa: E402
from torchtune.models.llama3_1._position_embeddings import Llama3ScaledRoPE as TTScaled  # noqa: E402
from torchtune.modules import RotaryPositionalEmbeddings as TTRope  # noqa: E402

import torch_rope  # noqa: E402
from torch_rope import torchtune as tr  # noqa: E402


def test_rope_module_matches_torchtune_bshd():
    theirs, ours = (
        TTRope(64, max_seq_len=256, base=500_000),
        tr.RotaryPositionalEmbeddings(64, max_seq_len=256, base=500_000),
    )
    x = torch.randn(2, 50, 4, 64)
    pos = torch.randint(0, 256, (2, 50))
    step = torch.randn(2, 1, 4, 64)
    step_pos = torch.tensor([[37], [41]])
    # Default positions, input_pos [b, s] (packed samples) and one decode step. torchtune builds
    # its cache with float32 angles (off by ~1.5e-5 rad at position 255), hence 1e-4 between the
    # two; ours is checked against the float64 oracle to float32 rounding.
    for args, positions in (
        ((x,), torch.arange(50).view(50, 1)),
        ((x, pos), pos[..., None]),
        ((step, step_pos), step_pos[..., None]),
    ):
        kwargs = {} if len(args) == 1 else {"input_pos": args[1]}
        got = ours(args[0], **kwargs)
        torch.testing.assert_close(got, theirs(args[0], **kwargs), rtol=1e-4, atol=1e-4)
        assert_matches_reference(got, args[0], positions, 64, interleaved=True, theta=500_000.0)


def test_default_positions_follow_the_sequence_axis_not_the_heads():
    """The bug of the obvious swap: x.size(-2) is n_h in torchtune's [b, s, n_h, h_d]."""
    ours = tr.RotaryPositionalEmbeddings(32, max_seq_len=64)
    x = torch.randn(1, 9, 3, 32)  # s = 9, n_h = 3
    out = ours(x)
    torch.testing.assert_close(out, TTRope(32, max_seq_len=64)(x), rtol=1e-5, atol=1e-5)
    # Every head of a token gets the same rotation: token t, heads 0..2 at position t.
    plain = torch_rope.RotaryPositionalEmbedding(10000.0, 32, 64)
    for t in range(9):
        torch.testing.assert_close(out[0, t], plain(x[0, t], torch.full((3,), t)))


def test_llama3_scaled_rope_matches_torchtune():
    theirs = TTScaled(64, max_seq_len=512, base=500_000, scale_factor=8, old_context_len=128)
    ours = tr.Llama3ScaledRoPE(
        64, max_seq_len=512, base=500_000, scale_factor=8, old_context_len=128
    )
    x = torch.randn(1, 300, 2, 64)
    # torchtune builds its cache in float32 arithmetic: at position 300 its angles are off by
    # ~3e-5 rad, ours by ~1e-14.
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-4, atol=1e-4)
    assert ours.is_cache_built and list(ours.state_dict()) == []


def tiny(builder, **kwargs):
    torch.manual_seed(0)
    return builder(
        vocab_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        embed_dim=64,
        max_seq_len=128,
        intermediate_dim=128,
        **kwargs,
    ).eval()


def swap(model, rope):
    for layer in model.layers:
        layer.attn.pos_embeddings = rope
    return model


BUILDERS = {
    "llama3": (
        llama3,
        dict(rope_base=500_000),
        lambda: tr.RotaryPositionalEmbeddings(16, max_seq_len=128, base=500_000),
    ),
    "llama3_1": (
        llama3_1,
        dict(rope_base=500_000, scale_factor=8),
        lambda: tr.Llama3ScaledRoPE(16, max_seq_len=128, base=500_000, scale_factor=8),
    ),
}


@pytest.mark.parametrize("name", list(BUILDERS))
def test_llama_model_with_drop_in_matches_and_trains(name):
    builder, kwargs, make = BUILDERS[name]
    reference = tiny(builder, **kwargs)
    model = swap(copy.deepcopy(reference), make())
    tokens = torch.randint(0, 128, (2, 40))
    with torch.no_grad():
        want, got = reference(tokens), model(tokens)
    assert ((got - want).abs().max() / want.abs().max()).item() <= 1e-5

    # One training step: gradients through the kernel agree.
    for m in (reference, model):
        m.train()
        torch.nn.functional.cross_entropy(m(tokens).flatten(0, 1), tokens.flatten()).backward()
    for (n, p), q in zip(reference.named_parameters(), model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=n)


@pytest.mark.parametrize("name", list(BUILDERS))
def test_llama_kv_cache_generation_identical(name):
    from torchtune.generation import generate

    builder, kwargs, make = BUILDERS[name]
    reference = tiny(builder, **kwargs)
    model = swap(copy.deepcopy(reference), make())
    prompt = torch.randint(1, 128, (2, 10))
    outputs = []
    for m in (reference, model):
        m.setup_caches(batch_size=2, dtype=torch.float32, decoder_max_seq_len=64)
        with torch.no_grad():
            tokens, _ = generate(m, prompt, max_generated_tokens=16, temperature=1.0, top_k=1)
        outputs.append(tokens)
    assert torch.equal(outputs[0], outputs[1])


def test_rope_init_rebuilds_tables_after_meta_init():
    with torch.device("meta"):
        rope = tr.RotaryPositionalEmbeddings(32, max_seq_len=16)
    assert rope.cos.is_meta
    rope.to_empty(device="cpu")
    rope.rope_init()
    torch.testing.assert_close(rope.cos, tr.RotaryPositionalEmbeddings(32, 16).cos, rtol=0, atol=0)


def test_drop_in_compiles_fullgraph():
    rope = tr.RotaryPositionalEmbeddings(32, max_seq_len=64)
    x, pos = torch.randn(2, 9, 3, 32), torch.arange(9).expand(2, 9)
    compiled = torch.compile(rope, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x, input_pos=pos), rope(x, input_pos=pos))
