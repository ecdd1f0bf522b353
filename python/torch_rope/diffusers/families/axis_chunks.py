# SPDX-License-Identifier: BSD-3-Clause
"""Allegro: the head split in three chunks, one per axis, each rotated over halves by a table of
its own that the pipeline hands in.

``AllegroPipeline._prepare_rotary_positional_embeddings`` builds, once per generation, three
tables with ``get_3d_rotary_pos_embed_allegro``: axis ``a`` (frame, row, column) over ``c = D //
3`` features, halves (``[cos, cos]``), float32 angles at coordinates ``linspace(0, n - 1, n) /
s_a`` (``s_a``: the config's ``interpolation_scale_t/h/w``, 2.2 and 2 by default, so the
coordinates are fractional), and the integer grid ``(3, 1, S)`` of each token's index on each
axis. ``apply_rotary_emb_allegro(x, freqs_cis, positions)`` cuts q and k ``(B, H, S, D)`` into
``x.chunk(3, -1)`` and rotates chunk ``a`` by ``rotate_half`` over its ``c`` features with
``F.embedding(positions[a], cos_a)[:, None]``; the processor (``AllegroAttnProcessor2_0``)
calls it on self-attention only.

The op's multi-axis form (``mrope_section``) cannot say this in one table: its halves pair plane
``k`` with ``k + R / 2`` across the whole rotated width, where Allegro pairs ``k`` with ``k + c /
2`` inside each chunk. Two exact forms instead, both on unit-stride views of q and k, no copy:

* **positions from the patched pipeline** (:func:`allegro_positions`): one coordinate table of
  ``c / 2`` planes whose rows are the three axes' coordinates one after the other (frames, then
  rows, then columns), float64-built; a token's row on axis ``a`` is its grid index plus the
  axis' offset. q and k are viewed as ``(B, H, S, 3, c)`` and rotated in one call, rotary_dim
  ``c``, halves, positions ``(.., S, 3)``. Its rows are in range by construction.
* **a caller's own tables** (the transformer patched alone): one call per chunk on the chunk's
  slice view, with that axis' table (the first half of the caller's ``[cos, cos]``) and the
  caller's positions, so an index past an axis' table fails in the op as it does in
  ``F.embedding`` (one stacked table would read the next axis' rows silently instead).

Patched with its pipeline (``patch(pipeline)``), the pipeline's helper is an instance attribute
that builds the coordinate table on the transformer's :class:`..tables.Tables` (once per grid
and kept) and returns the rows.
"""

import functools
from types import SimpleNamespace

import torch
from torch import Tensor, nn

from ..._patching.record import PatchRecord
from ..._patching.self_check import probe
from ...ops import apply
from .. import self_check
from ..model_parts import attention_modules, device_of, require_patched
from ..processors import ProcessorPatcher, Swap
from ..rotate import carries_positions
from ..tables import Tables
from .caller_tables import _linspace

CALLER = "torch_rope.diffusers.patch"
ROTARY_ARGUMENTS = ("image_rotary_emb",)
THETA = 10000  # get_3d_rotary_pos_embed_allegro's default, which the pipeline keeps
HELPER = "_prepare_rotary_positional_embeddings"


def buildable(model: nn.Module) -> bool:
    """Whether the pipeline's RoPE exists for this head: three equal chunks of whole pairs
    (diffusers' helper asserts even chunks; chunks of unequal width do not broadcast)."""
    return model.config.attention_head_dim % 6 == 0


def make_tables(model: nn.Module, device) -> Tables:
    """One axis of ``c / 2`` frequencies ``THETA ** (-2 j / c)``, the same for all three axes."""
    c = model.config.attention_head_dim // 3
    inv_freq = float(THETA) ** (-torch.arange(0, c - c % 2, 2, dtype=torch.float64) / max(c, 1))
    return Tables(inv_freq, None, False, rows=1, device=device)


def _scales(config):
    return (
        config.interpolation_scale_t,
        config.interpolation_scale_h,
        config.interpolation_scale_w,
    )


def allegro_positions(tables, model, pipeline, batch_size, height, width, num_frames, device):
    """``AllegroPipeline._prepare_rotary_positional_embeddings`` once patched: the coordinates of
    its helper (``linspace(0, n - 1, n) / scale`` per axis) in float64, stacked into one table,
    and each token's row on each axis (grid index plus axis offset), ``(1, S)`` per axis as the
    pipeline's own positions; handed as both of the transformer's pair."""
    config = model.config
    step = pipeline.vae_scale_factor_spatial * config.patch_size
    sizes = (num_frames, height // step, width // step)
    scales = _scales(config)
    coordinates = [_linspace(0, n, n) / float(s) for n, s in zip(sizes, scales)]
    tables.coordinate_rows(("allegro", sizes, scales), [torch.cat(coordinates)])
    offsets = (0, sizes[0], sizes[0] + sizes[1])
    axes = [torch.arange(n, device=device) + o for n, o in zip(sizes, offsets)]
    grid = torch.cartesian_prod(*axes).reshape(-1, 3)
    rows = tuple(grid[:, a].reshape(1, -1) for a in range(3))
    return rows, rows


def _chunks(x: Tensor) -> int:
    if x.size(-1) % 3:
        raise ValueError(
            f"{CALLER}: Allegro's RoPE rotates three equal chunks of the head; head_dim "
            f"{x.size(-1)} is not a multiple of 3"
        )
    return x.size(-1) // 3


def allegro_apply(tables: Tables, x: Tensor, freqs_cis, positions) -> Tensor:
    """diffusers' ``apply_rotary_emb_allegro(x, freqs_cis, positions)`` by the op: ``freqs_cis``
    the rows :func:`allegro_positions` hands out, or a caller's three ``(cos, sin)`` tables with
    its positions. Math in float32 (float64 for float64 x), the result in x's dtype."""
    c = _chunks(x)
    if carries_positions(freqs_cis):
        # diffusers' F.embedding(...)[:, None]: positions (P0, .., S) broadcast as (P0, 1, .., S).
        rows = torch.stack(list(freqs_cis), -1).unsqueeze(1)
        view = x.unflatten(-1, (3, c))
        out = apply(view, tables.cos, tables.sin, rows, interleaved=False)
        return out.flatten(-2)
    parts = []
    for a, (cos, sin) in enumerate(freqs_cis):
        half = cos.size(-1) // 2
        cos = cos[:, :half].to(device=x.device, dtype=torch.float32)
        sin = sin[:, :half].to(device=x.device, dtype=torch.float32)
        rows = positions[a].unsqueeze(1)
        part = x[..., a * c : (a + 1) * c]
        parts.append(apply(part, cos, sin, rows, interleaved=False))
    return torch.cat(parts, dim=-1)


# --------------------------------------------------------------------- the pipeline
def _drop(owner, name) -> None:
    vars(owner).pop(name, None)


def patch_pipeline(pipeline, models, row, record: PatchRecord, patcher) -> bool:
    """Make the pipeline's helper hand the transformer rows of its coordinate table; False when
    the pipeline has no such helper or the head cannot carry the RoPE."""
    model = models[0]
    if not buildable(model) or not hasattr(type(pipeline), HELPER):
        return False
    record.on_undo(functools.partial(_drop, pipeline, HELPER))
    vars(pipeline)[HELPER] = functools.partial(
        allegro_positions, model.torch_rope_tables, model, pipeline
    )
    return True


# --------------------------------------------------------------------- the self-check
def _pipeline_rope(model, frames, rows, columns, device):
    """The pipeline helper's output for a latent grid, from diffusers' own table builder and the
    helper's own steps (without importing the pipeline module, which needs transformers)."""
    from diffusers.models.embeddings import get_3d_rotary_pos_embed_allegro

    freqs_t, freqs_h, freqs_w, grid_t, grid_h, grid_w = get_3d_rotary_pos_embed_allegro(
        embed_dim=model.config.attention_head_dim,
        crops_coords=((0, 0), (rows, columns)),
        grid_size=(rows, columns),
        temporal_size=frames,
        interpolation_scale=_scales(model.config),
        device=device,
    )
    grids = [g.to(dtype=torch.long) for g in (grid_t, grid_h, grid_w)]
    pos = torch.cartesian_prod(*grids).reshape(-1, 3).transpose(0, 1).reshape(3, 1, -1)
    return (freqs_t, freqs_h, freqs_w), tuple(pos.contiguous())


def _check(model: nn.Module, tables: Tables) -> None:
    from diffusers.models import embeddings

    device = tables.cos.device
    frames, rows, columns = 2, 3, 4
    freqs, positions = _pipeline_rope(model, frames, rows, columns, device)
    tokens, d = frames * rows * columns, model.config.attention_head_dim
    q = probe((1, 2, tokens, d), device, torch.float32)
    pipeline = SimpleNamespace(vae_scale_factor_spatial=1)
    step = model.config.patch_size
    ours = allegro_positions(
        tables, model, pipeline, 1, rows * step, columns * step, frames, device
    )
    name = type(model).__name__
    unpatched = functools.partial(embeddings.apply_rotary_emb_allegro, q, freqs, positions)
    self_check.check(
        model,
        f"{name}'s pipeline RoPE",
        unpatched,
        functools.partial(allegro_apply, tables, q, *ours),
    )
    self_check.check(
        model,
        f"{name}'s caller tables",
        unpatched,
        functools.partial(allegro_apply, tables, q, freqs, positions),
    )


def patch(model: nn.Module, row, record: PatchRecord, patcher: ProcessorPatcher, options) -> None:
    from diffusers.models import embeddings

    tables = make_tables(model, device_of(model))
    if buildable(model):
        _check(model, tables)
    record.set(model, "torch_rope_tables", tables)
    swaps = {
        "apply_rotary_emb_allegro": Swap(
            functools.partial(allegro_apply, tables), embeddings.apply_rotary_emb_allegro
        )
    }
    patched = [m for m in attention_modules(model) if patcher.patch_processor(m, swaps)]
    require_patched(model, patched, ROTARY_ARGUMENTS)
