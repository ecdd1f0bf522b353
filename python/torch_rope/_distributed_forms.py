# SPDX-License-Identifier: BSD-3-Clause
"""DTensor sharding rules of the frequency and packed-sequence forms (rope.apply.freqs,
apply.varlen, apply.freqs_varlen, the same suffixes on apply_ and apply_qk, and the out=
overloads); registered by :func:`torch_rope.distributed.register_sharding_rules`.

The frequency form places like the table form (freqs replicated, as cos and sin). The packed
sequences keep x's tokens on dim 0, where cu_seqlens counts them: x is never sharded there (a
rank's slice of the tokens would no longer match the boundaries); any other dim but head_dim is,
and cu_seqlens and seq_offsets are replicated.
"""

from .distributed import (
    _argument_names,
    _check_positions,
    _key_on_mrope_section,
    _row_shape,
    _x_choices,
)


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


def register_form_rules(ops) -> None:
    """Registers every rule of this module on the rope ops `ops` (torch.ops.rope)."""
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
