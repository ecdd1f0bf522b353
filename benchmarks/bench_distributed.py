# SPDX-License-Identifier: BSD-3-Clause
"""Per-call overhead of DTensor arguments (torch.distributed, gloo, CPU), as ratios within one run.

For rope::apply on a DTensor against the same call on the rank's local shard, with aten::add as
DTensor's own per-op cost on the same machine and run; then the module on a sequence-sharded
DTensor x with default positions, with the module's cached wrapping of its tables and positions
(torch_rope/distributed/dtensor_args.py, FAST_WRAP) and with the public DTensor.from_local path.

    PYTHONPATH=python .venv/bin/python benchmarks/bench_distributed.py [--world-size 2]

Writes benchmarks/results/distributed_cpu.{json,md}. Timing: benchmarks/timing.py (interleaved
rounds, medians); every rank runs the same calls, none of which communicates.
"""

import argparse
import json
import os
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import timing  # noqa: E402


def measure(mesh):
    import torch.distributed.tensor as d

    import torch_rope
    from torch_rope.distributed import dtensor_args as _dtensor_args

    torch_rope.distributed.register_sharding_rules()  # raw torch.ops calls: register explicitly
    rank, world = mesh.get_local_rank(), mesh.size()
    cos, sin = torch_rope.rope_tables(10000.0, 64, 1024)
    R, S0, S1, S2 = d.Replicate(), d.Shard(0), d.Shard(1), d.Shard(2)
    rows = []
    # (x shape, x placement, positions placement): sequence-sharded x with replicated positions
    # makes DTensor slice the positions on every call (a redistribution); pre-sharded ones not.
    for shape, placement, pos_placement in [
        ((1, 8, 1, 64), S1, R),
        ((1, 8, 128, 64), S1, R),
        ((1, 8, 128, 64), S2, R),
        ((1, 8, 128, 64), S2, S0),
        ((4, 8, 512, 64), S1, R),
    ]:
        pos = torch.arange(shape[2])
        xd = d.distribute_tensor(torch.randn(shape), mesh, [placement])
        cd, sd = (d.distribute_tensor(t, mesh, [R]) for t in (cos, sin))
        pd = d.distribute_tensor(pos, mesh, [pos_placement])
        local = xd.to_local()
        local_pos = pos.chunk(world)[rank] if placement.dim == 2 else pos
        with torch.no_grad():
            r = timing.measure(
                {
                    "rope local": lambda: torch.ops.rope.apply(local, cos, sin, local_pos),
                    "rope DTensor": lambda: torch.ops.rope.apply(xd, cd, sd, pd),
                    "add local": lambda: torch.add(local, local),
                    "add DTensor": lambda: torch.add(xd, xd),
                },
                rounds=15,
            )
        rows.append(
            {
                "case": f"x{list(shape)} {placement}, positions {pos_placement}",
                "us": {k: v["s"] * 1e6 for k, v in r.items()},
            }
        )
    # The module with a sequence-sharded DTensor x and default positions (it pre-slices them),
    # with the cached wrapping and with the public from_local path.
    rope = torch_rope.RotaryPositionalEmbedding(10000.0, 64, 1024)
    xd = d.distribute_tensor(torch.randn(1, 8, 128, 64), mesh, [S2])
    local = xd.to_local()
    local_pos = torch.arange(128).chunk(world)[rank]
    fast = _dtensor_args.FAST_WRAP

    def module_call(fast_wrap):
        def call():
            _dtensor_args.FAST_WRAP = fast_wrap
            rope(xd)

        return call

    with torch.no_grad():
        r = timing.measure(
            {
                "module local": lambda: rope(local, local_pos),
                "module DTensor, cached wrap": module_call(True),
                "module DTensor, from_local": module_call(False),
            },
            rounds=15,
        )
    _dtensor_args.FAST_WRAP = fast
    rows.append(
        {
            "case": "module, x[1, 8, 128, 64] Shard(2), default positions",
            "us": {k: v["s"] * 1e6 for k, v in r.items()},
        }
    )
    return rows


def run_rank(rank, world_size, store, out):
    torch.set_num_threads(1)  # the ranks share the machine's cores
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=300),
    )
    from torch.distributed.device_mesh import init_device_mesh

    rows = measure(init_device_mesh("cpu", (world_size,)))
    if rank == 0:
        Path(out).write_text(json.dumps(rows))
    dist.destroy_process_group()


def markdown(meta, rows):
    lines = [
        f"# DTensor per-call overhead ({meta['world_size']} ranks, gloo, CPU)",
        "",
        f"{meta['cpu_model']}, torch {meta['torch']}, {meta['date']}. Median microseconds per call "
        "on rank 0, one thread per rank; every figure of a row comes from the same interleaved "
        "rounds.",
        "",
        "| case | call | us |",
        "|---|---|---:|",
    ]
    for row in rows:
        for name, us in row["us"].items():
            lines.append(f"| {row['case']} | {name} | {us:.1f} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    args = parser.parse_args()
    if not dist.is_available():
        sys.exit("torch.distributed is not available in this build of PyTorch")
    meta = timing.start_run(1, world_size=args.world_size)  # one thread per rank
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        mp.spawn(
            run_rank,
            args=(args.world_size, os.path.join(tmp, "store"), out),
            nprocs=args.world_size,
        )
        rows = json.loads(Path(out).read_text())
    timing.write_results("distributed_cpu", {"meta": meta, "rows": rows}, markdown(meta, rows))
    print(markdown(meta, rows))


if __name__ == "__main__":
    main()
