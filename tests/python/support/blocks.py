# SPDX-License-Identifier: BSD-3-Clause
"""A small attention block for the model-level tests: fused qkv projection, RoPE on q and k,
F.scaled_dot_product_attention. The rotation is pluggable so the same block runs with the
library, with the test oracle, or with no position encoding at all."""

from typing import Optional

import references as ref
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import torch_rope


class AttentionBlock(nn.Module):
    def __init__(
        self, d_model: int, n_heads: int, rope: Optional[nn.Module], *, causal: bool = True
    ) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)
        self.rope = rope
        self.causal = causal

    def forward(self, x: Tensor, token_positions: Optional[Tensor] = None) -> Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if self.rope is not None:
            q = self.rope(q, token_positions)
            k = self.rope(k, token_positions)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.out(y.transpose(1, 2).reshape(b, s, -1))


class OracleRope(nn.Module):
    """Drop-in stand-in for torch_rope.RotaryPositionalEmbedding built on the test oracle."""

    def __init__(self, theta: float, d_k: int, *, interleaved: bool = True) -> None:
        super().__init__()
        self.theta, self.d_k, self.interleaved = theta, d_k, interleaved

    def forward(self, x: Tensor, token_positions: Optional[Tensor] = None) -> Tensor:
        if token_positions is None:
            token_positions = torch.arange(x.size(-2))
        ang = ref.angles(token_positions, x.shape[:-1], self.d_k, self.theta)
        return ref.rope(x, ang, interleaved=self.interleaved).to(x.dtype)


class TinyLM(nn.Module):
    """Embedding -> pre-norm attention block with RoPE -> logits."""

    def __init__(
        self,
        vocab: int,
        d_model: int,
        n_heads: int,
        max_seq_len: int,
        *,
        interleaved: bool = True,
        causal: bool = True,
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        rope = torch_rope.RotaryPositionalEmbedding(
            10000.0, d_model // n_heads, max_seq_len, interleaved=interleaved
        )
        self.norm = nn.LayerNorm(d_model)
        self.attn = AttentionBlock(d_model, n_heads, rope, causal=causal)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens: Tensor) -> Tensor:
        h = self.embed(tokens)
        h = h + self.attn(self.norm(h))
        return self.head(h)
