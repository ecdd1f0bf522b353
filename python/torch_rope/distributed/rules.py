# SPDX-License-Identifier: BSD-3-Clause
"""The DTensor sharding rules of every rope op and form (registered by
:func:`torch_rope.distributed.register_sharding_rules`; what they offer is in the package's
docstring). Nothing here imports ``torch.distributed.tensor`` at import time."""

from typing import List, Optional, Sequence, Tuple


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
    Also used by :func:`as_dtensors_like` to hand the module's positions over already placed.

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


# --- the rules of the frequency and packed-sequence forms (see the module docstring) -----------


def _varlen_x_choices(x_ndim: int):
    """Placements of x for one mesh dimension with packed sequences: not dim 0 (tokens), not the
    last (head_dim)."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    choices = [Replicate()] + [Shard(d) for d in range(1, x_ndim - 1)]
    return choices + [Partial("sum"), Partial("avg")]


def _apply_freqs_rule(x, freqs, positions, *, mrope_section=None, **_flags):
    _check_positions("rope.apply.freqs", "x", x, positions, mrope_section)
    from torch.distributed.tensor import Replicate

    r = Replicate()
    rows = _row_shape(positions, mrope_section)
    return [([xp], [xp, r, pp]) for xp, pp in _x_choices(x.ndim, rows)]


def _apply_inplace_freqs_rule(x, freqs, positions, *, mrope_section=None, **_flags):
    _check_positions("rope.apply_.freqs", "x", x, positions, mrope_section)
    from torch.distributed.tensor import Replicate

    r = Replicate()
    rows = _row_shape(positions, mrope_section)
    return [([], [xp, r, pp]) for xp, pp in _x_choices(x.ndim, rows)]


def _apply_qk_freqs_rule(q, k, freqs, positions, *, mrope_section=None, **_flags):
    _check_positions("rope.apply_qk.freqs", "q", q, positions, mrope_section)
    _check_positions("rope.apply_qk.freqs", "k", k, positions, mrope_section)
    from torch.distributed.tensor import Replicate

    r = Replicate()
    rows = _row_shape(positions, mrope_section)
    return [
        ([qp, kp], [qp, kp, r, qpp])
        for qp, qpp in _x_choices(q.ndim, rows)
        for kp, kpp in _x_choices(k.ndim, rows)
        if qpp == kpp
    ]


def _varlen_rules(angle_tensors: int):
    """The rules of apply / apply_ / apply_qk with packed sequences: `angle_tensors` replicated
    (cos and sin, or freqs), then cu_seqlens, then seq_offsets when given (a keyword tensor)."""
    from torch.distributed.tensor import Replicate

    r = Replicate()

    def rest(seq_offsets):
        return [r] * (angle_tensors + 1 + (seq_offsets is not None))

    def apply_rule(x, *args, seq_offsets=None, **_flags):
        return [([xp], [xp] + rest(seq_offsets)) for xp in _varlen_x_choices(x.ndim)]

    def inplace_rule(x, *args, seq_offsets=None, **_flags):
        return [([], [xp] + rest(seq_offsets)) for xp in _varlen_x_choices(x.ndim)]

    def qk_rule(q, k, *args, seq_offsets=None, **_flags):
        return [
            ([qp, kp], [qp, kp] + rest(seq_offsets))
            for qp in _varlen_x_choices(q.ndim)
            for kp in _varlen_x_choices(k.ndim)
        ]

    return apply_rule, inplace_rule, qk_rule


def _register_form_rules(ops) -> None:
    """Registers the forms' rules on the rope ops `ops` (torch.ops.rope)."""
    from torch.distributed.tensor.experimental import register_sharding

    register_sharding(ops.apply.freqs)(_apply_freqs_rule)
    register_sharding(ops.apply_.freqs)(_apply_inplace_freqs_rule)
    register_sharding(ops.apply_qk.freqs)(_apply_qk_freqs_rule)
    for op in (ops.apply.freqs, ops.apply_.freqs, ops.apply_qk.freqs):
        _key_on_mrope_section(op)
    for form, angle_tensors in (("varlen", 2), ("freqs_varlen", 1)):
        apply_rule, inplace_rule, qk_rule = _varlen_rules(angle_tensors)
        register_sharding(getattr(ops.apply, form))(apply_rule)
        register_sharding(getattr(ops.apply_, form))(inplace_rule)
        register_sharding(getattr(ops.apply_qk, form))(qk_rule)
        _key_on_seq_offsets(getattr(ops.apply, form))
        _key_on_seq_offsets(getattr(ops.apply_, form))
        _key_on_seq_offsets(getattr(ops.apply_qk, form))
    _register_form_out_rules(ops)


def _key_on_seq_offsets(op) -> None:
    """Whether seq_offsets is given changes the number of inputs the rule places: part of the
    cache key, as mrope_section is for the positions forms."""
    from torch.distributed.tensor import DTensor

    infos = DTensor._op_dispatcher.sharding_propagator.op_to_schema_info
    info = infos.get(op)
    if info is not None:
        keys = list(info.static_kwargkey or [])
        if "seq_offsets" not in keys:
            info.static_kwargkey = keys + ["seq_offsets"]


def _register_form_out_rules(ops) -> None:
    """apply.freqs_out, apply.varlen_out and apply.freqs_varlen_out: as _register_out_rule, the
    result is `out`, whose placement never changes. They return nothing, so under DTensor the
    strategy raises before any write (torch_rope.apply copies from the out-of-place overload)."""
    from torch.distributed.tensor import DTensor, Replicate
    from torch.distributed.tensor._op_schema import OpStrategy, RuntimeSchemaInfo
    from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy

    def register(op, tensors_after_x: int, packed: bool):
        returns_out = len(op._schema.returns) == 1

        def strategy(op_schema):
            if not returns_out:
                raise RuntimeError(
                    f"{op._schema.name}.{op._overloadname}: DTensor arguments are not supported "
                    "by an out= overload that returns nothing: DTensor returns `out` from out= "
                    "overloads. Use torch_rope.apply (which copies the out-of-place result "
                    "into out)"
                )

            def spec(arg):
                return arg.strategies[0].output_spec if isinstance(arg, OpStrategy) else arg

            x = spec(op_schema.args_schema[0])
            r = Replicate()
            offsets = 1 if op_schema.kwargs_schema.get("seq_offsets") is not None else 0
            if packed:
                single_dim = [
                    [xp, xp] + [r] * (tensors_after_x + offsets) + [xp]
                    for xp in _varlen_x_choices(x.ndim)
                ]
            else:
                positions = spec(op_schema.args_schema[2])
                mrope_section = op_schema.kwargs_schema.get("mrope_section")
                _check_positions("rope.apply.freqs_out", "x", x, positions, mrope_section)
                rows = _row_shape(positions, mrope_section)
                single_dim = [[xp, xp, r, pp, xp] for xp, pp in _x_choices(x.ndim, rows)]
            return expand_to_full_mesh_op_strategy(
                op_schema.get_mesh_from_args(), op_schema, single_dim, input_index=1
            )

        keys = ["out"] + [k for k in ("mrope_section", "seq_offsets") if k in _argument_names(op)]
        DTensor._op_dispatcher.sharding_propagator.register_op_strategy(
            op, strategy, RuntimeSchemaInfo(static_kwargkey=keys)
        )

    register(ops.apply.freqs_out, 2, packed=False)
    register(ops.apply.varlen_out, 3, packed=True)
    register(ops.apply.freqs_varlen_out, 2, packed=True)
