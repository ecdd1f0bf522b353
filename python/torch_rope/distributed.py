# SPDX-License-Identifier: BSD-3-Clause
"""DTensor sharding rules for the rope ops (``torch.distributed.tensor``).

With these rules registered, ``rope::apply``, ``rope::apply_``, ``rope::apply_qk`` and
``rope::apply.out`` accept DTensor arguments in any placement and give the single-process result.
Per mesh dimension the rules offer:

* ``x`` (``q``, ``k``) sharded on any dim but the last (batch, heads, sequence, packed tokens),
  unevenly too: each rank rotates its own rows. ``positions`` follow ``x``: where they vary along
  the sharded dim they are sharded the same way (DTensor slices replicated positions locally, no
  communication), elsewhere they are replicated.
* ``x`` replicated, or ``Partial("sum")`` / ``Partial("avg")``: rotation is linear in ``x``.
* ``cos`` and ``sin`` always replicated (a sharded table is all-gathered).
* A sharded ``head_dim`` is never offered (a rotation mixes features of one head), so DTensor
  redistributes ``x`` first: the only case that communicates.
* ``apply_`` and ``apply.out`` never change the placement of the tensor they write.
* Multi-axis positions (``mrope_section``): the trailing axis dim of ``positions`` aligns with
  nothing in ``x``; it is never sharded (a positions DTensor sharded there is gathered), and the
  dims before it follow ``x`` as above.

Backward is ``rope::apply`` with ``inverse`` flipped (C++ autograd), so the same rules cover it.

Nothing here imports ``torch.distributed.tensor`` at import time (it costs ~1.5 s): the package
registers the rules on its own once that module is loaded (at ``import torch_rope``, when a
:class:`~torch_rope.RotaryPositionalEmbedding` is built, and on the first eager call that sees a
DTensor). Call :func:`register_sharding_rules` yourself when your first rope call on DTensors is
inside ``torch.compile`` and nothing above has happened yet.
"""

import sys
from typing import List, Optional, Sequence, Tuple

import torch

__all__ = ["register_sharding_rules"]

_registered = False


def register_sharding_rules() -> None:
    """Register the DTensor sharding rules of every rope op. Idempotent; cheap after the first call.

    Imports ``torch.distributed.tensor``. Raises ``RuntimeError`` when ``torch.distributed`` is
    not available in this build of PyTorch, or when it lacks DTensor's ``register_sharding``.
    """
    global _registered
    if _registered:
        return
    if not torch.distributed.is_available():
        raise RuntimeError(
            "torch_rope.distributed.register_sharding_rules: torch.distributed is not available "
            "in this build of PyTorch, so there is no DTensor to register rules for"
        )
    try:
        from torch.distributed.tensor.experimental import register_sharding
    except ImportError as e:  # torch < 2.5
        raise RuntimeError(
            "torch_rope.distributed.register_sharding_rules: needs "
            "torch.distributed.tensor.experimental.register_sharding (PyTorch >= 2.5), "
            f"PyTorch {torch.__version__} has none"
        ) from e

    ops = torch.ops.rope
    register_sharding(ops.apply.default)(_apply_rule)
    register_sharding(ops.apply_.default)(_apply_inplace_rule)
    register_sharding(ops.apply_qk.default)(_apply_qk_rule)
    register_sharding(ops.rms_norm_apply_qk.default)(_rms_norm_apply_qk_rule)
    for op in (ops.apply.default, ops.apply_.default, ops.apply_qk.default):
        _key_on_mrope_section(op)
    if hasattr(ops.apply, "out"):
        _register_out_rule(ops.apply.out)
    from ._distributed_forms import register_form_rules

    register_form_rules(ops)
    _registered = True


def _key_on_mrope_section(op) -> None:
    """Make ``mrope_section`` part of DTensor's sharding cache key for ``op``.

    register_sharding keys its cache on int kwargs only, and ``mrope_section`` (``int[]?``)
    decides whether positions' last dim is the axis dim: the same shapes with and without it
    can need different positions placements (x ``(B, S, 3, D)``, positions ``(S, 3)``)."""
    if "mrope_section" not in _argument_names(op):
        return
    from torch.distributed.tensor import DTensor

    infos = DTensor._op_dispatcher.sharding_propagator.op_to_schema_info
    info = infos.get(op)
    if info is None:
        return
    keys = list(info.static_kwargkey or [])
    if "mrope_section" not in keys:
        info.static_kwargkey = keys + ["mrope_section"]


def maybe_register_for(*tensors) -> None:
    """Register the rules if any of ``tensors`` is a DTensor (the ops' eager wrappers call this).

    After registration this is one global read. Before it, it costs a ``sys.modules`` lookup when
    ``torch.distributed.tensor`` was never imported (no DTensor can exist then). Under
    ``torch.compile`` it does nothing: registering is not traceable, so compiled first calls rely
    on the other triggers or an explicit :func:`register_sharding_rules`.
    """
    if _registered:
        return
    dtensor_module = sys.modules.get("torch.distributed.tensor")
    if dtensor_module is None or torch.compiler.is_compiling():
        return
    dtensor_type = dtensor_module.DTensor
    if any(isinstance(t, dtensor_type) for t in tensors):
        register_sharding_rules()


def register_if_loaded() -> None:
    """Register the rules when ``torch.distributed.tensor`` is already imported (else do nothing).

    Used at ``import torch_rope`` and when a module is built: a process that loaded DTensor gets
    the rules for free, and one that did not pays one dictionary lookup.
    """
    if _registered or "torch.distributed.tensor" not in sys.modules:
        return
    if torch.distributed.is_available():
        register_sharding_rules()


# --- the rules ------------------------------------------------------------------------------
#
# A rule gets DTensorSpecs (global shape + placements) and returns, for ONE mesh dimension, the
# acceptable (output placements, input placements) pairs; DTensor expands them to every mesh
# dimension and picks the cheapest redistribution of the actual inputs.


def _row_shape(positions, mrope_section) -> Tuple[int, ...]:
    """The dims of ``positions`` that align with ``x.shape[:-1]``: all of them, or all but the
    trailing axis dim with multi-axis positions (``mrope_section``)."""
    shape = tuple(positions.shape)
    return shape if mrope_section is None else shape[:-1]


def _check_positions(op: str, name: str, x, positions, mrope_section=None) -> None:
    """Positions (without their axis dim, if multi-axis) must broadcast (trailing alignment) to
    the GLOBAL ``x.shape[:-1]``.

    DTensor runs the op's fake kernel on the global shapes before any rule, and that check says
    the same; this one keeps the rules' dim mapping safe whatever the propagation order.
    """
    rows = tuple(x.shape[:-1])
    if mrope_section is not None and len(positions.shape) == 0:
        pos = None
    else:
        pos = _row_shape(positions, mrope_section)
    if pos is not None and (
        len(pos) <= len(rows)
        and all(p == 1 or p == r for p, r in zip(reversed(pos), reversed(rows)))
    ):
        return
    what = "positions"
    if mrope_section is not None:
        what = "positions.shape[:-1] (without the axis dim)"
    raise ValueError(
        f"{op}: {name} is a DTensor, so positions must be global and {what} broadcastable to "
        f"the global {name}.shape[:-1] = {list(rows)}; got positions of global shape "
        f"{list(positions.shape)}. Pass the positions of the whole (unsharded) tensor, e.g. as "
        "a replicated DTensor; the rule gives each rank its slice"
    )


def positions_placement(x_ndim: int, positions_shape: Sequence[int], x_dim: Optional[int]):
    """The placement ``positions`` need when ``x`` is sharded on ``x_dim`` (None: not sharded).
    Also used by the module (_dtensor_args.py) to hand positions over already placed.

    positions dim ``j`` aligns with x dim ``x_ndim - 1 - len(positions_shape) + j`` (broadcasting
    to ``x.shape[:-1]``, aligned right). Sharded alike where positions vary along that dim;
    replicated where they broadcast (size 1) or do not reach it. For multi-axis positions pass
    ``positions.shape[:-1]``: the axis dim comes last, so ``Shard(j)`` means the same dim of the
    full positions, and the axis dim itself is never sharded.
    """
    from torch.distributed.tensor import Replicate, Shard

    if x_dim is None:
        return Replicate()
    j = x_dim - (x_ndim - 1 - len(positions_shape))
    if j < 0 or positions_shape[j] == 1:
        return Replicate()
    return Shard(j)


def _x_choices(x_ndim: int, positions_shape: Sequence[int]) -> List[Tuple[object, object]]:
    """(placement of x, placement positions then need), for one mesh dimension."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    choices = [(Replicate(), Replicate())]
    for d in range(x_ndim - 1):  # never the last (head_dim): a rotation mixes features
        choices.append((Shard(d), positions_placement(x_ndim, positions_shape, d)))
    # Rotation is linear in x: a pending sum (or mean) can be rotated before it is reduced.
    choices += [(Partial("sum"), Replicate()), (Partial("avg"), Replicate())]
    return choices


def _apply_rule(x, cos, sin, positions, *, mrope_section=None, **_flags):
    _check_positions("rope.apply", "x", x, positions, mrope_section)
    from torch.distributed.tensor import Replicate

    r = Replicate()
    rows = _row_shape(positions, mrope_section)
    return [([xp], [xp, r, r, pp]) for xp, pp in _x_choices(x.ndim, rows)]


def _apply_inplace_rule(x, cos, sin, positions, *, mrope_section=None, **_flags):
    # Same choices; DTensor's in-place filter keeps only those where x keeps its placement, and
    # raises (naming the placement) when none does, e.g. for a sharded head_dim.
    _check_positions("rope.apply_", "x", x, positions, mrope_section)
    from torch.distributed.tensor import Replicate

    r = Replicate()
    rows = _row_shape(positions, mrope_section)
    return [([], [xp, r, r, pp]) for xp, pp in _x_choices(x.ndim, rows)]


def _apply_qk_rule(q, k, cos, sin, positions, *, mrope_section=None, **_flags):
    _check_positions("rope.apply_qk", "q", q, positions, mrope_section)
    _check_positions("rope.apply_qk", "k", k, positions, mrope_section)
    from torch.distributed.tensor import Replicate

    r = Replicate()
    rows = _row_shape(positions, mrope_section)
    # q and k are placed independently (GQA: different head counts), but share one positions
    # tensor, so a pair is offered only when both need the same placement of positions.
    return [
        ([qp, kp], [qp, kp, r, r, qpp])
        for qp, qpp in _x_choices(q.ndim, rows)
        for kp, kpp in _x_choices(k.ndim, rows)
        if qpp == kpp
    ]


def _rms_norm_apply_qk_rule(
    q, k, q_weight, k_weight, cos, sin, positions, *, mrope_section=None, **_flags
):
    _check_positions("rope.rms_norm_apply_qk", "q", q, positions, mrope_section)
    _check_positions("rope.rms_norm_apply_qk", "k", k, positions, mrope_section)
    from torch.distributed.tensor import Replicate

    r = Replicate()
    rows = _row_shape(positions, mrope_section)

    # apply_qk's choices without the pending reductions: the norm is not linear in x, so a
    # Partial q or k is reduced first. Rows are normalised whole (never a sharded head_dim);
    # the weights and tables are replicated.
    def choices(x):
        return [(p, pp) for p, pp in _x_choices(x.ndim, rows) if not p.is_partial()]

    return [
        ([qp, kp], [qp, kp, r, r, r, r, qpp])
        for qp, qpp in choices(q)
        for kp, kpp in choices(k)
        if qpp == kpp
    ]


def _register_out_rule(op) -> None:
    """Rule for ``rope::apply.out(x, cos, sin, positions, *, ..., Tensor(a!) out)``.

    ``register_sharding`` does not handle out= overloads (it would give ``out`` no placement), so
    this one builds the strategy itself: the result is ``out``, whose placement never changes;
    ``x`` (and positions after it) are placed like ``out``, redistributed if need be.

    DTensor returns ``out`` from every out= overload, so the schema must return it too
    (``-> Tensor(a!)``, as ATen's out= ops do). With ``-> ()`` the dispatcher would refuse the
    result after the kernel wrote ``out``; the rule raises first instead, before any write.
    """
    from torch.distributed.tensor import DTensor, Replicate
    from torch.distributed.tensor._op_schema import OpStrategy, RuntimeSchemaInfo
    from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy

    returns_out = len(op._schema.returns) == 1

    def strategy(op_schema):
        if not returns_out:
            raise RuntimeError(
                f"{op._schema.name}.out: DTensor arguments are not supported by an out= "
                f"overload that returns nothing ({op._schema}): DTensor returns `out` from out= "
                "overloads. Use rope::apply (torch_rope.apply) and copy the result into out"
            )

        def spec(arg):
            return arg.strategies[0].output_spec if isinstance(arg, OpStrategy) else arg

        x, cos, sin, positions = (spec(a) for a in op_schema.args_schema[:4])
        mrope_section = op_schema.kwargs_schema.get("mrope_section")
        _check_positions("rope.apply.out", "x", x, positions, mrope_section)
        rows = _row_shape(positions, mrope_section)
        r = Replicate()
        # One entry for the output, then one per tensor input (args, then the out kwarg). DTensor
        # keeps only the combinations whose output placement equals out's current one (it never
        # redistributes kwargs), so out stays where it is and x moves to out's placement.
        single_dim = [[xp, xp, r, r, pp, xp] for xp, pp in _x_choices(x.ndim, rows)]
        return expand_to_full_mesh_op_strategy(
            op_schema.get_mesh_from_args(), op_schema, single_dim, input_index=1
        )

    # out's placement decides the strategy, so it must be part of DTensor's cache key; so does
    # mrope_section (whether positions' last dim is the axis dim).
    keys = ["out"] + (["mrope_section"] if "mrope_section" in _argument_names(op) else [])
    DTensor._op_dispatcher.sharding_propagator.register_op_strategy(
        op, strategy, RuntimeSchemaInfo(static_kwargkey=keys)
    )


def _argument_names(op):
    return {a.name for a in op._schema.arguments}
