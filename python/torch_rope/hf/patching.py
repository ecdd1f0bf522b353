# SPDX-License-Identifier: BSD-3-Clause
"""patch, unpatch and is_patched: the registry row of the model's type says which families put
torch_rope under it; what they change is recorded on the model, to be undone."""

from typing import Optional

from torch import nn

from .._patching import record as records
from .._patching.self_check import require_weights
from . import families
from .registry import REGISTRY


def _model_type(model: nn.Module) -> str:
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "model_type"):
        raise TypeError(
            "torch_rope.hf.patch: expected a transformers PreTrainedModel (with a .config), got "
            f"{type(model).__name__}"
        )
    return config.model_type


def is_patched(model: nn.Module) -> bool:
    """True when :func:`patch` was applied to ``model`` (and not undone)."""
    return records.attached(model) is not None


def patch(
    model: nn.Module,
    *,
    max_seq_len: Optional[int] = None,
    max_vision_positions: int = 4096,
    tables: bool = True,
) -> nn.Module:
    """Put torch_rope under every RoPE of a loaded transformers model. Returns ``model``.

    The model's rotary modules hand their attention layers positions instead of gathered cos/sin,
    and each layer rotates q and k in one ``rope::apply_qk`` call (``rope::rms_norm_apply_qk``
    where its per-head q/k RMSNorms are fused in) with float32 tables built in float64 from
    ``config.rope_parameters``. Only this model is changed: forwards are bound to its modules, not
    to their classes, and :func:`unpatch` restores them. Every patched layer is first run
    unpatched and patched on a probe input; where they disagree, the model is refused rather
    than patched wrongly.

    ``max_seq_len``: the text positions the tables cover at first (default: the length the
    config declares, :func:`.tables.default_rows`); in eager mode they grow past it when a call
    needs more (:func:`.tables.serving`), under torch.compile they do not.
    ``max_vision_positions``: the rows and columns a vision tower's tables cover.
    ``tables=False``: the text RoPE table-free (each rotary module holds only its float64
    frequencies, :class:`~torch_rope.RotaryPositionalEmbedding` ``(..., tables=False)``, and the
    layers call the ops' frequency form: exact angles at any position, nothing to grow). Layers
    with per-head q/k norms then keep them unfused (the fused op has no frequency form yet); a
    vision tower keeps its tables (its positions are bounded by the image grid). GPT-J, CodeGen
    and RoFormer, which have no rotary module, have no table-free form: they are patched with
    tables, and a ``UserWarning`` says so.

    What each kind of model needs, and the supported types, are in docs/huggingface.md and
    docs/hf_models.md.

    A module whose forward patch replaces (a rotary module, an attention layer) must not have a
    forward set on the instance (a wrapper, an ad-hoc change, a hook's forward): patch would
    replace it and check the class's, so such a model is refused, naming the module.

    Raises ``NotImplementedError`` for a model type not in :data:`SUPPORTED_MODEL_TYPES` (naming
    why), whose layers are not what patch expects, or with a forward set on the instance of a
    module patch replaces the forward of; ``ValueError`` for a model on the meta
    device (patch after the weights are materialised); ``TypeError`` for a module that is not a
    transformers model.
    """
    model_type = _model_type(model)
    row = REGISTRY.row(model_type)
    if is_patched(model):
        return model
    require_weights(model, "torch_rope.hf.patch")
    if not isinstance(tables, bool):
        raise TypeError(f"torch_rope.hf.patch: tables must be a bool, got {type(tables).__name__}")
    options = families.Options(max_seq_len, max_vision_positions, tables)
    record = records.PatchRecord()
    try:
        for family in families.for_row(row):
            family.patch(model, model_type, row, record, options)
    except records.ForwardOnInstance as found:
        record.undo()
        raise found.refusal(model, "torch_rope.hf.patch") from None
    except BaseException:
        record.undo()
        raise
    records.attach(model, record)
    return model


def unpatch(model: nn.Module) -> nn.Module:
    """Undo :func:`patch`: the model's own rotary and attention forwards again.

    Returns ``model``."""
    record = records.detach(model)
    if record is not None:
        record.undo()
    return model
