# SPDX-License-Identifier: BSD-3-Clause
"""Runs the LibTorch example and checks it against the same model in Python.

    python tests/integration/check_example.py <path to attention_example binary>

Writes seeded weights and inputs, runs the binary, and compares its forward output, loss, weight
gradient, post-step loss and incremental-decode output with this file's Python implementation
(torch_rope.RotaryPositionalEmbedding). Exits non-zero on any mismatch.
"""

import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from compare import report  # tests/integration/compare.py, beside this script
from torch import nn

import torch_rope


class Attention(nn.Module):
    def __init__(self, d_model, n_heads, max_seq_len=256):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.wq, self.wk, self.wv, self.wo = (
            nn.Linear(d_model, d_model, bias=False) for _ in range(4)
        )
        self.rope = torch_rope.RotaryPositionalEmbedding(10000.0, self.head_dim, max_seq_len)

    def forward(self, x, positions):
        b, s, _ = x.shape

        def heads(t):
            return t.view(b, s, self.n_heads, self.head_dim).transpose(1, 2)

        q = self.rope(heads(self.wq(x)), positions)
        k = self.rope(heads(self.wk(x)), positions)
        y = F.scaled_dot_product_attention(q, k, heads(self.wv(x)), is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, s, -1))


def main(binary: str) -> int:
    torch.manual_seed(0)
    d_model, n_heads, seq, prefill = 64, 4, 12, 5
    model = Attention(d_model, n_heads)
    x = torch.randn(2, seq, d_model)
    inputs = {
        name: getattr(model, name).weight.detach().clone() for name in ("wq", "wk", "wv", "wo")
    }
    inputs.update(x=x, n_heads=torch.tensor(n_heads), prefill=torch.tensor(prefill))

    out = model(x, torch.arange(seq))
    loss = out.pow(2).mean()
    loss.backward()
    grad_wq = model.wq.weight.grad.clone()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad
        loss_after = model(x, torch.arange(seq)).pow(2).mean()

    with tempfile.TemporaryDirectory() as tmp:
        in_path, out_path = Path(tmp, "inputs.pt"), Path(tmp, "outputs.pt")
        torch.save(inputs, in_path)
        subprocess.run([binary, str(in_path), str(out_path)], check=True)
        # Written by our own binary through torch::pickle_save, whose type tags the
        # weights-only unpickler refuses.
        got = torch.load(out_path, weights_only=False)

    expected = {
        "out": out.detach(),
        "loss": loss.detach(),
        "grad_wq": grad_wq,
        "loss_after_step": loss_after,
        "decode_out": out.detach(),
    }
    errors = {key: (got[key] - want).abs().max().item() for key, want in expected.items()}
    return 1 if report("C++ example vs Python", errors, tolerance=1e-4) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
