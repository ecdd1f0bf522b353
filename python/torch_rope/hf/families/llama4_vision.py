# SPDX-License-Identifier: BSD-3-Clause
"""Llama 4's vision tower (the vision-language model type ``llama4``; its text model is patched as
``llama4_text`` is, by :mod:`.complex_form`).

The vision rotary module holds a precomputed complex table ``freqs_ci`` (N, 1, D/2) for the
N = side * side patches of the one image size plus the class token (last), and each vision
attention layer calls the module-level ``vision_apply_rotary_emb(q, k, freqs_ci)``, which views
consecutive feature pairs of q/k (B, N, H, D) as complex numbers and multiplies them by it: GPT-J
pairs, rotated in float32. Its first D/4 planes turn by the patch's column + 1, the last D/4 by
its row + 1, each axis with the frequencies theta^(-2j/(D/2)); the class token does not turn.
That is torch_rope's multi-axis rule: ``mrope_section = [D/4, D/4]``, GPT-J pairs, at positions
(column + 1, row + 1) per patch and (0, 0) for the class token.

What patch changes, on this model instance only:

* The vision rotary module gets axial tables (:class:`..tables.AxialTables`, GPT-J pairs) as its
  ``torch_rope``, checked against its own ``freqs_ci`` at those positions, and its forward
  returns :class:`VisionPositions` (the (N, 2) positions and the tables) instead of ``freqs_ci``.
* In the patched copy of the modeling module's globals, ``vision_apply_rotary_emb`` is
  :func:`vision_apply_rotary_emb`: one ``rope::apply_qk`` at those positions.
* Each vision attention layer runs its own forward over that namespace, after one probe forward
  of it patched and unpatched agreed (the self-check).
"""

from typing import NamedTuple

import torch
from torch import Tensor, nn

from ..._patching.record import PatchRecord, bind
from ..._patching.self_check import check_against_unpatched, probe
from ...ops import apply_qk
from ..forwards import FORWARDS
from ..tables import AxialTables

#: transformers' vision rotation in the Llama 4 modeling module.
HF_NAME = "vision_apply_rotary_emb"
_MODULE = "transformers.models.llama4.modeling_llama4"


class VisionPositions(NamedTuple):
    """What the patched vision rotary module hands the layers instead of ``freqs_ci``."""

    positions: Tensor  # (N, 2): column + 1, row + 1; (0, 0) for the class token
    tables: nn.Module


def vision_apply_rotary_emb(query: Tensor, key: Tensor, freqs_ci) -> tuple:
    """What a patched vision layer calls: q/k (B, N, H, D) turned at ``freqs_ci.positions``."""
    if not isinstance(freqs_ci, VisionPositions):
        raise TypeError(
            "torch_rope.hf: a patched Llama 4 vision layer expected the positions and tables of "
            f"the patched vision rotary module, got {type(freqs_ci).__name__}"
        )
    tables = freqs_ci.tables
    return apply_qk(
        query,
        key,
        tables.cos,
        tables.sin,
        freqs_ci.positions.unsqueeze(-2),  # (N, 1, 2): the same for every head
        interleaved=tables.interleaved,
        mrope_section=tables.mrope_section,
    )


def replacements(original_globals) -> dict:
    """The names to replace in the patched copy of Llama 4's modeling module's globals."""
    if original_globals.get("__name__") != _MODULE or HF_NAME not in original_globals:
        return {}
    return {HF_NAME: vision_apply_rotary_emb}


def patch_positions(config, device) -> Tensor:
    """(N, 2) positions of the side * side patches (row-major) and the class token (last)."""
    side = config.image_size // config.patch_size
    patches = torch.arange(side * side, device=device)
    grid = torch.stack([patches % side + 1, patches // side + 1], dim=-1)
    return torch.cat([grid, grid.new_zeros(1, 2)])


def rotary_forward(rotary: nn.Module, pixel_values: Tensor, positions=None) -> VisionPositions:
    """The vision rotary module's forward once patched (``positions``: a test's override)."""
    if positions is None:
        positions = patch_positions(rotary.config, rotary.torch_rope.cos.device)
    return VisionPositions(positions, rotary.torch_rope)


def _refuse(why: str) -> NotImplementedError:
    return NotImplementedError(f"torch_rope.hf.patch: {why} in this llama4 model; not patching")


def _recomposed(tables: nn.Module, positions: Tensor) -> Tensor:
    """HF's complex freqs_ci (N, 1, D/2) made from our tables' rows at ``positions``."""
    n = tables.mrope_section[0]
    cos = torch.cat([tables.cos[positions[:, a], a * n : (a + 1) * n] for a in (0, 1)], -1)
    sin = torch.cat([tables.sin[positions[:, a], a * n : (a + 1) * n] for a in (0, 1)], -1)
    return torch.complex(cos, sin)[:, None, :]


def patch(model: nn.Module, model_type: str, row, record: PatchRecord, options) -> None:
    """Put torch_rope under the vision tower."""
    rotaries = [m for m in model.modules() if isinstance(getattr(m, "freqs_ci", None), Tensor)]
    attentions = [
        m
        for m in model.modules()
        if HF_NAME in getattr(getattr(type(m).forward, "__code__", None), "co_names", ())
    ]
    if len(rotaries) != 1 or not attentions:
        raise _refuse(
            f"expected one vision rotary module with freqs_ci and vision layers calling {HF_NAME}, "
            f"found {len(rotaries)} and {len(attentions)}"
        )
    rotary = rotaries[0]
    config = rotary.config
    head_dims = {getattr(a, "head_dim", None) for a in attentions}
    head_dim = config.hidden_size // config.num_attention_heads
    if head_dims != {head_dim} or head_dim % 4:
        raise _refuse(f"expected vision heads of {head_dim} (a multiple of 4), found {head_dims}")
    n = head_dim // 4
    theta = float(config.rope_parameters["rope_theta"])
    inv_freq = theta ** (-torch.arange(0, 2 * n, 2, dtype=torch.float64) / (2 * n))
    # The same frequencies on both axes: (column + 1)'s planes, then (row + 1)'s.
    own = rotary.freqs_ci
    tables = AxialTables(inv_freq.repeat(2), 2, options.max_vision_positions, own.device)
    tables.interleaved = True  # consecutive pairs are the complex numbers
    ours = _recomposed(tables, patch_positions(config, own.device))
    if ours.shape != own.shape or not torch.allclose(ours, own, rtol=0, atol=1e-5):
        raise _refuse(
            f"the vision tables built for theta {theta} at (column + 1, row + 1) do not match "
            "the vision rotary module's freqs_ci"
        )
    record.set(rotary, "torch_rope", tables)
    for attention_class in {type(a) for a in attentions}:
        FORWARDS.forward(attention_class, refresh=True)
    for attention in attentions:
        _self_check(attention, rotary)
        record.set(attention, "forward", bind(layer_forward, attention))
        record.attention.append(attention)
    record.set(rotary, "forward", bind(rotary_forward, rotary))


def layer_forward(attention: nn.Module, *args, **kwargs):
    """A patched vision layer's forward: its class's forward over the patched globals."""
    return FORWARDS.forward(type(attention))(attention, *args, **kwargs)


def _self_check(attention: nn.Module, rotary: nn.Module) -> None:
    """One probe forward of the layer unpatched (the module's own freqs_ci) and one patched."""
    weight = attention.q_proj.weight
    refusal = _refuse(
        f"a patched {type(attention).__name__} disagrees with the unpatched one on a probe input "
        "(it rotates q/k differently from torch_rope's 2-D RoPE)"
    )
    own = rotary.freqs_ci
    hidden = probe((2, own.shape[0], weight.shape[1]), weight.device, weight.dtype)
    ours = VisionPositions(patch_positions(rotary.config, own.device), rotary.torch_rope)

    def unpatched() -> Tensor:
        return type(attention).forward(attention, hidden, freqs_ci=own)[0]

    def patched() -> Tensor:
        return layer_forward(attention, hidden, freqs_ci=ours)[0]

    check_against_unpatched(attention, unpatched, patched, weight.dtype, refusal)
