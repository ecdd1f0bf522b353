# SPDX-License-Identifier: BSD-3-Clause
"""patch, unpatch and is_patched, for one diffusers model or every RoPE model of a pipeline: the
registry row of the model's class says which family puts torch_rope under it; what it changes is
recorded on the model, to be undone."""

import functools
import warnings
from typing import Any, Iterable, List, Optional, Tuple

from torch import nn

from .._patching import record as records
from .._patching.self_check import require_weights
from . import families
from .processors import CALLER, ProcessorPatcher
from .registry import REGISTRY

#: The integer positions the tables cover at first when ``max_positions`` is not given: enough
#: for the rows and columns of a 4096-pixel image's latent grid, and for 1024 text tokens.
DEFAULT_ROWS = 1024


def model_class(model: nn.Module) -> str:
    """The registry key of ``model``: its class's name, or that of the nearest base class the
    registry knows (a subclass of a supported class is patched as that class, then checked)."""
    for cls in type(model).__mro__:
        if cls.__name__ in REGISTRY.rows or cls.__name__ in REGISTRY.refused:
            return cls.__name__
    return type(model).__name__


def _is_model(value: Any) -> bool:
    return isinstance(value, nn.Module)


def _components(pipeline: Any) -> List[Tuple[str, nn.Module]]:
    components = getattr(pipeline, "components", None)
    if not isinstance(components, dict):
        raise TypeError(
            f"{CALLER}: expected a diffusers model (an nn.Module) or pipeline (with .components), "
            f"got {type(pipeline).__name__}"
        )
    return [(name, value) for name, value in components.items() if _is_model(value)]


def _rope_components(pipeline: Any) -> List[Tuple[str, nn.Module]]:
    """The components of a pipeline whose class the registry knows (supported or refused): the
    ones that apply RoPE. The others (text encoders, a VAE without RoPE, UNets) are left alone."""
    known = set(REGISTRY.rows) | set(REGISTRY.refused)
    return [(n, m) for n, m in _components(pipeline) if model_class(m) in known]


def is_patched(model_or_pipeline: Any) -> bool:
    """True when :func:`patch` was applied (and not undone), and every processor it installed is
    still in place. Replacing a processor through ``set_processor`` (``set_attn_processor``,
    ``fuse_qkv_projections``, loading an IP adapter) undoes the patch on that model, with a
    warning; patch again after it. For a pipeline: every RoPE component is patched."""
    if _is_model(model_or_pipeline):
        record = records.attached(model_or_pipeline)
        return record is not None and all(check() for check in record.checks)
    found = _rope_components(model_or_pipeline)
    return bool(found) and all(is_patched(m) for _, m in found)


def patch_model(model: nn.Module, options: families.Options) -> bool:
    """Patch one model; False when it already was (nothing done)."""
    row = REGISTRY.row(model_class(model))
    record = records.attached(model)
    if record is not None:
        if all(check() for check in record.checks):
            return False
        unpatch_model(model)  # a processor was replaced since: patch again from scratch
    require_weights(model, CALLER)
    record = records.PatchRecord()
    patcher = ProcessorPatcher(record)
    record.patcher = patcher
    record.checks.append(patcher.still_installed)
    try:
        family = families.FAMILIES[row.family]
        family.patch(model, row, record, patcher, options)
        # A model that holds others (a multi-controlnet wrapper): each is patched as the model it
        # is, and unpatched with the one that holds it.
        for held in getattr(family, "held_models", _holds_none)(model):
            if patch_model(held, options):
                record.on_undo(functools.partial(unpatch_model, held))
            record.checks.append(functools.partial(is_patched, held))
    except records.ForwardOnInstance as found:
        record.undo()
        raise found.refusal(model, CALLER) from None
    except BaseException:
        record.undo()
        raise
    for attention, _ in patcher.installed:
        record.set(attention, "set_processor", functools.partial(_set_processor, model, attention))
    records.attach(model, record)
    return True


def _holds_none(model: nn.Module) -> List[nn.Module]:
    return []


def _set_processor(model: nn.Module, attention: nn.Module, processor: Any, *args, **kwargs):
    """A patched attention module's ``set_processor``: a processor other than the one patch
    installed (``set_attn_processor``, an IP adapter, ``fuse_qkv_projections``, a custom one)
    would be handed positions it does not know, so the whole model is unpatched first (its RoPE
    modules compute diffusers' cos/sin again, its other processors are diffusers' again), with a
    warning; then the processor is set as diffusers sets it."""
    if processor is not getattr(attention, "processor", None) and records.attached(model):
        warnings.warn(
            f"{CALLER}: an attention processor of this {type(model).__name__} is being replaced "
            f"(by a {type(processor).__name__}) since patch; torch_rope is undone on the model, "
            "which rotates with diffusers' own RoPE again: call torch_rope.diffusers.patch on it "
            "again to put torch_rope under the new processors",
            stacklevel=3,
        )
        unpatch_model(model)
    return type(attention).set_processor(attention, processor, *args, **kwargs)


def unpatch_model(model: nn.Module) -> None:
    record = records.detach(model)
    if record is not None:
        record.undo()


def patch(model_or_pipeline: Any, *, max_positions: Optional[int] = None) -> Any:
    """Put torch_rope under the RoPE of a diffusers model, or of every model of a pipeline that
    applies RoPE (its transformer, controlnets, a VAE or text connector with RoPE). Returns its
    argument.

    Each model's RoPE module hands its attention processors integer positions instead of the
    cos/sin it computed, and each processor that rotates (a copy installed on that attention
    module alone) rotates q and k with ``rope::apply`` and float32 tables built in float64 from
    the model's own frequencies. Only this model is changed, and :func:`unpatch` restores it.
    Each RoPE is first checked against diffusers' own on a probe input; where they disagree, the
    model is refused rather than patched wrongly.

    ``max_positions``: the integer positions the tables cover at first (default
    :data:`DEFAULT_ROWS`); in eager mode they grow when a call needs more, under torch.compile
    they do not (a position past them raises in the op).

    Raises ``NotImplementedError`` for a class the registry refuses or does not know (naming
    why), or whose RoPE or processors are not what patch expects; ``ValueError`` for a model on
    the meta device (patch after the weights are materialised) or a pipeline without a RoPE
    model; ``TypeError`` for anything else. A pipeline is patched whole or not at all.
    """
    if max_positions is not None and (not isinstance(max_positions, int) or max_positions < 1):
        raise ValueError(f"{CALLER}: max_positions must be an int >= 1, got {max_positions!r}")
    options = families.Options(rows=max_positions or DEFAULT_ROWS)
    if _is_model(model_or_pipeline):
        patch_model(model_or_pipeline, options)
        return model_or_pipeline
    found = _rope_components(model_or_pipeline)
    if not found:
        names = ", ".join(f"{n} ({type(m).__name__})" for n, m in _components(model_or_pipeline))
        raise ValueError(
            f"{CALLER}: this {type(model_or_pipeline).__name__} has no component that applies "
            f"RoPE (components: {names or 'none'})"
        )
    done: List[nn.Module] = []
    try:
        for _, model in found:
            if patch_model(model, options):
                done.append(model)
        _patch_pipeline_rope(model_or_pipeline, [m for _, m in found])
    except BaseException:
        _unpatch_all(reversed(done))
        raise
    return model_or_pipeline


def _patch_pipeline_rope(pipeline: Any, models: List[nn.Module]) -> None:
    """Where a pipeline builds its models' RoPE (CogVideoX, HunyuanDiT, Stable Audio, Allegro),
    make it hand them positions: the family's ``patch_pipeline``, once per family and variant,
    recorded on the first of its models (unpatching that model restores the pipeline)."""
    groups = {}
    expanded = []
    for model in models:  # a multi-controlnet wrapper's nets, each in its own right
        expanded.extend(getattr(model, "nets", None) or [model])
    for model in expanded:
        row = REGISTRY.rows.get(model_class(model))
        family = families.FAMILIES.get(row.family) if row is not None else None
        if family is not None and hasattr(family, "patch_pipeline"):
            groups.setdefault((row.family, row.variant), (family, row, []))[2].append(model)
    for family, row, group in groups.values():
        record = records.attached(group[0])
        if id(pipeline) in record.pipelines:
            continue
        if family.patch_pipeline(pipeline, group, row, record, record.patcher):
            record.pipelines.add(id(pipeline))


def _unpatch_all(models: Iterable[nn.Module]) -> None:
    for model in models:
        unpatch_model(model)


def unpatch(model_or_pipeline: Any) -> Any:
    """Undo :func:`patch`: diffusers' own RoPE modules and processors again (a processor replaced
    since patch is left as it is). Returns its argument."""
    if _is_model(model_or_pipeline):
        unpatch_model(model_or_pipeline)
    else:
        _unpatch_all(m for _, m in _components(model_or_pipeline))
    return model_or_pipeline
