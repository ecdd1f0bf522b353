# SPDX-License-Identifier: BSD-3-Clause
"""The module's tables and positions as DTensors on x's mesh (RotaryPositionalEmbedding.forward
with a DTensor x), with no communication.

The tables and plain positions are full, global tensors on every rank (default positions come
from x's global shape): DTensors replicated *in value*. The tables are wrapped as ``Replicate``.
Positions are handed over already split the way the sharding rules (:mod:`.rules`) want them for
x's placements, each rank keeping its slice: the same value, but DTensor has nothing left to
redistribute (slicing replicated positions inside the op costs ~0.4 ms per eager call on a 2-core
VM). Under ``torch.compile``, and for placements this does not model, positions are wrapped as
``Replicate`` and the rules slice them.

Wrapping uses the public ``DTensor.from_local``. On the torch versions where this project has
measured DTensor's internals (``_FAST_WRAP_VERSIONS``), the spec and the slice of each wrapped
shape are cached and the DTensor is built from them directly, which skips from_local's per-call
spec construction; benchmarks/bench_distributed.py measures the difference (see
docs/distributed.md).
"""

import sys

import torch

from .rules import positions_placement

# torch versions whose DTensor internals (DTensorSpec, TensorMeta, the DTensor constructor) the
# cached path was tested on; anything else takes the public path.
_FAST_WRAP_VERSIONS = ((2, 6), (2, 14))
_TORCH = torch.torch_version.TorchVersion(torch.__version__)
FAST_WRAP = _FAST_WRAP_VERSIONS[0] <= _TORCH < _FAST_WRAP_VERSIONS[1]


def as_dtensors_like(x, cos, sin, positions):
    """``(cos, sin, positions)`` as DTensors on ``x``'s mesh; DTensor arguments pass through, and
    an ``x`` that is not a DTensor (another tensor subclass) gets them back unchanged."""
    dtensor_module = sys.modules.get("torch.distributed.tensor")
    if dtensor_module is None or not isinstance(x, dtensor_module.DTensor):
        return cos, sin, positions
    DTensor, Replicate, Shard = (
        dtensor_module.DTensor,
        dtensor_module.Replicate,
        dtensor_module.Shard,
    )
    mesh = x.device_mesh
    replicated = (Replicate(),) * mesh.ndim
    wanted = replicated
    if not isinstance(positions, DTensor) and not torch.compiler.is_compiling():
        wanted = []
        for p in x.placements:
            if type(p) is Shard:  # not _StridedShard: nested shard orders are DTensor's business
                wanted.append(positions_placement(x.ndim, positions.shape, p.dim))
            elif p.is_replicate() or p.is_partial():
                wanted.append(Replicate())
            else:
                wanted = replicated
                break
        wanted = tuple(wanted)
    return (
        wrap_global(cos, mesh, replicated),
        wrap_global(sin, mesh, replicated),
        wrap_global(positions, mesh, wanted),
    )


def local_slice_index(t, mesh, placements):
    """This rank's part of the global tensor ``t`` under ``placements``, as one slice per dim:
    torch.chunk semantics per sharded mesh dim, in mesh-dim order, as DTensor splits (uneven: the
    last ranks get less, possibly nothing)."""
    bounds = [(0, n) for n in t.shape]
    for mesh_dim, p in enumerate(placements):
        if p.is_shard():
            begin, end = bounds[p.dim]
            n, rank = mesh.size(mesh_dim), mesh.get_local_rank(mesh_dim)
            chunk = -(-(end - begin) // n)  # torch.chunk: ceil(size / n) per chunk
            lo = min(begin + rank * chunk, end)
            bounds[p.dim] = (lo, min(lo + chunk, end))
    return tuple(slice(lo, hi) for lo, hi in bounds)


def _from_local(t, mesh, placements):
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(
        t[local_slice_index(t, mesh, placements)],
        mesh,
        placements,
        run_check=False,
        shape=t.shape,
        stride=t.stride(),
    )


# (mesh, placements, shape, stride, dtype) -> (DTensorSpec, slice index or None); bounded for
# varying sequence lengths, and cheap to refill.
_wrap_plans: dict = {}
_MAX_WRAP_PLANS = 256


def wrap_global(t, mesh, placements):
    """``t`` (a global tensor, the same on every rank) as a DTensor with ``placements`` on
    ``mesh``: each rank keeps its own slice, nothing is communicated. DTensors pass through."""
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        return t
    if not FAST_WRAP or torch.compiler.is_compiling():  # public path; traced, it costs nothing
        return _from_local(t, mesh, placements)
    key = (mesh, placements, t.shape, t.stride(), t.dtype)
    plan = _wrap_plans.get(key)
    if plan is None:
        plan = _wrap_plan(t, mesh, placements)
        if len(_wrap_plans) >= _MAX_WRAP_PLANS:
            _wrap_plans.clear()
        _wrap_plans[key] = plan
    spec, index = plan
    return DTensor(t if index is None else t[index], spec, requires_grad=False)


def _wrap_plan(t, mesh, placements):
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

    spec = DTensorSpec(
        mesh, tuple(placements), tensor_meta=TensorMeta(t.shape, t.stride(), t.dtype)
    )
    if all(p.is_replicate() for p in placements):
        return spec, None
    return spec, local_slice_index(t, mesh, placements)
