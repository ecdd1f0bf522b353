# SPDX-License-Identifier: BSD-3-Clause
"""RoPE inside a real attention block (F.scaled_dot_product_attention): drop-in equality with the
oracle, training, and what position encoding does to permutation equivariance."""

import pytest
import torch
from blocks import AttentionBlock, OracleRope, TinyLM
from helpers import LAYOUT_IDS, LAYOUTS, cpu_and_cuda

import torch_rope

D_MODEL, N_HEADS, S = 32, 2, 10


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
def test_block_equals_block_with_oracle_rope(interleaved, device):
    head_dim = D_MODEL // N_HEADS
    lib = AttentionBlock(
        D_MODEL,
        N_HEADS,
        torch_rope.RotaryPositionalEmbedding(10000.0, head_dim, 64, interleaved=interleaved),
    ).to(device)
    oracle = AttentionBlock(
        D_MODEL, N_HEADS, OracleRope(10000.0, head_dim, interleaved=interleaved)
    )
    oracle.load_state_dict(lib.state_dict())
    x = torch.randn(2, S, D_MODEL)
    positions = torch.randint(0, 64, (S,))

    out_lib = lib(x.to(device), positions.to(device))
    out_ref = oracle(x, positions)
    tol = 1e-5 if device == "cpu" else 1e-4  # GPU attention kernels sum in another order
    torch.testing.assert_close(out_lib.cpu(), out_ref, rtol=tol, atol=tol)

    out_lib.square().sum().backward()
    out_ref.square().sum().backward()
    torch.testing.assert_close(
        lib.qkv.weight.grad.cpu(), oracle.qkv.weight.grad, rtol=10 * tol, atol=10 * tol
    )


def _previous_token_batch(generator, batch, vocab):
    tokens = torch.randint(0, vocab, (batch, S), generator=generator)
    targets = torch.roll(tokens, 1, dims=1)  # predict the token one step back: needs positions
    return tokens, targets


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
def test_attention_with_rope_trains(interleaved, device):
    # One intra-op thread: these ops are tiny, and on a shared 2-core machine OpenMP hand-offs
    # between busy cores turn 20 steps from a fraction of a second into many seconds.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _train_previous_token_task(interleaved, device)
    finally:
        torch.set_num_threads(threads)


def _train_previous_token_task(interleaved, device):
    vocab = 12
    model = TinyLM(vocab, D_MODEL, N_HEADS, 64, interleaved=interleaved).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    tokens, targets = _previous_token_batch(g, 16, vocab)
    tokens, targets = tokens.to(device), targets.to(device)
    losses = []
    for _ in range(20):
        logits = model(tokens)
        loss = torch.nn.functional.cross_entropy(
            logits[:, 1:].reshape(-1, vocab), targets[:, 1:].reshape(-1)
        )
        opt.zero_grad()
        loss.backward()
        assert model.attn.qkv.weight.grad.abs().sum() > 0, "no gradient reached through RoPE"
        opt.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < 0.5 * losses[0], f"loss did not decrease enough: {losses}"


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_permutation_equivariance_broken_by_rope_restored_by_positions(device):
    head_dim = D_MODEL // N_HEADS
    plain = AttentionBlock(D_MODEL, N_HEADS, None, causal=False).to(device)
    rope = torch_rope.RotaryPositionalEmbedding(10000.0, head_dim, 64, device=device)
    rotary = AttentionBlock(D_MODEL, N_HEADS, rope, causal=False).to(device)
    rotary.load_state_dict(plain.state_dict())
    x = torch.randn(2, S, D_MODEL, device=device)
    perm = torch.randperm(S, device=device)
    assert not torch.equal(perm, torch.arange(S, device=device))

    # Without positions, attention without a mask is permutation-equivariant.
    torch.testing.assert_close(plain(x[:, perm]), plain(x)[:, perm], rtol=1e-5, atol=1e-5)

    # RoPE makes the output depend on where each token sits ...
    moved = rotary(x[:, perm])
    assert (moved - rotary(x)[:, perm]).abs().max() > 1e-3

    # ... and only on that: moving the positions with the tokens restores equivariance.
    torch.testing.assert_close(rotary(x[:, perm], perm), rotary(x)[:, perm], rtol=1e-5, atol=1e-5)
