"""TorchScript and torch.export paths for a block that calls torch.ops.rope.apply.

    python examples/cpp/check_torchscript.py <path to run_scripted binary>

1. torch.jit.script the block, save it, load and run it from C++ (run_scripted), compare.
2. torch.export.export the same block: rope.apply appears in the graph, the program matches eager.
Exits non-zero on any mismatch.
"""

import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn

import torch_rope  # noqa: F401  (registers torch.ops.rope.*)


class RopeBlock(nn.Module):
    """Projection, then RoPE through the raw op (what a scripted/exported model calls)."""

    def __init__(self, d_model: int = 64, n_heads: int = 4, max_seq_len: int = 128):
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.proj = nn.Linear(d_model, d_model)
        cos, sin = torch_rope.rope_tables(10000.0, self.head_dim, max_seq_len)
        self.register_buffer("cos", cos)
        self.register_buffer("sin", sin)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        h = self.proj(x).view(b, s, self.n_heads, self.head_dim)
        h = torch.ops.rope.apply(h, self.cos, self.sin, positions.view(s, 1), interleaved=False)
        return h.reshape(b, s, d)


def main(binary: str) -> int:
    torch.manual_seed(0)
    block = RopeBlock().eval()
    x, positions = torch.randn(2, 10, 64), torch.arange(3, 13)
    with torch.no_grad():
        eager = block(x, positions)
    results = {}

    with tempfile.TemporaryDirectory() as tmp:
        module_path, in_path, out_path = (Path(tmp, n) for n in ("block.pt", "in.pt", "out.pt"))
        torch.jit.script(block).save(str(module_path))
        torch.save({"x": x, "positions": positions}, in_path)
        subprocess.run([binary, str(module_path), str(in_path), str(out_path)], check=True)
        # Our own binary's torch::pickle_save output; its type tags need weights_only=False.
        from_cpp = torch.load(out_path, weights_only=False)
    results["TorchScript saved in Python, run from C++"] = (from_cpp - eager).abs().max().item()

    exported = torch.export.export(block, (x, positions))
    graph = str(exported.graph_module.code)
    in_graph = "torch.ops.rope.apply" in graph
    print(f"  torch.export graph calls torch.ops.rope.apply: {in_graph}")
    with torch.no_grad():
        results["torch.export program vs eager"] = (
            (exported.module()(x, positions) - eager).abs().max().item() if in_graph else float("inf"))

    failures = 0
    for name, err in results.items():
        ok = err < 1e-5
        failures += not ok
        print(f"  {name:45s} max |diff| = {err:.2e}  {'ok' if ok else 'MISMATCH'}")
    print(f"TorchScript/export checks: {len(results) - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
