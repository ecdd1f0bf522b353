# SPDX-License-Identifier: BSD-3-Clause
"""The family of most text models: a rotary module computes cos/sin from the positions, and each
attention layer calls transformers' ``apply_rotary_pos_emb(q, k, cos, sin)`` (DeepSeek's MLA:
``apply_rotary_pos_emb_interleave``) from its forward.

Patched, on this model instance only:

* the rotary module gets the tables (``torch_rope``: one
  :class:`~torch_rope.RotaryPositionalEmbedding` per layer type) and a forward that hands the
  positions and the tables on, computing nothing;
* each attention layer gets a forward that runs its class's forward over a copy of its modeling
  module's globals in which ``apply_rotary_pos_emb`` is :func:`..rotate.apply_with_tables` (one
  ``rope::apply_qk``); layers that RMS-normalise each head of q and k right before RoPE call
  ``rope::rms_norm_apply_qk`` instead (:mod:`..qk_norm`);
* before that, the self-check finds the pair layout every layer rotates with (rotate_half, GPT-J
  pairs, either by minus the angle) by running each layer unpatched and patched on a probe input.
* a module inside a layer that rotates too (a DSA indexer) is patched with a layout of its own
  (:mod:`..inner_rotations`), found in the check of the layer that holds it.

A model with a rotary module per part (an encoder-decoder's stacks, RecurrentGemma's layers) is
patched part by part (:mod:`..stacks`); one with several side by side that its forward picks from
per layer (Granite SWA's, one per theta), all of them over the same layers. The complex-number
variant (Llama 4's text model, DeepSeek-V2) is :mod:`.complex_form`, this family with another
:class:`Form`.
"""

import functools
import inspect
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

import torch
from torch import Tensor, nn

from ..._patching.record import PatchRecord, bind, refuse_forward_on_instance
from ..._patching.self_check import check_against_unpatched, probe
from ...nn import long_rope_positions
from ...nn.forward import long_rope_frequencies
from .. import inner_rotations, qk_norm, stacks, tables
from ..forwards import FORWARDS
from ..model_parts import HF_NAMES, calls_hf_apply, rotary_modules
from ..rotate import apply_with_tables

#: The layouts a text model's layers may rotate with, (interleaved, inverse), tried in this order:
#: rotate_half, GPT-J pairs, then either turned by minus the angle (NanoChat's rotate_half returns
#: (x2, -x1)). A layer that passes with one cannot pass with another unless it does not rotate.
TEXT_LAYOUTS = ((False, False), (True, False), (False, True), (True, True))


class Form(NamedTuple):
    """How a model of this family hands RoPE to its layers: the names of the rotation functions
    its layers call, the layouts they may rotate with, and the patched rotary module's forward."""

    names: Tuple[str, ...]
    layouts: Tuple[Tuple[bool, bool], ...]
    rotary_forward: Callable  # (rotary, x, position_ids, ...), bound to the rotary module
    # For the self-check: what the patched rotary module hands a layer where the unpatched one
    # handed it ``hf_output``, (hf_output, positions, tables) -> position embeddings.
    probe_embeddings: Callable


def replacements(original_globals) -> dict:
    """The names a patched layer's forward finds as ours: both rotation functions, when its
    modeling module defines them."""
    return {name: apply_with_tables for name in HF_NAMES if name in original_globals}


def patched_rotary_forward(self, x: Tensor, position_ids: Tensor, layer_type=None):
    """The rotary module's forward once patched: hand the positions and the tables on, compute
    nothing. The attention layers unpack them as ``cos, sin`` and pass them to our
    apply_rotary_pos_emb (:func:`..rotate.apply_with_tables`)."""
    key = tables.ALL_LAYERS if layer_type is None else layer_type
    found = tables.serving(self, key, position_ids)
    if getattr(found, "mrope_section", None) is not None:
        # M-RoPE: HF's (A, B, S) position ids (or (B, S), the same position on every axis, as
        # HF's own expand makes them) become torch_rope's (B, S, A), axis dim last.
        position_ids = position_ids.expand(len(found.mrope_section), -1, -1).movedim(0, -1)
    return long_rope_positions(position_ids, found.long_offset, found.long_after), found


def patched_attention_forward(attention: nn.Module, *args, **kwargs):
    args, kwargs = qk_norm.rewrap(attention, args, kwargs)
    return FORWARDS.forward(type(attention))(attention, *args, **kwargs)


def _positions_and_tables(hf_output, positions: Tensor, found: nn.Module):
    return positions, found


FORM = Form(HF_NAMES, TEXT_LAYOUTS, patched_rotary_forward, _positions_and_tables)


def text_stacks(
    model: nn.Module, model_type: str, names: Tuple[str, ...]
) -> List[Tuple[List[nn.Module], List[nn.Module]]]:
    """The text rotary modules with the attention layers they hand positions to: one rotary
    module for most models; one per stack of an encoder-decoder, or per layer that holds its own;
    several side by side over the same layers (:mod:`..stacks`)."""
    rotaries = rotary_modules(model)
    attentions = [m for m in model.modules() if calls_hf_apply(m, names)]
    groups = stacks.stacks(model, rotaries, attentions)
    if groups is not None:
        return [([rotary], layers) for rotary, layers in groups]
    if stacks.side_by_side(model, rotaries, attentions) is not None:
        return [(rotaries, attentions)]
    if len(rotaries) != 1 or not attentions:
        raise NotImplementedError(
            f"torch_rope.hf.patch: expected one rotary embedding module and attention layers "
            f"that call {' or '.join(names)}, found {len(rotaries)} rotary module(s) and "
            f"{len(attentions)} such layer(s) in this {model_type} model"
        )
    return [(rotaries, attentions)]


def patch(model: nn.Module, model_type: str, row, record: PatchRecord, options, form=FORM):
    """Put torch_rope under every text rotary module of ``model`` and the layers it feeds."""
    for rotaries, attentions in text_stacks(model, model_type, form.names):
        for module in (*rotaries, *attentions):
            # Before the self-check, which runs the classes' forwards (and sets a rotary module's
            # own for a moment, RecurrentGemma's): a forward set on an instance is refused.
            refuse_forward_on_instance(module)
        attentions, inner = inner_rotations.nested(attentions)
        known = {
            _build_tables(model_type, row, rotary, record, options.max_seq_len, options.tables)
            for rotary in rotaries
        }
        # A multi-axis text tower's pair layout is known; a text model's is found by the check.
        layouts = known.pop() if len(known) == 1 and None not in known else form.layouts
        for attention_class in {type(a) for a in attentions}:
            FORWARDS.forward(attention_class, refresh=True)
        _patch_layers(rotaries, attentions, record, form, layouts, options.tables, inner)


def _build_tables(
    model_type: str, row, rotary: nn.Module, record: PatchRecord, max_seq_len, use_tables: bool
) -> Optional[Tuple[Tuple[bool, bool], ...]]:
    """Give one text rotary module its tables (``use_tables=False``: table-free), checked against
    transformers' frequencies. Returns the pair layouts a multi-axis text tower's layers may
    rotate with (the one it names), None for a text model's (found by the self-check)."""
    config = rotary.config
    keys = tables.layer_types(rotary) or [tables.ALL_LAYERS]
    axes = tables.multi_axis(model_type, row, rotary, keys)
    built = nn.ModuleDict()
    dynamic: Dict[str, tables.DynamicState] = {}
    for key in keys:
        hf = tables.hf_frequencies(rotary, key)
        params = tables.module_rope_parameters(rotary, key)
        rows = tables.default_rows(config, params) if max_seq_len is None else max_seq_len
        seq_len = None
        if tables.rope_type(params) == "dynamic":
            dynamic[key] = tables.DynamicState(config.max_position_embeddings)
            seq_len = config.max_position_embeddings
        rotary_dim = 2 * hf[0].numel()
        key_axes = None if axes is None else axes[key]
        built[key] = tables.make_tables(
            rotary, key, rotary_dim, rows, key_axes, seq_len=seq_len, use_tables=use_tables
        )
        built[key].alternating = row.multi_axis is not None and row.multi_axis.alternating
        tables.check_frequencies(rotary, key, built[key], hf)
        if key_axes is not None and sum(key_axes[1]) != rotary_dim // 2:
            raise NotImplementedError(
                f"torch_rope.hf.patch: mrope_section {key_axes[1]} does not cover the "
                f"{rotary_dim // 2} rotary planes of this {model_type} model"
            )
    record.set(rotary, "torch_rope", built)
    record.set(rotary, "_torch_rope_dynamic", dynamic)
    return ((axes[keys[0]][0], False),) if axes else None


def _patch_layers(
    rotaries, attentions, record: PatchRecord, form: Form, layouts, use_tables, inner=None
):
    """Find the layout the attention layers (and the modules inside them that rotate too,
    ``inner``) rotate with, checked against the unpatched layers with each of ``rotaries`` (which
    have their tables), then patch them all and the rotary modules."""
    inner = inner or {}
    inner_layouts = _check_layout(rotaries, attentions, form, layouts, inner)
    for attention in attentions:
        record.attention.append(attention)
        held = inner.get(id(attention), [])
        # The fused q/k norm op has tables only; a layer that hands its position embeddings on to
        # a module inside it keeps its norms unfused (the module would get the fused tables).
        if use_tables and not held:
            _fuse_qk_norms(rotaries, attention, form, record)
        record.set(attention, "forward", bind(patched_attention_forward, attention))
        for module in held:
            layout = inner_layouts[id(module)]
            inner_rotations.forwards(layout).forward(type(module), refresh=True)
            record.set(module, "forward", bind(inner_rotations.patched_forward, module, layout))
    for rotary in rotaries:
        record.set(rotary, "forward", bind(form.rotary_forward, rotary))


def _fuse_qk_norms(rotaries, attention: nn.Module, form: Form, record: PatchRecord) -> None:
    """Fuse the layer's per-head q/k RMSNorms into its RoPE call (rope::rms_norm_apply_qk) when
    they are norms the op computes and the fused layer passes the self-check; otherwise the layer
    stays on the unfused path it has already passed the self-check with."""
    head_dim = getattr(attention, "head_dim", None)
    parameters = qk_norm.norm_parameters(attention, head_dim) if head_dim else None
    if parameters is None:
        return
    qk_norm.defer(attention, parameters)
    try:
        # With the norms' own weights, a freshly initialised model (all ones, or Gemma's zeros)
        # could not tell norm-then-RoPE from RoPE-then-norm: check with random weights.
        with qk_norm.random_norm_weights(attention):
            for rotary in rotaries:
                for key in _keys_of(attention, list(rotary.torch_rope), rotary.config):
                    _self_check(rotary, key, attention, form)
    except NotImplementedError:
        qk_norm.undo(attention)
        return
    record.on_undo(functools.partial(qk_norm.undo, attention))


def _check_layout(rotaries, attentions, form: Form, layouts, inner=None) -> Dict[int, tuple]:
    """Find the layout the attention layers rotate with and set it on the tables: the first of
    ``layouts`` (torch_rope's ``(interleaved, inverse)``) with which every attention layer passes
    the self-check. rotate_half models pass with ``(False, False)``; GPT-J-pair models (Cohere,
    GLM, DeepSeek's MLA with ``rope_interleave``) with ``(True, False)``; NanoChat, which turns by
    minus the angle, with ``(False, True)``. None passes: the first refusal is raised.

    Every layer is checked, not one per class: layers of one class differ (Cohere 2's full
    layers skip RoPE, its sliding ones rotate), and a layer that does not rotate passes with
    either layout, so checking it alone could pick the wrong one.

    Returned: the layout of each module inside a layer that rotates too (``inner``, by the
    layer's id), by its id, found in the layer's checks."""
    inner = inner or {}
    inner_layouts: Dict[int, tuple] = {}
    first_refusal = None
    for interleaved, inverse in layouts:
        for rotary in rotaries:
            for found in rotary.torch_rope.values():
                found.interleaved = interleaved
                found.inverse = inverse
        try:
            for attention in attentions:
                for rotary in rotaries:
                    for key in _keys_of(attention, list(rotary.torch_rope), rotary.config):
                        _self_check(
                            rotary, key, attention, form, inner.get(id(attention)), inner_layouts
                        )
            return inner_layouts
        except NotImplementedError as refusal:
            first_refusal = first_refusal or refusal
    raise first_refusal


def _keys_of(attention: nn.Module, keys: List[str], config) -> List[str]:
    """The table keys an attention layer is checked with: its own layer type's, where the layer
    names it (``layer_type``, or its ``layer_idx`` into ``config.layer_types``), as the model
    hands that layer only that type's RoPE (Gemma 4's full layers have heads of another width
    than its sliding ones, so another type's cos/sin would not even fit); every key otherwise."""
    layer_type = getattr(attention, "layer_type", None)
    types = getattr(config, "layer_types", None)
    index = getattr(attention, "layer_idx", None)
    if layer_type is None and isinstance(index, int) and types and 0 <= index < len(types):
        layer_type = types[index]
    return [layer_type] if layer_type in keys else keys


def _self_check(rotary, key, attention, form: Form, inner=None, inner_layouts=None) -> None:
    """Refuse to patch when a patched attention layer disagrees with the unpatched one.

    One forward of the layer each way on a probe input: the unpatched forward gets the cos/sin
    (Llama 4, DeepSeek-V2: the complex freqs_cis) of the model's own (unpatched) rotary module,
    as the model would hand them over, so this checks everything between them and the rotated
    q/k: frequencies, their layout (rotate_half's duplicated halves or GPT-J's repeated pairs),
    slices, casts, partial rotary, MLA's rotary slice of each head. The patched one gets the
    positions and the tables, as the patched rotary module returns them. Multi-axis (M-RoPE)
    models get HF's recomposition of our own tables' rows instead, at three position axes that
    differ.

    ``inner``: the modules inside the layer that rotate too (a DSA indexer). The unpatched run
    records the layer's call of each, on which its layout is found (``inner_layouts``, by
    :func:`.inner_rotations.layout_of`); the patched run runs them patched with it.
    """
    inner = inner or []
    inner_layouts = {} if inner_layouts is None else inner_layouts
    device = tables.device_of(rotary, key)
    config = rotary.config
    found = rotary.torch_rope[key]
    dtype = next((p.dtype for p in attention.parameters()), torch.float32)
    length = min(16, tables.default_rows(config))
    hidden = probe((1, length, _input_width(attention, config)), device, dtype)
    position_ids = torch.arange(length, device=device).unsqueeze(0)
    section = getattr(found, "mrope_section", None)
    if section is None:
        # (cos, sin), or a complex-form model's freqs_cis (.complex_form)
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
        if key != tables.ALL_LAYERS and "layer_type" in inspect.signature(recompose).parameters:
            # One recomposition per layer type (Cohere Compass; NeoMME's is one for all)
            recompose = functools.partial(recompose, layer_type=key)
        cos, sin = _rows_at(found, axes)
        cos = recompose(rotary, cos).to(dtype)
        sin = recompose(rotary, sin).to(dtype)
        hf_embeddings = (cos, sin)
        position_ids = axes.movedim(0, -1)  # what the patched rotary module hands on
    our_embeddings = form.probe_embeddings(hf_embeddings, position_ids, found)
    layout = "GPT-J pairs" if found.interleaved else "rotate_half"
    if getattr(found, "inverse", False):
        layout += " by minus the angle"
    refusal = NotImplementedError(
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

    calls: Dict[int, tuple] = {}

    def record_call(module, args, kwargs):
        calls[id(module)] = (args, kwargs)

    def unpatched() -> Tensor:
        forward = type(attention).forward
        hooks = [m.register_forward_pre_hook(record_call, with_kwargs=True) for m in inner]
        try:
            with qk_norm.norms_restored(attention):
                try:
                    return forward(attention, hidden_states=hidden, **want_rope, **other)[0]
                except TypeError:
                    # A layer that adds its mask unconditionally (Falcon; a DSA indexer slices
                    # it): a mask that masks nothing, for the patched run too.
                    other["attention_mask"] = hidden.new_zeros(1, 1, length, length)
                    calls.clear()
                    return forward(attention, hidden_states=hidden, **want_rope, **other)[0]
        finally:
            for hook in hooks:
                hook.remove()

    def patched() -> Tensor:
        embeddings = (hf_embeddings, our_embeddings)
        for module in inner:  # each one's layout first: setting none of them if one fails
            call = calls.get(id(module))
            inner_layouts[id(module)] = inner_rotations.layout_of(
                module, attention, call, embeddings, dtype, TEXT_LAYOUTS
            )
        try:
            for module in inner:
                layout = inner_layouts[id(module)]
                module.forward = bind(inner_rotations.patched_forward, module, layout)
            if own_rotary:
                rotary.forward = bind(form.rotary_forward, rotary)
            return patched_attention_forward(attention, hidden_states=hidden, **got_rope, **other)[
                0
            ]
        finally:
            if own_rotary:
                vars(rotary).pop("forward", None)
            for module in inner:
                vars(module).pop("forward", None)

    check_against_unpatched(attention, unpatched, patched, dtype, refusal)


def _rows_at(found: nn.Module, positions: Tensor) -> Tuple[Tensor, Tensor]:
    """The float32 cos/sin rows our tables module rotates ``positions`` by, ``(*positions.shape,
    rotary_dim / 2)``: rows of its tables, or, for a table-free module (``tables=False``: only
    float64 frequencies), the same rows computed from them, ``cos(p * f) * attention_factor``
    rounded once to float32 as the tables' are."""
    if found.tables:
        return found.cos[positions].clone(), found.sin[positions].clone()
    freqs = long_rope_frequencies(
        found.freqs, found._buffers.get("long_freqs"), positions, found.long_after
    )
    angles = positions.to(torch.float64).unsqueeze(-1) * freqs
    factor = found.attention_factor
    return (angles.cos() * factor).float(), (angles.sin() * factor).float()


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
        if key == tables.ALL_LAYERS:
            return forward(rotary, hidden, position_ids)
        return forward(rotary, hidden, position_ids, layer_type=key)
