# SPDX-License-Identifier: BSD-3-Clause
"""The typed wrapper of ``torch.ops.rope.apply_qk``: queries and keys rotated together (one kernel
launch on CUDA), in every form of the arguments of :func:`torch_rope.apply` (:mod:`.rotation`).
Re-exported by :mod:`torch_rope.ops` and :mod:`torch_rope`."""

from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor

from ..distributed import maybe_register_for as _maybe_register_for
from . import _autograd
from ._autograd import FormRotateQK, form_inputs
from ._native import _C
from .rotation import (
    FREQS,
    FREQS_VARLEN,
    VARLEN,
    Form,
    _flags,
    _missing_source,
    _overload,
    _section,
    _typed_section,
    eager_fast_path,
)

_apply_qk = torch.ops.rope.apply_qk.default
_fast_apply_qk = _C._apply_qk


def apply_qk(
    q: Tensor,
    k: Tensor,
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
) -> Tuple[Tensor, Tensor]:
    """Rotate queries and keys together (one kernel launch on CUDA).

    ``q`` and ``k`` may have different head counts (GQA/MQA); ``positions`` is broadcast against
    ``q.shape[:-1]`` and ``k.shape[:-1]`` separately. ``freqs=`` and ``cu_seqlens=`` forms as
    :func:`apply` (with packed sequences, q and k share their tokens on dim 0).
    """
    if (
        freqs is not None
        or cu_seqlens is not None
        or seq_offsets is not None
        or cp_size != 1
        or cp_rank != 0
        or attention_factor != 1.0
    ):
        return _apply_qk_form(
            q,
            k,
            Form(cos, sin, positions, freqs, attention_factor, cu_seqlens, seq_offsets, cp_size,
                 cp_rank, interleaved, inverse, mrope_section, mrope_interleaved),
        )  # fmt: skip
    if (mrope_section is None or _typed_section(mrope_section)) and eager_fast_path(
        q, k, cos, sin, positions
    ):
        if mrope_section is None and not mrope_interleaved:
            return _fast_apply_qk(q, k, cos, sin, positions, interleaved, inverse)
        return _fast_apply_qk(
            q, k, cos, sin, positions, interleaved, inverse, mrope_section, mrope_interleaved
        )
    if cos is None or sin is None or positions is None:
        _missing_source("rope.apply_qk", cos, sin, positions)
    mrope_section = _section("rope.apply_qk", mrope_section)
    if type(q) is not Tensor or type(k) is not Tensor:  # a subclass such as DTensor
        _maybe_register_for(q, k)
    if _autograd.transforms_active():
        return _autograd.RotateQK.apply(
            q, k, cos, sin, positions, interleaved, inverse, mrope_section, mrope_interleaved
        )
    return _apply_qk(
        q, k, cos, sin, positions, **_flags(interleaved, inverse, mrope_section, mrope_interleaved)
    )


def _apply_qk_form(q: Tensor, k: Tensor, form: Form) -> Tuple[Tensor, Tensor]:
    suffix, args, kw = form.call("rope.apply_qk")
    if form.fast(q, k, args=args):
        return _FAST_APPLY_QK[suffix](q, k, *args, **kw)
    if type(q) is not Tensor or type(k) is not Tensor:
        _maybe_register_for(q, k)
    if _autograd.transforms_active():
        return FormRotateQK.apply(q, k, suffix, *form_inputs(args, kw))
    return _overload(torch.ops.rope.apply_qk, suffix)(q, k, *args, **kw)


# The typed entry points of the eager fast path (csrc/python/bindings.cpp), by form.
_FAST_APPLY_QK = {
    FREQS: _C._apply_qk_freqs,
    VARLEN: _C._apply_qk_varlen,
    FREQS_VARLEN: _C._apply_qk_freqs_varlen,
}
