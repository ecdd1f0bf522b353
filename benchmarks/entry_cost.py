# SPDX-License-Identifier: BSD-3-Clause
"""What one call costs before any rotation happens: the Python and dispatcher layers of the entry.

Times, for a decode step (1, 32, 1, 128) float32 and a single row (1, 1, 1, 128), with
interleaved rounds (timing.py):

  clone                 x.clone(): aten's typed Python binding, an allocation and a 16 KiB copy
  aten boxed clone      torch.ops.aten.clone.default(x): the same op through the boxed path
  ops positional        torch.ops.rope.apply.default(x, cos, sin, pos)
  ops keywords          ... (..., interleaved=True, inverse=False)
  ops packet            torch.ops.rope.apply(x, cos, sin, pos): overload resolution first
  torch_rope.apply      the public wrapper as it is today
  module                torch_rope.RotaryPositionalEmbedding(...)(x, pos)
  typed probe           (--typed-probe) a pybind11 function that calls the C++ rope::apply, i.e.
                        what a typed eager fast path would cost; built with load_inline
  C++ floor             (--typed-probe) the probe's kernel on an empty tensor: binding + dispatch

--engines: the inference engines' call, rotary_embedding(positions, query, key, head_size,
cos_sin_cache, is_neox) (vLLM, SGLang) and FlashInfer's apply_rope_with_cos_sin_cache(_inplace),
through torch_rope.compat, against torch_rope.apply_qk on the same tensors (its cos and sin split
from the cache once, outside the timing; target: compat <= 1.2x apply_qk at every T) and a clone
of q and k and a copy of them into kept buffers (the floor without an allocation). q (T, 32 *
128), k (T, 8 * 128), a (4096, 128) float32 cache, random positions; bf16 and fp32, NeoX pairs; T
from 1 (decode, B = 1) to 1024. Writes
benchmarks/results/engines_entry_cpu_<kernel>_<N>t.json and .md (one thread by default, as
measured for the engines: torch.set_num_threads(1)).

    PYTHONPATH=python .venv/bin/python benchmarks/entry_cost.py [--typed-probe]
    PYTHONPATH=python .venv/bin/python benchmarks/entry_cost.py --engines [--threads 1]
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import timing  # noqa: E402

import torch_rope  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_PROBE_SOURCE = r"""
#include <torch/extension.h>
#include <torch_rope/ops.h>

at::Tensor apply_typed(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                       const at::Tensor& positions) {
  return rope::apply(x, cos, sin, positions);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("apply", &apply_typed); }
"""


def build_typed_probe():
    """A throw-away extension calling the C++ op API (a typed dispatcher call)."""
    from torch.utils.cpp_extension import load_inline

    package = os.path.dirname(torch_rope.__file__)
    libs = [f for f in os.listdir(package) if f.startswith("librope.so")]
    if not libs:
        raise RuntimeError(f"no librope.so in {package}: build the project first")
    return load_inline(
        name="rope_entry_probe",
        cpp_sources=[_PROBE_SOURCE],
        extra_include_paths=[os.path.join(REPO, "csrc", "include")],
        extra_ldflags=[f"-L{package}", f"-l:{sorted(libs)[0]}", f"-Wl,-rpath,{package}"],
        verbose=False,
    )


def measure_entry(typed_probe=None, rounds=31):
    """{shape: {candidate: {"s": ..., ...}}} for a decode step and a single row."""
    cos, sin = torch_rope.rope_tables(10000.0, 128, 4096)
    module = torch_rope.RotaryPositionalEmbedding(10000.0, 128, 4096)
    results = {}
    with torch.inference_mode():
        for shape in [(1, 32, 1, 128), (1, 1, 1, 128)]:
            x = torch.randn(shape)
            pos = torch.tensor([[[7]]])
            fns = {
                "clone": lambda: x.clone(),
                "aten boxed clone": lambda: torch.ops.aten.clone.default(x),
                "ops positional": lambda: torch.ops.rope.apply.default(x, cos, sin, pos),
                "ops keywords": lambda: torch.ops.rope.apply.default(
                    x, cos, sin, pos, interleaved=True, inverse=False
                ),
                "ops packet": lambda: torch.ops.rope.apply(x, cos, sin, pos),
                "torch_rope.apply": lambda: torch_rope.apply(x, cos, sin, pos),
                "module": lambda: module(x, pos),
            }
            if typed_probe is not None:
                empty = x[:, :, :0]
                fns["typed probe"] = lambda: typed_probe.apply(x, cos, sin, pos)
                fns["C++ floor"] = lambda: typed_probe.apply(empty, cos, sin, pos)
            results["x".join(map(str, shape))] = timing.measure(fns, rounds=rounds)
    return results


ENGINE_TOKENS = (1, 4, 16, 64, 256, 1024)
ENGINE_TARGET = 1.2  # compat call / apply_qk


def measure_engines(tokens=ENGINE_TOKENS, rounds=21):
    """[row]: per (T, dtype), the compat calls, apply_qk, a clone of q and k and a copy of them
    into kept buffers."""
    from torch_rope import compat

    cos, sin = torch_rope.rope_tables(10000.0, 128, 4096)
    cache = torch.cat([cos, sin], dim=-1)  # (4096, 128): cos in the first half, sin the second
    cos, sin = cache[:, :64], cache[:, 64:]  # split once, outside the timing
    rows = []
    with torch.inference_mode():
        for dtype in (torch.bfloat16, torch.float32):
            for T in tokens:
                g = torch.Generator().manual_seed(T)
                q = torch.randn(T, 32 * 128, generator=g).to(dtype)
                k = torch.randn(T, 8 * 128, generator=g).to(dtype)
                pos = torch.randint(0, 4096, (T,), generator=g)
                q3, k3, pos1 = q.view(T, 32, 128), k.view(T, 8, 128), pos.unsqueeze(-1)
                q_kept, k_kept = torch.empty_like(q), torch.empty_like(k)
                fns = {
                    "clone q, k": lambda: (q.clone(), k.clone()),
                    # The floor without an allocation: a copy into buffers kept across calls.
                    "copy_ q, k": lambda: (q_kept.copy_(q), k_kept.copy_(k)),
                    "apply_qk": lambda: torch_rope.apply_qk(
                        q3, k3, cos, sin, pos1, interleaved=False
                    ),
                    # In place: every call rotates q and k again (a rotation keeps their norms).
                    "rotary_embedding": lambda: compat.rotary_embedding(
                        pos, q, k, 128, cache, True
                    ),
                    "FlashInfer inplace": lambda: compat.apply_rope_with_cos_sin_cache_inplace(
                        pos, q, k, 128, cache, True
                    ),
                    "FlashInfer": lambda: compat.apply_rope_with_cos_sin_cache(
                        pos, q, k, 128, cache, True
                    ),
                }
                res = timing.measure(fns, rounds=rounds)
                base = res["apply_qk"]["s"]
                rows.append(
                    {
                        "T": T,
                        "dtype": str(dtype).replace("torch.", ""),
                        "us": {n: r["s"] * 1e6 for n, r in res.items()},
                        "over_apply_qk": {n: r["s"] / base for n, r in res.items()},
                        "spread": {n: r["spread"] for n, r in res.items()},
                    }
                )
                print(
                    f"T={T:5d} {rows[-1]['dtype']:9s} "
                    + "  ".join(f"{n} {r['s'] * 1e6:.1f} us" for n, r in res.items())
                )
    return rows


def engines_markdown(result):
    m = result["meta"]
    cpu = m["lscpu"]
    names = list(result["rows"][0]["us"])
    out = [
        "# The inference engines' call through torch_rope.compat",
        "",
        f"CPU: {cpu.get('Model name', m['cpu_model'])} ({cpu.get('Vendor ID', '?')}, family "
        f"{cpu.get('CPU family', '?')}, model {cpu.get('Model', '?')}; "
        f"{', '.join(cpu.get('isa', []))}), kernel **{m['kernel_variant']}**, {m['threads']} "
        f"thread(s), torch {m['torch']}, {m['date']}. Load average {m['loadavg_before']} "
        f"before, {m['loadavg_after']} after.",
        "",
        "q (T, 32 * 128), k (T, 8 * 128), cos_sin_cache (4096, 128) float32, NeoX pairs, under "
        "inference_mode. Each call's time and its ratio to `torch_rope.apply_qk` on the same "
        f"tensors (target for the compat calls: <= {ENGINE_TARGET}).",
        "",
        "| T | dtype | " + " | ".join(names) + " |",
        "|---:|---|" + "---:|" * len(names),
    ]
    for r in result["rows"]:
        cells = [f"{r['us'][n]:.1f} us ({r['over_apply_qk'][n]:.2f}x)" for n in names]
        out.append(f"| {r['T']} | {r['dtype']} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--typed-probe",
        action="store_true",
        help="also build and time a typed pybind11 call of rope::apply",
    )
    parser.add_argument(
        "--engines", action="store_true", help="time the engines' compat calls (writes results)"
    )
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--output", default=None, help="results name (--engines)")
    args = parser.parse_args()
    if args.engines:
        threads = 1 if args.threads is None else args.threads
        meta = timing.start_run(threads, grad=False, recompile_limit=64)
        rows = measure_engines()
        name = args.output or (
            f"engines_entry_cpu_{meta['kernel_variant'].lower()}_{meta['threads']}t"
        )
        timing.write_results(name, {"meta": meta, "rows": rows}, engines_markdown)
        return
    torch.set_num_threads(2 if args.threads is None else args.threads)
    probe = build_typed_probe() if args.typed_probe else None
    for shape, res in measure_entry(probe).items():
        clone = res["clone"]["s"]
        print(
            f"\nx = {shape} float32, {torch.get_num_threads()} threads, "
            f"kernel {torch_rope._C.cpu_kernel_variant()}"
        )
        for name, r in res.items():
            print(
                f"  {name:18s} {r['s'] * 1e6:7.2f} us   {r['s'] / clone:5.2f}x clone   "
                f"(spread {r['spread']:.0%})"
            )


if __name__ == "__main__":
    main()
