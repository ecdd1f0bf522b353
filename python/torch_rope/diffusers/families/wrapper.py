# SPDX-License-Identifier: BSD-3-Clause
"""Models that hold other models and run them: the multi-controlnet wrappers
(``FluxMultiControlNetModel``, ``QwenImageMultiControlNetModel``,
``HunyuanDiT2DMultiControlNetModel``). Each model they hold (``nets``: :func:`held_models`) is
patched as the model it is, by the patch of the wrapper (``diffusers/patching.py``), and unpatched
with the wrapper."""

from typing import List

from torch import nn

from ..._patching.record import PatchRecord


def held_models(model: nn.Module) -> List[nn.Module]:
    """The models ``model`` holds and runs, each to be patched in its own right."""
    nets = getattr(model, "nets", None)
    if not nets:
        raise NotImplementedError(
            f"torch_rope.diffusers.patch: this {type(model).__name__} holds no models (nets) to "
            "patch"
        )
    return list(nets)


def patch(model: nn.Module, row, record: PatchRecord, patcher, options) -> None:
    """Nothing of the wrapper's own to patch: only the models it holds (:func:`held_models`)."""
    held_models(model)
