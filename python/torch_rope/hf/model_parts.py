# SPDX-License-Identifier: BSD-3-Clause
"""The parts of a transformers model that patch works on: its rotary modules, and the attention
layers whose forward calls one of transformers' rotation functions."""

import inspect
from typing import List, Tuple

from torch import nn

#: transformers' q/k rotation: ``apply_rotary_pos_emb``, and its GPT-J-pair twin in DeepSeek's MLA
#: (and the models built on it), which a patched layer calls under either name.
HF_NAME = "apply_rotary_pos_emb"
HF_NAMES = (HF_NAME, "apply_rotary_pos_emb_interleave")


def is_vision_rotary(module: nn.Module) -> bool:
    return type(module).__name__.endswith("VisionRotaryEmbedding")


def rotary_modules(model: nn.Module, vision: bool = False) -> List[nn.Module]:
    """The text rotary modules of ``model`` (``vision``: its vision towers' rotary modules)."""
    found = []
    for module in model.modules():
        if (
            type(module).__name__.endswith("RotaryEmbedding")
            and hasattr(module, "config")
            and (hasattr(module, "inv_freq") or hasattr(module, "layer_types"))
            and is_vision_rotary(module) == vision
        ):
            found.append(module)
    return found


def calls_hf_apply(module: nn.Module, names: Tuple[str, ...] = HF_NAMES) -> bool:
    """Whether the module's class forward calls one of ``names``, a global of its module (under
    its decorators: a DSA indexer's forward is wrapped in ``@torch.no_grad()``)."""
    forward = getattr(type(module), "forward", None)
    if forward is not None:
        forward = inspect.unwrap(forward)
    code = getattr(forward, "__code__", None)
    return code is not None and any(
        name in code.co_names and name in forward.__globals__ for name in names
    )
