# SPDX-License-Identifier: BSD-3-Clause
"""diffusers integration: one line to put torch_rope under a diffusion transformer's RoPE.

    import torch_rope.diffusers
    torch_rope.diffusers.patch(pipeline)      # or one model: pipeline.transformer
    torch_rope.diffusers.unpatch(pipeline)    # and back

:func:`patch` takes a model (a transformer, a controlnet, a VAE or text connector that applies
RoPE) or a pipeline (every such component of it). Each model's RoPE module hands its attention
processors integer positions instead of the cos/sin it computed every forward, and each processor
rotates q and k with ``rope::apply`` and tables built in float64 from the model's frequencies.
docs/diffusers.md says what each family of models needs; docs/diffusers_models.md lists every
RoPE model class of diffusers 0.42.1, supported or refused with the reason.

diffusers is imported lazily, only by :func:`patch`; ``import torch_rope.diffusers`` never needs
it.

The package: :mod:`.patching` looks up the model class's row in :mod:`.registry` (one row per
supported class; :mod:`.refused` for the others) and runs the family the row names
(:mod:`.families`, one module each), which share :mod:`.tables`, :mod:`.rotate`,
:mod:`.processors` (the processors rebuilt over patched globals), :mod:`.self_check` and the
library-neutral core in :mod:`torch_rope._patching`.
"""

from .patching import is_patched, patch, unpatch
from .registry import SUPPORTED_MODEL_CLASSES

__all__ = ["patch", "unpatch", "is_patched", "SUPPORTED_MODEL_CLASSES"]
