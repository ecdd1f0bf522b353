# SPDX-License-Identifier: BSD-3-Clause
"""The frequency and packed-sequence forms of ``torch_rope.apply``, ``apply_`` and ``apply_qk``
(docs/architecture.md, "Angle sources and position sources"): ops.py hands a call here when it
names ``freqs`` or ``cu_seqlens``.

* Angle source: the ``cos``/``sin`` tables, or ``freqs`` (float64, one frequency per plane) and
  ``attention_factor``: table-free, exact at any position.
* Position source: ``positions``, or packed sequences: ``cu_seqlens`` (and ``seq_offsets``,
  ``cp_size``, ``cp_rank``), with x's tokens on dim 0.

Exactly one of each; anything else is a ``TypeError`` naming the arguments. Each combination is
one overload of the op (``rope.apply.freqs``, ``apply.varlen``, ``apply.freqs_varlen``, the same
suffixes on ``apply_`` and ``apply_qk``, ``apply.freqs_out``, ...).
"""

import numbers

import torch
from torch import Tensor

from . import _C, _functorch
from ._functorch_forms import FormRotate, FormRotateQK, form_inputs, form_rotate_inplace
from ._op_arguments import _is_compiling, _section, eager_fast_path
from .distributed import maybe_register_for as _maybe_register_for

_ops = torch.ops.rope
_dynamo_refuses_out = torch.torch_version.TorchVersion(torch.__version__) < (2, 6)

FREQS, VARLEN, FREQS_VARLEN = "freqs", "varlen", "freqs_varlen"


def resolve(
    op: str,
    cos,
    sin,
    positions,
    freqs,
    attention_factor,
    cu_seqlens,
    seq_offsets,
    cp_size,
    cp_rank,
    mrope_section,
    mrope_interleaved,
) -> str:
    """The form of a call that names an argument of the new forms: ``freqs``, ``varlen`` or
    ``freqs_varlen``. A ``TypeError`` names what is missing or given twice."""
    tables = cos is not None or sin is not None
    if freqs is not None and tables:
        raise TypeError(
            f"{op}: give one angle source, the cos and sin tables or freqs (the table-free "
            "form), not both"
        )
    if freqs is None and (cos is None or sin is None):
        raise TypeError(
            f"{op}: give the cos and sin tables or freqs=, got "
            + ("no angle source" if not tables else "only " + ("cos" if sin is None else "sin"))
        )
    if cu_seqlens is not None and positions is not None:
        raise TypeError(
            f"{op}: give one position source, positions or cu_seqlens= (packed sequences), not both"
        )
    if cu_seqlens is None and positions is None:
        raise TypeError(f"{op}: give positions or cu_seqlens= (packed sequences)")
    if cu_seqlens is None and (seq_offsets is not None or cp_size != 1 or cp_rank != 0):
        raise TypeError(
            f"{op}: seq_offsets, cp_size and cp_rank describe packed sequences; they need "
            "cu_seqlens="
        )
    if cu_seqlens is not None and (mrope_section is not None or mrope_interleaved):
        raise TypeError(
            f"{op}: mrope_section (multi-axis positions) cannot be combined with cu_seqlens; pass "
            "the multi-axis positions themselves"
        )
    if freqs is None and attention_factor != 1.0:
        raise TypeError(
            f"{op}: attention_factor goes with freqs= (the tables carry it in cos and sin), got "
            f"attention_factor={attention_factor!r} with tables"
        )
    for name, value in (("cp_size", cp_size), ("cp_rank", cp_rank)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{op}: {name} must be an int, got {type(value).__name__} {value!r}")
    if isinstance(attention_factor, bool) or not isinstance(attention_factor, numbers.Real):
        raise TypeError(
            f"{op}: attention_factor must be a number, got {type(attention_factor).__name__}"
        )
    if freqs is not None:
        return FREQS_VARLEN if cu_seqlens is not None else FREQS
    return VARLEN


def _overload(packet, form: str, out: bool = False):
    return getattr(packet, f"{form}_out" if out else form)


def _packed_kw(seq_offsets, cp_size, cp_rank) -> dict:
    kw = {}
    if seq_offsets is not None:
        kw["seq_offsets"] = seq_offsets
    if cp_size != 1 or cp_rank != 0:
        kw.update(cp_size=int(cp_size), cp_rank=int(cp_rank))
    return kw


def op_args(
    form,
    cos,
    sin,
    positions,
    freqs,
    attention_factor,
    cu_seqlens,
    seq_offsets,
    cp_size,
    cp_rank,
    interleaved,
    inverse,
    mrope_section,
    mrope_interleaved,
):
    """(positional tensors after x, keywords) of the overload of ``form``."""
    kw = {}
    if not interleaved or inverse:
        kw.update(interleaved=interleaved, inverse=inverse)
    if form == FREQS:
        args = (freqs, positions)
        if mrope_section is not None or mrope_interleaved:
            kw.update(mrope_section=mrope_section, mrope_interleaved=mrope_interleaved)
    elif form == VARLEN:
        args = (cos, sin, cu_seqlens)
        kw.update(_packed_kw(seq_offsets, cp_size, cp_rank))
    else:
        args = (freqs, cu_seqlens)
        kw.update(_packed_kw(seq_offsets, cp_size, cp_rank))
    if form != VARLEN and attention_factor != 1.0:
        kw["attention_factor"] = float(attention_factor)
    return args, kw


def _fast(form, tensors, seq_offsets) -> bool:
    """The eager fast path's gate for a call of ``form`` on ``tensors`` (x, q, k and the form's
    tensors), seq_offsets None or a plain tensor."""
    return (seq_offsets is None or type(seq_offsets) is Tensor) and eager_fast_path(*tensors)


def _form_call(
    name, cos, sin, positions, freqs, attention_factor, cu_seqlens, seq_offsets, cp_size, cp_rank,
    interleaved, inverse, mrope_section, mrope_interleaved,
):  # fmt: skip
    """(form, positional args, keywords) of the overload a wrapper's keywords select: the one
    angle source and one position source checked (resolve), then the overload's arguments."""
    form = resolve(
        name, cos, sin, positions, freqs, attention_factor, cu_seqlens, seq_offsets, cp_size,
        cp_rank, mrope_section, mrope_interleaved,
    )  # fmt: skip
    args, kw = op_args(
        form, cos, sin, positions, freqs, attention_factor, cu_seqlens, seq_offsets, cp_size,
        cp_rank, interleaved, inverse, _section(name, mrope_section), mrope_interleaved,
    )  # fmt: skip
    return form, args, kw


def apply(
    x,
    cos,
    sin,
    positions,
    freqs,
    attention_factor,
    cu_seqlens,
    seq_offsets,
    cp_size,
    cp_rank,
    interleaved,
    inverse,
    mrope_section,
    mrope_interleaved,
    out,
):
    name = "rope.apply" if out is None else "rope.apply.out"
    form, args, kw = _form_call(
        name, cos, sin, positions, freqs, attention_factor, cu_seqlens, seq_offsets, cp_size,
        cp_rank, interleaved, inverse, mrope_section, mrope_interleaved,
    )  # fmt: skip
    if out is None and _fast(form, (x,) + args, seq_offsets):
        return _FAST_APPLY[form](x, *args, **kw)
    if type(x) is not Tensor:  # a subclass such as DTensor
        _maybe_register_for(x)
    if out is not None:
        if type(out) is not Tensor or (
            _is_compiling() and (_dynamo_refuses_out or not out.is_contiguous())
        ):
            if torch.is_grad_enabled() and x.requires_grad:
                raise RuntimeError(
                    f"rope.apply.{form}_out: functions with out=... arguments don't support "
                    "automatic differentiation, but one of the arguments requires grad"
                )
            out.copy_(_overload(_ops.apply, form)(x, *args, **kw))
            return out
        _overload(_ops.apply, form, out=True)(x, *args, out=out, **kw)
        return out
    if _functorch.transforms_active():
        return FormRotate.apply(x, form, *form_inputs(args, kw))
    return _overload(_ops.apply, form)(x, *args, **kw)


def apply_(
    x,
    cos,
    sin,
    positions,
    freqs,
    attention_factor,
    cu_seqlens,
    seq_offsets,
    cp_size,
    cp_rank,
    interleaved,
    inverse,
    mrope_section,
    mrope_interleaved,
):
    name = "rope.apply_"
    form, args, kw = _form_call(
        name, cos, sin, positions, freqs, attention_factor, cu_seqlens, seq_offsets, cp_size,
        cp_rank, interleaved, inverse, mrope_section, mrope_interleaved,
    )  # fmt: skip
    if _fast(form, (x,) + args, seq_offsets):
        _FAST_APPLY_INPLACE[form](x, *args, **kw)
        return x
    if type(x) is not Tensor:
        _maybe_register_for(x)
    if _functorch.transforms_active():
        return form_rotate_inplace(x, form, *form_inputs(args, kw))
    _overload(_ops.apply_, form)(x, *args, **kw)
    return x


def apply_qk(
    q,
    k,
    cos,
    sin,
    positions,
    freqs,
    attention_factor,
    cu_seqlens,
    seq_offsets,
    cp_size,
    cp_rank,
    interleaved,
    inverse,
    mrope_section,
    mrope_interleaved,
):
    name = "rope.apply_qk"
    form, args, kw = _form_call(
        name, cos, sin, positions, freqs, attention_factor, cu_seqlens, seq_offsets, cp_size,
        cp_rank, interleaved, inverse, mrope_section, mrope_interleaved,
    )  # fmt: skip
    if _fast(form, (q, k) + args, seq_offsets):
        return _FAST_APPLY_QK[form](q, k, *args, **kw)
    if type(q) is not Tensor or type(k) is not Tensor:
        _maybe_register_for(q, k)
    if _functorch.transforms_active():
        return FormRotateQK.apply(q, k, form, *form_inputs(args, kw))
    return _overload(_ops.apply_qk, form)(q, k, *args, **kw)


# The typed entry points of the eager fast path (csrc/python/bindings.cpp), by form: the same
# dispatcher call as the overload, without the boxed call's argument parsing.
_FAST_APPLY = {
    FREQS: _C._apply_freqs,
    VARLEN: _C._apply_varlen,
    FREQS_VARLEN: _C._apply_freqs_varlen,
}
_FAST_APPLY_INPLACE = {
    FREQS: _C._apply_inplace_freqs,
    VARLEN: _C._apply_inplace_varlen,
    FREQS_VARLEN: _C._apply_inplace_freqs_varlen,
}
_FAST_APPLY_QK = {
    FREQS: _C._apply_qk_freqs,
    VARLEN: _C._apply_qk_varlen,
    FREQS_VARLEN: _C._apply_qk_freqs_varlen,
}
