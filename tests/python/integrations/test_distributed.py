# SPDX-License-Identifier: BSD-3-Clause
"""torch_rope under torch.distributed, with real processes: 2 gloo ranks on CPU (4 for 2-D).

The checks themselves are in distributed_worker.py (DTensor rules of every op in every placement,
apply_qk with GQA, apply_, apply.out, the module with DTensor input, TP with local and DTensor
heads eager and compiled, one FSDP2 step, context parallel). Each tier runs once, in a launcher
process started in its own process group and killed with all its ranks on a hard timeout; every
check then becomes one test here, failing with the rank's traceback. The slow tiers (inductor
compiles of whole models; 4 ranks on a 2 x 2 mesh incl. FSDP2 x TP) carry the ``slow`` mark.
"""

import json
import os
import signal
import subprocess
import sys

import distributed_launch
import distributed_worker as worker
import pytest
import torch
from helpers import needs_torch, subprocess_env

WORLD_SIZE = {"default": 2, "slow": 2, "mesh2d": 4}  # mesh2d: a 2 x 2 mesh (dp x tp)
TIMEOUT_S = {"default": 300, "slow": 900, "mesh2d": 600}  # hard; the default tier takes < 1 min


def _why_no_gloo():
    if not torch.distributed.is_available():
        return "torch.distributed is not available in this PyTorch build"
    if not torch.distributed.is_gloo_available():
        return "the gloo backend is not available in this PyTorch build"
    return None


pytestmark = [
    pytest.mark.skipif(_why_no_gloo() is not None, reason=str(_why_no_gloo())),
    needs_torch("2.5", "torch.distributed.tensor and its register_sharding"),
]


def _run(cmd, timeout, log_path, cwd=None):
    """Run cmd in a new process group; on timeout kill the whole group. Returns (code, log)."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=subprocess_env(OMP_NUM_THREADS="1"),
            start_new_session=True,
        )
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = None
    with open(log_path) as log:
        return code, log.read()


_RESULTS = {}


def _tier_results(tier, tmp_path_factory):
    if tier not in _RESULTS:
        out = tmp_path_factory.mktemp(f"distributed_{tier}")
        cmd = [
            sys.executable,
            distributed_launch.__file__,
            str(out),
            "--tier",
            tier,
            "--world-size",
            str(WORLD_SIZE[tier]),
        ]
        code, log = _run(cmd, TIMEOUT_S[tier], out / "log.txt")
        ranks = []
        for rank in range(WORLD_SIZE[tier]):
            path = out / f"rank{rank}.json"
            ranks.append(json.loads(path.read_text()) if path.exists() else None)
        _RESULTS[tier] = (code, log, ranks)
    return _RESULTS[tier]


def _check_names(tier):
    return [name for name, (t, _) in worker.CHECKS.items() if t == tier]


def _assert_check(tier, name, tmp_path_factory):
    code, log, ranks = _tier_results(tier, tmp_path_factory)
    if code is None:
        pytest.fail(
            f"{WORLD_SIZE[tier]} ranks killed after {TIMEOUT_S[tier]} s; log tail:\n{log[-4000:]}"
        )
    if any(r is None for r in ranks):
        pytest.fail(f"a rank wrote no results (launcher exit {code}); log tail:\n{log[-4000:]}")
    outcomes = [r.get(name, "not run") for r in ranks]
    failed = [
        (rank, o) for rank, o in enumerate(outcomes) if o != "ok" and not o.startswith("skip:")
    ]
    if failed:
        pytest.fail("\n".join(f"rank {rank}:\n{o}" for rank, o in failed), pytrace=False)
    if all(o.startswith("skip:") for o in outcomes):
        pytest.skip(outcomes[0][len("skip:") :].strip())
    assert outcomes == ["ok"] * WORLD_SIZE[tier], outcomes


@pytest.mark.parametrize("name", _check_names("default"))
def test_two_ranks(name, tmp_path_factory):
    _assert_check("default", name, tmp_path_factory)


@pytest.mark.slow
@pytest.mark.parametrize("name", _check_names("slow"))
def test_two_ranks_slow(name, tmp_path_factory):
    _assert_check("slow", name, tmp_path_factory)


@pytest.mark.slow
@pytest.mark.parametrize("name", _check_names("mesh2d"))
def test_four_ranks_2d_mesh(name, tmp_path_factory):
    _assert_check("mesh2d", name, tmp_path_factory)


def test_rules_registered_at_import_when_dtensor_is_loaded(tmp_path):
    """`import torch.distributed.tensor` before `import torch_rope`: the rules are registered by
    the import itself (the other triggers are checked by the worker's `registration`)."""
    code, log = _run(
        [
            sys.executable,
            "-c",
            "import sys, torch.distributed.tensor, torch_rope\n"
            "assert torch_rope.distributed._registered, 'not registered at import'\n"
            "from torch.distributed.tensor import DTensor\n"
            "table = DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs\n"
            "ops = [torch.ops.rope.apply.default, torch.ops.rope.apply_.default,\n"
            "       torch.ops.rope.apply_qk.default]\n"
            "missing = [str(op) for op in ops if op not in table]\n"
            "assert not missing, f'no sharding strategy for {missing}'\n",
        ],
        timeout=120,
        log_path=tmp_path / "log.txt",
    )
    assert code == 0, log
