# SPDX-License-Identifier: BSD-3-Clause
"""torch-rope demo: the op inside a causal attention block, checked and timed.

Run through `bash scripts/demo.sh` (which installs, builds, then runs this), or directly:
    PYTHONPATH=python .venv/bin/python examples/attention_demo.py
"""

import logging
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

import torch_rope
from torch_rope import eager

# torch.compile's C++ backend imports torch.utils.cpp_extension, which logs "No CUDA runtime is
# found" on a machine with the CUDA toolkit but no GPU: true, harmless for the demo, and it would
# land in the middle of the timing table.
logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)


class CausalSelfAttention(nn.Module):
    """A Llama-style attention block: fused qkv projection, GQA, RoPE on q and k, SDPA."""

    def __init__(self, d_model=512, n_heads=8, n_kv_heads=2, max_seq_len=4096, rope_impl="ours"):
        super().__init__()
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.head_dim = d_model // n_heads
        self.qkv = nn.Linear(d_model, (n_heads + 2 * n_kv_heads) * self.head_dim, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)
        self.rope = torch_rope.RotaryPositionalEmbedding(10000.0, self.head_dim, max_seq_len)
        self.rope_impl = rope_impl

    def forward(self, x, positions):
        b, s, _ = x.shape
        qkv = self.qkv(x).view(b, s, self.n_heads + 2 * self.n_kv_heads, self.head_dim)
        # q and k are strided slices of the fused projection: rotated without a copy.
        q, k, v = qkv.split([self.n_heads, self.n_kv_heads, self.n_kv_heads], dim=2)
        pos = positions.view(s, 1)  # (S, 1) broadcasts over heads of a (B, S, H, D) tensor
        if self.rope_impl == "ours":
            q, k = torch_rope.apply_qk(q, k, self.rope.cos, self.rope.sin, pos)
        else:
            q, k = eager.apply_qk(q, k, self.rope.cos, self.rope.sin, pos)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.out(y.transpose(1, 2).reshape(b, s, -1))


def spread_ms(candidates, device, rounds=15):
    """{name: (min, median, max) ms per call} over interleaved rounds: each round calls every
    candidate once, in an order that rotates, so a slow stretch of the machine (another process,
    memory compaction, a page-fault storm) lands on all of them rather than on one. Several
    rounds, and the spread shown, so that no single round can mislead."""
    names = list(candidates)
    for fn in candidates.values():  # warm-up: first-call costs
        fn()
    times = {name: [] for name in names}
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            candidates[name]()
            if device == "cuda":
                torch.cuda.synchronize()
            times[name].append((time.perf_counter() - t0) * 1e3)
    return {n: (min(t), statistics.median(t), max(t)) for n, t in times.items()}


def main():
    torch.manual_seed(0)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    print(
        f"torch {torch.__version__}, torch_rope {torch_rope.__version__}, "
        f"CUDA kernels built: {torch_rope.compiled_with_cuda()}, "
        f"GPU present: {torch.cuda.is_available()}\n"
    )

    # 1. Inside an attention block: identical to the plain-PyTorch reference.
    block = CausalSelfAttention()
    x = torch.randn(2, 256, 512)
    positions = torch.arange(256)
    with torch.no_grad():
        ours = block(x, positions)
        block.rope_impl = "reference"
        ref = block(x, positions)
        block.rope_impl = "ours"
    print(
        f"1. attention block output vs reference RoPE: max |diff| = "
        f"{(ours - ref).abs().max().item():.2e}"
    )

    # 2. The relative-position property: q_i . k_j depends only on i - j.
    cos, sin = torch_rope.rope_tables(10000.0, 64, 4096)
    q, k = torch.randn(1, 64), torch.randn(1, 64)

    def score(i, j):
        qi = torch_rope.apply(q, cos, sin, torch.tensor([i]))
        kj = torch_rope.apply(k, cos, sin, torch.tensor([j]))
        return (qi * kj).sum().item()

    print(
        "2. relative position: score(i, j) for i - j = 3 at three offsets: "
        + ", ".join(f"({i},{i - 3}) -> {score(i, i - 3):+.6f}" for i in (3, 100, 3000))
    )

    # 3. Gradients flow, and torch.compile sees the op (no graph break).
    compiled_block = torch.compile(block, fullgraph=True)
    with torch.no_grad():
        diff = (compiled_block(x, positions) - ours).abs().max().item()
    print(f"3. torch.compile(fullgraph=True) of the block vs eager: max |diff| = {diff:.2e}")

    # 4. Speed of the rotation itself: ours vs eager PyTorch vs torch.compile of the reference,
    # in interleaved rounds; min / median / max per candidate, ratios of medians.
    print(
        "\n4. RoPE on q and k of a (B=4, S=1024, H=32/8 GQA, D=128) prefill, ms per call over 15 "
        "interleaved rounds (min / median / max):"
    )
    print(
        "| device | dtype | ours | x.clone() | eager reference | compiled reference "
        "| eager / ours | compiled / ours |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for device in devices:
        for dtype in (torch.float32, torch.bfloat16):
            cos, sin = torch_rope.rope_tables(10000.0, 128, 4096, device=device)
            q = torch.randn(4, 1024, 32, 128, device=device, dtype=dtype)
            k = torch.randn(4, 1024, 8, 128, device=device, dtype=dtype)
            pos = torch.arange(1024, device=device).view(1024, 1)
            compiled_ref = torch.compile(eager.apply_qk, fullgraph=True)
            with torch.no_grad():
                t = spread_ms(
                    {
                        "ours": lambda: torch_rope.apply_qk(q, k, cos, sin, pos),
                        "clone": lambda: (q.clone(), k.clone()),
                        "eager": lambda: eager.apply_qk(q, k, cos, sin, pos),
                        "compiled": lambda: compiled_ref(q, k, cos, sin, pos),
                    },
                    device,
                )
            cell = {n: "{:.2f} / {:.2f} / {:.2f}".format(*v) for n, v in t.items()}
            ours = t["ours"][1]
            print(
                f"| {device} | {str(dtype)[6:]} | {cell['ours']} | {cell['clone']} | "
                f"{cell['eager']} | {cell['compiled']} | {t['eager'][1] / ours:.1f}x | "
                f"{t['compiled'][1] / ours:.1f}x |"
            )
    if not torch.cuda.is_available():
        print("\n(no GPU on this machine: CUDA rows are absent; see README for GPU status)")


if __name__ == "__main__":
    main()
