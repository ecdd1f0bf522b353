# SPDX-License-Identifier: BSD-3-Clause
"""CPU benchmark of every fused op: rope.rms_norm_apply_qk, rope.apply_qk_cache (into a bf16
cache, into a float8 cache, and with multi-axis positions), rope.apply_qk_fp8 (static and dynamic
scales), rope.rms_norm_apply_qk_cache and rope.mla_apply_cache, each against its bytes floor and
against the unfused sequence of our own ops and torch.

Shapes: decode (T = 1, 16 and 64 tokens) and a prefill chunk (T = 2048), GQA q (T, 32, 128) and
k, v (T, 8, 128) in bf16; MLA (DeepSeek-V3) q_pe (T, 16, 64), k_pe (T, 64), kv_c (T, 512) into one
paged (num_blocks, 16, 576) cache. Every figure is a ratio of medians from one run with
interleaved rounds (timing.py):

  fused / floor      against a clone of as many bytes as the op reads and writes (a clone reads
                     and writes n bytes: the op's read + written bytes over 2); target <= 1.15 on
                     prefill;
  fused / unfused    against the same result from our unfused ops and torch (apply_qk then torch's
                     fp8 cast, or its per-row amax, division and cast for dynamic scales;
                     rms_norm_apply_qk then index_copy_ of k and v; apply_qk of q_pe and k_pe
                     then index_copy_ of [kv_c | k_pe] rows; F.rms_norm of q and k then
                     apply_qk; apply_qk then index_copy_ (after torch's fp8 cast for a float8
                     cache)), eager and under torch.compile (fullgraph); target < 1 at every T;
  fused / apply_qk   rms_norm_apply_qk against apply_qk alone of the same q and k: target <= 1.15.

    PYTHONPATH=python .venv/bin/python benchmarks/bench_serving_fusions.py [--threads N]
        [--no-compile] [--quick] [--ops a,b] [--tokens 1,16,64,2048]

writes benchmarks/results/serving_fusions_cpu_<kernel>_<N>t.json and .md.
"""

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import timing  # noqa: E402
import torch  # noqa: E402

import torch_rope  # noqa: E402

HQ, HKV, D = 32, 8, 128
MLA_H, MLA_R, MLA_L = 16, 64, 512
BLOCK_SIZE, NUM_BLOCKS = 16, 256  # 4096 slots
MAX_SEQ_LEN = 8192
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
TOKENS = (1, 16, 64, 2048)


def shape_name(T):
    return f"prefill T={T}" if T >= 1024 else f"decode T={T}"


def fp8(x, scale):
    """torch's own quantization, the rule the fused ops hold to."""
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def nbytes(*tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


# ---- the ops: (arguments, fused, unfused, bytes read + written[, other comparisons]) ----------


def qk_args(T, g):
    """bf16 GQA q (T, HQ, D) and k (T, HKV, D), float32 tables, one position per token."""
    q = torch.randn(T, HQ, D, generator=g).bfloat16()
    k = torch.randn(T, HKV, D, generator=g).bfloat16()
    cos, sin = torch_rope.rope_tables(10000.0, D, MAX_SEQ_LEN)
    pos = torch.randint(0, MAX_SEQ_LEN, (T, 1), generator=g)
    return q, k, cos, sin, pos


def qk_fp8_case(T, g):
    args = qk_args(T, g)
    q, k = args[:2]

    def fused(q, k, cos, sin, pos):
        return torch_rope.apply_qk_fp8(q, k, cos, sin, pos, q_scale=0.05, k_scale=0.1)[:2]

    def unfused(q, k, cos, sin, pos):
        q_rot, k_rot = torch_rope.apply_qk(q, k, cos, sin, pos)
        return fp8(q_rot, 0.05), fp8(k_rot, 0.1)

    moved = nbytes(q, k) + (q.numel() + k.numel())  # bf16 in, fp8 out
    return args, fused, unfused, moved


def per_row_fp8(x):
    """torch's dynamic per-row quantization of x: one float32 scale per (token, head) row."""
    x = x.float()
    scale = x.abs().amax(dim=-1, keepdim=True) / FP8_MAX
    return (x / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def qk_fp8_dynamic_case(T, g):
    args = qk_args(T, g)
    q, k = args[:2]

    def fused(q, k, cos, sin, pos):
        return torch_rope.apply_qk_fp8_dynamic(q, k, cos, sin, pos)

    def unfused(q, k, cos, sin, pos):
        q_rot, k_rot = torch_rope.apply_qk(q, k, cos, sin, pos)
        return (*per_row_fp8(q_rot), *per_row_fp8(k_rot))

    rows = T * (HQ + HKV)
    moved = nbytes(q, k) + (q.numel() + k.numel()) + 4 * rows  # bf16 in, fp8 and scales out
    return args, fused, unfused, moved


def norm_cache_case(T, g):
    q = torch.randn(T, HQ, D, generator=g).bfloat16()
    k = torch.randn(T, HKV, D, generator=g).bfloat16()
    v = torch.randn(T, HKV, D, generator=g).bfloat16()
    qw = (torch.rand(D, generator=g) + 0.5).bfloat16()
    kw = (torch.rand(D, generator=g) + 0.5).bfloat16()
    cos, sin = torch_rope.rope_tables(10000.0, D, MAX_SEQ_LEN)
    pos = torch.randint(0, MAX_SEQ_LEN, (T, 1), generator=g)
    k_cache = torch.zeros(NUM_BLOCKS, BLOCK_SIZE, HKV, D, dtype=torch.bfloat16)
    v_cache = torch.zeros_like(k_cache)
    slots = torch.randperm(NUM_BLOCKS * BLOCK_SIZE, generator=g)[:T]
    args = (q, k, v, qw, kw, cos, sin, pos, k_cache, v_cache, slots)

    def fused(q, k, v, qw, kw, cos, sin, pos, k_cache, v_cache, slots):
        return torch_rope.rms_norm_apply_qk_cache(
            q, k, v, qw, kw, cos, sin, pos, k_cache, v_cache, slots
        )

    def unfused(q, k, v, qw, kw, cos, sin, pos, k_cache, v_cache, slots):
        q_out, k_out = torch_rope.rms_norm_apply_qk(q, k, qw, kw, cos, sin, pos)
        k_cache.view(-1, HKV, D).index_copy_(0, slots, k_out)
        v_cache.view(-1, HKV, D).index_copy_(0, slots, v)
        return q_out

    moved = 2 * nbytes(q, k, v)  # read once, written once (q_out, the k and v rows)
    return args, fused, unfused, moved


def mla_case(T, g):
    q_pe = torch.randn(T, MLA_H, MLA_R, generator=g).bfloat16()
    k_pe = torch.randn(T, MLA_R, generator=g).bfloat16()
    kv_c = torch.randn(T, MLA_L, generator=g).bfloat16()
    cos, sin = torch_rope.rope_tables(10000.0, MLA_R, MAX_SEQ_LEN)
    pos = torch.randint(0, MAX_SEQ_LEN, (T, 1), generator=g)
    cache = torch.zeros(NUM_BLOCKS, BLOCK_SIZE, MLA_L + MLA_R, dtype=torch.bfloat16)
    slots = torch.randperm(NUM_BLOCKS * BLOCK_SIZE, generator=g)[:T]
    args = (q_pe, k_pe, kv_c, cos, sin, pos, cache, slots)

    def fused(q_pe, k_pe, kv_c, cos, sin, pos, cache, slots):
        return torch_rope.mla_apply_cache(q_pe, k_pe, kv_c, cos, sin, pos, cache, None, slots)[0]

    def unfused(q_pe, k_pe, kv_c, cos, sin, pos, cache, slots):
        q_rot, k_rot = torch_rope.apply_qk(q_pe, k_pe.unsqueeze(1), cos, sin, pos)
        rows = torch.cat([kv_c, k_rot.squeeze(1)], dim=-1)
        cache.view(-1, MLA_L + MLA_R).index_copy_(0, slots, rows)
        return q_rot

    moved = 2 * nbytes(q_pe, k_pe, kv_c)
    return args, fused, unfused, moved


def norm_weights(g):
    return (torch.rand(D, generator=g) + 0.5).bfloat16(), (
        torch.rand(D, generator=g) + 0.5
    ).bfloat16()


def rms_norm_qk_case(T, g):
    q, k, cos, sin, pos = qk_args(T, g)
    qw, kw = norm_weights(g)
    args = (q, k, qw, kw, cos, sin, pos)

    def fused(q, k, qw, kw, cos, sin, pos):
        return torch_rope.rms_norm_apply_qk(q, k, qw, kw, cos, sin, pos)

    def unfused(q, k, qw, kw, cos, sin, pos):
        q_n = torch.nn.functional.rms_norm(q, (D,), qw, eps=1e-6)
        k_n = torch.nn.functional.rms_norm(k, (D,), kw, eps=1e-6)
        return torch_rope.apply_qk(q_n, k_n, cos, sin, pos)

    def rotation_alone(q, k, qw, kw, cos, sin, pos):
        return torch_rope.apply_qk(q, k, cos, sin, pos)

    moved = 2 * nbytes(q, k)
    return args, fused, unfused, moved, {"apply_qk": rotation_alone}


def cache_args(T, g, cache_dtype, mrope=False):
    q, k, cos, sin, pos = qk_args(T, g)
    v = torch.randn(T, HKV, D, generator=g).bfloat16()
    if mrope:  # three axes (time, height, width) per token, as Qwen2-VL's M-RoPE
        pos = torch.randint(0, MAX_SEQ_LEN, (T, 1, 3), generator=g)
    k_cache = torch.zeros(NUM_BLOCKS, BLOCK_SIZE, HKV, D, dtype=cache_dtype)
    v_cache = torch.zeros_like(k_cache)
    slots = torch.randperm(NUM_BLOCKS * BLOCK_SIZE, generator=g)[:T]
    return (q, k, v, cos, sin, pos, k_cache, v_cache, slots)


def apply_qk_cache_case(T, g, cache_dtype=torch.bfloat16, mrope=False):
    args = cache_args(T, g, cache_dtype, mrope)
    q, k, v = args[:3]
    scales = {"k_scale": 0.1, "v_scale": 0.2} if cache_dtype == FP8 else {}
    rope = {"interleaved": False, "mrope_section": [16, 24, 24]} if mrope else {}

    def fused(q, k, v, cos, sin, pos, k_cache, v_cache, slots):
        return torch_rope.apply_qk_cache(
            q, k, v, cos, sin, pos, k_cache, v_cache, slots, **scales, **rope
        )

    def unfused(q, k, v, cos, sin, pos, k_cache, v_cache, slots):
        q_rot, k_rot = torch_rope.apply_qk(q, k, cos, sin, pos, **rope)
        if scales:  # torch's CPU index_copy_ takes no float8: the same bytes as uint8
            k_rot = fp8(k_rot, scales["k_scale"]).view(torch.uint8)
            v = fp8(v, scales["v_scale"]).view(torch.uint8)
            k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
        k_cache.view(-1, HKV, D).index_copy_(0, slots, k_rot)
        v_cache.view(-1, HKV, D).index_copy_(0, slots, v)
        return q_rot

    cache_bytes = (k.numel() + v.numel()) * args[6].element_size()
    moved = nbytes(q, k, v) + nbytes(q) + cache_bytes
    return args, fused, unfused, moved


OPS = {
    "rms_norm_apply_qk": rms_norm_qk_case,
    "apply_qk_cache": apply_qk_cache_case,
    "apply_qk_cache_fp8": lambda T, g: apply_qk_cache_case(T, g, FP8),
    "apply_qk_cache_mrope": lambda T, g: apply_qk_cache_case(T, g, mrope=True),
    "apply_qk_fp8": qk_fp8_case,
    "apply_qk_fp8_dynamic": qk_fp8_dynamic_case,
    "rms_norm_apply_qk_cache": norm_cache_case,
    "mla_apply_cache": mla_case,
}


def run_case(op, T, compile_too, quick):
    args, fused, unfused, moved, *others = OPS[op](T, torch.Generator().manual_seed(T))
    others = others[0] if others else {}
    floor_src = torch.ones((moved + 1) // 2, dtype=torch.uint8)
    floor_dst = torch.empty_like(floor_src)
    candidates = {
        "floor": floor_src.clone,
        # The same bytes into an existing buffer: no allocation, no first-touch page faults.
        "copy_": lambda: floor_dst.copy_(floor_src),
        "fused": lambda: fused(*args),
        "unfused": lambda: unfused(*args),
    }
    for name, fn in others.items():
        candidates[name] = lambda fn=fn: fn(*args)
    if compile_too:
        torch._dynamo.reset()
        unfused_c = torch.compile(unfused, fullgraph=True, dynamic=False)
        fused_c = torch.compile(fused, fullgraph=True, dynamic=False)
        candidates["unfused compiled"] = lambda: unfused_c(*args)
        candidates["fused compiled"] = lambda: fused_c(*args)
    rounds = 9 if quick else (15 if T >= 2048 else 31)
    res = timing.measure(candidates, rounds=rounds)
    s = {n: r["s"] for n, r in res.items()}
    ratios = {
        "fused / floor": s["fused"] / s["floor"],
        "fused / copy_": s["fused"] / s["copy_"],
        "fused / unfused": s["fused"] / s["unfused"],
    }
    for name in others:
        ratios[f"fused / {name}"] = s["fused"] / s[name]
    if compile_too:
        ratios["fused / unfused compiled"] = s["fused"] / s["unfused compiled"]
        ratios["fused compiled / unfused compiled"] = s["fused compiled"] / s["unfused compiled"]
    print(
        f"  {op:24s} {shape_name(T):15s} "
        + "  ".join(f"{n} {v:.2f}" for n, v in ratios.items())
        + f"  (fused {s['fused'] * 1e6:.1f} us, floor {s['floor'] * 1e6:.1f} us)",
        flush=True,
    )
    return {
        "op": op,
        "shape": shape_name(T),
        "tokens": T,
        "bytes_moved": moved,
        "us": {n: v * 1e6 for n, v in s.items()},
        "spread": {n: r["spread"] for n, r in res.items()},
        "ratios": ratios,
    }


def markdown(result):
    m = result["meta"]
    names = []
    for r in result["rows"]:
        names += [n for n in r["ratios"] if n not in names]
    out = [
        "# The fused ops on the CPU",
        "",
        f"CPU: {m['cpu_model']} ({m['cpus']} CPUs), kernel **{m['kernel_variant']}**, "
        f"{m['threads']} thread(s), torch {m['torch']}, {m['date']}. Load average "
        f"{m['loadavg_before']} before, {m['loadavg_after']} after. bf16 inputs; GQA q (T, {HQ}, "
        f"{D}), k and v (T, {HKV}, {D}), paged ({NUM_BLOCKS}, {BLOCK_SIZE}, ...) caches; MLA "
        f"q_pe (T, {MLA_H}, {MLA_R}), k_pe (T, {MLA_R}), kv_c (T, {MLA_L}). floor: a clone of "
        "(bytes read + written) / 2 bytes; copy_: the same bytes copied into an existing buffer. "
        "Targets: fused / floor <= 1.15 on prefill, fused / unfused < 1 at every T, "
        "rms_norm_apply_qk / apply_qk <= 1.15.",
        "",
        "| op | shape | fused (us) | floor (us) | " + " | ".join(names) + " |",
        "|---|---|---:|---:|" + "---:|" * len(names),
    ]
    for r in result["rows"]:
        cells = [f"{r['ratios'][n]:.2f}" if n in r["ratios"] else "" for n in names]
        out.append(
            f"| {r['op']} | {r['shape']} | {r['us']['fused']:.1f} | {r['us']['floor']:.1f} | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(out) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--ops", default=",".join(OPS), help="comma-separated ops")
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)), help="token counts")
    parser.add_argument("--output", default=None, help="results name")
    args = parser.parse_args()
    meta = timing.start_run(args.threads, grad=False, recompile_limit=64)
    rows = []
    for op in args.ops.split(","):
        for T in map(int, args.tokens.split(",")):
            rows.append(run_case(op, T, not args.no_compile, args.quick))
    name = args.output or (
        f"serving_fusions_cpu_{meta['kernel_variant'].lower()}_{meta['threads']}t"
    )
    timing.write_results(name, {"meta": meta, "rows": rows}, markdown)


if __name__ == "__main__":
    main()
