# SPDX-License-Identifier: BSD-3-Clause
"""The models that rotate through complex numbers (Llama 4's text model, DeepSeek-V2): their
rotary module returns ``freqs_cis`` (``polar(1, angle)`` times the attention factor, one complex
tensor), and the attention layer calls a module-level ``apply_rotary_emb(xq, xk, freqs_cis)`` that
views each consecutive feature pair of q and k as one complex number and multiplies it by
``freqs_cis``. That product is torch_rope's GPT-J pair rotation (``interleaved=True``), with the
attention factor folded into the tables as for the other models.

Patched as :mod:`.rotary_module` patches the other text models, in this :data:`FORM`:

* The patched rotary module hands on :class:`ComplexPositions` (the positions and the torch_rope
  tables) where the unpatched one handed ``freqs_cis``. The layers call
  ``position_embeddings.to(device)`` before rotating, so it has a ``to``; being a NamedTuple, it
  also unpacks as the ``(positions, tables)`` pair, and torch.compile traces it with
  ``fullgraph=True``.
* In the patched copy of the modeling module's globals, ``apply_rotary_emb`` is
  :func:`apply_rotary_emb` bound to where that module broadcasts ``freqs_cis`` against q and k
  (:data:`_UNSQUEEZE_DIM`): one ``rope::apply_qk`` at the positions.
* The self-check runs each layer unpatched with the real ``freqs_cis`` of the unpatched rotary
  module and patched with :class:`ComplexPositions`, with GPT-J pairs only; a layer where they
  disagree (a wrong broadcast dim, another layout) refuses the model.
"""

import functools
from typing import Any, Dict, NamedTuple, Tuple

import torch
from torch import Tensor, nn

from ..model_parts import HF_NAMES
from ..rotate import apply_with_tables
from . import rotary_module

#: The name of transformers' complex-form rotation in those modeling modules.
HF_NAME = "apply_rotary_emb"

# Where each modeling module broadcasts freqs_cis (B, S, R/2) against q and k: Llama 4 rotates
# q/k as (B, S, H, D) (``freqs_cis[:, :, None, :]``), DeepSeek-V2 its rotary slices as
# (B, H, S, R) (``freqs_cis.unsqueeze(1)``). The self-check catches a module that changed.
_UNSQUEEZE_DIM = {
    "transformers.models.llama4.modeling_llama4": 2,
    "transformers.models.deepseek_v2.modeling_deepseek_v2": 1,
}


class ComplexPositions(NamedTuple):
    """What a patched complex-form rotary module hands the attention layers instead of
    ``freqs_cis``: the (B, S) positions and the torch_rope tables module."""

    positions: Tensor
    tables: nn.Module

    def to(self, device) -> "ComplexPositions":
        """The layers' ``freqs_cis.to(q.device)``: the positions follow; the tables are where
        the rotary module is (a different device makes the op raise, never a silent copy)."""
        return ComplexPositions(self.positions.to(device), self.tables)


def apply_rotary_emb(
    xq: Tensor, xk: Tensor, freqs_cis: ComplexPositions, *, unsqueeze_dim: int
) -> Tuple[Tensor, Tensor]:
    """What a patched layer calls as ``apply_rotary_emb``: q and k turned at the positions
    ``freqs_cis`` carries."""
    if not isinstance(freqs_cis, ComplexPositions):
        raise TypeError(
            "torch_rope.hf: a patched layer's apply_rotary_emb expected the positions and tables "
            f"of the patched rotary module, got {type(freqs_cis).__name__}"
        )
    return apply_with_tables(xq, xk, freqs_cis.positions, freqs_cis.tables, unsqueeze_dim)


def replacements(original_globals: Dict[str, Any]) -> Dict[str, Any]:
    """The names to replace in the patched copy of a modeling module's globals: its
    ``apply_rotary_emb`` when it is one of the complex-form modules, else nothing."""
    dim = _UNSQUEEZE_DIM.get(original_globals.get("__name__"))
    if dim is None or HF_NAME not in original_globals:
        return {}
    return {HF_NAME: functools.partial(apply_rotary_emb, unsqueeze_dim=dim)}


def rotary_forward(rotary: nn.Module, x: Tensor, position_ids: Tensor) -> ComplexPositions:
    """The complex-form rotary module's forward once patched: the (positions, tables) of the other
    text models, as :class:`ComplexPositions`."""
    positions, tables = rotary_module.patched_rotary_forward(rotary, x, position_ids)
    return ComplexPositions(positions, tables)


def probe_embeddings(hf_output: Any, positions: Tensor, tables: nn.Module):
    """For the self-check, what the patched rotary module would hand the layer that the unpatched
    one handed ``hf_output``: :class:`ComplexPositions` for a complex ``freqs_cis``, else the
    ``(positions, tables)`` pair of the other models."""
    if isinstance(hf_output, Tensor) and torch.is_complex(hf_output):
        return ComplexPositions(positions, tables)
    return positions, tables


#: Each consecutive pair is one complex number: GPT-J pairs, the only layout tried.
FORM = rotary_module.Form(HF_NAMES + (HF_NAME,), ((True, False),), rotary_forward, probe_embeddings)


def patch(model: nn.Module, model_type: str, row, record, options) -> None:
    rotary_module.patch(model, model_type, row, record, options, form=FORM)
