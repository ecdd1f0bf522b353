# SPDX-License-Identifier: BSD-3-Clause
"""The autograd Functions that the ``torch_rope`` API switches to while functorch transforms are
active, for every form: each carries ``backward``, ``jvp`` (RoPE is linear in x, so the tangent is
the same rotation of the tangent) and a vmap rule generated from the raw ops' own
(:mod:`torch_rope._functorch`). ``cos``, ``sin`` and ``positions`` (``freqs``, ``cu_seqlens``,
``seq_offsets``) are not differentiable: their gradients and tangents are ignored (zero).
"""

import torch

from .._functorch import _apply, _apply_qk, _form_op, _kw


def transforms_active() -> bool:
    """Whether a functorch transform (grad, jvp, vmap, ...) is active around this call.

    Never true while Dynamo traces: it cannot trace a custom jvp, and compiled code keeps the C++
    autograd path.
    """
    return not torch.compiler.is_compiling() and torch._C._are_functorch_transforms_active()


# ---- the tables and positions form ------------------------------------------------------------


def _save(ctx, inputs, first_rotated):
    cos, sin, positions, interleaved, inverse, mrope_section, mrope_interleaved = inputs[
        first_rotated:
    ]
    ctx.save_for_backward(cos, sin, positions)
    ctx.save_for_forward(cos, sin, positions)
    ctx.interleaved = interleaved
    ctx.inverse = inverse
    ctx.mrope = (mrope_section, mrope_interleaved)


def _rotate(ctx, t, *, back):
    """``t`` rotated like the forward (``back=False``) or by its transpose (``back=True``)."""
    if t is None:
        return None
    cos, sin, positions = ctx.saved_tensors
    return Rotate.apply(t, cos, sin, positions, ctx.interleaved, ctx.inverse != back, *ctx.mrope)


class Rotate(torch.autograd.Function):
    """rope.apply with a backward, a jvp and a generated vmap rule."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, cos, sin, positions, interleaved, inverse, mrope_section, mrope_interleaved):
        kw = _kw(interleaved, inverse, mrope_section, mrope_interleaved)
        return _apply(x, cos, sin, positions, **kw)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _save(ctx, inputs, 1)

    @staticmethod
    def backward(ctx, grad):
        return _rotate(ctx, grad, back=True), None, None, None, None, None, None, None

    @staticmethod
    def jvp(ctx, x_t, *_):
        return _rotate(ctx, x_t, back=False)


def rotate_inplace(x, cos, sin, positions, interleaved, inverse, mrope_section, mrope_interleaved):
    """rope.apply_ under a functorch transform: the out-of-place rotation copied into x.

    Not an autograd.Function with mark_dirty: functorch's generated vmap rule cannot return a
    dirtied input (torch raises "Some elements marked as dirty ... were not returned"), while
    copy_ has its own grad, jvp and batching rules, and Rotate supplies the rotation's."""
    return x.copy_(
        Rotate.apply(x, cos, sin, positions, interleaved, inverse, mrope_section, mrope_interleaved)
    )


class RotateQK(torch.autograd.Function):
    """rope.apply_qk with a backward, a jvp and a generated vmap rule."""

    generate_vmap_rule = True

    @staticmethod
    def forward(q, k, cos, sin, positions, interleaved, inverse, mrope_section, mrope_interleaved):
        kw = _kw(interleaved, inverse, mrope_section, mrope_interleaved)
        return _apply_qk(q, k, cos, sin, positions, **kw)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _save(ctx, inputs, 2)

    @staticmethod
    def backward(ctx, grad_q, grad_k):
        return (
            _rotate(ctx, grad_q, back=True),
            _rotate(ctx, grad_k, back=True),
            None,
            None,
            None,
            None,
            None,
            None,
            None,
        )

    @staticmethod
    def jvp(ctx, q_t, k_t, *_):
        return _rotate(ctx, q_t, back=False), _rotate(ctx, k_t, back=False)


# ---- the frequency and packed-sequence forms ----------------------------------------------------
# Their inputs: the rotated tensor(s), the form, the overload's static keywords, then every
# tensor the overload reads (seq_offsets or None first), so that functorch sees each one.


def form_inputs(args, kw):
    """(keywords without seq_offsets, seq_offsets, *tensors) of an overload call."""
    kw = dict(kw)
    offsets = kw.pop("seq_offsets", None)
    return (kw, offsets) + tuple(args)


def _form_kwargs(kw, offsets):
    if offsets is None:
        return kw
    return dict(kw, seq_offsets=offsets)


def _save_form(ctx, form, kw, offsets, tensors):
    ctx.form = form
    ctx.kw = kw
    ctx.num_tensors = len(tensors)
    ctx.save_for_backward(offsets, *tensors)
    ctx.save_for_forward(offsets, *tensors)


def _rotate_form(ctx, t, *, back):
    if t is None:
        return None
    offsets, *tensors = ctx.saved_tensors
    return FormRotate.apply(t, ctx.form, _flipped(ctx.kw, back), offsets, *tensors)


def _flipped(kw, flip):
    if not flip:
        return kw
    kw = dict(kw)
    kw["inverse"] = not kw.get("inverse", False)
    kw.setdefault("interleaved", True)
    return kw


class FormRotate(torch.autograd.Function):
    """rope.apply.<form> with a backward, a jvp and a generated vmap rule."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, form, kw, offsets, *tensors):
        return _form_op("apply", form)(x, *tensors, **_form_kwargs(kw, offsets))

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, form, kw, offsets, *tensors = inputs
        _save_form(ctx, form, kw, offsets, tensors)

    @staticmethod
    def backward(ctx, grad):
        return (_rotate_form(ctx, grad, back=True), None, None, None) + (None,) * ctx.num_tensors

    @staticmethod
    def jvp(ctx, x_t, *_):
        return _rotate_form(ctx, x_t, back=False)


def form_rotate_inplace(x, form, kw, offsets, *tensors):
    """rope.apply_.<form> under a functorch transform: as rotate_inplace, the out-of-place
    rotation copied into x."""
    return x.copy_(FormRotate.apply(x, form, kw, offsets, *tensors))


class FormRotateQK(torch.autograd.Function):
    """rope.apply_qk.<form> with a backward, a jvp and a generated vmap rule."""

    generate_vmap_rule = True

    @staticmethod
    def forward(q, k, form, kw, offsets, *tensors):
        return _form_op("apply_qk", form)(q, k, *tensors, **_form_kwargs(kw, offsets))

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, _, form, kw, offsets, *tensors = inputs
        _save_form(ctx, form, kw, offsets, tensors)

    @staticmethod
    def backward(ctx, grad_q, grad_k):
        return (
            _rotate_form(ctx, grad_q, back=True),
            _rotate_form(ctx, grad_k, back=True),
            None,
            None,
            None,
        ) + (None,) * ctx.num_tensors

    @staticmethod
    def jvp(ctx, q_t, k_t, *_):
        return _rotate_form(ctx, q_t, back=False), _rotate_form(ctx, k_t, back=False)
