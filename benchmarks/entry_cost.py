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

    PYTHONPATH=python .venv/bin/python benchmarks/entry_cost.py [--typed-probe]
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--typed-probe",
        action="store_true",
        help="also build and time a typed pybind11 call of rope::apply",
    )
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
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
