# SPDX-License-Identifier: BSD-3-Clause
"""The parts of a diffusers model that patch works on: its attention modules (both kinds:
``Attention`` and the ``AttentionModuleMixin`` classes, anything with a ``processor`` and
``set_processor``) and the device its tables go to."""

import inspect
from typing import Iterable, List

import torch
from torch import nn

CALLER = "torch_rope.diffusers.patch"


def attention_modules(model: nn.Module) -> List[nn.Module]:
    return [
        m
        for m in model.modules()
        if hasattr(m, "processor") and callable(getattr(m, "set_processor", None))
    ]


def device_of(model: nn.Module) -> torch.device:
    for tensor in model.parameters():
        return tensor.device
    for tensor in model.buffers():
        return tensor.device
    return torch.device("cpu")


def takes(processor, names: Iterable[str]) -> bool:
    """Whether ``processor.__call__`` has a parameter named one of ``names``."""
    try:
        parameters = inspect.signature(type(processor).__call__).parameters
    except (TypeError, ValueError):
        return False
    return any(n in parameters for n in names)


def require_patched(model: nn.Module, patched: List[nn.Module], rotary_arguments) -> None:
    """Refuse a model where an attention module that takes a RoPE argument (``rotary_arguments``:
    the parameter names its processors receive cos/sin by) kept a processor patch could not
    rebuild: it would receive positions and not know them. At least one module must be patched."""
    if not patched:
        raise NotImplementedError(
            f"{CALLER}: no attention processor of this {type(model).__name__} rotates with the "
            "diffusers function patch expects; not patching"
        )
    done = {id(m) for m in patched}
    for module in attention_modules(model):
        if id(module) not in done and takes(module.processor, rotary_arguments):
            raise NotImplementedError(
                f"{CALLER}: the attention processor {type(module.processor).__name__} of this "
                f"{type(model).__name__} takes RoPE ({', '.join(rotary_arguments)}) but does not "
                "rotate with a diffusers function patch knows (a custom processor?); not patching"
            )
