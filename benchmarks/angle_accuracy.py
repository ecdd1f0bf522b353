# SPDX-License-Identifier: BSD-3-Clause
"""How accurate each way of getting RoPE angles is, at positions 2^10 ... 2^31.

For Llama 3's frequencies (theta 500,000, rotary_dim 128: 64 planes) and 64 random positions in
each octave [2^e, 2^(e+1)), every method rotates the unit pairs (1, 0), whose rotated value is
(cos, sin) of the angle it used. The error is the largest |cos - cos*|, |sin - sin*| against
cos*/sin* of the exact product p * f (f the float64 frequency as stored), computed with mpmath at
200 bits. Methods:

  table-free fp32 / fp64  torch_rope.apply(x, freqs=..., positions=...): the op itself;
  fp64 / fp32 tables      the rows torch_rope.rope_tables builds (angle p * f rounded to float64,
                          then cos/sin in float64; fp32 tables round that once more), computed at
                          the sampled rows with the builder's formula (checked bit for bit against
                          real tables on the rows a table of 2^16 rows holds), then the op;
  HF eager fp32           transformers' default: float32 inv_freq, float32 positions, float32
                          product, torch's float32 cos/sin;
  fast-math fp32          the in-kernel peers: float(p) * float(f) and a float32 sincos (torch's
                          float32 sin/cos stand in for __sincosf, whose own error only adds).

Memory: the cos/sin tables of 1M and 10M positions against the frequencies alone.

    PYTHONPATH=python .venv/bin/python benchmarks/angle_accuracy.py

writes benchmarks/results/angle_accuracy.json and .md.
"""

import sys
from pathlib import Path

import mpmath
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import timing  # noqa: E402

import torch_rope  # noqa: E402

THETA, ROTARY_DIM = 500000.0, 128
PLANES = ROTARY_DIM // 2
OCTAVES = range(10, 32)
PER_OCTAVE = 64


def sampled_positions(seed=0):
    g = torch.Generator().manual_seed(seed)
    rows = []
    for e in OCTAVES:
        rows.append((1 << e) + torch.randint(0, 1 << e, (PER_OCTAVE,), generator=g))
    return torch.cat(rows)


def exact_cos_sin(positions, freqs):
    """cos/sin of p * f in mpmath (200 bits), as float64 (rounded once: error <= 2^-54)."""
    cos = torch.empty(len(positions), PLANES, dtype=torch.float64)
    sin = torch.empty_like(cos)
    with mpmath.workprec(200):
        fs = [mpmath.mpf(float(f)) for f in freqs]
        for i, p in enumerate(positions.tolist()):
            for k, f in enumerate(fs):
                angle = p * f
                cos[i, k] = float(mpmath.cos(angle))
                sin[i, k] = float(mpmath.sin(angle))
    return cos, sin


def rotate_unit_pairs(positions, dtype, **angles):
    """The op's (cos, sin) per (position, plane): the rotation of (1, 0) pairs (GPT-J layout)."""
    x = torch.zeros(len(positions), 1, ROTARY_DIM, dtype=dtype)
    x[..., 0::2] = 1
    out = torch_rope.apply(x, positions=positions.view(-1, 1), interleaved=True, **angles)
    return out[:, 0, 0::2].double(), out[:, 0, 1::2].double()


def table_rows(positions, freqs, dtype):
    """The rows rope_tables builds, at the given positions (the builder's float64 formula)."""
    angle = positions.double()[:, None] * freqs[None, :]
    return angle.cos().to(dtype), angle.sin().to(dtype)


def check_table_formula(freqs):
    """The emulated rows equal real tables on every row a 2^16-row table holds (bit for bit)."""
    rows = 1 << 16
    real = torch_rope.rope_tables(THETA, ROTARY_DIM, rows, dtype=torch.float64)
    emulated = table_rows(torch.arange(rows), freqs, torch.float64)
    mismatches = sum(int((a != b).sum()) for a, b in zip(real, emulated))
    return mismatches


def via_tables(positions, freqs, dtype):
    """The op given the rows: a small table holding exactly the sampled rows."""
    cos, sin = table_rows(positions, freqs, dtype)
    x = torch.zeros(len(positions), 1, ROTARY_DIM, dtype=dtype)  # the table's own precision
    x[..., 0::2] = 1
    row = torch.arange(len(positions)).view(-1, 1)
    out = torch_rope.apply(x, cos, sin, row, interleaved=True)
    return out[:, 0, 0::2].double(), out[:, 0, 1::2].double()


def hf_eager_fp32(positions):
    exponents = torch.arange(0, ROTARY_DIM, 2, dtype=torch.int64).float() / ROTARY_DIM
    inv_freq = 1.0 / (THETA**exponents)
    angle = positions.float()[:, None] @ inv_freq[None, :]
    return angle.cos().double(), angle.sin().double()


def fast_math_fp32(positions, freqs):
    angle = positions.float()[:, None] * freqs.float()[None, :]
    return angle.cos().double(), angle.sin().double()


def main():
    meta = timing.start_run(1)
    freqs, _ = torch_rope.rope_frequencies(THETA, ROTARY_DIM)
    mismatches = check_table_formula(freqs)
    positions = sampled_positions()
    cos_x, sin_x = exact_cos_sin(positions, freqs)
    methods = {
        "table-free fp32 (torch-rope)": rotate_unit_pairs(positions, torch.float32, freqs=freqs),
        "table-free fp64 (torch-rope)": rotate_unit_pairs(positions, torch.float64, freqs=freqs),
        "fp64 tables (torch-rope)": via_tables(positions, freqs, torch.float64),
        "fp32 tables (torch-rope)": via_tables(positions, freqs, torch.float32),
        "HF eager fp32": hf_eager_fp32(positions),
        "fast-math fp32 (in-kernel peers)": fast_math_fp32(positions, freqs),
    }
    octave_of = torch.repeat_interleave(torch.tensor(list(OCTAVES)), PER_OCTAVE)
    errors = {}
    for name, (c, s) in methods.items():
        err = torch.maximum((c - cos_x).abs(), (s - sin_x).abs()).amax(dim=1)
        errors[name] = {int(e): float(err[octave_of == e].max()) for e in OCTAVES}
    memory = {}
    for n in (1 << 20, 10 << 20):
        memory[n] = {
            "fp32 tables": 2 * n * PLANES * 4,
            "fp64 tables": 2 * n * PLANES * 8,
            "table-free": PLANES * 8,
        }
    result = {
        "meta": meta,
        "theta": THETA,
        "rotary_dim": ROTARY_DIM,
        "positions_per_octave": PER_OCTAVE,
        "table_formula_mismatches_on_2^16_rows": mismatches,
        "max_error_by_octave": errors,
        "memory_bytes": memory,
    }
    timing.write_results("angle_accuracy", result, markdown)
    print(markdown(result))


def markdown(result):
    shown = (10, 16, 20, 24, 28, 31)
    out = [
        "# Angle accuracy: max |cos - cos*|, |sin - sin*| of the angle p x f",
        "",
        f"theta {result['theta']:g}, rotary_dim {result['rotary_dim']}, "
        f"{result['positions_per_octave']} random positions per octave, the exact values from "
        "mpmath (200 bits). Written by `benchmarks/angle_accuracy.py`; the table rows' formula "
        f"matched real tables on {result['table_formula_mismatches_on_2^16_rows']} mismatching "
        "entries of 2^16 rows (0 means bit for bit).",
        "",
        "| method | " + " | ".join(f"p ~ 2^{e}" for e in shown) + " |",
        "|---|" + "---:|" * len(shown),
    ]
    for name, by_octave in result["max_error_by_octave"].items():
        out.append(f"| {name} | " + " | ".join(f"{by_octave[e]:.1e}" for e in shown) + " |")
    out += ["", "| memory | 1M positions | 10M positions |", "|---|---:|---:|"]
    m1, m10 = result["memory_bytes"][1 << 20], result["memory_bytes"][10 << 20]
    for key in ("fp32 tables", "fp64 tables", "table-free"):
        out.append(f"| {key} | {fmt_bytes(m1[key])} | {fmt_bytes(m10[key])} |")
    return "\n".join(out) + "\n"


def fmt_bytes(n):
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


if __name__ == "__main__":
    main()
