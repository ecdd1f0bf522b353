# SPDX-License-Identifier: BSD-3-Clause
"""A decode loop over a paged KV cache with torch_rope.apply_qk_cache.

Several sequences of different lengths share one paged cache (num_blocks, block_size, Hkv, D):
each owns a list of blocks (its block table), and token ``p`` of a sequence lives in slot
``block_table[p // block_size] * block_size + p % block_size``. Each step rotates the new
token's q and k, writes k and v into their slots (one fused call), and attends over the cache
(GQA). The same loop runs unfused (``apply_qk``, then index writes into a second cache) and the
two are compared; the script prints the largest difference and fails if they disagree.

    python examples/paged_decode.py [--device cuda] [--steps 16] [--cache-dtype bfloat16]
"""

import argparse
import math

import torch

import torch_rope


def attend(q, k_cache, v_cache, block_tables, seq_lens):
    """q (B, Hq, D) against each sequence's first seq_lens[b] cached tokens; (B, Hq, Dv)."""
    B, Hq, D = q.shape
    block_size, Hkv = k_cache.size(1), k_cache.size(2)
    out = []
    for b in range(B):
        n = int(seq_lens[b])
        p = torch.arange(n, device=q.device)
        blocks = block_tables[b][p // block_size]
        k = k_cache[blocks, p % block_size].float()  # (n, Hkv, D)
        v = v_cache[blocks, p % block_size].float()
        k = k.repeat_interleave(Hq // Hkv, dim=1)  # GQA: each kv head serves Hq / Hkv q heads
        v = v.repeat_interleave(Hq // Hkv, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[b].float(), k) / math.sqrt(D)
        out.append(torch.einsum("hn,nhd->hd", scores.softmax(-1), v))
    return torch.stack(out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--cache-dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    dtype = getattr(torch, args.cache_dtype)
    torch.manual_seed(0)

    B, Hq, Hkv, D = 4, 8, 2, 64
    block_size, num_blocks, max_len = 16, 64, 256
    cos, sin = torch_rope.rope_tables(10000.0, D, max_len, device)
    # Blocks handed out in a shuffled order, as an allocator would after some churn.
    free = torch.randperm(num_blocks).tolist()
    blocks_per_seq = max_len // block_size // 2
    block_tables = torch.tensor(
        [[free.pop() for _ in range(blocks_per_seq)] for _ in range(B)], device=device
    )
    seq_lens = torch.tensor([5, 17, 1, 30], device=device)  # tokens already in the cache

    def new_cache():
        return torch.zeros(num_blocks, block_size, Hkv, D, dtype=dtype, device=device)

    fused_k, fused_v, plain_k, plain_v = new_cache(), new_cache(), new_cache(), new_cache()
    # Prefill the cached prefixes (random keys and values, rotated at their positions).
    for b in range(B):
        n = int(seq_lens[b])
        pos = torch.arange(n, device=device)
        slots = block_tables[b][pos // block_size] * block_size + pos % block_size
        q = torch.randn(n, Hq, D, device=device, dtype=dtype)
        k = torch.randn(n, Hkv, D, device=device, dtype=dtype)
        v = torch.randn(n, Hkv, D, device=device, dtype=dtype)
        torch_rope.apply_qk_cache(q, k, v, cos, sin, pos.view(n, 1), fused_k, fused_v, slots)
        _, k_rot = torch_rope.apply_qk(q, k, cos, sin, pos.view(n, 1))
        plain_k.view(-1, Hkv, D)[slots] = k_rot
        plain_v.view(-1, Hkv, D)[slots] = v

    worst = 0.0
    for _ in range(args.steps):
        # One new token per sequence, at position seq_lens[b].
        pos = seq_lens.clone()
        slots = block_tables[torch.arange(B, device=device), pos // block_size] * block_size
        slots = slots + pos % block_size
        qkv = torch.randn(B, (Hq + 2 * Hkv) * D, device=device, dtype=dtype)  # a fused projection
        q = qkv[:, : Hq * D].view(B, Hq, D)
        k = qkv[:, Hq * D : (Hq + Hkv) * D].view(B, Hkv, D)
        v = qkv[:, (Hq + Hkv) * D :].view(B, Hkv, D)

        q_fused = torch_rope.apply_qk_cache(
            q, k, v, cos, sin, pos.view(B, 1), fused_k, fused_v, slots
        )

        q_plain, k_rot = torch_rope.apply_qk(q, k, cos, sin, pos.view(B, 1))
        plain_k.view(-1, Hkv, D).index_copy_(0, slots, k_rot)
        plain_v.view(-1, Hkv, D).index_copy_(0, slots, v)

        seq_lens += 1
        out_fused = attend(q_fused, fused_k, fused_v, block_tables, seq_lens)
        out_plain = attend(q_plain, plain_k, plain_v, block_tables, seq_lens)
        worst = max(worst, (out_fused - out_plain).abs().max().item())

    cache_diff = max(
        (fused_k.float() - plain_k.float()).abs().max().item(),
        (fused_v.float() - plain_v.float()).abs().max().item(),
    )
    print(
        f"paged decode: {B} sequences, {args.steps} steps, {dtype} cache on {device}: "
        f"max |attention difference| = {worst:.3g}, max |cache difference| = {cache_diff:.3g}"
    )
    if worst > 1e-5 or cache_diff != 0.0:
        raise SystemExit("fused and unfused paths disagree")


if __name__ == "__main__":
    main()
