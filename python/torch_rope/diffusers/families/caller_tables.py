# SPDX-License-Identifier: BSD-3-Clause
"""Models whose pipeline builds the RoPE tables and hands them in: CogVideoX 1.0 / 1.5, ConsisID,
HunyuanDiT and its controlnet, Stable Audio Open; and EasyAnimate, whose RoPE module builds
CogVideoX's tables over a crop of its own base grid.

The transformer takes cos/sin from its caller (``image_rotary_emb``, ``rotary_embedding``) and
its processors call diffusers' ``apply_rotary_emb`` on q and k ``(B, H, S, D)`` (CogVideoX: the
image part; Stable Audio: the first half of the head, halves). The pipeline builds them once per
generation, with float32 angles, from coordinates that are fractional except at the base
resolution:

* CogVideoX 1.0, ConsisID (``_prepare_rotary_positional_embeddings``): (frame, row, column) over
  ``D / 4, 3 D / 8, 3 D / 8`` features, the rows and columns a ``linspace`` over the crop of a
  base grid (``get_resize_crop_region_for_grid``); CogVideoX 1.5 (``patch_size_t``): integer
  aranges;
* HunyuanDiT (inline in ``__call__``: ``get_2d_rotary_pos_embed``): (column, row) over ``D / 2``
  features each, a ``linspace`` over the crop of a 512-pixel base grid: 0, 0.5, 1, ... at the
  default 1024 pixels;
* Stable Audio (inline: ``get_1d_rotary_pos_embed``): 0 .. S - 1 over half the head, halves;
* EasyAnimate: CogVideoX 1.0's tables over a crop of a 60 x 90 / patch base grid, built every
  forward by its RoPE module.

Patched, on this transformer only: the processors rotate with :func:`..rotate.embeddings_apply`
(:func:`stable_audio_apply`), which takes either positions into the transformer's
:class:`..tables.Tables` (``torch_rope_tables``) or cos/sin from a caller, rotated by the op one
row per token, exactly as diffusers would. Patched with its pipeline (``patch(pipeline)``), the
pipeline hands positions instead: its RoPE helper (CogVideoX, ConsisID: the method, as an
instance attribute; HunyuanDiT, Stable Audio: the function its ``__call__`` calls, through a
per-instance subclass whose ``__call__`` is rebuilt) builds coordinate tables in float64 from the
same coordinates, once per resolution, and returns the integer grid indices. EasyAnimate's RoPE
module does that itself once patched.
"""

import functools
import sys

import torch
from torch import Tensor, nn

from ..._patching.record import PatchRecord, bind
from ..._patching.self_check import probe
from ...ops import apply
from .. import self_check
from ..model_parts import attention_modules, device_of, require_patched
from ..processors import ProcessorPatcher, Swap
from ..rotate import carries_positions, embeddings_apply, rotate_token_tables
from ..tables import Tables

CALLER = "torch_rope.diffusers.patch"
ROTARY_ARGUMENTS = ("image_rotary_emb", "rotary_emb")
THETA = 10000.0  # what the pipelines' helpers use


def _frequencies(dim: int) -> Tensor:
    return THETA ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def make_tables(model: nn.Module, variant: str, device) -> Tables:
    """The transformer's tables: CogVideoX's three axes, HunyuanDiT's (column, row), Stable
    Audio's one axis over half the head."""
    config = model.config
    if variant in ("cogvideox", "easyanimate"):
        d = config.attention_head_dim
        dims = [n - n % 2 for n in (d // 4, d // 8 * 3, d // 8 * 3)]  # whole pairs: buildable()
        inv_freq = torch.cat([_frequencies(n) for n in dims])
        return Tables(inv_freq, [n // 2 for n in dims], True, rows=1, device=device)
    if variant == "hunyuandit":
        d = model.inner_dim // model.num_heads
        inv_freq = torch.cat([_frequencies(d // 2)] * 2)
        return Tables(inv_freq, [d // 4, d // 4], True, rows=1, device=device)
    rotary = config.attention_head_dim // 2
    return Tables(_frequencies(rotary), None, False, rows=1024, device=device)


# --------------------------------------------------------------------- coordinates, float64
def _linspace(start: float, stop: float, n: int) -> Tensor:
    """diffusers' crop coordinates ``linspace(start, stop * (n - 1) / n, n)``, in float64."""
    return torch.linspace(float(start), float(stop) * (n - 1) / n, n, dtype=torch.float64)


def _grid_rows(sizes, device) -> Tensor:
    axes = [torch.arange(n, device=device) for n in sizes]
    return torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, len(sizes))


def cogvideox_positions(tables: Tables, model, pipeline, height, width, num_frames, device):
    """CogVideoX's and ConsisID's ``_prepare_rotary_positional_embeddings`` once patched."""
    config = model.config
    p, p_t = config.patch_size, getattr(config, "patch_size_t", None)
    rows = height // (pipeline.vae_scale_factor_spatial * p)
    columns = width // (pipeline.vae_scale_factor_spatial * p)
    base_w, base_h = config.sample_width // p, config.sample_height // p
    if p_t is None:
        crop = sys.modules[type(pipeline).__module__].get_resize_crop_region_for_grid(
            (rows, columns), base_w, base_h
        )
        frames = num_frames
        coordinates = [
            _linspace(0, frames, frames),
            _linspace(crop[0][0], crop[1][0], rows),
            _linspace(crop[0][1], crop[1][1], columns),
        ]
        key = ("cogvideox", frames, rows, columns, crop)
    else:
        frames = (num_frames + p_t - 1) // p_t
        coordinates = [torch.arange(n, dtype=torch.float64) for n in (frames, rows, columns)]
        key = ("cogvideox1.5", frames, rows, columns)
    tables.coordinate_rows(key, coordinates)
    positions = _grid_rows((frames, rows, columns), device)
    return positions, positions


def easyanimate_forward(rope: nn.Module, hidden_states: Tensor):
    """EasyAnimate's RoPE module's forward once patched: its crop of the 60 x 90 base grid (its
    own arithmetic), as coordinate tables; the grid indices."""
    _, _, frames, height, width = hidden_states.shape
    rows, columns = height // rope.patch_size, width // rope.patch_size
    crop = rope.get_resize_crop_region_for_grid(
        (rows, columns), 90 // rope.patch_size, 60 // rope.patch_size
    )
    coordinates = [
        _linspace(0, frames, frames),
        _linspace(crop[0][0], crop[1][0], rows),
        _linspace(crop[0][1], crop[1][1], columns),
    ]
    tables = rope.torch_rope
    if not torch.compiler.is_compiling():
        tables.coordinate_rows(("easyanimate", frames, rows, columns, crop), coordinates)
    positions = _grid_rows((frames, rows, columns), hidden_states.device)
    return positions, positions


def hunyuandit_positions(
    tables: Tables, embed_dim, crops_coords, grid_size, use_real=True, device=None, output_type="pt"
):
    """HunyuanDiT's pipelines' ``get_2d_rotary_pos_embed`` once patched: (column, row) grid
    indices into coordinate tables of its crop."""
    (top, left), (bottom, right) = crops_coords
    rows, columns = grid_size
    tables.coordinate_rows(
        ("hunyuandit", tuple(map(tuple, crops_coords)), rows, columns),
        [_linspace(left, right, columns), _linspace(top, bottom, rows)],
    )
    grid = _grid_rows((rows, columns), device).flip(-1)  # (column, row) per token, row-major
    return grid, grid


def stable_audio_positions(tables: Tables, dim, pos, *args, **kwargs):
    """Stable Audio's pipeline's ``get_1d_rotary_pos_embed(dim, length, use_real=True,
    repeat_interleave_real=False)`` once patched: the rows, widened to ``dim`` (its processor
    reads the rotated width from their last dim)."""
    length = int(pos)
    rows = torch.arange(length, device=tables.cos.device) + tables.cover(0, length - 1)
    rows = rows[:, None].expand(length, dim)
    return rows, rows


def stable_audio_apply(
    tables: Tables, x, freqs_cis, use_real=True, use_real_unbind_dim=-1, sequence_dim=2
):
    """Stable Audio's call of ``apply_rotary_emb`` on the first half of the head: positions
    widened to the rotated width (:func:`stable_audio_positions`), or a caller's cos/sin."""
    if not carries_positions(freqs_cis):
        return rotate_token_tables(x, freqs_cis[0], freqs_cis[1], use_real_unbind_dim == -1, "bhsd")
    rows = freqs_cis[0][..., 0]
    return apply(x, tables.cos, tables.sin, rows, interleaved=False)


# --------------------------------------------------------------------- the pipeline
def _restore_class(owner, cls, installed) -> None:
    if type(owner) is installed:
        owner.__class__ = cls


def _drop(owner, name) -> None:
    vars(owner).pop(name, None)


class TablesGroup:
    """The tables of every model of a pipeline that the pipeline's RoPE feeds (a HunyuanDiT
    transformer and its controlnets): coordinates set on one are set on all, so the positions
    the pipeline hands out are rows of each."""

    def __init__(self, tables) -> None:
        self.tables = list(tables)
        self.cos = self.tables[0].cos

    def coordinate_rows(self, key, coordinates) -> None:
        for tables in self.tables:
            tables.coordinate_rows(key, coordinates)

    def cover(self, low: int, high: int) -> int:
        origins = {tables.cover(low, high) for tables in self.tables}
        if len(origins) != 1:
            raise RuntimeError(f"{CALLER}: the pipeline's models' tables disagree on the origin")
        return origins.pop()


def patch_pipeline(pipeline, models, row, record: PatchRecord, patcher) -> bool:
    """Make ``pipeline`` hand ``models`` (its transformer and the controlnets the same RoPE
    feeds) positions into their tables; False when this pipeline has no RoPE helper patch knows
    (the models then rotate the pipeline's own cos/sin)."""
    model = models[0]
    tables = TablesGroup(m.torch_rope_tables for m in models)
    if not all(buildable(m, row.variant) for m in models):
        return False
    if row.variant == "cogvideox":
        if not hasattr(type(pipeline), "_prepare_rotary_positional_embeddings"):
            return False
        record.on_undo(functools.partial(_drop, pipeline, "_prepare_rotary_positional_embeddings"))
        vars(pipeline)["_prepare_rotary_positional_embeddings"] = functools.partial(
            cogvideox_positions, tables, model, pipeline
        )
        return True
    name, function = {
        "hunyuandit": ("get_2d_rotary_pos_embed", hunyuandit_positions),
        "stable_audio": ("get_1d_rotary_pos_embed", stable_audio_positions),
    }[row.variant]
    cls = type(pipeline)
    call = cls.__call__
    swaps = {name: Swap(functools.partial(function, tables))}
    if name not in getattr(call, "__wrapped__", call).__code__.co_names:
        return False
    rebuilt = patcher.rebuilt(call, swaps, "pipeline")
    installed = type(cls.__name__, (cls,), {"__call__": rebuilt, "__module__": cls.__module__})
    pipeline.__class__ = installed
    record.on_undo(functools.partial(_restore_class, pipeline, cls, installed))
    return True


# --------------------------------------------------------------------- the self-check
def _check(model, variant, tables) -> None:
    """diffusers' own tables for a probe grid against the coordinate tables patch builds for it
    (and the caller path, the same tables one row per token)."""
    from diffusers.models import embeddings

    device = tables.cos.device
    if variant == "stable_audio":
        rotary = tables.rotary_dim
        freqs = embeddings.get_1d_rotary_pos_embed(
            rotary, 7, use_real=True, repeat_interleave_real=False
        )
        freqs = tuple(f.to(device) for f in freqs)
        q = probe((1, 2, 7, rotary), device, torch.float32)
        ours = stable_audio_positions(tables, rotary, 7)
        unpatched = functools.partial(embeddings.apply_rotary_emb, q, freqs, True, -2)
        patched = functools.partial(stable_audio_apply, tables, q, ours, True, -2)
    elif variant == "hunyuandit":
        d = tables.rotary_dim
        crops, grid = ((0, 1), (3, 5)), (4, 6)  # a crop with 0.5 and 0.75 steps
        freqs = embeddings.get_2d_rotary_pos_embed(d, crops, grid, device=device)
        q = probe((1, 2, 24, d), device, torch.float32)
        ours = hunyuandit_positions(tables, d, crops, grid, device=device)
        unpatched = functools.partial(embeddings.apply_rotary_emb, q, freqs)
        patched = functools.partial(embeddings_apply, tables, q, ours)
    elif variant == "easyanimate":
        rope = model.rope_embedding
        hidden = torch.zeros(1, 1, 2, 4 * rope.patch_size, 7 * rope.patch_size, device=device)
        q = probe((1, 2, 56, rope.rope_dim), device, torch.float32)
        freqs = type(rope).forward(rope, hidden)
        holder = self_check.WithTables(rope, tables)
        unpatched = functools.partial(embeddings.apply_rotary_emb, q, freqs)
        patched = functools.partial(
            embeddings_apply, tables, q, easyanimate_forward(holder, hidden)
        )
    else:
        d = model.config.attention_head_dim
        crops, grid, frames = ((1, 0), (4, 5)), (4, 6), 2
        freqs = embeddings.get_3d_rotary_pos_embed(d, crops, grid, frames, device=device)
        q = probe((1, 2, 48, d), device, torch.float32)
        coordinates = [_linspace(0, frames, frames), _linspace(1, 4, 4), _linspace(0, 5, 6)]
        tables.coordinate_rows(("check",), coordinates)
        ours = (_grid_rows((frames, 4, 6), device),) * 2
        unpatched = functools.partial(embeddings.apply_rotary_emb, q, freqs)
        patched = functools.partial(embeddings_apply, tables, q, ours)
    self_check.check(model, f"{type(model).__name__}'s pipeline RoPE", unpatched, patched)
    self_check.check(
        model,
        f"{type(model).__name__}'s caller tables",
        unpatched,
        functools.partial(
            (stable_audio_apply if variant == "stable_audio" else embeddings_apply),
            tables,
            q,
            freqs,
            True,
            -2 if variant == "stable_audio" else -1,
        ),
    )


def buildable(model: nn.Module, variant: str) -> bool:
    """Whether the pipeline's RoPE exists for this config: CogVideoX's split of the head
    (``D / 4, 3 D / 8, 3 D / 8``) must be whole pairs, as diffusers' own helper asserts (its
    tests' configs, head 8, cannot build it: such a model only runs without RoPE)."""
    if variant not in ("cogvideox", "easyanimate"):
        return True
    d = model.config.attention_head_dim
    return all(n % 2 == 0 and n > 0 for n in (d // 4, d // 8 * 3))


def patch(model: nn.Module, row, record: PatchRecord, patcher: ProcessorPatcher, options) -> None:
    from diffusers.models import embeddings

    tables = make_tables(model, row.variant, device_of(model))
    if buildable(model, row.variant):
        _check(model, row.variant, tables)
    if row.variant == "easyanimate":  # its RoPE module builds the tables in the model
        record.set(model.rope_embedding, "torch_rope", tables)
        record.set(model.rope_embedding, "forward", bind(easyanimate_forward, model.rope_embedding))
    else:
        record.set(model, "torch_rope_tables", tables)
    apply_fn = stable_audio_apply if row.variant == "stable_audio" else embeddings_apply
    swaps = {
        "apply_rotary_emb": Swap(functools.partial(apply_fn, tables), embeddings.apply_rotary_emb)
    }
    patched = [m for m in attention_modules(model) if patcher.patch_processor(m, swaps)]
    require_patched(model, patched, ROTARY_ARGUMENTS)
