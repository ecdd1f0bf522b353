# SPDX-License-Identifier: BSD-3-Clause
"""``torch.func`` support of the frequency and packed-sequence forms (python/torch_rope/_forms.py):
vmap rules for their raw overloads, and the autograd Functions the API switches to while functorch
transforms are active (as _functorch.py does for the tables and positions form)."""

import torch

from ._functorch import _batched_positions, _per_example, _to_front, _with_batch

# ---- the frequency and packed-sequence forms (python/torch_rope/_forms.py) ----------------------
# Raw overloads: the positions forms (apply.freqs, apply_.freqs, apply_qk.freqs) batch positions
# as the table forms do; the packed-sequence forms keep x's tokens on dim 0, so a batch dim goes
# after it ((T, N, ..., D): one more "head" dim, the same packed sequences). A batched angle
# source or cu_seqlens falls back to one call per example. torch.library.register_vmap refuses
# schemas with keyword-only tensors (seq_offsets), so those overloads' rules are registered through
# the helper register_vmap itself uses, where this torch has it.

_FORM_OVERLOADS = {
    (op, form): getattr(getattr(torch.ops.rope, op), form)
    for op in ("apply", "apply_", "apply_qk")
    for form in ("freqs", "varlen", "freqs_varlen")
}


def _form_op(op, form):
    return _FORM_OVERLOADS[(op, form)]


def _refuse_batched_offsets(op, kwargs):
    offsets = kwargs.get("seq_offsets")
    if offsets is not None and torch._C._functorch.is_batchedtensor(offsets):
        raise RuntimeError(
            f"{op}: vmap over seq_offsets is not supported; vmap over x (or call once per example)"
        )


def _vmap_apply_freqs(info, in_dims, x, freqs, positions, **kwargs):
    x_bdim, freqs_bdim, pos_bdim = in_dims
    op = _form_op("apply", "freqs")
    if freqs_bdim is not None:
        outs = _per_example(info, in_dims, lambda *a: op(*a, **kwargs), x, freqs, positions)
        return torch.stack(outs), 0
    if x_bdim is None and pos_bdim is None:
        return op(x, freqs, positions, **kwargs), None
    row_dims = x.dim() - 1 - (x_bdim is not None)
    xb = _with_batch(x, x_bdim, info.batch_size)
    pb = _batched_positions(
        "rope.apply.freqs", positions, pos_bdim, row_dims, kwargs.get("mrope_section")
    )
    return op(xb, freqs, pb, **kwargs), 0


def _vmap_apply_inplace_freqs(info, in_dims, x, freqs, positions, **kwargs):
    x_bdim, freqs_bdim, pos_bdim = in_dims
    op = _form_op("apply_", "freqs")
    if x_bdim is None and (pos_bdim is not None or freqs_bdim is not None):
        raise RuntimeError(
            "rope.apply_.freqs: vmap would write a different rotation of the same unbatched x "
            "for each example; make x batched too, or use rope.apply.freqs"
        )
    if freqs_bdim is not None:
        _per_example(info, in_dims, lambda *a: op(*a, **kwargs), x, freqs, positions)
        return None, None
    row_dims = x.dim() - 1 - (x_bdim is not None)
    pb = _batched_positions(
        "rope.apply_.freqs", positions, pos_bdim, row_dims, kwargs.get("mrope_section")
    )
    op(_to_front(x, x_bdim), freqs, pb, **kwargs)
    return None, None


def _vmap_apply_qk_freqs(info, in_dims, q, k, freqs, positions, **kwargs):
    q_bdim, k_bdim, freqs_bdim, pos_bdim = in_dims
    op = _form_op("apply_qk", "freqs")
    if freqs_bdim is not None:
        pairs = _per_example(info, in_dims, lambda *a: op(*a, **kwargs), q, k, freqs, positions)
        return (torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])), (0, 0)
    if pos_bdim is None:
        q_out, k_out = op(_to_front(q, q_bdim), _to_front(k, k_bdim), freqs, positions, **kwargs)
        return (q_out, k_out), (None if q_bdim is None else 0, None if k_bdim is None else 0)
    q_rows = q.dim() - 1 - (q_bdim is not None)
    k_rows = k.dim() - 1 - (k_bdim is not None)
    section = kwargs.get("mrope_section")
    if q_rows != k_rows:
        q_out, _ = _vmap_apply_freqs(info, (q_bdim, None, pos_bdim), q, freqs, positions, **kwargs)
        k_out, _ = _vmap_apply_freqs(info, (k_bdim, None, pos_bdim), k, freqs, positions, **kwargs)
        return (q_out, k_out), (0, 0)
    qb = _with_batch(q, q_bdim, info.batch_size)
    kb = _with_batch(k, k_bdim, info.batch_size)
    pb = _batched_positions("rope.apply_qk.freqs", positions, pos_bdim, q_rows, section)
    return op(qb, kb, freqs, pb, **kwargs), (0, 0)


def _behind_tokens(t, bdim):
    """A batched x (T, ..., D) of packed sequences with its batch dim right after the tokens."""
    return t if bdim is None else t.movedim(bdim, 1)


def _vmap_varlen(form):
    op = _form_op("apply", form)

    def rule(info, in_dims, x, *rest, **kwargs):
        _refuse_batched_offsets(f"rope.apply.{form}", kwargs)
        x_bdim = in_dims[0]
        if any(d is not None for d in in_dims[1:]):
            outs = _per_example(info, in_dims, lambda *a: op(*a, **kwargs), x, *rest)
            return torch.stack(outs), 0
        return op(_behind_tokens(x, x_bdim), *rest, **kwargs), (None if x_bdim is None else 1)

    return rule


def _vmap_inplace_varlen(form):
    op = _form_op("apply_", form)

    def rule(info, in_dims, x, *rest, **kwargs):
        _refuse_batched_offsets(f"rope.apply_.{form}", kwargs)
        x_bdim = in_dims[0]
        if any(d is not None for d in in_dims[1:]):
            if x_bdim is None:
                raise RuntimeError(
                    f"rope.apply_.{form}: vmap would write a different rotation of the same "
                    f"unbatched x for each example; make x batched too, or use rope.apply.{form}"
                )
            _per_example(info, in_dims, lambda *a: op(*a, **kwargs), x, *rest)
            return None, None
        op(_behind_tokens(x, x_bdim), *rest, **kwargs)
        return None, None

    return rule


def _vmap_qk_varlen(form):
    op = _form_op("apply_qk", form)

    def rule(info, in_dims, q, k, *rest, **kwargs):
        _refuse_batched_offsets(f"rope.apply_qk.{form}", kwargs)
        q_bdim, k_bdim = in_dims[:2]
        if any(d is not None for d in in_dims[2:]):
            pairs = _per_example(info, in_dims, lambda *a: op(*a, **kwargs), q, k, *rest)
            return (torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])), (
                0,
                0,
            )
        q_out, k_out = op(_behind_tokens(q, q_bdim), _behind_tokens(k, k_bdim), *rest, **kwargs)
        return (q_out, k_out), (None if q_bdim is None else 1, None if k_bdim is None else 1)

    return rule


def _register_vmap_with_kwarg_tensors(op, rule):
    """register_vmap's own registration, for a schema with keyword-only tensors (seq_offsets):
    the rule refuses a batched one itself. Skipped where this torch lacks the helper."""
    try:
        from torch._functorch.autograd_function import custom_function_call_vmap_helper
        from torch._functorch.pyfunctorch import retrieve_current_functorch_interpreter
    except ImportError:  # pragma: no cover (older torch: the raw ops then have no vmap rule)
        return

    def batched(keyset, *args, **kwargs):
        return custom_function_call_vmap_helper(
            retrieve_current_functorch_interpreter(), rule, op, *args, **kwargs
        )

    _VMAP_LIBRARY.impl(op._schema.name.split("::")[1] + "." + op._overloadname, batched,
                       "FuncTorchBatched", with_keyset=True)  # fmt: skip


if hasattr(torch.library, "register_vmap"):
    torch.library.register_vmap(_form_op("apply", "freqs"), _vmap_apply_freqs)
    torch.library.register_vmap(_form_op("apply_", "freqs"), _vmap_apply_inplace_freqs)
    torch.library.register_vmap(_form_op("apply_qk", "freqs"), _vmap_apply_qk_freqs)
    _VMAP_LIBRARY = torch.library.Library("rope", "IMPL")
    for _form in ("varlen", "freqs_varlen"):
        _register_vmap_with_kwarg_tensors(_form_op("apply", _form), _vmap_varlen(_form))
        _register_vmap_with_kwarg_tensors(_form_op("apply_", _form), _vmap_inplace_varlen(_form))
        _register_vmap_with_kwarg_tensors(_form_op("apply_qk", _form), _vmap_qk_varlen(_form))


# The autograd Functions of the forms, for the torch_rope API under functorch transforms. Their
# inputs: the rotated tensor(s), the form, the overload's static keywords, then every tensor the
# overload reads (seq_offsets or None first), so that functorch sees each one.


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
