# SPDX-License-Identifier: BSD-3-Clause
"""The rotation: the typed wrappers of ``torch.ops.rope.apply`` and ``apply_`` (``apply_qk``'s is
:mod:`.qk`), in every form of their arguments (docs/architecture.md, "Angle sources and position
sources"); and what every typed wrapper shares (the other op families, the module of
torch_rope.nn, the compat layers): the one gate of the eager fast path, and the op arguments made
ready for the dispatcher.

* Angle source: the ``cos``/``sin`` tables, or ``freqs`` (float64, one frequency per plane) and
  ``attention_factor``: table-free, exact at any position.
* Position source: ``positions``, or packed sequences: ``cu_seqlens`` (and ``seq_offsets``,
  ``cp_size``, ``cp_rank``), with x's tokens on dim 0.

Exactly one of each; anything else is a ``TypeError`` naming the arguments. Each combination is
one overload (``rope.apply.freqs``, ``apply.varlen``, ``apply.freqs_varlen``, the same suffixes on
``apply_`` and ``apply_qk``, ``apply.freqs_out``, ...). A call of the tables and positions form
goes straight to its overload; a call of another form is described by one :class:`Form` record,
which checks the sources and gives the overload and its arguments.
"""

import numbers
from typing import List, NamedTuple, Optional, Sequence

import torch
from torch import Tensor

from ..distributed import maybe_register_for as _maybe_register_for
from . import _autograd
from ._autograd import FormRotate, form_inputs, form_rotate_inplace
from ._native import _C

# ---- what every typed wrapper shares ----------------------------------------------------------
# The eager fast path: for plain tensors, with no torch.compile, functorch transform or
# __torch_function__ mode around the call, the typed C++ entry points (csrc/python/bindings.cpp)
# make the same dispatcher call as torch.ops.rope.* without the boxed call's argument parsing
# (about 2 us of a decode-sized call). Everything else takes torch.ops, which Dynamo traces, and
# which honours subclasses (DTensor) and modes. is_compiling comes first: Dynamo folds it to
# True, so it never looks past it.
_is_compiling = torch.compiler.is_compiling
_functorch_active = torch._C._are_functorch_transforms_active
_function_mode_active = torch._C._is_torch_function_mode_enabled


# A plain tensor standing for an argument a call does not have (a fixed signature with defaults
# costs a third of a variadic one, and this runs on every decode call).
_ABSENT = torch.empty(0)


def eager_fast_path(a, b=_ABSENT, c=_ABSENT, d=_ABSENT, e=_ABSENT) -> bool:
    """Whether a call on these tensors may take the typed C++ entry points: eager, plain tensors
    (not None, not a subclass such as DTensor), no functorch transform and no
    ``__torch_function__`` mode. The one gate of the op wrappers and torch_rope.nn."""
    return (
        not _is_compiling()  # first: Dynamo folds it to True and looks no further
        and type(a) is Tensor
        and type(b) is Tensor
        and type(c) is Tensor
        and type(d) is Tensor
        and type(e) is Tensor
        and not _functorch_active()
        and not _function_mode_active()
    )


def _flags(
    interleaved: bool,
    inverse: bool,
    mrope_section: Optional[List[int]] = None,
    mrope_interleaved: bool = False,
) -> dict:
    """The keyword flags that differ from the schema's defaults (keywords cost per call)."""
    flags = {}
    if not interleaved or inverse:
        flags.update(interleaved=interleaved, inverse=inverse)
    if mrope_section is not None or mrope_interleaved:
        flags.update(mrope_section=mrope_section, mrope_interleaved=mrope_interleaved)
    return flags


def _typed_section(mrope_section) -> bool:
    """Whether the typed entry points take this mrope_section as it is: None, or a list or tuple
    of Python ints (anything else, a tensor or numpy ints, goes through :func:`_section`)."""
    return mrope_section is None or (
        type(mrope_section) in (list, tuple) and all(type(s) is int for s in mrope_section)
    )


def _is_plane_count(s) -> bool:
    """An integer (a Python or numpy int, an integer tensor's value); not a bool, not a float."""
    if isinstance(s, Tensor):
        integer = not (s.is_floating_point() or s.is_complex() or s.dtype == torch.bool)
        return s.dim() == 0 and integer
    return isinstance(s, numbers.Integral) and not isinstance(s, bool)


def _section(op: str, mrope_section: Optional[Sequence[int]]) -> Optional[List[int]]:
    """mrope_section as the op's int[] (a list of Python ints), or None. A float or bool entry is
    a TypeError, as the raw op and the module refuse them, rather than truncated (2.7 is not 2
    planes)."""
    if mrope_section is None:
        return None
    if isinstance(mrope_section, Tensor):
        mrope_section = mrope_section.tolist()
    for a, s in enumerate(mrope_section):
        if not _is_plane_count(s):
            raise TypeError(
                f"{op}: mrope_section[{a}] must be an int (a number of planes), got "
                f"{type(s).__name__} {s!r} in mrope_section={list(mrope_section)!r}"
            )
    return [int(s) for s in mrope_section]


# ---- the rotation -------------------------------------------------------------------------------

_apply = torch.ops.rope.apply.default
_apply_inplace = torch.ops.rope.apply_.default
_apply_out = torch.ops.rope.apply.out

_fast_apply = _C._apply
# Dynamo before torch 2.6 (pytorch#140202) refuses an out= op that returns nothing.
_dynamo_refuses_out = torch.torch_version.TorchVersion(torch.__version__) < (2, 6)
_fast_apply_inplace = _C._apply_


FREQS, VARLEN, FREQS_VARLEN = "freqs", "varlen", "freqs_varlen"


class Form(NamedTuple):
    """A call's arguments after the rotated tensor(s), for the frequency and packed-sequence
    forms: its angle source, its position source and the flags, in the wrappers' order (they
    build it by position: by keyword costs a decode call about 1 us more). :meth:`overload`
    names the overload (``freqs``, ``varlen`` or ``freqs_varlen``) and :meth:`call` gives its
    arguments."""

    cos: Optional[Tensor] = None
    sin: Optional[Tensor] = None
    positions: Optional[Tensor] = None
    freqs: Optional[Tensor] = None
    attention_factor: float = 1.0
    cu_seqlens: Optional[Tensor] = None
    seq_offsets: Optional[Tensor] = None
    cp_size: int = 1
    cp_rank: int = 0
    interleaved: bool = True
    inverse: bool = False
    mrope_section: Optional[Sequence[int]] = None
    mrope_interleaved: bool = False

    def overload(self, op: str) -> str:
        """The overload suffix of this call: ``freqs``, ``varlen`` or ``freqs_varlen``. A
        ``TypeError`` names what is missing or given twice."""
        cos, sin, freqs, cu_seqlens = self.cos, self.sin, self.freqs, self.cu_seqlens
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
        if cu_seqlens is not None and self.positions is not None:
            raise TypeError(
                f"{op}: give one position source, positions or cu_seqlens= (packed sequences), "
                "not both"
            )
        if cu_seqlens is None and self.positions is None:
            raise TypeError(f"{op}: give positions or cu_seqlens= (packed sequences)")
        if cu_seqlens is None and (
            self.seq_offsets is not None or self.cp_size != 1 or self.cp_rank != 0
        ):
            raise TypeError(
                f"{op}: seq_offsets, cp_size and cp_rank describe packed sequences; they need "
                "cu_seqlens="
            )
        if cu_seqlens is not None and (self.mrope_section is not None or self.mrope_interleaved):
            raise TypeError(
                f"{op}: mrope_section (multi-axis positions) cannot be combined with cu_seqlens; "
                "pass the multi-axis positions themselves"
            )
        attention_factor = self.attention_factor
        if freqs is None and attention_factor != 1.0:
            raise TypeError(
                f"{op}: attention_factor goes with freqs= (the tables carry it in cos and sin), "
                f"got attention_factor={attention_factor!r} with tables"
            )
        for name, value in (("cp_size", self.cp_size), ("cp_rank", self.cp_rank)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise TypeError(
                    f"{op}: {name} must be an int, got {type(value).__name__} {value!r}"
                )
        if isinstance(attention_factor, bool) or not isinstance(attention_factor, numbers.Real):
            raise TypeError(
                f"{op}: attention_factor must be a number, got {type(attention_factor).__name__}"
            )
        if freqs is not None:
            return FREQS_VARLEN if cu_seqlens is not None else FREQS
        return VARLEN

    def call(self, op: str):
        """(overload suffix, positional tensors after x, keywords) of this call, after
        :meth:`overload`'s checks."""
        form = self.overload(op)
        mrope_section = _section(op, self.mrope_section)
        kw = {}
        if not self.interleaved or self.inverse:
            kw.update(interleaved=self.interleaved, inverse=self.inverse)
        if form == FREQS:
            args = (self.freqs, self.positions)
            if mrope_section is not None or self.mrope_interleaved:
                kw.update(mrope_section=mrope_section, mrope_interleaved=self.mrope_interleaved)
        else:
            args = (
                (self.cos, self.sin, self.cu_seqlens)
                if form == VARLEN
                else (self.freqs, self.cu_seqlens)
            )
            if self.seq_offsets is not None:
                kw["seq_offsets"] = self.seq_offsets
            if self.cp_size != 1 or self.cp_rank != 0:
                kw.update(cp_size=int(self.cp_size), cp_rank=int(self.cp_rank))
        if form != VARLEN and self.attention_factor != 1.0:
            kw["attention_factor"] = float(self.attention_factor)
        return form, args, kw

    def fast(self, *rotated: Tensor, args) -> bool:
        """The eager fast path's gate for this call on ``rotated`` (x, or q and k) and the
        overload's tensors ``args``, seq_offsets None or a plain tensor."""
        offsets = self.seq_offsets
        return (offsets is None or type(offsets) is Tensor) and eager_fast_path(*rotated, *args)


def _missing_source(op: str, cos, sin, positions):
    """The forms' ``TypeError`` for a call with no angle source (cos and sin, or freqs=) or no
    position source (positions, or cu_seqlens=): it names what is missing."""
    Form(cos, sin, positions).overload(op)


def _overload(packet, form: str, out: bool = False):
    return getattr(packet, f"{form}_out" if out else form)


def apply(
    x: Tensor,
    cos: Optional[Tensor] = None,
    sin: Optional[Tensor] = None,
    positions: Optional[Tensor] = None,
    *,
    freqs: Optional[Tensor] = None,
    attention_factor: float = 1.0,
    cu_seqlens: Optional[Tensor] = None,
    seq_offsets: Optional[Tensor] = None,
    cp_size: int = 1,
    cp_rank: int = 0,
    interleaved: bool = True,
    inverse: bool = False,
    mrope_section: Optional[Sequence[int]] = None,
    mrope_interleaved: bool = False,
    out: Optional[Tensor] = None,
) -> Tensor:
    """Return ``x`` with its first ``rotary_dim`` features rotated by the positions' angles.

    The result is a new contiguous tensor of ``x``'s shape and dtype (math in float32, float64
    for float64 inputs). With ``out=``, the result is written into ``out`` instead (e.g. a
    KV-cache slot: any strides, ``x``'s shape and dtype, never resized, sharing no memory with
    an input) and ``out`` is returned; ``out=`` is not differentiable. ``mrope_section`` and
    ``mrope_interleaved``: multi-axis positions (see the module docstring).

    Other forms (docs/api.md): ``freqs=`` (float64 ``(rotary_dim // 2,)``, with
    ``attention_factor``) instead of ``cos, sin``: table-free, every float32 output within
    ``2^-23 * attention_factor * (|a| + |b|)`` of the exact rotation at any position >= 0;
    ``cu_seqlens=`` (with ``seq_offsets``, ``cp_size``, ``cp_rank``) instead of ``positions``:
    packed sequences, x ``(T, ..., head_dim)`` with its tokens on dim 0.
    """
    if (
        freqs is not None
        or cu_seqlens is not None
        or seq_offsets is not None
        or cp_size != 1
        or cp_rank != 0
        or attention_factor != 1.0
    ):
        return _apply_form(
            x,
            Form(cos, sin, positions, freqs, attention_factor, cu_seqlens, seq_offsets, cp_size,
                 cp_rank, interleaved, inverse, mrope_section, mrope_interleaved),
            out,
        )  # fmt: skip
    if (
        out is None
        and (mrope_section is None or _typed_section(mrope_section))
        and eager_fast_path(x, cos, sin, positions)
    ):
        if mrope_section is None and not mrope_interleaved:
            return _fast_apply(x, cos, sin, positions, interleaved, inverse)
        return _fast_apply(
            x, cos, sin, positions, interleaved, inverse, mrope_section, mrope_interleaved
        )
    if cos is None or sin is None or positions is None:
        _missing_source("rope.apply" if out is None else "rope.apply.out", cos, sin, positions)
    mrope_section = _section("rope.apply" if out is None else "rope.apply.out", mrope_section)
    flags = _flags(interleaved, inverse, mrope_section, mrope_interleaved)
    if type(x) is not Tensor:  # a subclass such as DTensor
        _maybe_register_for(x)
    if out is not None:
        if type(out) is not Tensor or (
            _is_compiling() and (_dynamo_refuses_out or not out.is_contiguous())
        ):
            # DTensor cannot run an out= overload that returns nothing (it returns `out` from
            # out= ops), and Dynamo refuses any op called with a non-contiguous out= (e.g. a
            # KV-cache slot): the same values reach `out` through the out-of-place op and a copy.
            if torch.is_grad_enabled() and x.requires_grad:
                raise RuntimeError(
                    "rope.apply.out: functions with out=... arguments don't support automatic "
                    "differentiation, but one of the arguments requires grad"
                )
            out.copy_(_apply(x, cos, sin, positions, **flags))
            return out
        _apply_out(x, cos, sin, positions, out=out, **flags)
        return out
    if _autograd.transforms_active():
        return _autograd.Rotate.apply(
            x, cos, sin, positions, interleaved, inverse, mrope_section, mrope_interleaved
        )
    return _apply(x, cos, sin, positions, **flags)


def apply_(
    x: Tensor,
    cos: Optional[Tensor] = None,
    sin: Optional[Tensor] = None,
    positions: Optional[Tensor] = None,
    *,
    freqs: Optional[Tensor] = None,
    attention_factor: float = 1.0,
    cu_seqlens: Optional[Tensor] = None,
    seq_offsets: Optional[Tensor] = None,
    cp_size: int = 1,
    cp_rank: int = 0,
    interleaved: bool = True,
    inverse: bool = False,
    mrope_section: Optional[Sequence[int]] = None,
    mrope_interleaved: bool = False,
) -> Tensor:
    """Rotate ``x`` in place and return it. Every check runs before anything is written.
    ``freqs=`` and ``cu_seqlens=`` forms as :func:`apply`."""
    if (
        freqs is not None
        or cu_seqlens is not None
        or seq_offsets is not None
        or cp_size != 1
        or cp_rank != 0
        or attention_factor != 1.0
    ):
        return _apply_inplace_form(
            x,
            Form(cos, sin, positions, freqs, attention_factor, cu_seqlens, seq_offsets, cp_size,
                 cp_rank, interleaved, inverse, mrope_section, mrope_interleaved),
        )  # fmt: skip
    if (mrope_section is None or _typed_section(mrope_section)) and eager_fast_path(
        x, cos, sin, positions
    ):
        if mrope_section is None and not mrope_interleaved:
            _fast_apply_inplace(x, cos, sin, positions, interleaved, inverse)
        else:
            _fast_apply_inplace(
                x, cos, sin, positions, interleaved, inverse, mrope_section, mrope_interleaved
            )
        return x
    if cos is None or sin is None or positions is None:
        _missing_source("rope.apply_", cos, sin, positions)
    mrope_section = _section("rope.apply_", mrope_section)
    if type(x) is not Tensor:  # a subclass such as DTensor
        _maybe_register_for(x)
    if _autograd.transforms_active():
        return _autograd.rotate_inplace(
            x, cos, sin, positions, interleaved, inverse, mrope_section, mrope_interleaved
        )
    _apply_inplace(
        x, cos, sin, positions, **_flags(interleaved, inverse, mrope_section, mrope_interleaved)
    )
    return x


# ---- the frequency and packed-sequence forms ----------------------------------------------------


def _apply_form(x: Tensor, form: Form, out: Optional[Tensor]) -> Tensor:
    name = "rope.apply" if out is None else "rope.apply.out"
    suffix, args, kw = form.call(name)
    if out is None and form.fast(x, args=args):
        return _FAST_APPLY[suffix](x, *args, **kw)
    if type(x) is not Tensor:  # a subclass such as DTensor
        _maybe_register_for(x)
    if out is not None:
        if type(out) is not Tensor or (
            _is_compiling() and (_dynamo_refuses_out or not out.is_contiguous())
        ):
            if torch.is_grad_enabled() and x.requires_grad:
                raise RuntimeError(
                    f"rope.apply.{suffix}_out: functions with out=... arguments don't support "
                    "automatic differentiation, but one of the arguments requires grad"
                )
            out.copy_(_overload(_ops.apply, suffix)(x, *args, **kw))
            return out
        _overload(_ops.apply, suffix, out=True)(x, *args, out=out, **kw)
        return out
    if _autograd.transforms_active():
        return FormRotate.apply(x, suffix, *form_inputs(args, kw))
    return _overload(_ops.apply, suffix)(x, *args, **kw)


def _apply_inplace_form(x: Tensor, form: Form) -> Tensor:
    suffix, args, kw = form.call("rope.apply_")
    if form.fast(x, args=args):
        _FAST_APPLY_INPLACE[suffix](x, *args, **kw)
        return x
    if type(x) is not Tensor:
        _maybe_register_for(x)
    if _autograd.transforms_active():
        return form_rotate_inplace(x, suffix, *form_inputs(args, kw))
    _overload(_ops.apply_, suffix)(x, *args, **kw)
    return x


_ops = torch.ops.rope
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
