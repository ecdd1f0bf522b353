# SPDX-License-Identifier: BSD-3-Clause
"""A Hugging Face Llama attention layer, patched by torch_rope.hf.patch vs unpatched.

Three timings per case, each also as a ratio to ``q.clone(); k.clone()`` of the same tensors in
the same run (the memory-traffic floor of rotating q and k):

* rope: what one attention layer's RoPE costs in the model: the rotary module's forward (HF:
  gathered cos/sin from inv_freq; patched: the positions) plus ``apply_rotary_pos_emb`` on the
  layer's q and k (strided views of the projections, as in the model);
* layer: the whole ``LlamaAttention`` forward (projections, RoPE, SDPA, output projection), with
  the rotary module run once for it;
* the layer's speed-up, unpatched / patched.

Prefill and decode (one token per sequence at a KV-cache offset), float32 and bfloat16. Writes
benchmarks/results/hf_<device>.json and .md.

    PYTHONPATH=python .venv/bin/python benchmarks/bench_hf.py [--device cuda]
"""

import argparse
import copy
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import timing  # noqa: E402
import torch  # noqa: E402
from bench_gpu import Timer  # noqa: E402  (one timer for CPU and CUDA: events on the GPU)

import torch_rope  # noqa: E402
import torch_rope.hf  # noqa: E402

CASES = [
    # name, batch, seq, start position (decode: each sequence at its own offset around it)
    ("prefill", 1, 1024, 0),
    ("decode", 16, 1, 3000),
]


def build(dtype, device):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=128,
        hidden_size=4096,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=8192,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval().to(device=device, dtype=dtype)
    model.config._attn_implementation = "sdpa"
    return model


def run_case(name, batch, seq, start, dtype, device, min_time_s):
    hf = build(dtype, device)
    ours = torch_rope.hf.patch(copy.deepcopy(hf))
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(batch, seq, 4096, generator=gen).to(device=device, dtype=dtype)
    if seq == 1:
        offsets = torch.randint(start - 100, start + 100, (batch, 1), generator=gen)
        position_ids = offsets.to(device)
    else:
        position_ids = (start + torch.arange(seq, device=device)).unsqueeze(0).expand(batch, seq)

    def qk(model):
        attn = model.model.layers[0].self_attn
        shape = (batch, seq, -1, 128)
        q = attn.q_proj(hidden).view(shape).transpose(1, 2)
        k = attn.k_proj(hidden).view(shape).transpose(1, 2)
        return attn, q, k

    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf_apply

    from torch_rope.hf.rotate import apply_with_tables

    results = {}
    with torch.no_grad():
        _, q, k = qk(hf)

        def floor():
            q.clone()
            k.clone()

        def hf_rope():
            cos, sin = hf.model.rotary_emb(hidden, position_ids)
            hf_apply(q, k, cos, sin)

        def our_rope():
            positions, tables = ours.model.rotary_emb(hidden, position_ids)
            apply_with_tables(q, k, positions, tables)

        # Same values first, against a float32 rotary module: the benchmark compares equal work.
        # (Not against HF's bf16 model: `.to(bfloat16)` also casts its inv_freq buffer, so its
        # angles at position 1000 are off by up to ~1 rad; ours keeps float32 tables.)
        fp32_rotary = type(hf.model.rotary_emb)(hf.config).to(device)
        cos, sin = fp32_rotary(hidden.float(), position_ids)
        want = hf_apply(q.float(), k.float(), cos, sin)
        got = apply_with_tables(q, k, *ours.model.rotary_emb(hidden, position_ids))
        tol = 1e-3 if dtype == torch.float32 else 5e-2
        for w, g in zip(want, got):
            torch.testing.assert_close(g.float(), w, rtol=tol, atol=tol)

        def layer(model):
            attn = model.model.layers[0].self_attn
            rotary = model.model.rotary_emb

            def fn():
                attn(hidden, position_embeddings=rotary(hidden, position_ids), attention_mask=None)

            return fn

        timer = Timer(device, min_time_s)
        for key, fn in [
            ("clone", floor),
            ("hf_rope", hf_rope),
            ("ours_rope", our_rope),
            ("hf_layer", layer(hf)),
            ("ours_layer", layer(ours)),
        ]:
            results[key] = timer(fn) * 1e3  # ms
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--min-time", type=float, default=1.0, help="seconds per measurement")
    parser.add_argument(
        "--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)"
    )
    args = parser.parse_args()
    device = args.device
    meta = timing.start_run(
        args.threads or None,
        device=device if device != "cuda" else torch.cuda.get_device_name(),
        model="Llama attention layer: hidden 4096, 32 q / 8 kv heads, head_dim 128, llama3",
        timing="median wall time; ratios within one run",
    )
    rows = []
    for name, batch, seq, start in CASES:
        for dtype in (torch.float32, torch.bfloat16):
            ms = run_case(name, batch, seq, start, dtype, device, args.min_time)
            rows.append(
                {"case": name, "batch": batch, "seq": seq, "dtype": str(dtype)[6:], "ms": ms}
            )
            print(name, dtype, {k: round(v, 4) for k, v in ms.items()}, flush=True)
    tag = "cpu" if device == "cpu" else "cuda"
    lines = [
        f"Device: {meta['device']} ({meta['threads']} threads), torch {meta['torch']}, "
        f"transformers {meta['versions']['transformers']}",
        "",
        "| case | dtype | clone q,k (ms) | HF rope (ms) | patched rope (ms) | HF rope / clone "
        "| patched rope / clone | rope speed-up | HF layer (ms) | patched layer (ms) "
        "| layer speed-up |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        m = r["ms"]
        lines.append(
            f"| {r['case']} (B={r['batch']}, S={r['seq']}) | {r['dtype']} | {m['clone']:.3f} "
            f"| {m['hf_rope']:.3f} | {m['ours_rope']:.3f} | {m['hf_rope'] / m['clone']:.2f} "
            f"| {m['ours_rope'] / m['clone']:.2f} | {m['hf_rope'] / m['ours_rope']:.1f}x "
            f"| {m['hf_layer']:.3f} | {m['ours_layer']:.3f} "
            f"| {m['hf_layer'] / m['ours_layer']:.2f}x |"
        )
    print("\n".join(lines))
    timing.write_results(f"hf_{tag}", {"meta": meta, "rows": rows}, "\n".join(lines))


if __name__ == "__main__":
    main()
