# SPDX-License-Identifier: BSD-3-Clause
"""Models that hold other models and run them: the multi-controlnet wrappers
(``FluxMultiControlNetModel``, ``QwenImageMultiControlNetModel``,
``HunyuanDiT2DMultiControlNetModel``). Each model they hold (``nets``) is patched as the model it
is, and unpatched with the wrapper."""

import functools

from torch import nn

from ..._patching.record import PatchRecord


def patch(model: nn.Module, row, record: PatchRecord, patcher, options) -> None:
    from ..patching import is_patched, patch_model, unpatch_model

    nets = getattr(model, "nets", None)
    if not nets:
        raise NotImplementedError(
            f"torch_rope.diffusers.patch: this {type(model).__name__} holds no models (nets) to "
            "patch"
        )
    for net in nets:
        if patch_model(net, options):
            record.on_undo(functools.partial(unpatch_model, net))
        record.checks.append(functools.partial(is_patched, net))
