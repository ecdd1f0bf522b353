# SPDX-License-Identifier: BSD-3-Clause
"""torch_rope tables for a transformers model, from its config, built by the float64 builder.

* Text tables: one :class:`~torch_rope.RotaryPositionalEmbedding` per layer type of a rotary
  module (:data:`ALL_LAYERS` when its layers share one RoPE), from ``config.rope_parameters``
  (older configs: ``rope_scaling``), checked against transformers' own frequencies; ``dynamic``
  re-evaluated as transformers does (:func:`follow_dynamic`).
* :class:`AxialTables`: a vision tower's 2-D (or 3-D) RoPE, one run of planes per position axis.

Both are float32 non-persistent buffers that keep their dtype when the model is cast.
"""

import math
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import Tensor, nn

from .._patching.host_reads import readable as _positions_readable
from ..nn import RotaryPositionalEmbedding, apply_keeping_table_dtypes
from ..ops.tables import rope_frequencies, rope_tables_from_inv_freq

#: The table key of a rotary module whose layers all share one RoPE (one with layer types, such as
#: Gemma 3, keys its tables by layer type instead).
ALL_LAYERS = "all"

#: The positions the tables cover for a config that names no maximum (RecurrentGemma's, whose
#: local attention has a window but whose positions keep counting): those of its pretraining.
_ROWS_WITHOUT_A_MAXIMUM = 8192


def layer_types(rotary: nn.Module) -> Optional[List[str]]:
    """The layer types of a per-layer-type rotary module (Gemma 3), else None."""
    types = getattr(rotary, "layer_types", None)
    if types is None or hasattr(rotary, "inv_freq"):
        return None
    return [t for t in types if hasattr(rotary, f"{t}_inv_freq")]


def default_rows(config, params: Optional[Dict[str, Any]] = None) -> int:
    """How many positions patch's tables cover at first when ``max_seq_len`` is not given:
    ``config.max_position_embeddings``, or the length a scaling declares when it is longer
    (``factor * original_max_position_embeddings``: the YaRN recipe of Qwen2.5's model cards
    leaves ``max_position_embeddings`` at the original length)."""
    rows = getattr(config, "max_position_embeddings", None)
    rows = _ROWS_WITHOUT_A_MAXIMUM if rows is None else rows
    factor = (params or {}).get("factor")
    original = (params or {}).get("original_max_position_embeddings")
    if isinstance(factor, (int, float)) and isinstance(original, int):
        rows = max(rows, math.ceil(factor * original))
    return rows


def layer_config(config, key: str):
    """The config a rotary module reads for layer type ``key``: ``config.per_layer_config[key]``
    where the config is heterogeneous (Gemma 4's full layers have a head twice as wide as its
    sliding ones, and transformers then refuses to read ``head_dim`` from the global config), else
    ``config`` itself, as transformers' rotary modules do."""
    if key != ALL_LAYERS and getattr(config, "is_heterogeneous", False):
        return config.per_layer_config[key]
    return config


def rope_parameters(config, key: str) -> Dict[str, Any]:
    """config.rope_parameters (of layer type ``key``); for a config that has only a rope_theta
    (ESM's), the default RoPE at that theta, which is what its rotary module computes."""
    config = layer_config(config, key)
    params = getattr(config, "rope_parameters", None)
    if params is None and key == ALL_LAYERS and hasattr(config, "rope_theta"):
        return {"rope_type": "default", "rope_theta": config.rope_theta}
    return params if key == ALL_LAYERS else params[key]


def rope_type(params: Dict[str, Any]) -> str:
    return params.get("rope_type", params.get("type", "default"))


def module_rope_parameters(rotary: nn.Module, key: str) -> Dict[str, Any]:
    """The RoPE rotary module ``rotary`` computes for layer type ``key``: the config's
    (:func:`rope_parameters`), except where the module says its own ``rope_type`` is the default
    over a scaled config (Molmo 2's unscaled module, beside the scaled one, for the layers outside
    ``rope_scaling_layers``): the default RoPE at the config's theta."""
    params = rope_parameters(rotary.config, key)
    own = getattr(rotary, "rope_type", None)
    if key == ALL_LAYERS and own == "default" and rope_type(params) != "default":
        return {"rope_type": "default", "rope_theta": params["rope_theta"]}
    return params


def _scaling_dict(params: Dict[str, Any], config) -> Dict[str, Any]:
    """config.rope_parameters (one layer type's) -> the dict RotaryPositionalEmbedding takes."""
    # mrope_section / mrope_interleaved say which position axis each plane reads, not how the
    # frequencies are made: they go to the op, not to the table builder. llama_4_scaling_beta
    # (Ministral 3, Mistral 4) scales q by position in the attention layer, after the rotation,
    # which patch leaves as it is (the self-check runs it).
    scaling = {
        k: v
        for k, v in params.items()
        if v is not None and k not in ("mrope_section", "mrope_interleaved", "llama_4_scaling_beta")
    }
    if rope_type(scaling) in ("dynamic", "yarn", "longrope"):
        # The pretraining length these variants read from the config, outside the dict.
        scaling["max_position_embeddings"] = config.max_position_embeddings
    return scaling


def device_of(rotary: nn.Module, key: str) -> torch.device:
    name = "inv_freq" if key == ALL_LAYERS else f"{key}_inv_freq"
    return getattr(rotary, name).device


def make_tables(
    rotary: nn.Module,
    key: str,
    rotary_dim: int,
    max_seq_len: int,
    axes: Optional[Tuple[bool, Optional[List[int]], bool]] = None,
    seq_len: Optional[int] = None,
    use_tables: bool = True,
) -> RotaryPositionalEmbedding:
    """The tables of layer type ``key`` of ``rotary``, ``max_seq_len`` rows (more if ``seq_len``,
    the length ``dynamic`` is evaluated at, is larger). ``axes``: a multi-axis text tower's
    ``(interleaved, mrope_section, mrope_interleaved)``. ``use_tables=False``: the table-free
    module (float64 frequencies only), for any position."""
    config = rotary.config
    params = module_rope_parameters(rotary, key)
    scaling = _scaling_dict(params, config)
    if seq_len is not None:
        scaling["seq_len"] = seq_len
    interleaved, mrope_section, mrope_interleaved = axes or (False, None, False)
    tables = RotaryPositionalEmbedding(
        float(params["rope_theta"]),
        rotary_dim,
        max(max_seq_len, seq_len or 0),
        device_of(rotary, key),
        interleaved=interleaved,
        scaling=scaling,
        tables=use_tables,
    )
    # Multi-axis positions: read by the patched layers (rotate.apply_with_tables), never by the
    # module's own forward, which patch does not call.
    tables.mrope_section = mrope_section
    tables.mrope_interleaved = mrope_interleaved
    # Set by the layout check: NanoChat's rotate_half turns by minus the angle.
    tables.inverse = False
    # Set by the family: NeoMME's two axes alternate plane by plane (rotate.alternating_rows).
    tables.alternating = False
    return tables


def hf_frequencies(rotary: nn.Module, key: str) -> Tuple[Tensor, float]:
    """transformers' own (inv_freq, attention_scaling) for this rotary module, computed afresh
    from the config in float32 (the module's buffer may have been cast to bf16 with the model)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    kind = rope_type(module_rope_parameters(rotary, key))
    kwargs = {} if key == ALL_LAYERS else {"layer_type": key}
    if kind == "default":
        init = getattr(type(rotary), "compute_default_rope_parameters", None)
    else:
        init = ROPE_INIT_FUNCTIONS.get(kind)
    if init is None:
        raise NotImplementedError(
            f"torch_rope.hf.patch: cannot find transformers' initialisation of rope_type "
            f"{kind!r} for {type(rotary).__name__}; not patching"
        )
    config = layer_config(rotary.config, key)
    inv_freq, attention_scaling = init(config, device=torch.device("cpu"), **kwargs)
    return inv_freq.float(), float(attention_scaling)


def multi_axis(model_type: str, row, rotary: nn.Module, keys: List[str]):
    """Per table key, a multi-axis text tower's (interleaved, mrope_section, mrope_interleaved);
    None for a text model with 1-D positions."""
    if row.multi_axis is None:
        return None
    if row.multi_axis.alternating:
        # Two axes, plane by plane (NeoMME): no section to read, the rule is fixed. The section
        # only counts the planes each axis turns: the patched rotary module hands on (B, S, 2)
        # positions, and the layers read the tables' ``alternating``, not the section.
        planes = {key: hf_frequencies(rotary, key)[0].numel() for key in keys}
        pairs = row.multi_axis.interleaved
        return {key: (pairs, [(p + 1) // 2, p // 2], False) for key, p in planes.items()}
    section = getattr(rotary, "mrope_section", None)
    # One section for the model, or (Cohere Compass) one per layer type that rotates.
    sections = section if isinstance(section, dict) else dict.fromkeys(keys, section)
    if set(sections) != set(keys) or any(
        not isinstance(s, (list, tuple)) or len(s) != 3 for s in sections.values()
    ):
        raise NotImplementedError(
            f"torch_rope.hf.patch: expected the {model_type} text rotary module to have a "
            f"3-axis mrope_section for each of its layer types {keys}, found {section!r}; "
            "not patching"
        )
    interleaved, mrope_interleaved = row.multi_axis.interleaved, row.multi_axis.mrope_interleaved
    return {key: (interleaved, [int(s) for s in sections[key]], mrope_interleaved) for key in keys}


def check_frequencies(
    rotary: nn.Module, key: str, tables: RotaryPositionalEmbedding, hf: Tuple[Tensor, float]
) -> None:
    """Our float64 frequencies must round to transformers' float32 ones (``hf``, from
    :func:`hf_frequencies`) and the attention factors agree; otherwise the model is refused."""
    hf_inv_freq, hf_scaling = hf
    ours, ours_scaling = rope_frequencies(
        tables.theta, tables.rotary_dim, scaling=tables.scaling, seq_len=1
    )
    if not (
        torch.allclose(ours.float(), hf_inv_freq, rtol=1e-5, atol=0)
        and abs(ours_scaling - hf_scaling) <= 1e-6 * hf_scaling
    ):
        raise NotImplementedError(
            f"torch_rope.hf.patch: the frequencies built from config.rope_parameters "
            f"({rope_parameters(rotary.config, key)}) do not match transformers' own for this "
            "model; not patching"
        )


class DynamicState:
    """transformers' dynamic-NTK bookkeeping (dynamic_rope_update), mirrored step for step."""

    def __init__(self, original: int) -> None:
        self.original = original
        self.cached = original


def follow_dynamic(rotary: nn.Module, key: str, state: DynamicState, seq_len: int) -> None:
    """transformers recomputes dynamic frequencies when a sequence (``seq_len``, its largest
    position + 1) outgrows the cached length, and resets them when a short sequence follows a long
    one."""
    old = rotary.torch_rope[key]
    axes = (old.interleaved, old.mrope_section, old.mrope_interleaved)
    if seq_len > state.cached:
        rotary.torch_rope[key] = make_tables(
            rotary, key, old.rotary_dim, seq_len, axes, seq_len=seq_len, use_tables=old.tables
        )
        state.cached = seq_len
    if seq_len < state.original < state.cached:
        rotary.torch_rope[key] = make_tables(
            rotary, key, old.rotary_dim, state.original, axes, seq_len=state.original,
            use_tables=old.tables,
        )  # fmt: skip
        state.cached = state.original
    # The rebuilt tables keep the layout the check found (GPT-J pairs, minus the angle) and the
    # family's axis rule.
    rotary.torch_rope[key].inverse = old.inverse
    rotary.torch_rope[key].alternating = old.alternating


def serving(rotary: nn.Module, key: str, position_ids: Tensor) -> RotaryPositionalEmbedding:
    """The tables of layer type ``key``, made to serve ``position_ids`` (the patched rotary
    module's forward calls this once per call, before handing the tables on).

    transformers computes its angles per call, so its models run at any position. Here the
    largest position is read on the host, one device sync on CUDA per call of the rotary module
    (the sync transformers' own ``dynamic`` makes): ``dynamic`` frequencies follow it as
    transformers' do, and tables too short for it are rebuilt twice as long (or as long as the
    call needs, if that is more), so that growth is rare. Where the positions cannot be read
    (:func:`_positions_readable`: torch.compile, CUDA graphs) the tables stay as they are and a
    position past them raises in the op (``IndexError`` on CPU, a device assert on CUDA): pass
    ``max_seq_len`` to ``patch`` to size them for that. ``dynamic`` is read whatever the mode, as
    transformers reads it (a graph break under torch.compile)."""
    dynamic = rotary._torch_rope_dynamic.get(key)
    found = rotary.torch_rope[key]
    if position_ids.numel() == 0 or (
        dynamic is None and (not found.tables or not _positions_readable(position_ids))
    ):
        return found  # (table-free and not dynamic: nothing follows the positions, no sync)
    seq_len = int(position_ids.max()) + 1
    if dynamic is not None:
        follow_dynamic(rotary, key, dynamic, seq_len)
    found = rotary.torch_rope[key]
    if found.tables and seq_len > found.max_seq_len:  # (table-free: no position bound)
        found.extend_tables(max(seq_len, 2 * found.max_seq_len))
    return found


class AxialTables(nn.Module):
    """A vision tower's 2-D RoPE tables: ``cos[p, k] = cos(p * frequencies[k])`` for the ``2 n``
    planes (n per axis: mostly the same n frequencies again on each axis; Pixtral's axes have
    frequencies of their own), built in float64 and stored float32 as non-persistent buffers that
    keep their dtype when the model is cast. Planes ``[0, n)`` turn by the row, ``[n, 2n)`` by
    the column (``mrope_section = [n, n]``); with three axes, frame, row and column,
    ``[n, n, n]``, and the planes past ``3 n`` pass through."""

    interleaved = False
    mrope_interleaved = False
    # Inkling2's tower turns its first planes by the column and pairs GPT-J style: set per model
    # type; the layers reverse the (row, column) positions they get.
    column_first = False
    # Kimi-K2.5's tower alternates the axes plane by plane instead of one run per axis: the
    # layers turn by per-call rows gathered from these tables (axial_vision.alternating_rows).
    alternating = False

    def __init__(self, frequencies: Tensor, axes: int, max_seq_len: int, device) -> None:
        super().__init__()
        n = frequencies.numel() // axes
        self.mrope_section = [n] * axes
        self.rotary_dim = 2 * n * axes
        self.max_seq_len = max_seq_len
        cos, sin = rope_tables_from_inv_freq(frequencies, max_seq_len, device)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def _apply(self, fn, recurse=True):
        # As RotaryPositionalEmbedding: follow device moves, not dtype casts.
        return apply_keeping_table_dtypes(self, super()._apply, fn, recurse)

    def extra_repr(self) -> str:
        return f"max_seq_len={self.max_seq_len}, mrope_section={self.mrope_section}"
