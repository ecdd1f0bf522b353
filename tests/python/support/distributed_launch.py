# SPDX-License-Identifier: BSD-3-Clause
"""The launcher of distributed_worker.py's ranks, without torch: it only starts them and waits, so
it does not pay torch's import (about 3 s of CPU on the 2-core VM) before each tier.

    python distributed_launch.py OUT_DIR [--tier default|slow|mesh2d] [--world-size 2]

It starts one ``distributed_worker.py`` process per rank, children of this process and in its
process group (test_distributed.py kills the group on a timeout), and exits with the largest of
their exit codes; when one rank dies the others are killed 5 s later (they would hang)."""

import argparse
import os
import subprocess
import sys
import tempfile
import time

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "distributed_worker.py")
TIERS = ["default", "slow", "mesh2d"]


def launch(args):
    """Start the ranks (children of this process, in its process group) and wait for them."""
    out = args.out or tempfile.mkdtemp(prefix="torch_rope_dist_")
    store = os.path.join(out, "store")
    if os.path.exists(store):
        os.remove(store)
    procs = []
    for rank in range(args.world_size):
        cmd = [
            sys.executable,
            WORKER,
            out,
            "--rank",
            str(rank),
            "--world-size",
            str(args.world_size),
            "--tier",
            args.tier,
            "--store",
            store,
            "--collective-timeout",
            str(args.collective_timeout),
        ]
        if args.only:
            cmd += ["--only", args.only]
        procs.append(subprocess.Popen(cmd))
    codes = [None] * len(procs)
    while any(c is None for c in codes):
        for i, p in enumerate(procs):
            codes[i] = p.poll()
        if any(c not in (None, 0) for c in codes):  # one rank died: the others would hang
            time.sleep(5)
            for p in procs:
                if p.poll() is None:
                    p.kill()
            codes = [p.wait() for p in procs]
            break
        time.sleep(0.05)
    return max(codes)


def parser(description=None):
    """The command line of both scripts (the worker adds its ranks' hidden options)."""
    p = argparse.ArgumentParser(description=description or __doc__.splitlines()[0])
    p.add_argument("out", nargs="?", help="directory for rank<r>.json")
    p.add_argument(
        "--tier",
        default="default",
        choices=TIERS,
        help="mesh2d: a 2 x 2 mesh, needs --world-size 4",
    )
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--only", help="comma-separated check names (default: the whole tier)")
    p.add_argument("--collective-timeout", type=int, default=120, help=argparse.SUPPRESS)
    return p


if __name__ == "__main__":
    sys.exit(launch(parser().parse_args()))
