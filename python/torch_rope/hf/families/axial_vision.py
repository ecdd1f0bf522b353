# SPDX-License-Identifier: BSD-3-Clause
"""The vision towers with an axial 2-D RoPE: those of Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4V and
their kin, patched inside the whole vision-language model or loaded on their own as image encoders
(transformers registers the towers as model types of their own, ``qwen2_5_vl_vision`` ...).

Each vision block calls ``apply_rotary_pos_emb_vision(q, k, cos, sin)`` (Pixtral's: the text
models' ``apply_rotary_pos_emb``) with cos/sin recomposed by the vision rotary module from its
per-axis frequencies: rotate_half over the whole head, the first half of the planes turned by the
patch's row and the second half by its column (MiniMax-M3-VL: three thirds, frame, row and column),
each axis with the same frequencies ``theta^(-2j/(head_dim/2))`` (Pixtral: each its own,
:func:`split_frequencies`; Inkling2: GPT-J pairs, the column first; Step 3.7: the column first;
Kimi-K2.5: the axes alternating plane by plane, the column first,
:func:`..rotate.alternating_rows`).

Patched, on this model instance only: the vision rotary module holds :class:`..tables.AxialTables`
(checked against its own frequencies) and its forward returns the patches' positions instead of
cos/sin; each vision block runs its class's forward over the patched globals, with the tables
handed in, and rotates q and k with one multi-axis ``rope::apply_qk`` after passing the self-check.
"""

import inspect

import torch
from torch import Tensor, nn

from ..._patching.record import PatchRecord, bind
from ..._patching.self_check import check_against_unpatched, probe
from ...ops import apply_qk
from ..forwards import FORWARDS
from ..model_parts import HF_NAME, calls_hf_apply, rotary_modules
from ..rotate import alternating_rows
from ..tables import AxialTables

#: transformers' vision rotation.
HF_VISION_NAME = "apply_rotary_pos_emb_vision"


def split_frequencies(theta: float, head_dim: int) -> Tensor:
    """Pixtral's per-plane frequencies, float64: of the ``head_dim / 2`` frequencies
    ``theta^(-2i/head_dim)``, the even-numbered ones turn the row's planes (the first quarter of
    the head, and its rotate_half partner) and the odd-numbered ones the column's. Unlike the
    other axial towers, the two axes do not share their frequencies."""
    full = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    return torch.cat([full[0::2], full[1::2]])


def _vision_tables(
    rotary: nn.Module, head_dim: int, max_seq_len: int, axes: int = 2
) -> AxialTables:
    """The vision rotary module's tables, after checking that its frequencies are the axial ones
    this builds (theta^(-2j/(head_dim/2)) per axis, no attention factor; with three axes,
    theta^(-2j/(2n)) for the n pairs of each third of the head; Pixtral's one frequency a plane,
    :func:`split_frequencies`)."""
    config = rotary.config
    params = getattr(config, "rope_parameters", None) or {}
    refusal = (
        f"torch_rope.hf.patch: {type(rotary).__name__} is not the axial 2-D RoPE patch knows "
        f"(rope_parameters {params}); not patching"
    )
    init = getattr(type(rotary), "compute_axial_rope_parameters", None)
    if params.get("rope_type") != "axial" or init is None:
        raise NotImplementedError(refusal)
    hf_inv_freq, hf_scaling = init(config, device=torch.device("cpu"))
    n = hf_inv_freq.numel()
    theta = float(params["rope_theta"])
    if axes == 2 and 2 * n == head_dim:  # a frequency for every plane (Pixtral)
        ours = split_frequencies(theta, head_dim)
        if not (
            float(hf_scaling) == 1.0
            and torch.allclose(ours.float(), hf_inv_freq.float(), rtol=1e-5, atol=0)
        ):
            raise NotImplementedError(refusal)
        return AxialTables(ours, axes, max_seq_len, rotary.inv_freq.device)
    ours = theta ** (-torch.arange(0, 2 * n, 2, dtype=torch.float64) / (2 * n))
    whole = 4 * n == head_dim if axes == 2 else n == (head_dim // axes) // 2
    if not (
        whole
        and float(hf_scaling) == 1.0
        and torch.allclose(ours.float(), hf_inv_freq.float(), rtol=1e-5, atol=0)
    ):
        raise NotImplementedError(refusal)
    return AxialTables(ours.repeat(axes), axes, max_seq_len, rotary.inv_freq.device)


def patched_vision_rotary_forward(self, x: Tensor, position_ids: Tensor):
    """The vision rotary module's forward once patched: the (N, 2) positions in both slots (the
    model may reorder both the same way, as Qwen2.5-VL's window attention does); the attention
    layers get the tables from :func:`_patched_vision_attention_forward`."""
    return position_ids, position_ids


def patched_vision_attention_forward(attention: nn.Module, rotary: nn.Module, *args, **kwargs):
    embeddings = kwargs.get("position_embeddings")
    if embeddings is not None:
        kwargs["position_embeddings"] = (embeddings[0], rotary.torch_rope)
    else:
        index = type(attention).forward.__code__.co_varnames.index("position_embeddings") - 1
        if index < len(args) and args[index] is not None:
            args = args[:index] + ((args[index][0], rotary.torch_rope),) + args[index + 1 :]
    return FORWARDS.forward(type(attention))(attention, *args, **kwargs)


def apply_vision_with_tables(q, k, cos, sin):
    """What a patched vision attention layer calls as apply_rotary_pos_emb_vision: q and k are
    (N, H, D) (N patches of all images packed; Step 3.7: (B, N, H, D), a batch of images of one
    size, the positions broadcast over it), ``cos`` the patches' (N, 2) (row, column)
    positions and ``sin`` the vision tables (put there by
    :func:`patched_vision_attention_forward`). HF rotates in float32 and returns q's and
    k's dtypes; so does the op."""
    positions, tables = cos, sin
    if tables.column_first:
        positions = positions.flip(-1)
    if tables.alternating:  # Kimi-K2.5: column, row, column, ... each frequency twice
        cos, sin, index = alternating_rows(tables, positions, paired=True)
        return apply_qk(q, k, cos, sin, index.unsqueeze(-1), interleaved=tables.interleaved)
    return apply_qk(
        q,
        k,
        tables.cos,
        tables.sin,
        positions.unsqueeze(-2),
        interleaved=tables.interleaved,
        mrope_section=tables.mrope_section,
        mrope_interleaved=tables.mrope_interleaved,
    )


def replacements(original_globals) -> dict:
    if HF_VISION_NAME not in original_globals:
        return {}
    return {HF_VISION_NAME: apply_vision_with_tables}


def _self_check_vision(rotary: nn.Module, attention: nn.Module) -> None:
    """The self-check of a vision attention layer: one forward unpatched, with HF's (N, head_dim)
    cos/sin recomposed by the vision rotary module from our tables' rows at (row, column)
    probe positions, and one patched, with the positions and the tables."""
    tables = rotary.torch_rope
    device = tables.cos.device
    refusal = NotImplementedError(
        f"torch_rope.hf.patch: a patched {type(attention).__name__} disagrees with the unpatched "
        "one on a probe input (it rotates q/k differently from torch_rope's 2-D RoPE); not "
        "patching this model"
    )
    weight = next((p for p in attention.parameters() if p.dim() == 2), None)
    recompose = getattr(type(rotary), "recomposition_frequencies", None)
    if weight is None or recompose is None:
        raise refusal
    dtype, length = weight.dtype, 12
    hidden = probe((length, weight.size(1)), device, dtype)
    steps = torch.arange(length, device=device)
    # (N, 2): row, column (three axes: frame, row, column)
    axes = [steps // 3, (steps * 5 + 1) % 7, (steps * 3 + 2) % 5]
    positions = torch.stack(axes[-len(tables.mrope_section) :], dim=-1)
    # HF's vision rotary makes freqs (N, A, F), F its inv_freq's size, and recomposes them to
    # (N, head_dim). Our tables' rows hold the same F frequencies from each axis's first plane
    # (each axis its own n of them), or all of them once (Pixtral: F = 2 n).
    width = rotary.inv_freq.numel()
    n = tables.mrope_section[0]
    first = [a * n if width == n else 0 for a in range(len(tables.mrope_section))]
    cos = torch.stack([tables.cos[positions[:, a], f : f + width] for a, f in enumerate(first)], 1)
    sin = torch.stack([tables.sin[positions[:, a], f : f + width] for a, f in enumerate(first)], 1)
    # Packed patches (N, C) with their images' bounds (cu_seqlens), or a batch of one (1, N, C)
    # with an attention mask (Pixtral).
    if "cu_seqlens" in inspect.signature(type(attention).forward).parameters:
        bounds = {"cu_seqlens": torch.tensor([0, length], device=device, dtype=torch.int32)}
    else:
        hidden, bounds = hidden.unsqueeze(0), {"attention_mask": None}

    def first_output(output):  # (output, attention weights): VideoLLaMA3's layers
        return output[0] if isinstance(output, tuple) else output

    def unpatched() -> Tensor:
        embeddings = (recompose(rotary, cos), recompose(rotary, sin))
        forward = type(attention).forward
        return first_output(forward(attention, hidden, position_embeddings=embeddings, **bounds))

    def patched() -> Tensor:
        return first_output(
            patched_vision_attention_forward(
                attention, rotary, hidden, position_embeddings=(positions,), **bounds
            )
        )

    check_against_unpatched(attention, unpatched, patched, dtype, refusal)


def patch(model: nn.Module, model_type: str, row, record: PatchRecord, options) -> None:
    """Put torch_rope under the vision tower of ``model`` (a vision-language model, or a vision
    tower alone or a model whose text tower has no RoPE: ``row.text`` None), laid out as
    ``row.vision`` says."""
    vision = row.vision
    if row.text is None:
        # A vision tower alone, or a whole model whose text tower has no RoPE: a text RoPE beside
        # it would be left as it is, so refuse.
        found = len(rotary_modules(model))
        if found:
            raise NotImplementedError(
                f"torch_rope.hf.patch: expected a {model_type} model to rotate in a vision tower "
                f"alone (only a vision rotary embedding module), found {found} text rotary "
                "module(s); not patching"
            )
    rotaries = rotary_modules(model, vision=True)
    name = HF_NAME if vision.text_apply else HF_VISION_NAME
    attentions = [m for m in model.modules() if calls_hf_apply(m, (name,))]
    if len(rotaries) != 1 or not attentions:
        raise NotImplementedError(
            f"torch_rope.hf.patch: expected one vision rotary embedding module and vision "
            f"attention layers that call {name}, found {len(rotaries)} rotary "
            f"module(s) and {len(attentions)} such layer(s) in this {model_type} model"
        )
    rotary = rotaries[0]
    head_dims = {getattr(a, "head_dim", None) for a in attentions}
    if len(head_dims) != 1 or None in head_dims:
        raise NotImplementedError(
            f"torch_rope.hf.patch: the vision attention layers of this {model_type} model have "
            f"head dims {head_dims}; not patching"
        )
    tables = _vision_tables(rotary, head_dims.pop(), options.max_vision_positions, vision.axes)
    tables.interleaved, tables.column_first = vision.interleaved, vision.column_first
    tables.alternating = vision.alternating
    record.set(rotary, "torch_rope", tables)
    checked = set()
    for attention in attentions:
        if type(attention) not in checked:
            FORWARDS.forward(type(attention), refresh=True)
            _self_check_vision(rotary, attention)
            checked.add(type(attention))
        forward = bind(patched_vision_attention_forward, attention, rotary)
        record.set(attention, "forward", forward)
        record.attention.append(attention)
    record.set(rotary, "forward", bind(patched_vision_rotary_forward, rotary))
