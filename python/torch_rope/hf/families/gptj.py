# SPDX-License-Identifier: BSD-3-Clause
"""The GPT-J family (model types ``gptj`` and ``codegen``).

These models have no rotary module to hand positions to the attention layers: each attention
layer owns an ``embed_positions`` buffer (``sin | cos`` of a float32 sinusoid table), gathers its
rows at ``position_ids``, and rotates q and k apart, GPT-J pairs (``rotate_every_two``) over the
first ``rotary_dim`` features of each head. The rotation function only ever sees the gathered
(and, in GPT-J, dtype-cast) rows, never the positions, so swapping it in a rebuilt forward (as
:mod:`.rotary_module` does for the other text models) cannot make it rotate at the positions
with our tables.

What patch does instead, on this model instance only:

* One set of torch_rope tables (float64-built, float32 non-persistent buffers that keep their
  dtype when the model is cast) for all the layers: ``torch_rope["all"]`` on the base model (the
  module that holds the layers), so ``state_dict()`` is unchanged and ``.to(device)`` moves them.
  They are checked against the layers' own ``embed_positions`` first.
* Each attention layer's forward becomes :func:`patched_forward`, bound to the layer with
  ``functools.partial``: the layer's own projections, head split, ``_attn``, head merge and
  output projection, with q and k each rotated by one ``rope::apply`` at the layer's
  ``position_ids`` (the same number of rotations as transformers makes: one per tensor).
  GPT-J's transformers code rounds the table rows to a 16-bit model's dtype and rotates in that
  dtype; the op rotates in float32 with float32 tables and rounds once. CodeGen's rotates a
  16-bit q/k in float32 (its table rows stay float32) and keeps the float32 result; so does
  the patched layer.

Only the eager attention classes are known (:data:`_PROJECTIONS`); a model loaded with another
attention implementation (GPT-J's flash-attention class) is refused.
"""

import functools
from typing import Callable, Dict, List, Optional

import torch
from torch import Tensor, nn

from ..._patching.record import PatchRecord, bind
from ..._patching.self_check import check_against_unpatched, probe
from ...nn import RotaryPositionalEmbedding
from ...ops import apply
from ..sinusoid import THETA, check_tables, refuse, warn_tables_kept
from ..tables import ALL_LAYERS


def _gptj_projections(attention: nn.Module, hidden_states: Tensor):
    """GPT-J: separate q, k, v projections. q and k as (B, S, H, D), v as (B, H, S, D)."""
    heads, head_dim = attention.num_attention_heads, attention.head_dim
    query = attention._split_heads(attention.q_proj(hidden_states), heads, head_dim, True)
    key = attention._split_heads(attention.k_proj(hidden_states), heads, head_dim, True)
    value = attention._split_heads(attention.v_proj(hidden_states), heads, head_dim, False)
    return query, key, value


# CodeGen's fused projection is laid out for 4 model-parallel shards (the TPU-v4 cores it was
# trained on): each shard's slice holds its heads' q, then v, then k.
_CODEGEN_SHARDS = 4


def _codegen_projections(attention: nn.Module, hidden_states: Tensor):
    """CodeGen: one fused qkv projection, in shards of (q, v, k). q, k as (B, S, H, D), v as
    (B, H, S, D)."""
    heads, head_dim = attention.num_attention_heads, attention.head_dim
    qkv = attention.qkv_proj(hidden_states)
    sharded = qkv.reshape(*qkv.shape[:-1], _CODEGEN_SHARDS, -1)
    query, value, key = sharded.split(heads * head_dim // _CODEGEN_SHARDS, dim=-1)
    split = functools.partial(attention._split_heads, mp_num=_CODEGEN_SHARDS)
    query, key = split(query, heads, head_dim), split(key, heads, head_dim)
    return query, key, split(value, heads, head_dim).transpose(1, 2)


class _Family:
    """How one eager attention class of this family projects q/k/v, and whether it rotates in
    float32 and keeps the float32 q/k (CodeGen: its table rows are float32, and the product with
    a 16-bit q/k promotes) or keeps q's and k's own dtype (GPT-J)."""

    def __init__(self, project: Callable, rotates_in_float32: bool) -> None:
        self.project = project
        self.rotates_in_float32 = rotates_in_float32


_PROJECTIONS: Dict[str, _Family] = {
    "GPTJAttention": _Family(_gptj_projections, rotates_in_float32=False),
    "CodeGenAttention": _Family(_codegen_projections, rotates_in_float32=True),
}


def patched_forward(
    attention: nn.Module,
    holder: nn.Module,
    hidden_states: Tensor,
    layer_past=None,
    attention_mask: Optional[Tensor] = None,
    position_ids: Optional[Tensor] = None,
    use_cache: bool = False,
    output_attentions: bool = False,
    **kwargs,
):
    """A patched GPT-J / CodeGen attention layer's forward (bound to the layer and to the module
    holding the tables). Returns ``(attn_output, attn_weights)`` as the layer's own forward does."""
    family = _PROJECTIONS[type(attention).__name__]
    tables = holder.torch_rope[ALL_LAYERS]
    query, key, value = family.project(attention, hidden_states)
    if family.rotates_in_float32:
        query, key = query.float(), key.float()
    # (B, S, 1): each token's position, the same for every head.
    positions = position_ids.unsqueeze(-1)
    query = apply(query, tables.cos, tables.sin, positions, interleaved=tables.interleaved)
    key = apply(key, tables.cos, tables.sin, positions, interleaved=tables.interleaved)
    query, key = query.transpose(1, 2), key.transpose(1, 2)  # (B, H, S, D) views
    if layer_past is not None:
        # The cache holds the model's dtype (CodeGen's float32 keys are cast back for it).
        key, value = layer_past.update(key.to(hidden_states.dtype), value, attention.layer_idx)
    output, weights = attention._attn(query, key, value, attention_mask)
    output = attention._merge_heads(output, attention.num_attention_heads, attention.head_dim)
    return attention.resid_dropout(attention.out_proj(output)), weights


def _attention_layers(model: nn.Module, model_type: str) -> List[nn.Module]:
    """The layers that own a GPT-J sinusoid table; each must be an attention class we know."""
    layers = [m for m in model.modules() if isinstance(getattr(m, "embed_positions", None), Tensor)]
    if not layers:
        raise refuse(
            model_type, "expected attention layers with an embed_positions table, found none"
        )
    for layer in layers:
        name = type(layer).__name__
        if name not in _PROJECTIONS or "forward" not in vars(type(layer)):
            raise refuse(
                model_type,
                f"expected eager attention layers ({', '.join(_PROJECTIONS)}), found {name} "
                "(load the model with attn_implementation='eager')",
            )
    return layers


def _rotary_width(layers: List[nn.Module], model_type: str) -> int:
    """The features each head rotates: the width of the layers' sin | cos table (rotary_dim, or
    the whole hidden size when rotary_dim is unset, which only a one-head model can rotate)."""
    widths = {(int(m.embed_positions.shape[-1]), m.head_dim) for m in layers}
    if len(widths) != 1:
        raise refuse(model_type, f"expected one rotary width for all layers, found {widths}")
    width, head_dim = widths.pop()
    if width % 2 or width > head_dim:
        raise refuse(
            model_type,
            f"expected an even rotary width of at most head_dim = {head_dim}, found {width}",
        )
    return width


def _self_check(attention: nn.Module, holder: nn.Module, model_type: str) -> None:
    """One probe forward of the layer unpatched (its class's forward, its own tables) and one
    patched: they must agree."""
    weight = next((p for p in attention.parameters() if p.dim() == 2), None)
    refusal = refuse(
        model_type,
        f"a patched {type(attention).__name__} disagrees with the unpatched one on a probe input "
        "(it rotates q/k differently from torch_rope's GPT-J pairs)",
    )
    if weight is None:
        raise refusal
    length = 12
    rows = min(attention.embed_positions.shape[0], holder.torch_rope[ALL_LAYERS].cos.shape[0])
    hidden = probe((2, length, attention.embed_dim), weight.device, weight.dtype)
    steps = torch.arange(length)
    # Two rows at different positions: each row must turn by its own.
    position_ids = torch.stack([steps, steps * 3 + 1]) % rows
    position_ids = position_ids.to(weight.device)

    def unpatched() -> Tensor:
        return type(attention).forward(attention, hidden, position_ids=position_ids)[0]

    def patched() -> Tensor:
        got = patched_forward(attention, holder, hidden, position_ids=position_ids)[0]
        return got.to(hidden.dtype)  # CodeGen's float32 q/k make a float32 output

    check_against_unpatched(attention, unpatched, patched, weight.dtype, refusal)


def patch(model: nn.Module, model_type: str, row, record: PatchRecord, options) -> None:
    """Put torch_rope under the attention layers of a GPT-J-family model: one set of tables on
    its base model, and a forward of ours bound to each attention layer."""
    warn_tables_kept(model_type, options)
    layers = _attention_layers(model, model_type)
    width = _rotary_width(layers, model_type)
    holder = model.base_model
    if not isinstance(holder, nn.Module) or hasattr(holder, "torch_rope"):
        raise refuse(model_type, "expected a base model to hold the tables")
    max_seq_len = options.max_seq_len
    rows = model.config.max_position_embeddings if max_seq_len is None else max_seq_len
    device = layers[0].embed_positions.device
    tables = RotaryPositionalEmbedding(
        THETA, layers[0].head_dim, rows, device, rotary_dim=width, interleaved=True
    )
    record.set(holder, "torch_rope", nn.ModuleDict({ALL_LAYERS: tables}))
    for layer in layers:
        # float32 angles p * inv_freq are off by ~p * 6e-8 from our float64 ones.
        check_tables(
            tables,
            layer.embed_positions,
            f"{type(layer).__name__}'s embed_positions",
            model_type,
            1e-3,
        )
        _self_check(layer, holder, model_type)
        record.set(layer, "forward", bind(patched_forward, layer, holder))
        record.attention.append(layer)
