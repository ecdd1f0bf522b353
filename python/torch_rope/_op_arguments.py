# SPDX-License-Identifier: BSD-3-Clause
"""What every typed wrapper (ops.py, _kv_cache_ops.py, _rms_norm_ops.py, nn.py) shares: the one
gate of the eager fast path, and the op arguments made ready for the dispatcher."""

import numbers
from typing import List, Optional, Sequence

import torch
from torch import Tensor

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
    ``__torch_function__`` mode. The one gate of ops.py and nn.py."""
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


def require_sources(op: str, cos, sin, positions) -> None:
    """A ``TypeError`` naming the missing ones when the angle source (``cos`` and ``sin``) or the
    position source (``positions``) is None, as the rope ops' forms refuse a missing source; the
    op itself would raise a ``RuntimeError`` for the first None it meets. Called on the wrappers'
    slow paths only: the fast path takes tensors."""
    if cos is None or sin is None or positions is None:
        missing = [
            n for n, v in (("cos", cos), ("sin", sin), ("positions", positions)) if v is None
        ]
        raise TypeError(
            f"{op}: give the cos and sin tables and positions (tensors), got None for "
            + " and ".join(missing)
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
