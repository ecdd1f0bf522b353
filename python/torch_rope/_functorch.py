# SPDX-License-Identifier: BSD-3-Clause
"""``torch.func`` support: vmap rules for the raw ops, and the autograd Functions that the
``torch_rope`` API switches to while functorch transforms are active.

The ops' C++ autograd (csrc/rope_autograd.cpp) serves eager, ``torch.compile`` and LibTorch. A C++
``autograd::Function`` cannot take part in functorch's ``grad``/``jvp``, so the raw
``torch.ops.rope.*`` refuse those transforms with an error pointing here; the Python functions
below carry ``backward``, ``jvp`` (RoPE is linear in x, so the tangent is the same rotation of the
tangent) and a vmap rule generated from the ops' own vmap rules. ``cos``, ``sin`` and
``positions`` are not differentiable: their gradients and tangents are ignored (zero).
"""

import torch

_apply = torch.ops.rope.apply.default
_apply_inplace = torch.ops.rope.apply_.default
_apply_qk = torch.ops.rope.apply_qk.default


def transforms_active() -> bool:
    """Whether a functorch transform (grad, jvp, vmap, ...) is active around this call.

    Never true while Dynamo traces: it cannot trace a custom jvp, and compiled code keeps the C++
    autograd path.
    """
    return not torch.compiler.is_compiling() and torch._C._are_functorch_transforms_active()


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


# ---- autograd Functions for the torch_rope API under functorch -----------------------------------


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
