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

The package: :mod:`.patching` looks up the model type's row in :mod:`.registry` (one row per
supported type; :mod:`.refused` for the others) and runs the families the row names
(:mod:`.families`, one module each), which share :mod:`.tables`, :mod:`.rotate`,
:mod:`.qk_norm` (and :mod:`.inner_rotations`, for the modules inside an attention layer that
rotate too) and the library-neutral core in :mod:`torch_rope._patching` (the undo record,
the self-check, the rebuilt forwards). :mod:`.kernel_hook` is the separate layer for
transformers' own kernel hook (also importable as ``torch_rope.hf_kernel``).
"""

from .patching import is_patched, patch, unpatch
from .refused import REFUSED as _REFUSED  # noqa: F401  (the refusal table, by its old name)
from .registry import SUPPORTED_MODEL_TYPES
from .rotate import apply_rotary_pos_emb

__all__ = ["apply_rotary_pos_emb", "patch", "unpatch", "is_patched", "SUPPORTED_MODEL_TYPES"]
