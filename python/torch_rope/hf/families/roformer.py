# SPDX-License-Identifier: BSD-3-Clause
"""RoFormer (model type ``roformer``).

RoFormer has no rotary module of the transformers kind. Its encoder owns one
``embed_positions`` (a frozen ``nn.Embedding`` holding ``sin | cos`` of the standard sinusoid,
theta 10000 over the head size), gathers the rows at ``past_key_values_length + arange(S)`` and
hands them to every layer as ``sinusoidal_pos``; each self-attention layer rotates q and k (and v
when ``config.rotary_value``) in GPT-J pairs through its static method
``apply_rotary_position_embeddings(sinusoidal_pos, q, k[, v])``.

What patch changes, on this model instance only (the same split as :mod:`.rotary_module`'s for
the other text models: the position module hands positions on, the layers rotate with our
tables):

* The sinusoid module's forward returns the positions its own forward would have gathered at
  (``past_key_values_length + arange(S)``, as an (S, 1) column: the encoder's ``[None, None]``
  makes it the (1, 1, S, 1) ``sinusoidal_pos`` the layers receive) instead of the rows. It holds
  the tables: ``torch_rope["all"]``, float64-built, float32 non-persistent buffers, so
  ``state_dict()`` is unchanged; they are checked against the module's own weight first.
* Each self-attention layer gets an instance attribute ``apply_rotary_position_embeddings`` that
  rotates q and k with one ``rope::apply_qk`` at those positions (v, when the config rotates it,
  with one ``rope::apply``). The layer's own forward (projections, cache, attention) is untouched.
"""

import functools
from typing import List, Optional

import torch
from torch import Tensor, nn

from ..._patching.record import PatchRecord, bind
from ..._patching.self_check import check_against_unpatched, probe
from ...nn import RotaryPositionalEmbedding
from ...ops import apply, apply_qk
from ..sinusoid import THETA, check_tables, refuse, warn_tables_kept
from ..tables import ALL_LAYERS

# The method each self-attention layer rotates through, replaced per instance (undo pops it).
ROTATION_METHOD = "apply_rotary_position_embeddings"


def positions_forward(
    sinusoid: nn.Module,
    input_ids_shape: torch.Size,
    past_key_values_length: int = 0,
    position_ids: Optional[Tensor] = None,
) -> Tensor:
    """The patched sinusoid module's forward: the positions its rows would be gathered at, as an
    (S, 1) column, instead of the rows."""
    if position_ids is None:
        seq_len = input_ids_shape[1]
        position_ids = torch.arange(
            past_key_values_length,
            past_key_values_length + seq_len,
            dtype=torch.long,
            device=sinusoid.torch_rope[ALL_LAYERS].cos.device,
        )
    if position_ids.dim() != 1:
        raise ValueError(
            "torch_rope.hf: expected RoFormer's positions as one (S,) row shared by the batch, "
            f"got shape {tuple(position_ids.shape)}"
        )
    return position_ids.unsqueeze(-1)


def rotate(sinusoid: nn.Module, positions: Tensor, query: Tensor, key: Tensor, value=None):
    """A patched layer's ``apply_rotary_position_embeddings``: ``positions`` is what the patched
    sinusoid module returned ((1, 1, S, 1) once the encoder indexed it), q/k/v are (B, H, S, D).
    Rotates the (B, S, H, D) views (memory order) and hands (B, H, S, D) views back, as HF does."""
    if positions.is_floating_point() or positions.shape[-1] != 1:
        raise TypeError(
            "torch_rope.hf: a patched RoFormer layer expected integer positions (1, 1, S, 1) "
            f"from the patched sinusoid module, got {positions.dtype} {tuple(positions.shape)} "
            "(was the encoder's embed_positions unpatched?)"
        )
    tables = sinusoid.torch_rope[ALL_LAYERS]
    column = positions.reshape(-1, 1)  # (S, 1): one position per token, the same for every head
    query, key = apply_qk(
        query.transpose(1, 2),
        key.transpose(1, 2),
        tables.cos,
        tables.sin,
        column,
        interleaved=tables.interleaved,
    )
    query, key = query.transpose(1, 2), key.transpose(1, 2)
    if value is None:
        return query, key
    value = apply(
        value.transpose(1, 2), tables.cos, tables.sin, column, interleaved=tables.interleaved
    )
    return query, key, value.transpose(1, 2)


def _sinusoid(model: nn.Module, model_type: str) -> nn.Module:
    """The one sinusoid module (the encoder's embed_positions)."""
    found = [m for m in model.modules() if hasattr(type(m), "create_weight")]
    if len(found) != 1 or not isinstance(getattr(found[0], "weight", None), Tensor):
        raise refuse(model_type, f"expected one sinusoid position module, found {len(found)}")
    return found[0]


def _attention_layers(model: nn.Module, model_type: str, width: int) -> List[nn.Module]:
    """The self-attention layers that rotate through :data:`ROTATION_METHOD`, heads ``width``
    wide (the sinusoid's width)."""
    layers = [m for m in model.modules() if ROTATION_METHOD in vars(type(m))]
    if not layers:
        raise refuse(model_type, f"expected attention layers with {ROTATION_METHOD}, found none")
    sizes = {getattr(m, "attention_head_size", None) for m in layers}
    if sizes != {width} or width % 2:
        raise refuse(
            model_type,
            f"expected even attention heads as wide as the sinusoid ({width}), found {sizes}",
        )
    return layers


def _self_check(attention: nn.Module, sinusoid: nn.Module, model_type: str) -> None:
    """One probe forward of the layer unpatched (the module's own sinusoid rows) and one patched
    (positions, our tables): they must agree."""
    weight = attention.query.weight
    refusal = refuse(
        model_type,
        f"a patched {type(attention).__name__} disagrees with the unpatched one on a probe input "
        "(it rotates q/k differently from torch_rope's GPT-J pairs)",
    )
    length = 12
    rows = min(sinusoid.weight.shape[0], sinusoid.torch_rope[ALL_LAYERS].cos.shape[0])
    hidden = probe((2, length, weight.shape[1]), weight.device, weight.dtype)
    # Positions that are not 0..S-1: each token must turn by its own.
    positions = ((torch.arange(length) * 3 + 1) % rows).to(weight.device)

    def unpatched() -> Tensor:
        return attention(hidden, sinusoidal_pos=sinusoid.weight[positions][None, None])[0]

    def patched() -> Tensor:
        setattr(attention, ROTATION_METHOD, functools.partial(rotate, sinusoid))
        try:
            return attention(hidden, sinusoidal_pos=positions[:, None][None, None])[0]
        finally:
            delattr(attention, ROTATION_METHOD)

    check_against_unpatched(attention, unpatched, patched, weight.dtype, refusal)


def patch(model: nn.Module, model_type: str, row, record: PatchRecord, options) -> None:
    """Put torch_rope under a RoFormer model: the tables and a positions forward on its sinusoid
    module, a rotation method bound to each self-attention layer."""
    warn_tables_kept(model_type, options)
    sinusoid = _sinusoid(model, model_type)
    width = int(sinusoid.weight.shape[-1])
    layers = _attention_layers(model, model_type, width)
    if hasattr(sinusoid, "torch_rope"):
        raise refuse(model_type, "expected a sinusoid module without torch_rope tables")
    max_seq_len = options.max_seq_len
    rows = sinusoid.weight.shape[0] if max_seq_len is None else max_seq_len
    device = sinusoid.weight.device
    tables = RotaryPositionalEmbedding(THETA, width, rows, device, interleaved=True)
    record.set(sinusoid, "torch_rope", nn.ModuleDict({ALL_LAYERS: tables}))
    # numpy's float64 angles and ours agree to rounding.
    owner = f"the weight of {type(sinusoid).__name__}"
    check_tables(tables, sinusoid.weight, owner, model_type, 1e-5)
    for layer in layers:
        _self_check(layer, sinusoid, model_type)
        record.set(layer, ROTATION_METHOD, functools.partial(rotate, sinusoid))
        record.attention.append(layer)
    record.set(sinusoid, "forward", bind(positions_forward, sinusoid))
