# SPDX-License-Identifier: BSD-3-Clause
"""q and k rotated by torch_rope's ops as diffusers' attention processors hold them.

A patched RoPE module hands the processors integer positions (row indices into its
:class:`~.tables.Tables`) in place of the cos/sin it computed, in the same container and of the
same rank (so model code that concatenates the pair, or context parallelism that splits it along
the sequence, works on positions instead). The functions here take the place of diffusers'
rotation functions, bound (``functools.partial``) to the tables:

* :func:`rotate_positions`: the core, positions ``(S[, A])`` or ``(B, S[, A])`` for q/k laid out
  ``(B, S, H, D)`` (``"bshd"``), ``(B, H, S, D)`` (``"bhsd"``) or packed ``(N, H, D)``;
* :func:`embeddings_apply`: diffusers' ``apply_rotary_emb(x, freqs_cis, use_real,
  use_real_unbind_dim, sequence_dim)``, in every form it is called with.

cos/sin that did not come from a patched RoPE module (a caller's own tables, or the token tables
of fractional ids) are rotated by the same op, one table row per token: :func:`rotate_token_tables`.
"""

from typing import Optional

import torch
from torch import Tensor

from ..ops import apply
from .tables import Tables

CALLER = "torch_rope.diffusers"


def rotate_positions(tables: Tables, x: Tensor, positions: Tensor, layout: str) -> Tensor:
    """``x`` rotated at ``positions`` (rows of ``tables``): ``(S,)``/``(S, A)`` for every sample,
    or ``(B, S)``/``(B, S, A)`` per sample, ``A`` the tables' axes. ``layout``: ``"bshd"`` (also
    packed ``(N, H, D)`` with ``(N[, A])`` positions) or ``"bhsd"``."""
    axes = tables.section is not None
    if layout == "bshd":
        positions = positions.unsqueeze(-2 if axes else -1)
    elif layout == "bhsd":
        if positions.dim() - axes == 2:
            positions = positions.unsqueeze(1)
    else:
        raise ValueError(f"{CALLER}: layout must be 'bshd' or 'bhsd', got {layout!r}")
    return apply(
        x,
        tables.cos,
        tables.sin,
        positions,
        interleaved=tables.interleaved,
        mrope_section=tables.section,
        mrope_interleaved=tables.mrope_interleaved,
    )


def rotate_token_tables(
    x: Tensor, cos: Tensor, sin: Optional[Tensor], interleaved: bool, layout: str
) -> Tensor:
    """``x`` rotated by per-token tables: diffusers' real cos/sin ``(..., S, R)`` (pairs
    ``[c0, c0, c1, c1, ...]`` when ``interleaved``, halves ``[c0 .. cn, c0 .. cn]`` otherwise;
    ``R <= D``, the features past ``R`` pass through), or a complex ``freqs_cis`` ``(..., S, R /
    2)`` (``sin`` None). Each token's row becomes a table row and the token rotates at its own
    row. ``layout``: ``"bshd"``, ``"bhsd"``, or ``"as_is"`` (the tables' leading dims already
    broadcast against ``x``'s, as Wan's ``(1, S, 1, D)``)."""
    if cos.is_complex():
        cos, sin = cos.real, cos.imag
    else:  # one of each pair of equal entries
        half = cos.size(-1) // 2
        cos = cos[..., ::2] if interleaved else cos[..., :half]
        sin = sin[..., ::2] if interleaved else sin[..., :half]
    rows = cos.shape[:-1]
    cos = cos.reshape(-1, cos.size(-1)).to(device=x.device, dtype=torch.float32)
    sin = sin.reshape(-1, sin.size(-1)).to(device=x.device, dtype=torch.float32)
    positions = torch.arange(cos.size(0), device=x.device).view(rows)
    if layout == "bshd":
        positions = positions.unsqueeze(-1)
    elif layout == "bhsd" and positions.dim() == 2:  # (B, S) for (B, H, S, D)
        positions = positions.unsqueeze(1)
    return apply(x, cos, sin, positions, interleaved=interleaved)


def carries_positions(freqs) -> bool:
    """Whether a processor's rotary argument holds positions from a patched RoPE module (integer
    tensors) rather than cos/sin."""
    first = freqs[0] if isinstance(freqs, (tuple, list)) else freqs
    return isinstance(first, Tensor) and not (first.is_floating_point() or first.is_complex())


def embeddings_apply(
    tables: Tables,
    x: Tensor,
    freqs_cis,
    use_real: bool = True,
    use_real_unbind_dim: int = -1,
    sequence_dim: int = 2,
) -> Tensor:
    """diffusers' ``apply_rotary_emb`` (``diffusers.models.embeddings``), by the torch_rope op.

    ``use_real=True``: ``freqs_cis`` is the pair the RoPE module returned, positions here;
    ``sequence_dim`` 1 means q/k ``(B, S, H, D)``, 2 means ``(B, H, S, D)``;
    ``use_real_unbind_dim`` -1 rotates GPT-J pairs, -2 halves. ``use_real=False`` (Lumina): one
    complex ``freqs_cis``, positions here, q/k ``(B, S, H, D)``, pairs. Math in float32 as
    diffusers', the result in ``x``'s dtype."""
    if use_real:
        if sequence_dim not in (1, 2):
            raise ValueError(f"`sequence_dim={sequence_dim}` but should be 1 or 2.")
        if use_real_unbind_dim not in (-1, -2):
            raise ValueError(f"`use_real_unbind_dim={use_real_unbind_dim}` but should be -1 or -2.")
        interleaved = use_real_unbind_dim == -1
        layout = "bshd" if sequence_dim == 1 else "bhsd"
        first = freqs_cis[0]
    else:
        interleaved, layout, first = True, "bshd", freqs_cis
    if not carries_positions(freqs_cis):
        sin = freqs_cis[1] if use_real else None
        return rotate_token_tables(x, first, sin, interleaved, layout)
    if interleaved != tables.interleaved:
        raise ValueError(
            f"{CALLER}: this processor rotates {'pairs' if interleaved else 'halves'}, the tables "
            f"patch built rotate {'pairs' if tables.interleaved else 'halves'}"
        )
    return rotate_positions(tables, x, first, layout)
