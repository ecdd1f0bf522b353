# SPDX-License-Identifier: BSD-3-Clause
"""CPU benchmark of a diffusion transformer's RoPE, patched by torch_rope.diffusers vs diffusers.

Two DiT shapes, each in fp32 and bf16:

  flux  FLUX.1: 512 text + 4,096 image tokens (a 1024 x 1024 image), 24 heads x 128, ids
        (frame, row, column) over (16, 56, 56) features; q and k (1, 4608, 24, 128)
  wan   Wan 2.1 1.3B: a 33-frame 480 x 832 video, latent grid 9 x 30 x 52 = 14,040 tokens,
        12 heads x 128, (44, 42, 42) features per axis; q and k (1, 14040, 12, 128)

For each, one interleaved-round run (timing.py) times, on the same tensors:

  clone              q.clone(); k.clone(): the memory floor of rotating q and k
  diffusers block    what every attention block does: diffusers' rotation of q and k from the
                     RoPE module's output (FLUX: embeddings.apply_rotary_emb; Wan: the function
                     its processor defines), with that output computed once beforehand
  compiled block     the same function under torch.compile (inductor, static shapes)
  patched block      the patched processor's rotation: one rope::apply for q and one for k
  diffusers module   the RoPE module's forward, once per model forward (FLUX: cos/sin of every
                     id in float64; Wan: a gather from its cached tables)
  patched module     the patched RoPE module's forward (the positions; FLUX reads the ids'
                     extremes on the host)

and reports the ratios. Goal: the patched block at least 3x faster than diffusers'
eager block. The machine is shared while it runs: the load average before and after is recorded.

    PYTHONPATH=python .venv/bin/python benchmarks/bench_diffusers.py \
        [--quick] [--no-compile] [--threads N]

writes benchmarks/results/diffusers_cpu.json and .md.
"""

import argparse
import copy
import functools
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import timing  # noqa: E402
import torch  # noqa: E402

import torch_rope  # noqa: E402
import torch_rope.diffusers  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _rotation(model, name):
    """The rotation function the patched model's processors call in place of diffusers' ``name``
    (a global of the rebuilt ``__call__``'s namespace, or the one its nested stub calls)."""
    found = None
    for module in model.modules():
        processor = getattr(module, "processor", None)
        if processor is not None and type(processor).__name__.startswith("TorchRope"):
            namespace = type(processor).__call__.__globals__
            found = namespace.get(name)
            if not isinstance(found, functools.partial):
                found = next(
                    v
                    for k, v in namespace.items()
                    if k.startswith("_torch_rope_") and k.endswith(name)
                )
            break
    assert isinstance(found, functools.partial), name
    return found


def flux_case():
    """FLUX.1's RoPE: a FluxTransformer2DModel with FLUX.1's RoPE settings (head 128, axes
    (16, 56, 56), theta 1e4) and one head per layer (the rotation is per head: q and k below have
    24), patched; its ids for 512 text and 64 x 64 image tokens."""
    from diffusers import FluxTransformer2DModel
    from diffusers.models import embeddings

    model = FluxTransformer2DModel(
        in_channels=16,
        num_layers=1,
        num_single_layers=0,
        attention_head_dim=128,
        num_attention_heads=1,
        joint_attention_dim=32,
        pooled_projection_dim=32,
        axes_dims_rope=[16, 56, 56],
    ).eval()
    rope = model.pos_embed
    ids = torch.cat([torch.zeros(512, 3), torch_rope.vision.flux_ids(0, 64, 64).float()])
    patched = torch_rope.diffusers.patch(copy.deepcopy(model))
    ours = _rotation(patched, "apply_rotary_emb")

    def theirs_block(q, k, freqs):
        return (
            embeddings.apply_rotary_emb(q, freqs, sequence_dim=1),
            embeddings.apply_rotary_emb(k, freqs, sequence_dim=1),
        )

    def ours_block(q, k, positions):
        return ours(q, positions, sequence_dim=1), ours(k, positions, sequence_dim=1)

    return dict(
        name="flux (1,4608,24,128)",
        shape=(1, 4608, 24, 128),
        module=(lambda: rope(ids)),
        patched_module=(lambda: patched.pos_embed(ids)),
        theirs=theirs_block,
        ours=ours_block,
    )


def wan_case():
    """Wan 2.1's RoPE: a WanTransformer3DModel with Wan's RoPE settings (head 128, patch
    (1, 2, 2), 1024 positions) and one head, patched; a 9 x 60 x 104 latent video."""
    from diffusers import WanTransformer3DModel
    from diffusers.models.transformers.transformer_wan import WanAttnProcessor

    from torch_rope.diffusers.processors import library_function

    model = WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=1,
        attention_head_dim=128,
        in_channels=4,
        out_channels=4,
        text_dim=16,
        freq_dim=32,
        ffn_dim=32,
        num_layers=1,
    ).eval()
    rope = model.rope
    latents = torch.zeros(1, 1, 9, 60, 104)
    patched = torch_rope.diffusers.patch(copy.deepcopy(model))
    theirs = library_function(WanAttnProcessor.__call__, "apply_rotary_emb")
    ours = _rotation(patched, "apply_rotary_emb")

    def theirs_block(q, k, freqs):
        return theirs(q, *freqs), theirs(k, *freqs)

    def ours_block(q, k, positions):
        return ours(q, *positions), ours(k, *positions)

    return dict(
        name="wan (1,14040,12,128)",
        shape=(1, 14040, 12, 128),
        module=(lambda: rope(latents)),
        patched_module=(lambda: patched.rope(latents)),
        theirs=theirs_block,
        ours=ours_block,
    )


def run(quick, compile_diffusers):
    rows = []
    with torch.inference_mode():
        for make in (flux_case, wan_case):
            case = make()
            for dname, dtype in DTYPES.items():
                gen = torch.Generator().manual_seed(0)
                q = torch.randn(*case["shape"], generator=gen).to(dtype)
                k = torch.randn(*case["shape"], generator=gen).to(dtype)
                freqs = case["module"]()
                positions = case["patched_module"]()
                want = case["theirs"](q.double(), k.double(), tuple(f.double() for f in freqs))
                got = case["ours"](q, k, positions)
                tol = 1e-5 if dtype == torch.float32 else 2e-2
                for w, g in zip(want, got):
                    err = (g.double() - w).abs().max().item()
                    assert err <= tol * max(1.0, w.abs().max().item()), (case["name"], dname, err)
                fns = {
                    "clone": lambda: (q.clone(), k.clone()),
                    "diffusers block": lambda: case["theirs"](q, k, freqs),
                    "patched block": lambda: case["ours"](q, k, positions),
                    "diffusers module": case["module"],
                    "patched module": case["patched_module"],
                }
                if compile_diffusers:
                    compiled = torch.compile(case["theirs"], dynamic=False)
                    compiled(q, k, freqs)
                    fns["compiled block"] = lambda c=compiled: c(q, k, freqs)
                res = timing.measure(fns, 5 if quick else 11)
                ms = {key: v["s"] * 1e3 for key, v in res.items()}
                row = {
                    "case": case["name"],
                    "dtype": dname,
                    "ms": ms,
                    "spread": {key: v["spread"] for key, v in res.items()},
                    "patched/clone": ms["patched block"] / ms["clone"],
                    "diffusers/clone": ms["diffusers block"] / ms["clone"],
                    "diffusers/patched": ms["diffusers block"] / ms["patched block"],
                    "module diffusers/patched": ms["diffusers module"] / ms["patched module"],
                }
                if compile_diffusers:
                    row["compiled/clone"] = ms["compiled block"] / ms["clone"]
                    row["compiled/patched"] = ms["compiled block"] / ms["patched block"]
                rows.append(row)
                print(
                    f"  {row['case']:24s} {dname:5s} "
                    + " ".join(f"{key}={v:.2f}" for key, v in row.items() if "/" in key),
                    flush=True,
                )
    return rows


def markdown(result):
    meta, rows = result["meta"], result["rows"]
    compiled = any("compiled/patched" in r for r in rows)
    lines = [
        f"# A DiT's RoPE on the CPU: torch_rope.diffusers vs diffusers ({meta['kernel_variant']} "
        f"kernel, {meta['cpu_model']}, {meta['threads']} threads)",
        "",
        f"{meta['date']}, torch {meta['torch']}, diffusers {meta['versions']['diffusers']}, load "
        f"average {meta['loadavg_before']} before, {meta['loadavg_after']} after on a shared "
        f"{meta['cpus']}-CPU VM (other jobs ran meanwhile: absolute times are noisy, the ratios "
        "are medians of one interleaved run). A block is what every attention block does "
        "(rotate q and k); the module runs once per model forward. "
        "Goal: diffusers block / patched block >= 3.",
        "",
        "| case | dtype | clone (ms) | diffusers block (ms) | "
        + ("compiled block (ms) | " if compiled else "")
        + "patched block (ms) | patched / clone | diffusers / clone | "
        + ("compiled / clone | " if compiled else "")
        + "**diffusers / patched** | "
        + ("compiled / patched | " if compiled else "")
        + "diffusers module (ms) | patched module (ms) |",
        "|---|---|" + "---:|" * (11 if compiled else 8),
    ]
    for r in rows:
        m = r["ms"]
        cells = [
            r["case"],
            r["dtype"],
            f"{m['clone']:.2f}",
            f"{m['diffusers block']:.2f}",
        ]
        if compiled:
            cells.append(f"{m['compiled block']:.2f}")
        cells += [
            f"{m['patched block']:.2f}",
            f"{r['patched/clone']:.2f}",
            f"{r['diffusers/clone']:.2f}",
        ]
        if compiled:
            cells.append(f"{r['compiled/clone']:.2f}")
        cells.append(f"**{r['diffusers/patched']:.1f}x**")
        if compiled:
            cells.append(f"{r['compiled/patched']:.2f}x")
        cells += [f"{m['diffusers module']:.3f}", f"{m['patched module']:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads")
    args = parser.parse_args()
    meta = timing.start_run(args.threads or None, quick=args.quick)
    rows = run(args.quick, not args.no_compile)
    timing.write_results("diffusers_cpu", {"meta": meta, "rows": rows}, markdown)


if __name__ == "__main__":
    main()
