# SPDX-License-Identifier: BSD-3-Clause
"""``torch.func`` support of the raw ops: their vmap rules, for every form (the tables and
positions form, and the frequency and packed-sequence overloads).

The ops' C++ autograd (csrc/rope_autograd.cpp) serves eager, ``torch.compile`` and LibTorch. A C++
``autograd::Function`` cannot take part in functorch's ``grad``/``jvp``, so the raw
``torch.ops.rope.*`` refuse those transforms with an error pointing to the ``torch_rope`` API,
whose Python autograd Functions (:mod:`torch_rope.ops._autograd`) carry ``backward``, ``jvp`` and
a vmap rule generated from the rules here. Registered when this module is imported (the API's
Functions import it).
"""

import torch

_apply = torch.ops.rope.apply.default
_apply_inplace = torch.ops.rope.apply_.default
_apply_qk = torch.ops.rope.apply_qk.default


# ---- vmap rules for the raw ops -----------------------------------------------------------------
# rope.apply.out has none: torch.library.register_vmap refuses keyword-only tensors (out), and a
# vmapped out= buffer has no use the out-of-place op does not serve.
# A vmapped call sees each tensor without its batch dim; the rule moves that dim to the front and
# makes positions broadcast against it: positions align with x.shape[:-1] from the right, so a
# batched positions (N, *p) becomes (N, 1, ..., 1, *p) against x (N, *rows, head_dim).


def _to_front(t, bdim):
    return t if bdim is None else t.movedim(bdim, 0)


def _batched_positions(op, positions, pos_bdim, row_dims, mrope_section=None):
    """Batched positions (N, *p) as (N, 1, ..., 1, *p). With multi-axis positions the trailing
    axis dim stays last and does not count against x's row dims."""
    if pos_bdim is None:
        return positions
    p = positions.movedim(pos_bdim, 0)
    missing = row_dims - (p.dim() - 1 - (mrope_section is not None))
    if missing < 0:
        raise RuntimeError(
            f"{op}: positions of shape {list(p.shape[1:])} (per vmapped example) cannot be "
            f"broadcast to x.shape[:-1] with {row_dims} dims"
        )
    return p.reshape(p.shape[:1] + (1,) * missing + p.shape[1:])


def _with_batch(t, bdim, batch_size):
    """``t`` with its batch dim in front, expanded (no copy) when it has none."""
    if bdim is not None:
        return t.movedim(bdim, 0)
    return t.expand((batch_size,) + tuple(t.shape))


def _per_example(info, in_dims, fn, *args):
    """Fallback for batched cos/sin: one call per example (tables are rarely vmapped)."""
    results = []
    for i in range(info.batch_size):
        results.append(fn(*(a if d is None else a.select(d, i) for a, d in zip(args, in_dims))))
    return results


def _kw(interleaved, inverse, mrope_section, mrope_interleaved):
    kw = dict(interleaved=interleaved, inverse=inverse)
    if mrope_section is not None or mrope_interleaved:
        kw.update(mrope_section=mrope_section, mrope_interleaved=mrope_interleaved)
    return kw


def _vmap_apply(
    info,
    in_dims,
    x,
    cos,
    sin,
    positions,
    *,
    interleaved=True,
    inverse=False,
    mrope_section=None,
    mrope_interleaved=False,
):
    x_bdim, cos_bdim, sin_bdim, pos_bdim = in_dims
    kw = _kw(interleaved, inverse, mrope_section, mrope_interleaved)
    if cos_bdim is not None or sin_bdim is not None:
        outs = _per_example(info, in_dims, lambda *a: _apply(*a, **kw), x, cos, sin, positions)
        return torch.stack(outs), 0
    if x_bdim is None and pos_bdim is None:
        return _apply(x, cos, sin, positions, **kw), None
    row_dims = x.dim() - 1 - (x_bdim is not None)
    xb = _with_batch(x, x_bdim, info.batch_size)
    pb = _batched_positions("rope.apply", positions, pos_bdim, row_dims, mrope_section)
    return _apply(xb, cos, sin, pb, **kw), 0


def _vmap_apply_inplace(
    info,
    in_dims,
    x,
    cos,
    sin,
    positions,
    *,
    interleaved=True,
    inverse=False,
    mrope_section=None,
    mrope_interleaved=False,
):
    x_bdim, cos_bdim, sin_bdim, pos_bdim = in_dims
    kw = _kw(interleaved, inverse, mrope_section, mrope_interleaved)
    if x_bdim is None and (pos_bdim is not None or cos_bdim is not None or sin_bdim is not None):
        raise RuntimeError(
            "rope.apply_: vmap would write a different rotation of the same unbatched x for "
            "each example; make x batched too, or use rope.apply"
        )
    if cos_bdim is not None or sin_bdim is not None:
        _per_example(info, in_dims, lambda *a: _apply_inplace(*a, **kw), x, cos, sin, positions)
        return None, None
    row_dims = x.dim() - 1 - (x_bdim is not None)
    xb = _to_front(x, x_bdim)
    pb = _batched_positions("rope.apply_", positions, pos_bdim, row_dims, mrope_section)
    _apply_inplace(xb, cos, sin, pb, **kw)
    return None, None


def _vmap_apply_qk(
    info,
    in_dims,
    q,
    k,
    cos,
    sin,
    positions,
    *,
    interleaved=True,
    inverse=False,
    mrope_section=None,
    mrope_interleaved=False,
):
    q_bdim, k_bdim, cos_bdim, sin_bdim, pos_bdim = in_dims
    kw = _kw(interleaved, inverse, mrope_section, mrope_interleaved)
    if cos_bdim is not None or sin_bdim is not None:
        pairs = _per_example(
            info, in_dims, lambda *a: _apply_qk(*a, **kw), q, k, cos, sin, positions
        )
        return (torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])), (0, 0)
    if pos_bdim is None:
        # Each of q, k keeps its own batching; positions broadcast to both as they are.
        qb, kb = _to_front(q, q_bdim), _to_front(k, k_bdim)
        q_out, k_out = _apply_qk(qb, kb, cos, sin, positions, **kw)
        return (q_out, k_out), (None if q_bdim is None else 0, None if k_bdim is None else 0)
    q_rows = q.dim() - 1 - (q_bdim is not None)
    k_rows = k.dim() - 1 - (k_bdim is not None)
    if q_rows != k_rows:
        # Positions cannot broadcast one way to both: rotate each on its own.
        q_out, _ = _vmap_apply(info, (q_bdim, None, None, pos_bdim), q, cos, sin, positions, **kw)
        k_out, _ = _vmap_apply(info, (k_bdim, None, None, pos_bdim), k, cos, sin, positions, **kw)
        return (q_out, k_out), (0, 0)
    qb = _with_batch(q, q_bdim, info.batch_size)
    kb = _with_batch(k, k_bdim, info.batch_size)
    pb = _batched_positions("rope.apply_qk", positions, pos_bdim, q_rows, mrope_section)
    return _apply_qk(qb, kb, cos, sin, pb, **kw), (0, 0)


# torch.library.register_vmap is torch >= 2.5. On torch 2.4 the raw ops have no vmap rule (vmap of
# torch.ops.rope.* raises); the torch_rope API still vmaps through the Functions below.
if hasattr(torch.library, "register_vmap"):
    torch.library.register_vmap("rope::apply", _vmap_apply)
    torch.library.register_vmap("rope::apply_", _vmap_apply_inplace)
    torch.library.register_vmap("rope::apply_qk", _vmap_apply_qk)


# ---- vmap rules for the raw overloads of the frequency and packed-sequence forms ----------------
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
