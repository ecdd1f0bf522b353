# SPDX-License-Identifier: BSD-3-Clause
"""CPU benchmark of the argument forms (table-free and packed sequences), each against the
tables/positions form of the same op in the same run (interleaved rounds, timing.py):

Table-free (``freqs=``; targets: prefill <= 1.15x, decode <= 1.25x the table path):
  apply_qk of q (T, 32, 128) and k (T, 8, 128), T = 4096 (prefill, positions 0..T-1) and decode
  B = 1 and B = 64 (one token per sequence, positions near 2^20). Candidates: the table path
  (fp32 tables of 1M rows), the table-free path, a clone of q and k (the bytes floor), and
  ``torch.compile`` of the eager formula that computes its angles itself
  (``positions.float() * inv_freq``, cos/sin, rotate_half).

Packed sequences (``cu_seqlens=``; target: <= 1.05x the op given positions):
  apply of x (T, 8, 64) for 1024 sequences x 64 tokens, 128 x 512 and 1 x 65,536, forward and
  forward + backward, against the same op given the positions tensor the packing implies (built
  once, outside the timed region, as a caller who materialises positions would).

    PYTHONPATH=python .venv/bin/python benchmarks/bench_forms.py [--threads N] [--quick]

writes benchmarks/results/forms_cpu_<kernel>.json and .md.
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
THETA = 500000.0
TABLE_ROWS = 1 << 20
DECODE_POSITION = (1 << 20) - 4096
PACKINGS = {"1024 x 64": (1024, 64), "128 x 512": (128, 512), "1 x 65536": (1, 65536)}
PACKED_HEADS, PACKED_D = 8, 64


def eager_angle_formula(q, k, positions, inv_freq):
    """HF's eager RoPE computing its angles itself (fp32 angles, rotate_half pairs)."""
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]

    def rotate_half(x):
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)

    qf, kf = q.float(), k.float()
    return (
        (qf * cos + rotate_half(qf) * sin).to(q.dtype),
        (kf * cos + rotate_half(kf) * sin).to(k.dtype),
    )


def table_free_case(name, T, first_position, dtype, tables, freqs, compile_too, rounds):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(T, HQ, D, generator=g).to(dtype)
    k = torch.randn(T, HKV, D, generator=g).to(dtype)
    positions = torch.arange(first_position, first_position + T)
    if T <= 64:  # decode: one token per sequence, each at its own position
        positions = first_position + torch.randint(0, 4096, (T,), generator=g)
    p = positions.view(T, 1)
    cos, sin = tables
    want = torch_rope.apply_qk(q, k, cos, sin, p, interleaved=False)
    got = torch_rope.apply_qk(q, k, freqs=freqs, positions=p, interleaved=False)
    max_diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(want, got))
    candidates = {
        "clone": lambda: (q.clone(), k.clone()),
        "tables": lambda: torch_rope.apply_qk(q, k, cos, sin, p, interleaved=False),
        "table-free": lambda: torch_rope.apply_qk(
            q, k, freqs=freqs, positions=p, interleaved=False
        ),
    }
    if compile_too:
        torch._dynamo.reset()
        inv_freq = freqs.float()
        compiled = torch.compile(eager_angle_formula, fullgraph=True, dynamic=False)
        candidates["compiled eager formula"] = lambda: compiled(q, k, positions, inv_freq)
    res = timing.measure(candidates, rounds=rounds)
    s = {n: r["s"] for n, r in res.items()}
    ratios = {
        "table-free / tables": s["table-free"] / s["tables"],
        "table-free / clone": s["table-free"] / s["clone"],
        "tables / clone": s["tables"] / s["clone"],
    }
    if compile_too:
        ratios["table-free / compiled"] = s["table-free"] / s["compiled eager formula"]
    row = {
        "case": name,
        "tokens": T,
        "dtype": str(dtype).replace("torch.", ""),
        "max_abs_diff_vs_tables": max_diff,
        "us": {n: v * 1e6 for n, v in s.items()},
        "spread": {n: r["spread"] for n, r in res.items()},
        "ratios": ratios,
    }
    print(f"  {name:14s} {row['dtype']:8s} " + "  ".join(f"{n} {v:.2f}" for n, v in ratios.items()),
          flush=True)  # fmt: skip
    return row


def packed_positions(cu):
    lengths = (cu[1:] - cu[:-1]).tolist()
    return torch.cat([torch.arange(n) for n in lengths])


def packed_case(name, num_seqs, seq_len, dtype, tables, rounds):
    T = num_seqs * seq_len
    g = torch.Generator().manual_seed(1)
    x = torch.randn(T, PACKED_HEADS, PACKED_D, generator=g).to(dtype)
    cu = torch.arange(0, T + 1, seq_len, dtype=torch.int32)
    positions = packed_positions(cu).view(T, 1)
    cos, sin = tables
    assert torch.equal(
        torch_rope.apply(x, cos, sin, cu_seqlens=cu), torch_rope.apply(x, cos, sin, positions)
    )
    xg = x.clone().requires_grad_(True)
    grad = torch.randn(x.shape, generator=g).to(dtype)

    def backward(**form):
        y = torch_rope.apply(xg, cos, sin, **form)
        (gx,) = torch.autograd.grad(y, xg, grad)
        return gx

    candidates = {
        "clone": lambda: x.clone(),
        "positions fwd": lambda: torch_rope.apply(x, cos, sin, positions),
        "cu_seqlens fwd": lambda: torch_rope.apply(x, cos, sin, cu_seqlens=cu),
        "positions fwd+bwd": lambda: backward(positions=positions),
        "cu_seqlens fwd+bwd": lambda: backward(cu_seqlens=cu),
    }
    with torch.enable_grad():
        res = timing.measure(candidates, rounds=rounds)
    s = {n: r["s"] for n, r in res.items()}
    ratios = {
        "fwd: cu_seqlens / positions": s["cu_seqlens fwd"] / s["positions fwd"],
        "fwd+bwd: cu_seqlens / positions": s["cu_seqlens fwd+bwd"] / s["positions fwd+bwd"],
        "fwd: cu_seqlens / clone": s["cu_seqlens fwd"] / s["clone"],
    }
    row = {
        "case": name,
        "tokens": T,
        "dtype": str(dtype).replace("torch.", ""),
        "us": {n: v * 1e6 for n, v in s.items()},
        "spread": {n: r["spread"] for n, r in res.items()},
        "ratios": ratios,
    }
    print(f"  {name:14s} {row['dtype']:8s} " + "  ".join(f"{n} {v:.2f}" for n, v in ratios.items()),
          flush=True)  # fmt: skip
    return row


def markdown_table(rows, title):
    names = list(rows[0]["ratios"])
    out = [f"## {title}", "", "| case | dtype | " + " | ".join(names) + " | µs per call |",
           "|---|---|" + "---:|" * len(names) + "---|"]  # fmt: skip
    for r in rows:
        cells = [f"{r['ratios'][n]:.2f}" for n in names]
        us = ", ".join(f"{n} {v:.1f}" for n, v in r["us"].items())
        out.append(f"| {r['case']} | {r['dtype']} | " + " | ".join(cells) + f" | {us} |")
    return out


def markdown(result):
    m = result["meta"]
    out = [
        "# Table-free angles and packed sequences on the CPU",
        "",
        f"CPU: {m['cpu_model']} ({m['cpus']} CPUs), kernel **{m['kernel_variant']}**"
        f"{' (simulated)' if m.get('simulated') else ''}, {m['threads']} threads, torch "
        f"{m['torch']}, {m['date']}, {m['rounds']} interleaved rounds, medians. Load average "
        f"{m['loadavg_before']} before, {m['loadavg_after']} after. Written by "
        "`benchmarks/bench_forms.py`.",
        "",
        "Targets: table-free / tables <= 1.15 (prefill) and <= 1.25 (decode); packed "
        "cu_seqlens / positions <= 1.05.",
        "",
    ]
    out += markdown_table(result["table_free"], "Table-free apply_qk (q 32 heads, k 8, D 128)")
    out += [""]
    out += markdown_table(result["packed"], "Packed sequences, apply of x (T, 8, 64)")
    return "\n".join(out) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--output", default=None, help="results name")
    args = parser.parse_args()
    rounds = 5 if args.quick else 11
    meta = timing.start_run(args.threads, grad=False, rounds=rounds)
    tables = torch_rope.rope_tables(THETA, D, TABLE_ROWS)
    freqs, attention_factor = torch_rope.rope_frequencies(THETA, D)
    assert attention_factor == 1.0
    table_free = []
    for dtype in (torch.float32, torch.bfloat16):
        for name, T, first in (("prefill T=4096", 4096, 0), ("decode B=1", 1, DECODE_POSITION),
                               ("decode B=64", 64, DECODE_POSITION)):  # fmt: skip
            table_free.append(table_free_case(name, T, first, dtype, tables, freqs,
                                              not args.no_compile, rounds))  # fmt: skip
    packed_tables = torch_rope.rope_tables(10000.0, PACKED_D, 65536)
    packed = []
    for dtype in (torch.float32, torch.bfloat16):
        for name, (n, length) in PACKINGS.items():
            packed.append(packed_case(name, n, length, dtype, packed_tables, rounds))
    result = {"meta": meta, "table_free": table_free, "packed": packed}
    name = args.output or f"forms_cpu_{meta['kernel_variant'].lower()}"
    timing.write_results(name, result, markdown)


if __name__ == "__main__":
    main()
