# SPDX-License-Identifier: BSD-3-Clause
"""What bounds the CPU targets still missed, measured: each op's time split into a fixed
cost per call and a cost per token, against the op it is compared with and against the bytes
floor (``clone`` of the same bytes).

Decode calls are small enough that the rows sit in cache, so a ratio to another op says little by
itself: it mixes the per-call cost (the Python wrapper, the dispatcher, validation, allocation)
with the per-token work. Timing each candidate at B = 1 and at B = 64 tokens (interleaved rounds,
medians, benchmarks/timing.py) splits the two, assuming a cost linear in tokens:

    per token = (t(64) - t(1)) / 63,    fixed = t(1) - per token

The cases, each with the target the docs record as missed:

  fused QK-norm + RoPE decode   rms_norm_apply_qk against apply_qk       target 1.15
  multi-axis decode             apply with (B, 1, 1, 3) positions and    target 1.1
                                mrope_section against one-axis apply
  fp8 KV-cache write, decode    apply_qk_cache into an e4m3fn cache      target 1.15
                                against apply_qk (and into a bf16 cache)
  bf16 decode module call       RotaryPositionalEmbedding(...)(x, pos)   target 2.0 (x clone)
                                against clone, with the module's own
                                Python cost (an identity nn.Module) and
                                the op called without the Python wrapper
  in cache, half split (bf16)   apply of (1, 32, 64, 128) against clone    target 2.0 (missed on
                                (and the same values in fp32)              AVX2 hardware; here
                                                                           only simulated, with
                                                                           ATEN_CPU_CAPABILITY=avx2)

    PYTHONPATH=python .venv/bin/python benchmarks/missed_targets.py [--threads 1] [--quick]

writes benchmarks/results/missed_targets_cpu_<kernel>.json and .md.
"""

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import timing  # noqa: E402
import torch  # noqa: E402

import torch_rope  # noqa: E402

TOKENS = (1, 64)
HQ, HKV, D = 32, 8, 128
MAX_SEQ_LEN = 4096
FP8 = torch.float8_e4m3fn
FP8_SCALE = 0.05
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def fused_norm_case(dtype, T):
    g = torch.Generator().manual_seed(T)
    q = torch.randn(T, 1, HQ, D, generator=g).to(dtype)
    k = torch.randn(T, 1, HKV, D, generator=g).to(dtype)
    qw = (1 + 0.1 * torch.randn(D, generator=g)).to(dtype)
    kw = (1 + 0.1 * torch.randn(D, generator=g)).to(dtype)
    cos, sin = torch_rope.rope_tables(1e6, D, MAX_SEQ_LEN)
    pos = torch.randint(0, MAX_SEQ_LEN, (T, 1, 1), generator=g)
    return {
        "op": lambda: torch_rope.rms_norm_apply_qk(
            q, k, qw, kw, cos, sin, pos, eps=1e-6, interleaved=False
        ),
        "compared": lambda: torch_rope.apply_qk(q, k, cos, sin, pos, interleaved=False),
        "clone": lambda: (q.clone(), k.clone()),
    }


def multi_axis_case(dtype, T):
    g = torch.Generator().manual_seed(T)
    x = torch.randn(T, 32, 1, D, generator=g).to(dtype)
    t = torch.randint(0, MAX_SEQ_LEN // 2, (T, 1), generator=g)
    axes = torch.stack([t, t // 3 + 5, (t * 7) % 61 + 2], dim=-1).unsqueeze(1)  # (T, 1, 1, 3)
    one_axis = t.unsqueeze(1)  # (T, 1, 1)
    cos, sin = torch_rope.rope_tables(1e6, D, MAX_SEQ_LEN)
    return {
        "op": lambda: torch_rope.apply(
            x, cos, sin, axes, interleaved=False, mrope_section=[16, 24, 24]
        ),
        "compared": lambda: torch_rope.apply(x, cos, sin, one_axis, interleaved=False),
        "clone": lambda: x.clone(),
    }


def kv_cache_case(dtype, T):
    g = torch.Generator().manual_seed(T)
    qkv = torch.randn(T, (HQ + 2 * HKV) * D, generator=g).to(dtype)
    q = qkv[:, : HQ * D].view(T, HQ, D)
    k = qkv[:, HQ * D : (HQ + HKV) * D].view(T, HKV, D)
    v = qkv[:, (HQ + HKV) * D :].view(T, HKV, D)
    cos, sin = torch_rope.rope_tables(1e4, D, MAX_SEQ_LEN)
    pos = torch.randint(0, MAX_SEQ_LEN, (T, 1), generator=g)
    slots = torch.randperm(4096, generator=g)[:T]
    fp8_k, fp8_v = (torch.zeros(256, 16, HKV, D).to(FP8) for _ in range(2))
    same_k, same_v = (torch.zeros(256, 16, HKV, D).to(dtype) for _ in range(2))
    # The exact quantization divides every k and v value by the scale (x * (1 / scale) rounds
    # differently): the division alone, in float32, into a buffer kept in cache.
    kv_float = torch.randn(2, T, HKV, D, generator=g)
    quotients = torch.empty_like(kv_float)
    return {
        "op": lambda: torch_rope.apply_qk_cache(
            q, k, v, cos, sin, pos, fp8_k, fp8_v, slots, k_scale=FP8_SCALE, v_scale=FP8_SCALE
        ),
        "compared": lambda: torch_rope.apply_qk(q, k, cos, sin, pos),
        "same-dtype cache": lambda: torch_rope.apply_qk_cache(
            q, k, v, cos, sin, pos, same_k, same_v, slots
        ),
        "k, v / scale (division alone)": lambda: torch.div(kv_float, FP8_SCALE, out=quotients),
        "clone": lambda: (q.clone(), k.clone(), v.clone()),
    }


class Identity(torch.nn.Module):
    def forward(self, x, positions):
        return x


def module_case(dtype, T):
    g = torch.Generator().manual_seed(T)
    x = torch.randn(T, 32, 1, D, generator=g).to(dtype)
    pos = torch.randint(0, MAX_SEQ_LEN, (T, 1, 1), generator=g)
    module = torch_rope.RotaryPositionalEmbedding(1e4, D, MAX_SEQ_LEN)
    identity = Identity()
    cos, sin = module.cos, module.sin
    return {
        "op": lambda: module(x, pos),
        "compared": lambda: x.clone(),
        "apply (Python wrapper)": lambda: torch_rope.apply(x, cos, sin, pos),
        "torch.ops.rope.apply.default": lambda: torch.ops.rope.apply.default(x, cos, sin, pos),
        "identity module + clone": lambda: identity(x, pos).clone(),
        "clone": lambda: x.clone(),
    }


def in_cache_case(dtype, T):
    """(1, 32, T, 128) with positions arange(T): at T = 64 the in-cache shape of the speed table."""
    g = torch.Generator().manual_seed(T)
    x = torch.randn(1, 32, T, D, generator=g).to(dtype)
    x32 = x.float()
    pos = torch.arange(T)
    cos, sin = torch_rope.rope_tables(1e4, D, MAX_SEQ_LEN)
    return {
        "op": lambda: torch_rope.apply(x, cos, sin, pos, interleaved=False),
        "compared": lambda: x.clone(),
        "apply of the same values in fp32": lambda: torch_rope.apply(
            x32, cos, sin, pos, interleaved=False
        ),
        "clone fp32": lambda: x32.clone(),
        "clone": lambda: x.clone(),
    }


CASES = [
    ("fused QK-norm + RoPE decode", "rms_norm_apply_qk / apply_qk", 1.15, fused_norm_case),
    ("multi-axis decode", "mrope apply / one-axis apply", 1.1, multi_axis_case),
    ("fp8 KV-cache write, decode", "apply_qk_cache (fp8) / apply_qk", 1.15, kv_cache_case),
    ("decode module call", "module call / clone", 2.0, module_case),
    ("in cache, half split", "apply / clone", 2.0, in_cache_case),
]


def split(t1, t64):
    per_token = (t64 - t1) / (TOKENS[1] - TOKENS[0])
    return t1 - per_token * TOKENS[0], per_token


def run(quick):
    rows = []
    with torch.inference_mode():
        for name, ratio_name, target, make in CASES:
            for dname, dtype in DTYPES.items():
                if name in ("decode module call", "in cache, half split") and dname != "bf16":
                    continue  # the missed targets are bf16's; fp32 meets them
                us = {}
                for T in TOKENS:
                    fns = make(dtype, T)
                    res = timing.measure(fns, rounds=7 if quick else 31)
                    us[T] = {n: r["s"] * 1e6 for n, r in res.items()}
                parts = {n: split(us[1][n], us[64][n]) for n in us[1]}
                row = {
                    "case": name,
                    "ratio_name": ratio_name,
                    "target": target,
                    "dtype": dname,
                    "us": {str(T): {n: round(v, 3) for n, v in us[T].items()} for T in TOKENS},
                    "ratio": {str(T): round(us[T]["op"] / us[T]["compared"], 3) for T in TOKENS},
                    "fixed_us": {n: round(p[0], 3) for n, p in parts.items()},
                    "per_token_ns": {n: round(p[1] * 1e3, 1) for n, p in parts.items()},
                }
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


def markdown(result):
    m = result["meta"]
    out = [
        "# What bounds the missed CPU targets",
        "",
        f"CPU: {m['cpu_model']} ({m['cpus']} CPUs), kernel **{m['kernel_variant']}**, "
        f"{m['threads']} thread(s), torch {m['torch']}, {m['date']}. {timing.simulated_note(m)} "
        f"Load average {m['loadavg_before']} before, {m['loadavg_after']} after.",
        "",
        "Each candidate timed at 1 and 64 tokens (medians of interleaved rounds); fixed = the "
        "cost per call, per token = the slope. `op` is the op with the missed target, `compared` "
        "what the target compares it with, `clone` the bytes floor (a clone of the same tensors).",
        "",
        "| case | dtype | ratio at 1 token | at 64 | target | candidate | µs at 1 | µs at 64 "
        "| fixed µs | per token ns |",
        "|---|---|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        first = True
        for n in r["fixed_us"]:
            lead = (
                f"| {r['case']} ({r['ratio_name']}) | {r['dtype']} | {r['ratio']['1']:.2f} | "
                f"{r['ratio']['64']:.2f} | {r['target']} "
                if first
                else "| | | | | "
            )
            out.append(
                f"{lead}| {n} | {r['us']['1'][n]:.2f} | {r['us']['64'][n]:.2f} | "
                f"{r['fixed_us'][n]:.2f} | {r['per_token_ns'][n]:.0f} |"
            )
            first = False
    return "\n".join(out) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--output", default=None, help="results name")
    args = parser.parse_args()
    meta = timing.start_run(args.threads)
    result = {"meta": meta, "rows": run(args.quick)}
    name = args.output or f"missed_targets_cpu_{meta['kernel_variant'].lower()}"
    timing.write_results(name, result, markdown)
    print(markdown(result))


if __name__ == "__main__":
    main()
