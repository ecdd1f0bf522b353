# SPDX-License-Identifier: BSD-3-Clause
"""TorchScript, torch.export and AOTInductor paths for a block that calls torch.ops.rope.apply.

    python tests/integration/check_torchscript.py <run_scripted binary> <run_aoti binary>

1. torch.jit.script the block, save it, load and run it from C++ (run_scripted), compare.
2. torch.export.export the same block: rope.apply appears in the graph, the program matches eager.
3. AOTInductor-package the exported program (.pt2), load and run it from C++ (run_aoti), compare.
Exits non-zero on any mismatch.
"""

import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from compare import report  # tests/integration/compare.py, beside this script
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


def run_cpp(binary: str, model: Path, x, positions, tmp: str):
    """Runs one of the C++ loaders on `model` and returns its output."""
    in_path, out_path = Path(tmp, "in.pt"), Path(tmp, "out.pt")
    torch.save({"x": x, "positions": positions}, in_path)
    subprocess.run([binary, str(model), str(in_path), str(out_path)], check=True)
    # Our own binary's torch::pickle_save output; its type tags need weights_only=False.
    return torch.load(out_path, weights_only=False)


def main(scripted_binary: str, aoti_binary: str) -> int:
    torch.manual_seed(0)
    block = RopeBlock().eval()
    x, positions = torch.randn(2, 10, 64), torch.arange(3, 13)
    with torch.no_grad():
        eager = block(x, positions)
    results = {}

    with tempfile.TemporaryDirectory() as tmp:
        scripted = Path(tmp, "block.pt")
        torch.jit.script(block).save(str(scripted))
        from_cpp = run_cpp(scripted_binary, scripted, x, positions, tmp)
        results["TorchScript saved in Python, run from C++"] = (from_cpp - eager).abs().max().item()

        exported = torch.export.export(block, (x, positions))
        in_graph = "torch.ops.rope.apply" in str(exported.graph_module.code)
        print(f"  torch.export graph calls torch.ops.rope.apply: {in_graph}")
        with torch.no_grad():
            results["torch.export program vs eager"] = (
                (exported.module()(x, positions) - eager).abs().max().item()
                if in_graph
                else float("inf")
            )

        package = torch._inductor.aoti_compile_and_package(
            exported, package_path=str(Path(tmp, "block.pt2"))
        )
        from_aoti = run_cpp(aoti_binary, Path(package), x, positions, tmp)
        results["AOTInductor package, run from C++"] = (from_aoti - eager).abs().max().item()

    return 1 if report("TorchScript/export/AOTInductor checks", results, tolerance=1e-5) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
