# SPDX-License-Identifier: BSD-3-Clause
"""Hugging Face transformers integration: one line to put torch_rope under a loaded model.

    import torch_rope.hf
    model = torch_rope.hf.patch(model)        # every attention layer now calls rope::apply_qk
    model = torch_rope.hf.unpatch(model)      # and back

Two entry points, both thin layers over :func:`torch_rope.apply_qk`:

* :func:`apply_rotary_pos_emb` has the signature and the results of transformers' own function
  (``q, k, cos, sin, unsqueeze_dim=1`` with HF's gathered ``(B, S, R)`` cos/sin), for code that
  calls it directly.
* :func:`patch` goes further: the model's rotary module hands the *positions* to the attention
  layers instead of gathered cos/sin, and each attention layer rotates q and k with tables from
  torch_rope's float64 builder (``config.rope_parameters``, or ``rope_scaling`` in older configs).

transformers is imported lazily, only by :func:`patch`; ``import torch_rope.hf`` never needs it.

Why patch does not go through transformers' own ``rotary_pos_emb`` kernel hook: the hook swaps
the function for every model of an architecture in the process (patch changes one model and can
be undone), and it keeps the gathered-cos/sin signature, so the rotary module would still gather
(and, for a bf16 model, round) its tables on every call. (For users who want the hook anyway,
:mod:`torch_rope.hf_kernel` is a layer for it.) patch instead
hands the attention layers positions and float32 tables built in float64.
"""

import functools
import inspect
import sys
import types
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import Tensor, nn

from . import (
    _hf_complex,
    _hf_gptj,
    _hf_llama4_vision,
    _hf_qk_norm,
    _hf_refused,
    _hf_roformer,
    _hf_stacks,
    _hf_vision_tower,
)
from ._scaling import rope_frequencies, rope_tables_from_inv_freq
from .nn import RotaryPositionalEmbedding, apply_keeping_table_dtypes, long_rope_positions
from .ops import apply, apply_qk

__all__ = ["apply_rotary_pos_emb", "patch", "unpatch", "is_patched", "SUPPORTED_MODEL_TYPES"]

#: Vision-language models: a text tower with multi-axis positions (M-RoPE: ``position_ids`` of
#: shape ``(3, B, S)``, temporal/height/width) and a vision tower with 2-D (row, column) RoPE.
#: Per model type: the text tower's pair layout (torch_rope's ``interleaved``: GLM-4V's text
#: rotates GPT-J pairs, the others ``rotate_half``) and how its planes are dealt to the three axes
#: (``mrope_interleaved``: Qwen3-VL's interleaved rule; the others contiguous runs of
#: ``mrope_section``). The vision towers all rotate ``rotate_half`` over the whole head, the first
#: half of the planes by the row and the second half by the column, each half with its own
#: frequencies ``theta^(-2j/(head_dim/2))``.
_VLM_TYPES: Dict[str, Tuple[bool, bool]] = {
    "qwen2_vl": (False, False),
    "qwen2_5_vl": (False, False),
    "qwen3_vl": (False, True),
    "qwen3_vl_moe": (False, True),
    "glm4v": (True, False),
    "glm4v_moe": (False, False),
    "glm_ocr": (True, False),
    "paddleocr_vl": (False, False),
    "cohere_compass": (False, True),  # one M-RoPE table per layer type
    # Whole models whose vision tower has no RoPE (_UNROTATED_VISION): only the text is patched.
    "cosmos3_edge": (False, True),
    "glm_image": (False, False),
    # Text towers on their own: multi-axis text positions, no vision tower to patch.
    "qwen2_vl_text": (False, False),
    "qwen2_5_vl_text": (False, False),
    "qwen3_vl_text": (False, True),
    "qwen3_vl_moe_text": (False, True),
    "glm4v_text": (True, False),
    "glm4v_moe_text": (False, False),
    "cosmos3_edge_text": (False, True),
    "glm_image_text": (False, False),
    "glm_ocr_text": (True, False),
    "qwen3_5_text": (False, True),
    "qwen3_5_moe_text": (False, True),
    # Per-layer-type M-RoPE (its sliding layers rotate, its full ones do not), Qwen3-VL's rule.
    "cohere_compass_text": (False, True),
}
#: The types of :data:`_VLM_TYPES` that are a text tower alone (a ``*TextModel`` loaded by itself,
#: or a causal LM whose model is one): patch rotates their text with multi-axis positions and has no
#: vision tower to patch.
_TEXT_TOWERS = (
    "qwen2_vl_text",
    "qwen2_5_vl_text",
    "qwen3_vl_text",
    "qwen3_vl_moe_text",
    "glm4v_text",
    "glm4v_moe_text",
    "cosmos3_edge_text",
    "glm_image_text",
    "glm_ocr_text",
    "qwen3_5_text",
    "qwen3_5_moe_text",
    "cohere_compass_text",
)

#: Vision-language models whose vision tower has no RoPE (a SigLIP, CLIP or SAM-style tower with
#: learned or no positions): patch puts torch_rope under their text tower only, with multi-axis
#: positions for those in :data:`_VLM_TYPES`, as a text model's otherwise.
_UNROTATED_VISION = (
    "cosmos3_edge",
    "glm_image",
    "granite_docling",
    "granite4_vision",
    "unlimited_ocr",
)

#: Vision-language models whose text tower rotates with ordinary 1-D positions (patched as a text
#: model is) and whose vision tower has the same axial 2-D RoPE as Qwen2-VL's (patched as the
#: vision towers of :data:`_VLM_TYPES` are).
_VISION_TOWER_TYPES = ("video_llama_3", "lfm3_vl", "exaone4_5", "minimax_m3_vl")
#: Vision towers whose axial RoPE has more than the (row, column) axes: MiniMax-M3-VL's turns the
#: first third of each head by the frame, the second by the row, the third by the column (each
#: rounded down to whole pairs; the rest of the head passes through).
_VISION_AXES = {"minimax_m3_vl": 3}

#: transformers model types that :func:`patch` knows: each was checked against the unpatched model
#: (fp32 logits, greedy generation with a KV cache, bf16 error) by this project's tests. The text
#: models rotate through a module-level ``apply_rotary_pos_emb(q, k, cos, sin)`` (Gemma 4: one
#: tensor a call; DeepSeek-style MLA: ``apply_rotary_pos_emb_interleave``, on each head's rotary
#: slice) called from the attention's forward, with ``rotate_half`` or GPT-J pairs (the
#: self-check finds which); Llama 4's text model and DeepSeek-V2 through complex-number
#: ``apply_rotary_emb(xq, xk, freqs_cis)`` (GPT-J pairs, :mod:`torch_rope._hf_complex`); the
#: vision-language models (:data:`_VLM_TYPES`) also rotate their
#: vision tower's q/k, through ``apply_rotary_pos_emb_vision``.
SUPPORTED_MODEL_TYPES = (
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "phi3",
    "gpt_neox",
    "gemma",
    "gemma2",
    "gemma3_text",
    "olmo2",
    "granite",
    "granitemoe",
    "starcoder2",
    "olmo",
    "olmo3",
    "smollm3",
    "arcee",
    "exaone4",
    "seed_oss",
    "apertus",
    # Built tiny from their default configs (tests/python/support/hf_models.py, TINY).
    "afmoe",
    "aria_text",
    "axk1",
    "bamba",
    "beam",
    "bitnet",
    "cohere",
    "cohere2",
    "cohere2_moe",
    "cwm",
    "deepseek_v3",
    "diffllama",
    "doge",
    "ernie4_5",
    "ernie4_5_moe",
    "exaone_moe",
    "falcon",
    "falcon_h1",
    "flex_olmo",
    "flint",
    "gemma3",
    "gemma4",
    "gemma4_text",
    "gemma4_unified",
    "gemma4_unified_text",
    "glm",
    "glm4",
    "glm4_moe",
    "glm4_moe_lite",
    "gpt_neox_japanese",
    "gpt_oss",
    "granitemoeshared",
    "helium",
    "hy_v3",
    "hyperclovax",
    "internlm3",
    "iquestcoder",
    "jais2",
    "jetmoe",
    "kolibri1",
    "laguna",
    "lfm2",
    "lfm3",
    "longcat_flash",
    "mellum",
    "minicpm3",
    "minimax",
    "minimax_m2",
    "minimax_m3_vl_text",
    "modernbert-decoder",
    "olmo_hybrid",
    "olmoe",
    "persimmon",
    "phi",
    "phi4_multimodal",
    "phimoe",
    "qwen3_next",
    "solar_open",
    "stablelm",
    "vaultgemma",
    "youtu",
    "bailing_hybrid",
    "dots1",
    "hunyuan_v1_dense",
    "hunyuan_v1_moe",
    "mimo_v2_flash",
    "ministral",
    "ministral3",
    "nemotron",
    "gemma3n_text",
    # Turns by minus the angle (its rotate_half returns (x2, -x1)): the layout check finds it.
    "nanochat",
    # Complex-form RoPE (freqs_cis and apply_rotary_emb): python/torch_rope/_hf_complex.py.
    *_hf_complex.MODEL_TYPES,
    # Default configs completed by hand (hf_models._TINY_OVERRIDES).
    "dbrx",
    "granitemoehybrid",
    "hrm_text",
    "lfm2_moe",
    # The text models that emu3's and mllama's causal-LM classes are (hf_models.TEXT).
    "emu3_text_model",
    "mllama_text_model",
    # Base models with no causal-LM class (encoders, embedding models), tested on their last
    # hidden states (tests/python/support/hf_models.py, BASE).
    "aria",
    "chameleon",
    "embedding_gemma2",
    "embedding_gemma2_text",
    "esmc",
    "eurobert",
    "granite_docling_text",
    "gte",
    "higgs_audio_v2",
    "jina_embeddings_v3",
    "mistral4",
    "modernbert",
    "muse_glimmer_text",
    "nomic_bert",
    "openai_privacy_filter",
    "ultrabert",
    # GPT-J family: no rotary module; each attention layer gathers its own sin | cos table and
    # rotates GPT-J pairs (python/torch_rope/_hf_gptj.py; tests: hf_models.TINY).
    *_hf_gptj.MODEL_TYPES,
    # Untested-build family: built tiny once their default configs were completed
    # (hf_models._TINY_OVERRIDES), patched part by part where they have a rotary module per stack
    # or per layer (_hf_stacks), and tested with the inputs beyond token ids that their forwards
    # read (hf_models.batch_for).
    "esm",
    "t5gemma",
    "t5gemma2",
    "t5gemma2_encoder",
    "pocket_tts",
    "kyutai_speech_to_text",
    "dia",
    "moonshine_streaming",
    "voxtral_realtime_text",
    "recurrent_gemma",
    "zamba2",
    # Vision-language models whose vision tower has no RoPE, tested whole from token ids
    # (hf_models.IMAGE_TEXT; glm_image, with no LM head, in hf_models.BASE).
    "granite_docling",
    "granite4_vision",
    "unlimited_ocr",
    # RoFormer: no rotary module; its encoder's sinusoid module hands rows to a rotation method
    # of each self-attention layer (python/torch_rope/_hf_roformer.py; tests: hf_models.TINY).
    *_hf_roformer.MODEL_TYPES,
    # Llama 4 (vision-language): the text model as llama4_text, the vision tower's complex 2-D
    # RoPE as GPT-J pairs over two axes (python/torch_rope/_hf_llama4_vision.py).
    *_hf_llama4_vision.MODEL_TYPES,
    *_VLM_TYPES,
    *_VISION_TOWER_TYPES,
    # Vision towers loaded on their own: only the vision RoPE
    # (python/torch_rope/_hf_vision_tower.py; tests: test_hf_vision_tower.py).
    *_hf_vision_tower.MODEL_TYPES,
)

# The types with no rotary module, each patched by a module of its own (same patch signature).
_NO_ROTARY_MODULE = {
    **dict.fromkeys(_hf_gptj.MODEL_TYPES, _hf_gptj),
    **dict.fromkeys(_hf_roformer.MODEL_TYPES, _hf_roformer),
}

# Why patch refuses each of the other rotary model types (python/torch_rope/_hf_refused.py).
_REFUSED = _hf_refused.REFUSED

_HF_NAME = "apply_rotary_pos_emb"
# DeepSeek's MLA (and the models built on it) rotate GPT-J pairs through a function of its own;
# a patched layer calls our function under either name, with the pair layout the self-check found.
_HF_NAMES = (_HF_NAME, "apply_rotary_pos_emb_interleave")
_HF_VISION_NAME = "apply_rotary_pos_emb_vision"
_ONE_TYPE = "all"  # the table key of a model whose layers share one RoPE
_PATCH_ATTR = "_torch_rope_patch"


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
    return _rotate_qk(q, k, cos_table, sin_table, positions, unsqueeze_dim, interleaved=False)


# ---- patch ------------------------------------------------------------------------------------


class _Patch:
    """What patch() changed on one model, so that unpatch() can undo exactly that."""

    def __init__(self) -> None:
        self.rotary: List[nn.Module] = []
        self.attention: List[nn.Module] = []


def is_patched(model: nn.Module) -> bool:
    """True when :func:`patch` was applied to ``model`` (and not undone)."""
    return getattr(model, _PATCH_ATTR, None) is not None


def _model_type(model: nn.Module) -> str:
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "model_type"):
        raise TypeError(
            "torch_rope.hf.patch: expected a transformers PreTrainedModel (with a .config), got "
            f"{type(model).__name__}"
        )
    return config.model_type


def _is_vision_rotary(module: nn.Module) -> bool:
    return type(module).__name__.endswith("VisionRotaryEmbedding")


def _rotary_modules(model: nn.Module, vision: bool = False) -> List[nn.Module]:
    """The text rotary modules of ``model`` (``vision``: its vision towers' rotary modules)."""
    found = []
    for module in model.modules():
        if (
            type(module).__name__.endswith("RotaryEmbedding")
            and hasattr(module, "config")
            and (hasattr(module, "inv_freq") or hasattr(module, "layer_types"))
            and _is_vision_rotary(module) == vision
        ):
            found.append(module)
    return found


def _calls_hf_apply(module: nn.Module, names: Tuple[str, ...] = _HF_NAMES) -> bool:
    forward = getattr(type(module), "forward", None)
    code = getattr(forward, "__code__", None)
    return code is not None and any(
        name in code.co_names and name in forward.__globals__ for name in names
    )


def _layer_types(rotary: nn.Module) -> Optional[List[str]]:
    """The layer types of a per-layer-type rotary module (Gemma 3), else None."""
    layer_types = getattr(rotary, "layer_types", None)
    if layer_types is None or hasattr(rotary, "inv_freq"):
        return None
    return [t for t in layer_types if hasattr(rotary, f"{t}_inv_freq")]


#: The positions the tables cover for a config that names no maximum (RecurrentGemma's, whose
#: local attention has a window but whose positions keep counting): those of its pretraining.
_ROWS_WITHOUT_A_MAXIMUM = 8192


def _default_rows(config) -> int:
    """How many positions patch's tables cover when ``max_seq_len`` is not given."""
    rows = getattr(config, "max_position_embeddings", None)
    return _ROWS_WITHOUT_A_MAXIMUM if rows is None else rows


def _rope_parameters(config, key: str) -> Dict[str, Any]:
    """config.rope_parameters (of layer type ``key``); for a config that has only a rope_theta
    (ESM's), the default RoPE at that theta, which is what its rotary module computes."""
    params = getattr(config, "rope_parameters", None)
    if params is None and key == _ONE_TYPE and hasattr(config, "rope_theta"):
        return {"rope_type": "default", "rope_theta": config.rope_theta}
    return params if key == _ONE_TYPE else params[key]


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
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type in ("dynamic", "yarn", "longrope"):
        # The pretraining length these variants read from the config, outside the dict.
        scaling["max_position_embeddings"] = config.max_position_embeddings
    return scaling


class _DynamicState:
    """transformers' dynamic-NTK bookkeeping (dynamic_rope_update), mirrored step for step."""

    def __init__(self, original: int) -> None:
        self.original = original
        self.cached = original


def _make_tables(
    rotary: nn.Module, key: str, rotary_dim: int, max_seq_len: int, seq_len: Optional[int] = None
) -> RotaryPositionalEmbedding:
    config = rotary.config
    params = _rope_parameters(config, key)
    scaling = _scaling_dict(params, config)
    if seq_len is not None:
        scaling["seq_len"] = seq_len
    theta = float(params["rope_theta"])
    device = _device_of(rotary, key)
    axes = getattr(rotary, "_torch_rope_axes", {})
    interleaved, mrope_section, mrope_interleaved = axes.get(key, (False, None, False))
    tables = RotaryPositionalEmbedding(
        theta,
        rotary_dim,
        max(max_seq_len, seq_len or 0),
        device,
        interleaved=interleaved,
        scaling=scaling,
    )
    # Multi-axis positions: read by the patched layers (_apply_with_tables), never by the module's
    # own forward, which patch does not call.
    tables.mrope_section = mrope_section
    tables.mrope_interleaved = mrope_interleaved
    # Set by the layout check (_check_layout): NanoChat's rotate_half turns by minus the angle.
    tables.inverse = False
    return tables


def _device_of(rotary: nn.Module, key: str) -> torch.device:
    name = "inv_freq" if key == _ONE_TYPE else f"{key}_inv_freq"
    return getattr(rotary, name).device


def _hf_frequencies(rotary: nn.Module, key: str, rope_type: str) -> Tuple[Tensor, float]:
    """transformers' own (inv_freq, attention_scaling) for this rotary module, computed afresh
    from the config in float32 (the module's buffer may have been cast to bf16 with the model)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    kwargs = {} if key == _ONE_TYPE else {"layer_type": key}
    if rope_type == "default":
        init = getattr(type(rotary), "compute_default_rope_parameters", None)
    else:
        init = ROPE_INIT_FUNCTIONS.get(rope_type)
    if init is None:
        raise NotImplementedError(
            f"torch_rope.hf.patch: cannot find transformers' initialisation of rope_type "
            f"{rope_type!r} for {type(rotary).__name__}; not patching"
        )
    inv_freq, attention_scaling = init(rotary.config, device=torch.device("cpu"), **kwargs)
    return inv_freq.float(), float(attention_scaling)


def _patched_rotary_forward(self, x: Tensor, position_ids: Tensor, layer_type=None):
    """The rotary module's forward once patched: hand the positions and the tables on, compute
    nothing. The attention layers unpack them as ``cos, sin`` and pass them to our
    apply_rotary_pos_emb (:func:`_apply_with_tables`)."""
    key = _ONE_TYPE if layer_type is None else layer_type
    tables = self.torch_rope[key]
    dynamic = self._torch_rope_dynamic.get(key)
    if dynamic is not None:
        _dynamic_update(self, key, dynamic, position_ids)
        tables = self.torch_rope[key]
    if getattr(tables, "mrope_section", None) is not None:
        # M-RoPE: HF's (A, B, S) position ids (or (B, S), the same position on every axis, as
        # HF's own expand makes them) become torch_rope's (B, S, A), axis dim last.
        position_ids = position_ids.expand(len(tables.mrope_section), -1, -1).movedim(0, -1)
    return long_rope_positions(position_ids, tables.long_offset, tables.long_after), tables


def _dynamic_update(rotary: nn.Module, key: str, state: _DynamicState, position_ids: Tensor):
    # transformers recomputes the frequencies when a sequence outgrows the cached length, and
    # resets them when a short sequence follows a long one. Both need the length on the host: the
    # same sync transformers' own dynamic_rope_update makes.
    seq_len = int(position_ids.max()) + 1
    old = rotary.torch_rope[key]
    if seq_len > state.cached:
        rotary.torch_rope[key] = _make_tables(rotary, key, old.rotary_dim, seq_len, seq_len=seq_len)
        state.cached = seq_len
    if seq_len < state.original < state.cached:
        rotary.torch_rope[key] = _make_tables(
            rotary, key, old.rotary_dim, state.original, seq_len=state.original
        )
        state.cached = state.original
    # The regrown tables keep the layout the check found (GPT-J pairs, minus the angle).
    rotary.torch_rope[key].interleaved = old.interleaved
    rotary.torch_rope[key].inverse = old.inverse


def _seq_major(x: Tensor) -> bool:
    """A (B, H, S, D) view of (B, S, H, D) memory, as transformers' q/k:
    ``view().transpose(1, 2)``."""
    return x.dim() == 4 and x.stride(1) < x.stride(2)


def _rotate_qk(
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
):
    """apply_qk at ``positions`` (B, S), or (B, S, A) with ``mrope_section`` (A position axes),
    for q/k laid out as transformers' attention has them; with ``normed`` (a
    :class:`_hf_qk_norm.NormedTables`), rms_norm_apply_qk: the layer's q/k norms fused in.

    HF's q and k are (B, H, S, D) views of (B, S, H, D) projections. Rotating the (B, S, H, D)
    views (positions (B, S, 1[, A])) walks memory in order, which the CPU kernel does 2-5x faster
    than the transposed order; the results are handed back as (B, H, S, D) views, as HF's are.
    """
    flags = {"interleaved": interleaved, "inverse": inverse}
    if mrope_section is not None:
        flags.update(mrope_section=mrope_section, mrope_interleaved=mrope_interleaved)
    batch_dims = positions.dim() - (mrope_section is not None)
    seq_major = unsqueeze_dim == 1 and batch_dims == 2 and _seq_major(q) and _seq_major(k)
    if seq_major:
        q, k, positions = q.transpose(1, 2), k.transpose(1, 2), positions.unsqueeze(2)
    else:
        positions = positions.unsqueeze(unsqueeze_dim)
    if normed is None:
        q_out, k_out = apply_qk(q, k, cos_table, sin_table, positions, **flags)
    else:
        q_out, k_out = _hf_qk_norm.norm_rotate(q, k, positions, normed, flags)
    if seq_major:
        return q_out.transpose(1, 2), k_out.transpose(1, 2)
    return q_out, k_out


def _apply_with_tables(q, k, cos, sin=None, unsqueeze_dim=1):
    """What a patched attention layer calls as apply_rotary_pos_emb: ``cos`` holds the positions
    (B, S) (M-RoPE: (B, S, 3)) and ``sin`` the torch_rope tables module, as the patched rotary
    module returned them. Gemma 4 rotates one tensor per call, ``(x, cos, sin, unsqueeze_dim)``:
    there the positions arrive as ``k`` and the tables as ``cos``."""
    if sin is None and isinstance(cos, nn.Module):
        return _rotate_one(q, k, cos, unsqueeze_dim)
    positions, tables, normed = cos, sin, None
    if isinstance(tables, _hf_qk_norm.NormedTables):  # a layer with fused q/k norms
        tables, normed = tables.tables, tables
    return _rotate_qk(
        q,
        k,
        tables.cos,
        tables.sin,
        positions,
        unsqueeze_dim,
        tables.interleaved,
        getattr(tables, "mrope_section", None),
        getattr(tables, "mrope_interleaved", False),
        normed,
        getattr(tables, "inverse", False),
    )


def _rotate_one(x: Tensor, positions: Tensor, tables: nn.Module, unsqueeze_dim: int) -> Tensor:
    """One tensor (B, H, S, D) or (B, S, H, D) rotated at ``positions`` (B, S)."""
    return apply(
        x,
        tables.cos,
        tables.sin,
        positions.unsqueeze(unsqueeze_dim),
        interleaved=tables.interleaved,
        inverse=getattr(tables, "inverse", False),
    )


def _apply_vision_with_tables(q, k, cos, sin):
    """What a patched vision attention layer calls as apply_rotary_pos_emb_vision: q and k are
    (N, H, D) (N patches of all images packed), ``cos`` the patches' (N, 2) (row, column)
    positions and ``sin`` the vision tables (put there by
    :func:`_patched_vision_attention_forward`). HF rotates in float32 and returns q's and
    k's dtypes; so does the op."""
    positions, tables = cos, sin
    if tables.column_first:
        positions = positions.flip(-1)
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


# One patched copy of each transformers modeling module's globals, registered as a module of its
# own so that torch.compile resolves the patched forward's globals (it finds them by __name__).
_NAMESPACES: Dict[str, types.ModuleType] = {}


def _patched_namespace(original_globals: Dict[str, Any], refresh: bool) -> Dict[str, Any]:
    """The patched copy of a modeling module's globals: the module's live globals with our
    apply_rotary_pos_emb. ``refresh`` (every patch()) copies them again, so that a name rebound
    since the last patch (another patcher, transformers' hub-kernel swap) is seen; the dict object
    stays the same, so forwards built over it earlier see the refreshed names too."""
    source = original_globals["__name__"]
    module = _NAMESPACES.get(source)
    if module is None:
        name = "torch_rope_hf_patched__" + source.replace(".", "_")
        module = types.ModuleType(name)
        sys.modules[name] = module
        _NAMESPACES[source] = module
        refresh = True
    if refresh:
        name = module.__name__
        module.__dict__.clear()
        module.__dict__.update(original_globals)
        module.__dict__["__name__"] = name
        for hf_name in _HF_NAMES:
            if hf_name in original_globals:
                module.__dict__[hf_name] = _apply_with_tables
        if _HF_VISION_NAME in original_globals:
            module.__dict__[_HF_VISION_NAME] = _apply_vision_with_tables
        module.__dict__.update(_hf_complex.replacements(original_globals, _apply_with_tables))
        module.__dict__.update(_hf_llama4_vision.replacements(original_globals))
    return module.__dict__


_REBUILT_FORWARDS: Dict[type, types.FunctionType] = {}


def _rebuilt_forward(attention_class: type, refresh: bool = False) -> types.FunctionType:
    """attention_class.forward rebuilt over a patched copy of its module's globals, so that its
    apply_rotary_pos_emb is ours while other models (and unpatched instances of the same class)
    keep transformers' function. Rebuilt from the live class and module at every patch()
    (``refresh``); built on first use after unpickling in a new process."""
    function = _REBUILT_FORWARDS.get(attention_class)
    if function is None or refresh:
        original = attention_class.forward
        namespace = _patched_namespace(original.__globals__, refresh)
        function = types.FunctionType(
            original.__code__,
            namespace,
            original.__name__,
            original.__defaults__,
            original.__closure__,
        )
        function.__kwdefaults__ = original.__kwdefaults__
        function.__dict__.update(original.__dict__)
        function.__qualname__ = original.__qualname__
        _REBUILT_FORWARDS[attention_class] = function
    return function


def _patched_attention_forward(attention: nn.Module, *args, **kwargs):
    args, kwargs = _hf_qk_norm.rewrap(attention, args, kwargs)
    return _rebuilt_forward(type(attention))(attention, *args, **kwargs)


class _AxialTables(nn.Module):
    """A vision tower's 2-D RoPE tables: ``cos[p, k] = cos(p * frequencies[k])`` for the ``2 n``
    planes (n per axis: mostly the same n frequencies again on each axis; Pixtral's axes have
    frequencies of their own), built in float64 and stored float32 as non-persistent buffers that
    keep their dtype when the model is cast. Planes ``[0, n)`` turn by the row, ``[n, 2n)`` by
    the column (``mrope_section = [n, n]``); with three axes (:data:`_VISION_AXES`), frame, row
    and column, ``[n, n, n]``, and the planes past ``3 n`` pass through."""

    interleaved = False
    mrope_interleaved = False
    # Inkling2's tower turns its first planes by the column and pairs GPT-J style: set per model
    # from _hf_vision_tower.LAYOUTS; the layers reverse the (row, column) positions they get.
    column_first = False

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


def _vision_tables(
    rotary: nn.Module, head_dim: int, max_seq_len: int, axes: int = 2
) -> _AxialTables:
    """The vision rotary module's tables, after checking that its frequencies are the axial ones
    this builds (theta^(-2j/(head_dim/2)) per axis, no attention factor; with three axes,
    theta^(-2j/(2n)) for the n pairs of each third of the head; Pixtral's one frequency a plane,
    :func:`._hf_vision_tower.split_frequencies`)."""
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
        ours = _hf_vision_tower.split_frequencies(theta, head_dim)
        if not (
            float(hf_scaling) == 1.0
            and torch.allclose(ours.float(), hf_inv_freq.float(), rtol=1e-5, atol=0)
        ):
            raise NotImplementedError(refusal)
        return _AxialTables(ours, axes, max_seq_len, rotary.inv_freq.device)
    ours = theta ** (-torch.arange(0, 2 * n, 2, dtype=torch.float64) / (2 * n))
    whole = 4 * n == head_dim if axes == 2 else n == (head_dim // axes) // 2
    if not (
        whole
        and float(hf_scaling) == 1.0
        and torch.allclose(ours.float(), hf_inv_freq.float(), rtol=1e-5, atol=0)
    ):
        raise NotImplementedError(refusal)
    return _AxialTables(ours.repeat(axes), axes, max_seq_len, rotary.inv_freq.device)


def _patched_vision_rotary_forward(self, x: Tensor, position_ids: Tensor):
    """The vision rotary module's forward once patched: the (N, 2) positions in both slots (the
    model may reorder both the same way, as Qwen2.5-VL's window attention does); the attention
    layers get the tables from :func:`_patched_vision_attention_forward`."""
    return position_ids, position_ids


def _patched_vision_attention_forward(attention: nn.Module, rotary: nn.Module, *args, **kwargs):
    embeddings = kwargs.get("position_embeddings")
    if embeddings is not None:
        kwargs["position_embeddings"] = (embeddings[0], rotary.torch_rope)
    else:
        index = type(attention).forward.__code__.co_varnames.index("position_embeddings") - 1
        if index < len(args) and args[index] is not None:
            args = args[:index] + ((args[index][0], rotary.torch_rope),) + args[index + 1 :]
    return _rebuilt_forward(type(attention))(attention, *args, **kwargs)


def _bind(function, module: nn.Module, *more):
    """``function`` bound to this one module. A partial of a module-level function, not a bound
    method: a bound method pickles as ``getattr(module, name)``, which torch.load cannot resolve,
    while the partial pickles by reference, so a patched model saved whole loads patched."""
    return functools.partial(function, module, *more)


def _self_check(rotary, key, attention) -> None:
    """Refuse to patch when a patched attention layer disagrees with the unpatched one.

    One forward of the layer each way on a probe input: the unpatched forward gets the cos/sin
    (Llama 4, DeepSeek-V2: the complex freqs_cis) of the model's own (unpatched) rotary module,
    as the model would hand them over, so this checks everything between them and the rotated
    q/k: frequencies, their layout (rotate_half's duplicated halves or GPT-J's repeated pairs),
    slices, casts, partial rotary, MLA's rotary slice of each head. The patched one gets the
    positions and the tables, as the patched rotary module returns them. Multi-axis (M-RoPE)
    models get HF's recomposition of our own tables' rows instead, at three position axes that
    differ.
    """
    device = _device_of(rotary, key)
    if device.type == "meta":
        return
    config = rotary.config
    tables = rotary.torch_rope[key]
    dtype = next((p.dtype for p in attention.parameters()), torch.float32)
    length = min(16, _default_rows(config))
    generator = torch.Generator(device="cpu").manual_seed(0)
    hidden = torch.randn(1, length, _input_width(attention, config), generator=generator)
    hidden = hidden.to(device=device, dtype=dtype)
    position_ids = torch.arange(length, device=device).unsqueeze(0)
    section = getattr(tables, "mrope_section", None)
    if section is None:
        # (cos, sin), or a complex-form model's freqs_cis (_hf_complex)
        hf_embeddings = _hf_cos_sin(rotary, key, hidden, position_ids)
    else:
        # Three axes that differ everywhere, dealt to the planes by HF's own recomposition
        # (contiguous or interleaved, rotate_half or GPT-J halves) of our tables' rows.
        steps = torch.arange(length, device=device)
        axes = torch.stack([steps, steps // 2 + 1, (steps * 5 + 3) % length][: len(section)])
        axes = axes.unsqueeze(1)  # HF's (A, B, S)
        recompose = getattr(type(rotary), "recomposition_frequencies", None)
        if recompose is None:
            raise NotImplementedError(
                f"torch_rope.hf.patch: {type(rotary).__name__} has no recomposition_frequencies "
                "to check the multi-axis positions against; not patching"
            )
        if key != _ONE_TYPE:  # one recomposition per layer type (Cohere Compass)
            recompose = functools.partial(recompose, layer_type=key)
        cos = recompose(rotary, tables.cos[axes].clone()).to(dtype)
        sin = recompose(rotary, tables.sin[axes].clone()).to(dtype)
        hf_embeddings = (cos, sin)
        position_ids = axes.movedim(0, -1)  # what the patched rotary module hands on
    our_embeddings = _hf_complex.probe_embeddings(hf_embeddings, position_ids, tables)
    layout = "GPT-J pairs" if tables.interleaved else "rotate_half"
    if getattr(tables, "inverse", False):
        layout += " by minus the angle"
    refusal = (
        f"torch_rope.hf.patch: a patched {type(attention).__name__} disagrees with the unpatched "
        f"one on a probe input (it rotates q/k differently from torch_rope's {layout} RoPE); "
        "not patching this model"
    )
    other = _other_required_arguments(attention)
    if not any(name.endswith("attention_mask") for name in other):
        # (T5Gemma 2's merged attention takes its mask as merged_attention_mask, and would pass
        # an attention_mask on to the attention function a second time.)
        other["attention_mask"] = None
    if "position_ids" in other:  # a layer that reads them itself (Ministral 3's q scaling)
        other["position_ids"] = torch.arange(length, device=device).unsqueeze(0)
    if "encoder_hidden_states" in other:
        # A decoder layer that attends to the encoder's states in the same call (T5Gemma 2's
        # merged self- and cross-attention): the probe's states stand in for them.
        other["encoder_hidden_states"] = hidden
    own_rotary = any(child is rotary for child in attention.children())
    if own_rotary:
        # A layer that holds its rotary module and calls it on position_ids itself
        # (RecurrentGemma): both forwards get the positions, the patched one with the rotary
        # module patched, as the patched model runs it.
        want_rope = got_rope = dict(position_ids=position_ids)
    else:
        want_rope = dict(position_embeddings=hf_embeddings)
        got_rope = dict(position_embeddings=our_embeddings)
    with torch.no_grad():
        try:
            try:
                with _hf_qk_norm.norms_restored(attention):
                    want = type(attention).forward(
                        attention, hidden_states=hidden, **want_rope, **other
                    )[0]
            except TypeError:
                # A layer that adds its mask unconditionally (Falcon): a mask that masks nothing.
                other["attention_mask"] = hidden.new_zeros(1, 1, length, length)
                with _hf_qk_norm.norms_restored(attention):
                    want = type(attention).forward(
                        attention, hidden_states=hidden, **want_rope, **other
                    )[0]
            if own_rotary:
                rotary.forward = _bind(_patched_rotary_forward, rotary)
            try:
                got = _patched_attention_forward(
                    attention, hidden_states=hidden, **got_rope, **other
                )[0]
            finally:
                if own_rotary:
                    del rotary.forward
        except Exception as error:  # e.g. a layer that slices or reshapes cos/sin itself
            raise NotImplementedError(refusal) from error
    if not _close(want, got, dtype):
        raise NotImplementedError(refusal)


def _input_width(attention: nn.Module, config) -> int:
    """The width of the states the attention layer takes: its q projection's input, which is the
    model's hidden size except where the layer reads more (Zamba 2's shared attention takes the
    hidden states concatenated with the input embeddings, twice as wide)."""
    q_proj = getattr(attention, "q_proj", None)
    return q_proj.in_features if isinstance(q_proj, nn.Linear) else config.hidden_size


def _other_required_arguments(attention: nn.Module) -> Dict[str, None]:
    """None for each argument the attention's forward requires beyond those the probe gives:
    what a model passes there when it uses RoPE (Falcon's ``alibi``). A layer that needs more
    fails the probe and is refused."""
    code = type(attention).forward.__code__
    defaults = type(attention).forward.__defaults__ or ()
    names = code.co_varnames[1 : code.co_argcount]  # after self
    required = names[: len(names) - len(defaults)]
    given = ("hidden_states", "position_embeddings", "attention_mask")
    return {name: None for name in required if name not in given}


def _hf_cos_sin(rotary: nn.Module, key: str, hidden: Tensor, position_ids: Tensor):
    """The cos/sin the unpatched rotary module hands the attention layers at ``position_ids``."""
    forward = type(rotary).forward
    with torch.no_grad():
        if key == _ONE_TYPE:
            return forward(rotary, hidden, position_ids)
        return forward(rotary, hidden, position_ids, layer_type=key)


#: The layouts a text model's layers may rotate with, (interleaved, inverse), tried in this order:
#: rotate_half, GPT-J pairs, then either turned by minus the angle (NanoChat's rotate_half returns
#: (x2, -x1)). A layer that passes with one cannot pass with another unless it does not rotate.
_TEXT_LAYOUTS = ((False, False), (True, False), (False, True), (True, True))


def _check_layout(rotary, keys, attentions, layouts: Tuple[Tuple[bool, bool], ...]) -> None:
    """Find the layout the attention layers rotate with and set it on the tables: the first of
    ``layouts`` (torch_rope's ``(interleaved, inverse)``) with which every attention layer passes
    the self-check. rotate_half models pass with ``(False, False)``; GPT-J-pair models (Cohere,
    GLM, DeepSeek's MLA with ``rope_interleave``) with ``(True, False)``; NanoChat, which turns by
    minus the angle, with ``(False, True)``. None passes: the first refusal is raised.

    Every layer is checked, not one per class: layers of one class differ (Cohere 2's full
    layers skip RoPE, its sliding ones rotate), and a layer that does not rotate passes with
    either layout, so checking it alone could pick the wrong one."""
    first_refusal = None
    for interleaved, inverse in layouts:
        for key in keys:
            rotary.torch_rope[key].interleaved = interleaved
            rotary.torch_rope[key].inverse = inverse
        try:
            for attention in attentions:
                for key in keys:
                    _self_check(rotary, key, attention)
            return
        except NotImplementedError as refusal:
            first_refusal = first_refusal or refusal
    raise first_refusal


def _close(want: Tensor, got: Tensor, dtype: torch.dtype) -> bool:
    # float32: the two rotations differ by float32 rounding; 16-bit models also round q and k to
    # their dtype at different points.
    tol = 1e-4 if dtype in (torch.float32, torch.float64) else 5e-2
    scale = want.abs().max().item() or 1.0
    return want.shape == got.shape and (want - got).abs().max().item() <= tol * scale


def _self_check_vision(rotary: nn.Module, attention: nn.Module) -> None:
    """_self_check for a vision attention layer: one forward unpatched, with HF's (N, head_dim)
    cos/sin recomposed by the vision rotary module from our tables' rows at (row, column)
    probe positions, and one patched, with the positions and the tables."""
    tables = rotary.torch_rope
    device = tables.cos.device
    if device.type == "meta":
        return
    refusal = (
        f"torch_rope.hf.patch: a patched {type(attention).__name__} disagrees with the unpatched "
        "one on a probe input (it rotates q/k differently from torch_rope's 2-D RoPE); not "
        "patching this model"
    )
    weight = next((p for p in attention.parameters() if p.dim() == 2), None)
    recompose = getattr(type(rotary), "recomposition_frequencies", None)
    if weight is None or recompose is None:
        raise NotImplementedError(refusal)
    dtype, length = weight.dtype, 12
    generator = torch.Generator(device="cpu").manual_seed(0)
    hidden = torch.randn(length, weight.size(1), generator=generator)
    hidden = hidden.to(device=device, dtype=dtype)
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
    with torch.no_grad():
        try:
            want = type(attention).forward(
                attention,
                hidden,
                position_embeddings=(recompose(rotary, cos), recompose(rotary, sin)),
                **bounds,
            )
            got = _patched_vision_attention_forward(
                attention, rotary, hidden, position_embeddings=(positions,), **bounds
            )
        except Exception as error:
            raise NotImplementedError(refusal) from error
    if isinstance(want, tuple):  # (output, attention weights): VideoLLaMA3's layers
        want, got = want[0], got[0]
    if not _close(want, got, dtype):
        raise NotImplementedError(refusal)


def _patch_vision(model: nn.Module, model_type: str, record: "_Patch", rows: int) -> None:
    """Put torch_rope under the vision tower of a vision-language model (its 2-D RoPE)."""
    rotaries = _rotary_modules(model, vision=True)
    # Pixtral's vision attention calls the text models' apply_rotary_pos_emb.
    name = _HF_NAME if model_type in _hf_vision_tower.TEXT_NAMED_APPLY else _HF_VISION_NAME
    attentions = [m for m in model.modules() if _calls_hf_apply(m, (name,))]
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
    axes = _VISION_AXES.get(model_type, 2)
    rotary.torch_rope = _vision_tables(rotary, head_dims.pop(), rows, axes)
    if model_type in _hf_vision_tower.LAYOUTS:
        rotary.torch_rope.interleaved, rotary.torch_rope.column_first = _hf_vision_tower.LAYOUTS[
            model_type
        ]
    record.rotary.append(rotary)
    checked = set()
    for attention in attentions:
        if type(attention) not in checked:
            _rebuilt_forward(type(attention), refresh=True)
            _self_check_vision(rotary, attention)
            checked.add(type(attention))
        attention.forward = _bind(_patched_vision_attention_forward, attention, rotary)
        record.attention.append(attention)
    rotary.forward = _bind(_patched_vision_rotary_forward, rotary)


def patch(
    model: nn.Module, *, max_seq_len: Optional[int] = None, max_vision_positions: int = 4096
) -> nn.Module:
    """Make every attention layer of a loaded transformers model use torch_rope. Returns ``model``.

    * Tables come from torch_rope's float64 builder, from ``config.rope_parameters`` (older
      configs: ``rope_scaling``), one set per layer type when the config has several (Gemma 3's
      sliding and full layers). They are non-persistent buffers of a ``torch_rope`` submodule of
      the model's rotary module: ``state_dict()`` is unchanged, ``.to(device)`` moves them and
      dtype casts keep them in float32.
    * The rotary module then returns the position ids instead of gathered cos/sin, and each
      attention layer rotates q and k in one ``rope::apply_qk`` call at those positions (strided q/k
      of a fused qkv projection are read in place).
    * ``dynamic`` recomputes the frequencies when a sequence outgrows the cached length, as
      transformers does (with the same host sync); ``longrope`` switches between its short and
      long factors on the device, without a sync.
    * Attention layers that RMS-normalise each head of q and k right before RoPE (Qwen3, Gemma 3,
      ...) call one ``rope::rms_norm_apply_qk`` instead of their q/k norms and ``apply_qk``, when
      their norms pass a probe and the fused layer passes the self-check (docs/huggingface.md).
    * Vision-language models (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4V and their MoE variants,
      GLM-OCR, PaddleOCR-VL, Cohere Compass, whose text has one table per layer type): the
      text tower's (3, B, S) temporal/height/width position ids reach ``apply_qk`` as (B, 1, S, 3)
      multi-axis positions with the model's ``mrope_section`` (and Qwen3-VL's interleaved rule);
      each vision block rotates its patches' q/k with one ``apply_qk`` at their (row, column)
      positions (``mrope_section = [n, n]``), with tables of ``max_vision_positions`` rows.
      VideoLLaMA3, LFM3-VL, EXAONE 4.5 and MiniMax-M3-VL (:data:`_VISION_TOWER_TYPES`): the text
      tower is patched as a text model is, the vision tower as above (MiniMax-M3-VL's at
      (frame, row, column) positions). Cosmos3-Edge, GLM-Image, Granite-Docling, Granite 4
      Vision and UnlimitedOCR (:data:`_UNROTATED_VISION`): their vision tower has no RoPE; only
      the text tower is patched (Cosmos3-Edge's and GLM-Image's with multi-axis positions).
    * Vision towers loaded on their own (``qwen3_vl_vision``, ``glm4v_vision``, ``pixtral``, ...:
      :mod:`._hf_vision_tower`): their vision blocks are patched as above; there is no text RoPE.
    * GPT-J and CodeGen (no rotary module; each attention layer gathers its own sin | cos table):
      one set of tables in a ``torch_rope`` submodule of the base model, and each attention
      layer rotates q and k with one ``rope::apply`` each at its ``position_ids``, in a forward
      of torch_rope's that uses the layer's own projections and attention (:mod:`._hf_gptj`).
    * RoFormer (no rotary module; its encoder's sinusoid module gathers sin | cos rows for every
      layer): the tables on the sinusoid module, whose forward returns the positions instead, and
      each self-attention layer's ``apply_rotary_position_embeddings`` (bound to the instance)
      rotates q and k with one ``rope::apply_qk``, v with one ``rope::apply``
      (:mod:`._hf_roformer`).
    * Llama 4's text model and DeepSeek-V2 rotate through complex numbers (``freqs_cis`` and
      ``apply_rotary_emb``): their layers get the positions and tables in an object that survives
      their ``freqs_cis.to(device)``, and rotate GPT-J pairs with one ``apply_qk``. The
      vision-language Llama 4's vision tower (a precomputed complex ``freqs_ci``) rotates with one
      two-axis ``apply_qk`` at (column + 1, row + 1) positions (:mod:`._hf_llama4_vision`).
    * Only this model is changed: new forwards are bound to its modules, not to their classes.
      :func:`unpatch` restores them. The model stays compilable with ``torch.compile``, and a
      patched model saved whole (``torch.save(model)``) loads patched.

    * A model with a rotary module per part (an encoder-decoder's stacks, RecurrentGemma's
      attention layers) is patched part by part: each rotary module feeds the attention layers
      under the sub-module that holds it (:mod:`torch_rope._hf_stacks`).

    ``max_seq_len`` is the number of positions the tables cover (default
    ``config.max_position_embeddings``, or 8192 for a config that names no maximum); a position
    past it raises an ``IndexError``, as does a
    vision patch row or column past ``max_vision_positions``.

    Raises ``NotImplementedError`` for a model type not in :data:`SUPPORTED_MODEL_TYPES`, or whose
    layers do not match what patch expects, rather than patching it wrongly.
    """
    model_type = _model_type(model)
    if model_type not in SUPPORTED_MODEL_TYPES:
        reason = _REFUSED.get(model_type, "not one of the model types this project tests")
        raise NotImplementedError(
            f"torch_rope.hf.patch: model type {model_type!r} is not supported: {reason} "
            f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    if is_patched(model):
        return model
    record = _Patch()
    try:
        if model_type in _NO_ROTARY_MODULE:  # tables where the model keeps its sinusoid
            _NO_ROTARY_MODULE[model_type].patch(model, model_type, record, max_seq_len, _close)
        elif model_type in _hf_vision_tower.MODEL_TYPES:  # a vision tower alone: no text RoPE
            found = len(_rotary_modules(model))
            if found:
                raise NotImplementedError(_hf_vision_tower.text_rotary_refusal(model_type, found))
        else:
            for rotary, attentions in _text_stacks(model, model_type):
                _patch_text(model_type, rotary, attentions, record, max_seq_len)
        if (
            model_type in _VLM_TYPES and model_type not in _TEXT_TOWERS + _UNROTATED_VISION
        ) or model_type in _VISION_TOWER_TYPES + _hf_vision_tower.MODEL_TYPES:
            _patch_vision(model, model_type, record, max_vision_positions)
        if model_type in _hf_llama4_vision.MODEL_TYPES:
            _hf_llama4_vision.patch(
                model, record, max_vision_positions, _AxialTables, _rebuilt_forward, _close
            )
    except BaseException:
        _undo(record)
        raise
    object.__setattr__(model, _PATCH_ATTR, record)
    return model


def _text_stacks(model: nn.Module, model_type: str) -> List[Tuple[nn.Module, List[nn.Module]]]:
    """Each text rotary module with the attention layers it hands positions to: one for most
    models; one per stack of an encoder-decoder, or per layer that holds its own (_hf_stacks)."""
    rotaries = _rotary_modules(model)
    names = _HF_NAMES + (_hf_complex.HF_NAME,) if _complex_form(model_type) else _HF_NAMES
    attentions = [m for m in model.modules() if _calls_hf_apply(m, names)]
    groups = _hf_stacks.stacks(model, rotaries, attentions)
    if groups is not None:
        return groups
    if len(rotaries) != 1 or not attentions:
        raise NotImplementedError(
            f"torch_rope.hf.patch: expected one rotary embedding module and attention layers "
            f"that call {' or '.join(names)}, found {len(rotaries)} rotary module(s) and "
            f"{len(attentions)} such layer(s) in this {model_type} model"
        )
    return [(rotaries[0], attentions)]


def _complex_form(model_type: str) -> bool:
    """Whether the model's text layers rotate through complex numbers (:mod:`._hf_complex`)."""
    return model_type in _hf_complex.MODEL_TYPES + _hf_llama4_vision.MODEL_TYPES


def _patch_text(
    model_type: str,
    rotary: nn.Module,
    attentions: List[nn.Module],
    record: "_Patch",
    max_seq_len: Optional[int],
) -> None:
    """Put torch_rope under one text rotary module and the attention layers it feeds; what it
    changed goes into ``record`` (undone by the caller if anything raises)."""
    config = rotary.config
    keys = _layer_types(rotary) or [_ONE_TYPE]
    rows = _default_rows(config) if max_seq_len is None else max_seq_len
    axes = None  # per table key: (interleaved, mrope_section, mrope_interleaved)
    if model_type in _VLM_TYPES:
        interleaved, mrope_interleaved = _VLM_TYPES[model_type]
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
        axes = {
            key: (interleaved, [int(s) for s in sections[key]], mrope_interleaved) for key in keys
        }

    if axes is not None:
        rotary._torch_rope_axes = axes
    record.rotary.append(rotary)
    tables = nn.ModuleDict()
    dynamic: Dict[str, _DynamicState] = {}
    for key in keys:
        params = _rope_parameters(config, key)
        rope_type = params.get("rope_type", params.get("type", "default"))
        hf_inv_freq, hf_scaling = _hf_frequencies(rotary, key, rope_type)
        rotary_dim = 2 * hf_inv_freq.numel()
        seq_len = None
        if rope_type == "dynamic":
            dynamic[key] = _DynamicState(config.max_position_embeddings)
            seq_len = config.max_position_embeddings
        tables[key] = _make_tables(rotary, key, rotary_dim, rows, seq_len=seq_len)
        # Our float64 frequencies must round to transformers' float32 ones.
        ours, ours_scaling = rope_frequencies(
            tables[key].theta, rotary_dim, scaling=tables[key].scaling, seq_len=1
        )
        if not (
            torch.allclose(ours.float(), hf_inv_freq, rtol=1e-5, atol=0)
            and abs(ours_scaling - hf_scaling) <= 1e-6 * hf_scaling
        ):
            raise NotImplementedError(
                f"torch_rope.hf.patch: the frequencies built from config.rope_parameters "
                f"({params}) do not match transformers' own for this model; not patching"
            )
    for key, (_, section, _) in (axes or {}).items():
        if sum(section) != tables[key].rotary_dim // 2:
            raise NotImplementedError(
                f"torch_rope.hf.patch: mrope_section {section} does not cover the "
                f"{tables[key].rotary_dim // 2} rotary planes of this {model_type} model"
            )
    rotary.torch_rope = tables
    rotary._torch_rope_dynamic = dynamic
    for attention_class in {type(a) for a in attentions}:
        _rebuilt_forward(attention_class, refresh=True)
    # A vision-language text tower's layout is known, and so is a complex-form model's (each
    # consecutive pair is one complex number: GPT-J pairs); a text model's is found by the check.
    complex_form = _complex_form(model_type)
    if axes:
        layouts: Tuple[Tuple[bool, bool], ...] = ((axes[keys[0]][0], False),)
    else:
        layouts = ((True, False),) if complex_form else _TEXT_LAYOUTS
    _check_layout(rotary, keys, attentions, layouts)
    for attention in attentions:
        record.attention.append(attention)
        _fuse_qk_norms(rotary, keys, attention)
        attention.forward = _bind(_patched_attention_forward, attention)
    if complex_form:
        rotary.forward = functools.partial(
            _hf_complex.rotary_forward, _patched_rotary_forward, rotary
        )
    else:
        rotary.forward = _bind(_patched_rotary_forward, rotary)


def _fuse_qk_norms(rotary: nn.Module, keys: List[str], attention: nn.Module) -> None:
    """Fuse the layer's per-head q/k RMSNorms into its RoPE call (rope::rms_norm_apply_qk) when
    they are norms the op computes and the fused layer passes the self-check; otherwise the layer
    stays on the unfused path it has already passed the self-check with."""
    head_dim = getattr(attention, "head_dim", None)
    parameters = _hf_qk_norm.norm_parameters(attention, head_dim) if head_dim else None
    if parameters is None:
        return
    _hf_qk_norm.defer(attention, parameters)
    try:
        # With the norms' own weights, a freshly initialised model (all ones, or Gemma's zeros)
        # could not tell norm-then-RoPE from RoPE-then-norm: check with random weights.
        with _hf_qk_norm.random_norm_weights(attention):
            for key in keys:
                _self_check(rotary, key, attention)
    except NotImplementedError:
        _hf_qk_norm.undo(attention)


def _undo(record: _Patch) -> None:
    """Everything patch() did to the modules in ``record``, undone (also after a failed patch)."""
    for attention in record.attention:
        _hf_qk_norm.undo(attention)
    for module in record.attention + record.rotary:
        module.__dict__.pop("forward", None)
        module.__dict__.pop(_hf_roformer.ROTATION_METHOD, None)
    for rotary in record.rotary:
        for name in ("torch_rope", "_torch_rope_dynamic", "_torch_rope_axes"):
            if hasattr(rotary, name):
                delattr(rotary, name)


def unpatch(model: nn.Module) -> nn.Module:
    """Undo :func:`patch`: the model's own rotary and attention forwards again.

    Returns ``model``."""
    record = getattr(model, _PATCH_ATTR, None)
    if record is None:
        return model
    _undo(record)
    object.__delattr__(model, _PATCH_ATTR)
    return model
