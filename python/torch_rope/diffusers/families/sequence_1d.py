# SPDX-License-Identifier: BSD-3-Clause
"""One-axis RoPE over a token sequence (audio and text models), halves (``rotate_half``), often
over part of the head.

Each model of this family computes, every forward, cos/sin (or the angles) of positions
``0 .. S - 1`` (Anima: the ``position_ids`` it is handed) with ``theta ** (-2 j / R)`` over the
first ``R`` features, and its processors rotate ``(B, S, H, D)`` q and k, leaving the features
past ``R`` as they are. Where the RoPE is computed and how the processors call it, by the row's
variant:

* ``ace``: ACE-Step's function ``_ace_step_rotary_freqs(seq_len, head_dim, theta, device,
  dtype)``, called in the forward of the DiT and of each encoder; processors call diffusers'
  ``apply_rotary_emb(q, (cos, sin), use_real_unbind_dim=-2, sequence_dim=1)``;
* ``cos_sin``: a RoPE module whose forward returns ``(cos, sin)`` ``(S, R)`` (MiniMax-Music 3:
  ``forward(seq_len, device)``; LongCat-AudioDiT: ``forward(hidden_states, seq_len)``, its
  cross-attention rotating q and k at the positions of their own sequences), rotated by the
  file's function ``f(x, (cos, sin))``;
* ``angles``: a RoPE module whose forward returns the angles ``(S, R)`` (Stable Audio 3, and the
  SAME autoencoder, whose RoPE module sits on each attention module), rotated by
  ``_apply_rotary_partial(x, angles)``, which takes the last ``S`` rows of what it is handed;
* ``position_ids``: Anima's HF-Llama-style module, ``forward(hidden_states, position_ids)`` ->
  ``(cos, sin)`` ``(B, S, R)``, rotated by ``_apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim)``
  (its cross-attention: q at the target's positions, k at the source's).

Patched, on this model instance only: the RoPE computation returns the positions' table rows
(int64, ``(S,)``, or ``(B, S)`` for Anima) in the container it returned before, and the
rotation functions are :func:`rotate_rows`-based replacements, one ``rope::apply`` each.
"""

import functools
import inspect
from typing import Callable, Dict, List, Tuple

import torch
from torch import Tensor, nn

from ..._patching.record import PatchRecord, bind
from ..._patching.self_check import probe
from ...ops import apply
from .. import self_check
from ..model_parts import attention_modules, device_of, require_patched
from ..processors import ProcessorPatcher, Swap, library_function, uses
from ..rotate import carries_positions, embeddings_apply, rotate_token_tables
from ..tables import Tables

CALLER = "torch_rope.diffusers.patch"
ROTARY_ARGUMENTS = ("image_rotary_emb", "rotary_emb", "audio_rotary_emb", "position_embeddings")
#: The variants' rotation functions (the names their processors call).
ROTATIONS = {
    "ace": ("apply_rotary_emb",),
    "cos_sin": ("_apply_partial_rotary_emb", "_apply_rotary_emb"),
    "angles": ("_apply_rotary_partial",),
    "position_ids": ("_apply_rotary_pos_emb",),
}
ACE_FREQS = "_ace_step_rotary_freqs"


def rotate_rows(tables: Tables, x: Tensor, rows: Tensor) -> Tensor:
    """``x`` ``(B, S, H, D)`` rotated at ``rows`` ``(S,)`` or ``(B, S)``."""
    return apply(x, tables.cos, tables.sin, rows.unsqueeze(-1), interleaved=False)


def _rows(tables: Tables, length: int, device) -> Tensor:
    return torch.arange(length, device=device) + tables.cover(0, max(length - 1, 0))


# --------------------------------------------------------------------- the patched RoPE sources
def ace_freqs(tables: Tables, seq_len, head_dim, theta, device, dtype):
    """ACE-Step's ``_ace_step_rotary_freqs``: the rows of ``0 .. seq_len - 1``, twice."""
    if head_dim != tables.rotary_dim:
        raise ValueError(
            f"{CALLER}: ACE-Step RoPE of head_dim {head_dim} asked of tables of {tables.rotary_dim}"
        )
    rows = _rows(tables, int(seq_len), device)
    return rows, rows


def length_forward(rope: nn.Module, seq_len, device=None):
    """``forward(seq_len, device)`` (MiniMax-Music 3, Stable Audio 3, SAME)."""
    rows = _rows(rope.torch_rope, int(seq_len), device or rope.torch_rope.cos.device)
    return rows if rope._torch_rope_angles else (rows, rows)


def states_forward(rope: nn.Module, hidden_states: Tensor, seq_len=None):
    """LongCat-AudioDiT's ``forward(hidden_states, seq_len)``."""
    length = hidden_states.shape[1] if seq_len is None else int(seq_len)
    rows = _rows(rope.torch_rope, length, hidden_states.device)
    return rows, rows


def position_ids_forward(rope: nn.Module, hidden_states: Tensor, position_ids: Tensor):
    """Anima's ``forward(hidden_states, position_ids)``: the rows of ``position_ids``."""
    from ..tables import integer_rows

    rows = integer_rows(rope.torch_rope, position_ids)
    return rows, rows


# --------------------------------------------------------------------- the patched rotations
def cos_sin_apply(tables: Tables, hidden_states: Tensor, rotary_emb) -> Tensor:
    """``f(x, (cos, sin))`` of MiniMax-Music 3 and LongCat-AudioDiT, x ``(B, S, H, D)``."""
    if not carries_positions(rotary_emb):
        return rotate_token_tables(hidden_states, rotary_emb[0], rotary_emb[1], False, "bshd")
    return rotate_rows(tables, hidden_states, rotary_emb[0])


def angles_apply(tables: Tables, t: Tensor, freqs: Tensor) -> Tensor:
    """``_apply_rotary_partial(t, angles)``: the last ``S`` rows, as diffusers slices them."""
    rows = freqs[-t.shape[-3] :]
    if not carries_positions(rows):
        return rotate_token_tables(t, rows.float().cos(), rows.float().sin(), False, "bshd")
    return rotate_rows(tables, t, rows)


def position_ids_apply(tables: Tables, hidden_states, cos, sin, unsqueeze_dim: int = 1):
    """Anima's ``_apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim)``."""
    if not carries_positions(cos):
        layout = "bshd" if unsqueeze_dim == 2 else "bhsd"
        return rotate_token_tables(hidden_states, cos, sin, False, layout)
    rows = cos.unsqueeze(unsqueeze_dim)
    return apply(hidden_states, tables.cos, tables.sin, rows, interleaved=False)


# --------------------------------------------------------------------- finding and checking
def _ropes(model: nn.Module, row) -> List[nn.Module]:
    if row.rope == ("*rope",):  # SAME: one RoPE module on each attention module
        found = [getattr(m, "rope", None) for m in attention_modules(model)]
        return [r for r in found if isinstance(r, nn.Module)]
    return [getattr(model, name) for name in row.rope]


def _default(cls: type, name: str):
    return inspect.signature(cls.__init__).parameters[name].default


def _frequencies(rope: nn.Module, variant: str) -> Tuple[int, float]:
    """The rotated features ``R`` and the base of a RoPE module."""
    if variant == "position_ids":
        rotary, base = 2 * rope.inv_freq.numel(), _default(type(rope), "rope_theta")
    elif hasattr(rope, "rotary_dim"):
        rotary, base = rope.rotary_dim, rope.theta
    elif hasattr(rope, "base"):
        rotary, base = rope.dim, rope.base
    else:
        rotary, base = 2 * rope.inv_freq.numel(), _default(type(rope), "base")
    return int(rotary), float(base)


def _tables(rotary: int, base: float, options, device) -> Tables:
    inv_freq = base ** (-torch.arange(0, rotary, 2, dtype=torch.float64) / rotary)
    return Tables(inv_freq, None, False, rows=options.rows, device=device)


def _swaps(variant: str, tables: Tables, originals: Dict[str, Callable]) -> Dict[str, Swap]:
    apply_fn = {
        "ace": embeddings_apply,
        "cos_sin": cos_sin_apply,
        "angles": angles_apply,
        "position_ids": position_ids_apply,
    }[variant]
    swaps = {n: Swap(functools.partial(apply_fn, tables), f) for n, f in originals.items()}
    if variant == "ace":
        from diffusers.models.transformers import ace_step_transformer

        original = getattr(ace_step_transformer, ACE_FREQS)
        swaps[ACE_FREQS] = Swap(functools.partial(ace_freqs, tables), original)
    return swaps


def _originals(model: nn.Module, variant: str) -> Dict[str, Callable]:
    found = {}
    for module in attention_modules(model):
        call = type(module.processor).__call__
        for name in ROTATIONS[variant]:
            function = library_function(call, name)
            if function is not None:
                found[name] = function
    if not found:
        raise NotImplementedError(
            f"{CALLER}: no processor of this {type(model).__name__} rotates with "
            f"{' or '.join(ROTATIONS[variant])}; not patching"
        )
    return found


def _check(rope, variant, tables, original, swaps, head) -> None:
    device = tables.cos.device
    length = 7
    q = probe((1, length, 2, head), device, torch.float32)
    ours = swaps[next(n for n in ROTATIONS[variant] if n in swaps)].function
    if variant == "ace":
        freqs = swaps[ACE_FREQS].original

        def unpatched():
            cos_sin = freqs(length, head, rope.rope_theta, device, torch.float32)
            return original(q, cos_sin, use_real_unbind_dim=-2, sequence_dim=1)

        def patched():
            rows = ace_freqs(tables, length, head, rope.rope_theta, device, torch.float32)
            return ours(q, rows, use_real_unbind_dim=-2, sequence_dim=1)

    elif variant == "position_ids":
        ids = torch.arange(length, device=device)[None]

        def unpatched():
            return original(q, *type(rope).forward(rope, q, ids), unsqueeze_dim=2)

        def patched():
            rows = ids + tables.cover(0, length - 1)
            return ours(q, rows, rows, unsqueeze_dim=2)

    else:
        signature = inspect.signature(type(rope).forward).parameters
        by_states = "hidden_states" in signature
        args = (q, length) if by_states else (length, device)
        holder = self_check.WithTables(rope, tables, _torch_rope_angles=variant == "angles")
        patched_forward = states_forward if by_states else length_forward

        def unpatched():
            return original(q, type(rope).forward(rope, *args))

        def patched():
            return ours(q, patched_forward(holder, *args))

    self_check.check(rope, type(rope).__name__, unpatched, patched)


def patch(model: nn.Module, row, record: PatchRecord, patcher: ProcessorPatcher, options) -> None:
    variant = row.variant
    device = device_of(model)
    originals = _originals(model, variant)
    if variant == "ace":
        sources = [m for m in model.modules() if uses(type(m).forward, {ACE_FREQS: Swap(None)})]
        configs = {(int(m.head_dim), float(m.rope_theta)) for m in sources}
        if len(configs) != 1:
            raise NotImplementedError(
                f"{CALLER}: this {type(model).__name__} computes ACE-Step RoPE with "
                f"{len(configs)} (head_dim, theta) settings; patch supports one"
            )
        head, theta = configs.pop()
        tables = _tables(head, theta, options, device)
        swaps = _swaps(variant, tables, originals)
        _check(sources[0], variant, tables, next(iter(originals.values())), swaps, head)
        for module in sources:
            patcher.patch_forward(module, swaps)
    else:
        ropes = _ropes(model, row)
        settings = {_frequencies(r, variant) for r in ropes}
        if len(ropes) == 0 or len(settings) != 1:
            raise NotImplementedError(
                f"{CALLER}: expected RoPE modules of one setting at {row.rope} of this "
                f"{type(model).__name__}, found {len(ropes)} with {sorted(settings)}"
            )
        rotary, base = settings.pop()
        tables = _tables(rotary, base, options, device)
        swaps = _swaps(variant, tables, originals)
        _check(ropes[0], variant, tables, next(iter(originals.values())), swaps, rotary)
        forward = {"cos_sin": None, "angles": length_forward, "position_ids": position_ids_forward}
        for rope in ropes:
            chosen = forward[variant]
            if chosen is None:
                by_states = "hidden_states" in inspect.signature(type(rope).forward).parameters
                chosen = states_forward if by_states else length_forward
            record.set(rope, "torch_rope", tables)
            object.__setattr__(rope, "_torch_rope_angles", variant == "angles")
            record.on_undo(functools.partial(_forget_angles, rope))
            record.set(rope, "forward", bind(chosen, rope))
    patched = [m for m in attention_modules(model) if patcher.patch_processor(m, swaps)]
    require_patched(model, patched, ROTARY_ARGUMENTS)


def _forget_angles(rope: nn.Module) -> None:
    vars(rope).pop("_torch_rope_angles", None)
