# SPDX-License-Identifier: BSD-3-Clause
"""RoPE gathered from per-axis complex tables by integer ids: Z-Image and its controlnet, Bria
FIBO 2, Lumina 2.

The models build, once, complex tables per axis (``axes_dims[a] / 2`` frequencies
``theta ** (-2 j / axes_dims[a])``, float64 angles, positions ``0 .. axes_lens[a] - 1``) and
gather them every forward at the tokens' ids ``(N, 3)``: Z-Image and Bria FIBO 2 through a plain
object, ``rope_embedder(ids)`` (not a module), Lumina 2 through its RoPE module's
``_get_freqs_cis(position_ids)`` (``(B, S, 3)``: caption tokens along the first axis, image
tokens at the caption's end and their row and column). The model pads each sample's freqs to
the batch's longest with complex zeros. The processors multiply ``(B, S, H, D)`` q and k, as
complex pairs, by the freqs: a function defined inside ``__call__`` (Z-Image, Bria FIBO 2), or
diffusers' ``apply_rotary_emb(q, freqs, use_real=False)`` (Lumina 2).

Patched, on this model instance only: the gather returns the ids' table rows (int64, same shape
but the last dim: the 3 axes instead of the ``D / 2`` frequencies); the padding becomes row 0,
so a padded token is rotated by the angle 0 where diffusers zeroed it, a token that attention
masks out and whose output the model drops either way. The processors rotate with
:func:`nested_apply` / :func:`..rotate.embeddings_apply`.
"""

import functools

import torch
from torch import Tensor, nn

from ..._patching.record import PatchRecord
from ..._patching.self_check import probe
from ...ops import apply
from ...vision import axes_inv_freq
from .. import self_check
from ..model_parts import attention_modules, device_of, require_patched
from ..processors import ProcessorPatcher, Swap, library_function
from ..rotate import carries_positions, embeddings_apply, rotate_token_tables
from ..tables import Tables, integer_rows

CALLER = "torch_rope.diffusers.patch"
ROTARY_ARGUMENTS = ("freqs_cis", "image_rotary_emb")
NAME = "apply_rotary_emb"


def _restore(owner, name, value) -> None:
    setattr(owner, name, value)


class RowsEmbedder:
    """Z-Image's ``rope_embedder`` once patched: ``embedder(ids)`` -> the ids' table rows."""

    def __init__(self, tables: Tables, original) -> None:
        self.tables = tables
        self.original = original
        self.axes_dims = original.axes_dims
        self.axes_lens = original.axes_lens
        self.theta = original.theta

    def __call__(self, ids: Tensor) -> Tensor:
        return integer_rows(self.tables, ids)


def gather_rows(rope: nn.Module, ids: Tensor) -> Tensor:
    """Lumina 2's ``_get_freqs_cis(position_ids)`` once patched."""
    return integer_rows(rope.torch_rope, ids.long())


def nested_apply(tables: Tables, x_in: Tensor, freqs_cis: Tensor) -> Tensor:
    """Z-Image's and Bria FIBO 2's ``apply_rotary_emb(x, freqs_cis)``: x ``(B, S, H, D)``,
    rows ``(B, S, 3)`` (or ``(S, 3)``)."""
    if not carries_positions(freqs_cis):
        return rotate_token_tables(x_in, freqs_cis, None, True, "bshd")
    return apply(
        x_in,
        tables.cos,
        tables.sin,
        freqs_cis.unsqueeze(-2),
        interleaved=True,
        mrope_section=tables.section,
    )


def _unpatched_nested(original, embedder, q, ids):
    return original(q, embedder(ids)[None])


def _patched_nested(tables, q, ids):
    return nested_apply(tables, q, integer_rows(tables, ids)[None])


def _unpatched_lumina(original, rope, q, ids):
    return original(q, type(rope)._get_freqs_cis(rope, ids), use_real=False)


def _patched_lumina(tables, q, ids):
    return embeddings_apply(tables, q, integer_rows(tables, ids.long()), use_real=False)


def patch(model: nn.Module, row, record: PatchRecord, patcher: ProcessorPatcher, options) -> None:
    from diffusers.models import embeddings

    device = device_of(model)
    lumina = row.variant == "module"
    rope = getattr(model, row.rope[0], None)
    if rope is None:
        raise NotImplementedError(
            f"{CALLER}: this {type(model).__name__} has no {row.rope[0]} (a Z-Image controlnet "
            "gets its transformer's with from_transformer); not patching"
        )
    dims = list(rope.axes_dim if lumina else rope.axes_dims)
    inv_freq, section = axes_inv_freq(dims, float(rope.theta))
    tables = Tables(inv_freq, section, True, rows=max(rope.axes_lens), device=device)
    generator = torch.Generator().manual_seed(0)
    ids = [torch.randint(0, min(n, 9), (10,), generator=generator) for n in rope.axes_lens]
    ids = torch.stack(ids, -1).to(device)
    q = probe((1, 10, 2, sum(dims)), device, torch.float32)
    if lumina:
        swaps = {
            NAME: Swap(functools.partial(embeddings_apply, tables), embeddings.apply_rotary_emb)
        }
        self_check.check(
            rope,
            type(rope).__name__,
            functools.partial(_unpatched_lumina, embeddings.apply_rotary_emb, rope, q, ids[None]),
            functools.partial(_patched_lumina, tables, q, ids[None]),
        )
        record.set(rope, "torch_rope", tables)
        record.set(rope, "_get_freqs_cis", functools.partial(gather_rows, rope))
    else:
        calls = [type(m.processor).__call__ for m in attention_modules(model)]
        original = next((f for c in calls if (f := library_function(c, NAME))), None)
        if original is None:
            raise NotImplementedError(
                f"{CALLER}: no processor of this {type(model).__name__} defines {NAME}"
            )
        swaps = {NAME: Swap(functools.partial(nested_apply, tables))}
        self_check.check(
            model,
            type(rope).__name__,
            functools.partial(_unpatched_nested, original, rope, q, ids),
            functools.partial(_patched_nested, tables, q, ids),
        )
        record.set(model, "torch_rope_tables", tables)  # on the model: its embedder is no module
        setattr(model, row.rope[0], RowsEmbedder(tables, rope))
        record.on_undo(functools.partial(_restore, model, row.rope[0], rope))
    patched = [m for m in attention_modules(model) if patcher.patch_processor(m, swaps)]
    require_patched(model, patched, ROTARY_ARGUMENTS)
