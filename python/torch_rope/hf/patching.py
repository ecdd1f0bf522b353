# SPDX-License-Identifier: BSD-3-Clause
"""patch, unpatch and is_patched: which family puts torch_rope under a model, and undoing it."""

from typing import List, Optional

from torch import nn

from . import qk_norm
from .families import axial_vision, complex_form, gptj, llama4_vision, roformer, rotary_module
from .model_parts import rotary_modules
from .model_types import (
    SUPPORTED_MODEL_TYPES,
    TEXT_TOWERS,
    UNROTATED_VISION,
    VISION_TOWER_TYPES,
    VLM_TYPES,
)
from .refused import REFUSED

_PATCH_ATTR = "_torch_rope_patch"

# The types with no rotary module, each patched by a module of its own (same patch signature).
_NO_ROTARY_MODULE = {
    **dict.fromkeys(gptj.MODEL_TYPES, gptj),
    **dict.fromkeys(roformer.MODEL_TYPES, roformer),
}


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


def patch(
    model: nn.Module, *, max_seq_len: Optional[int] = None, max_vision_positions: int = 4096
) -> nn.Module:
    """Make every attention layer of a loaded transformers model use torch_rope.

    Returns ``model``."""
    model_type = _model_type(model)
    if model_type not in SUPPORTED_MODEL_TYPES:
        reason = REFUSED.get(model_type, "not one of the model types this project tests")
        raise NotImplementedError(
            f"torch_rope.hf.patch: model type {model_type!r} is not supported: {reason} "
            f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    if is_patched(model):
        return model
    record = _Patch()
    try:
        if model_type in _NO_ROTARY_MODULE:  # tables where the model keeps its sinusoid
            _NO_ROTARY_MODULE[model_type].patch(model, model_type, record, max_seq_len)
        elif model_type in axial_vision.MODEL_TYPES:  # a vision tower alone: no text RoPE
            found = len(rotary_modules(model))
            if found:
                raise NotImplementedError(axial_vision.text_rotary_refusal(model_type, found))
        elif model_type in complex_form.MODEL_TYPES + llama4_vision.MODEL_TYPES:
            complex_form.patch(model, model_type, record, max_seq_len)
        else:
            rotary_module.patch(model, model_type, record, max_seq_len)
        if (
            model_type in VLM_TYPES and model_type not in TEXT_TOWERS + UNROTATED_VISION
        ) or model_type in VISION_TOWER_TYPES + axial_vision.MODEL_TYPES:
            axial_vision.patch(model, model_type, record, max_vision_positions)
        if model_type in llama4_vision.MODEL_TYPES:
            llama4_vision.patch(model, model_type, record, max_vision_positions)
    except BaseException:
        _undo(record)
        raise
    object.__setattr__(model, _PATCH_ATTR, record)
    return model


def _undo(record: _Patch) -> None:
    """Everything patch() did to the modules in ``record``, undone (also after a failed patch)."""
    for attention in record.attention:
        qk_norm.undo(attention)
    for module in record.attention + record.rotary:
        module.__dict__.pop("forward", None)
        module.__dict__.pop(roformer.ROTATION_METHOD, None)
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
