# SPDX-License-Identifier: BSD-3-Clause
"""q and k rotated by torch_rope's ops as transformers' attention layers hold them.

* :func:`apply_rotary_pos_emb`: transformers' own function (its signature, its gathered cos/sin),
  for code that calls it directly;
* :func:`apply_with_tables`: what a patched text layer calls under that name, with the positions
  and tables the patched rotary module handed on instead of cos/sin.
"""

from typing import Tuple

import torch
from torch import Tensor, nn

from ..nn.forward import long_rope_frequencies
from ..ops.qk import apply_qk
from ..ops.rotation import apply
from . import qk_norm


def apply_rotary_pos_emb(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1
) -> Tuple[Tensor, Tensor]:
    """transformers' ``apply_rotary_pos_emb``, computed by the torch_rope kernel.

    ``cos``/``sin`` are HF's gathered tables, ``(B, S, R)`` (or ``(S, R)``) with duplicated halves
    (``emb = cat(freqs, freqs)``), in any floating dtype; ``R <= head_dim`` (partial rotary: the
    remaining features pass through, as in GPT-NeoX and Phi). ``unsqueeze_dim`` is where HF would
    unsqueeze cos/sin to broadcast against q and k: 1 for ``(B, H, S, D)``, 2 for ``(B, S, H, D)``.

    The first half of each row becomes a table row; the kernel reads it in place through its
    strides, so q and k are never copied and float32/float64 cos/sin are not either. 16-bit cos/sin
    are upcast once to float32 (half-precision tables are refused by the op), the only copy.
    Outputs have q's and k's dtypes; math is float32 (float64 for float64 inputs).
    """
    if cos.shape != sin.shape:
        raise ValueError(
            f"apply_rotary_pos_emb: cos and sin must have the same shape, got "
            f"{tuple(cos.shape)} and {tuple(sin.shape)}"
        )
    if cos.dim() < 1 or cos.size(-1) % 2:
        raise ValueError(
            "apply_rotary_pos_emb: cos/sin must be (..., R) with R even (HF's "
            f"duplicated halves), got shape {tuple(cos.shape)}"
        )
    half = cos.size(-1) // 2
    rows = cos.shape[:-1]
    cos_table = cos[..., :half].reshape(-1, half)
    sin_table = sin[..., :half].reshape(-1, half)
    if cos_table.dtype in (torch.float16, torch.bfloat16):
        cos_table, sin_table = cos_table.float(), sin_table.float()
    if unsqueeze_dim < 0:
        unsqueeze_dim += cos.dim() + 1
    positions = torch.arange(cos_table.size(0), device=cos.device).view(rows)
    return rotate_qk(q, k, cos_table, sin_table, positions, unsqueeze_dim, interleaved=False)


def _seq_major(x: Tensor) -> bool:
    """A (B, H, S, D) view of (B, S, H, D) memory, as transformers' q/k:
    ``view().transpose(1, 2)``."""
    return x.dim() == 4 and x.stride(1) < x.stride(2)


def rotate_qk(
    q,
    k,
    cos_table,
    sin_table,
    positions,
    unsqueeze_dim,
    interleaved,
    mrope_section=None,
    mrope_interleaved=False,
    normed=None,
    inverse=False,
    angles=None,
):
    """apply_qk at ``positions`` (B, S), or (B, S, A) with ``mrope_section`` (A position axes),
    for q/k laid out as transformers' attention has them; with ``normed`` (a
    :class:`.qk_norm.NormedTables`), rms_norm_apply_qk: the layer's q/k norms fused in.

    HF's q and k are (B, H, S, D) views of (B, S, H, D) projections. Rotating the (B, S, H, D)
    views (positions (B, S, 1[, A])) walks memory in order, which the CPU kernel does 2-5x faster
    than the transposed order; the results are handed back as (B, H, S, D) views, as HF's are.
    ``angles``: the frequency form's keywords (freqs, attention_factor) instead of the tables.
    """
    flags = {"interleaved": interleaved, "inverse": inverse}
    if angles is not None:
        flags.update(angles)
    if mrope_section is not None:
        flags.update(mrope_section=mrope_section, mrope_interleaved=mrope_interleaved)
    batch_dims = positions.dim() - (mrope_section is not None)
    seq_major = unsqueeze_dim == 1 and batch_dims == 2 and _seq_major(q) and _seq_major(k)
    if seq_major:
        q, k, positions = q.transpose(1, 2), k.transpose(1, 2), positions.unsqueeze(2)
    else:
        positions = positions.unsqueeze(unsqueeze_dim)
    if normed is None:
        q_out, k_out = apply_qk(q, k, cos_table, sin_table, positions=positions, **flags)
    else:
        q_out, k_out = qk_norm.norm_rotate(q, k, cos_table, sin_table, positions, normed, flags)
    if seq_major:
        return q_out.transpose(1, 2), k_out.transpose(1, 2)
    return q_out, k_out


def apply_with_tables(q, k, cos, sin=None, unsqueeze_dim=1, layout=None):
    """What a patched attention layer calls as apply_rotary_pos_emb: ``cos`` holds the positions
    (B, S) (M-RoPE: (B, S, 3)) and ``sin`` the torch_rope tables module, as the patched rotary
    module returned them. Gemma 4 rotates one tensor per call, ``(x, cos, sin, unsqueeze_dim)``:
    there the positions arrive as ``k`` and the tables as ``cos``.

    ``layout``: ``(interleaved, inverse)`` instead of the tables' own, for a module inside an
    attention layer that rotates its own q/k with the layer's positions in another pair layout
    (a DSA indexer's rotate_half beside DeepSeek-V3.2's GPT-J-pair MLA)."""
    if sin is None and isinstance(cos, nn.Module):
        return _rotate_one(q, k, cos, unsqueeze_dim)
    positions, tables, normed = cos, sin, None
    if isinstance(tables, qk_norm.NormedTables):  # a layer with fused q/k norms
        tables, normed = tables.tables, tables
    interleaved, inverse = (
        (tables.interleaved, getattr(tables, "inverse", False)) if layout is None else layout
    )
    section = getattr(tables, "mrope_section", None)
    if getattr(tables, "alternating", False):  # per-call rows, one per token: one axis
        cos_table, sin_table, positions = alternating_rows(tables, positions)
        section, angles = None, None
    else:
        cos_table, sin_table, angles = _angle_source(tables, positions)
    return rotate_qk(
        q,
        k,
        cos_table,
        sin_table,
        positions,
        unsqueeze_dim,
        interleaved,
        section,
        getattr(tables, "mrope_interleaved", False),
        normed,
        inverse,
        angles,
    )


def alternating_rows(
    tables: nn.Module, positions: Tensor, paired: bool = False
) -> Tuple[Tensor, Tensor, Tensor]:
    """Per-call cos/sin rows for two position axes that alternate plane by plane, which neither
    multi-axis rule of the op expresses: plane ``j`` turns by axis ``j % 2`` of ``positions``
    (..., 2) at the tables' ``j``-th frequency (NeoMME's text tower), or with ``paired`` at their
    ``(j // 2)``-th, each frequency turning two planes, one per axis (Kimi-K2.5's vision tower,
    whose axial tables hold the frequencies once per axis). Rows of the float64-built tables
    (table-free: computed from the float64 frequencies, ``cos(p * f) * attention_factor``
    rounded once to float32, as the tables' are), one per token: ``(M, planes)`` each, and the
    ``(...)`` index of each token's row, for one single-axis rotation over them."""
    flat = positions.reshape(-1, positions.shape[-1])
    if getattr(tables, "tables", True):
        planes = torch.arange(tables.cos.shape[-1], device=positions.device)
        at = flat[:, planes % 2]  # (M, P): each plane's position
        column = planes // 2 if paired else planes
        cos, sin = tables.cos[at, column], tables.sin[at, column]
    else:  # (a text tower's only: the vision tables are always tables)
        freqs = long_rope_frequencies(
            tables.freqs, tables._buffers.get("long_freqs"), positions, tables.long_after
        )
        planes = torch.arange(freqs.shape[-1], device=positions.device)
        angles = flat[:, planes % 2].to(torch.float64) * freqs
        factor = tables.attention_factor
        cos, sin = (angles.cos() * factor).float(), (angles.sin() * factor).float()
    index = torch.arange(flat.shape[0], device=positions.device).view(positions.shape[:-1])
    return cos, sin, index


def _angle_source(tables: nn.Module, positions: Tensor):
    """(cos, sin, None) of a tables module, or (None, None, the frequency form's keywords) of a
    table-free one, LongRoPE's frequency set chosen by the call's positions on the device."""
    if getattr(tables, "tables", True):
        return tables.cos, tables.sin, None
    freqs = long_rope_frequencies(
        tables.freqs, tables._buffers.get("long_freqs"), positions, tables.long_after
    )
    return None, None, {"freqs": freqs, "attention_factor": tables.attention_factor}


def _rotate_one(x: Tensor, positions: Tensor, tables: nn.Module, unsqueeze_dim: int) -> Tensor:
    """One tensor (B, H, S, D) or (B, S, H, D) rotated at ``positions`` (B, S)."""
    cos, sin, angles = _angle_source(tables, positions)
    return apply(
        x,
        cos,
        sin,
        positions=positions.unsqueeze(unsqueeze_dim),
        interleaved=tables.interleaved,
        inverse=getattr(tables, "inverse", False),
        **(angles or {}),
    )
