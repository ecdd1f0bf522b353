# SPDX-License-Identifier: BSD-3-Clause
"""What the model families without a rotary module share (GPT-J and CodeGen, :mod:`.families.gptj`;
RoFormer, :mod:`.families.roformer`): each keeps a ``sin | cos`` sinusoid table of its own (theta
10000, a constant of their modeling code), which patch replaces with torch_rope tables after
checking that the two agree."""

import warnings

import torch
from torch import Tensor

from ..nn import RotaryPositionalEmbedding

#: The base frequency of their sinusoid tables.
THETA = 10000.0


def warn_tables_kept(model_type: str, options) -> None:
    """``patch(model, tables=False)`` on a model of these families: they have no table-free form
    (their layers are rebuilt around tables), so the patch keeps tables, and says so."""
    if not options.tables:
        warnings.warn(
            f"torch_rope.hf.patch: tables=False is not available for {model_type} models (no "
            "rotary module; each layer's own sinusoid table is replaced by torch_rope tables): "
            "patched with float32 tables over max_seq_len positions (default: those the model's "
            "own table covers), as with tables=True",
            UserWarning,
            stacklevel=4,
        )


def refuse(model_type: str, why: str) -> NotImplementedError:
    return NotImplementedError(
        f"torch_rope.hf.patch: {why} in this {model_type} model; not patching"
    )


def check_tables(
    tables: RotaryPositionalEmbedding, own: Tensor, owner: str, model_type: str, float_tol: float
) -> None:
    """Our float64-built tables must be the model's own ``sin | cos`` table ``own`` (its float32
    rows within ``float_tol``, or their 16-bit rounding when the model was cast), on the rows both
    have; otherwise refuse, naming ``owner``."""
    rows = min(own.shape[0], tables.cos.shape[0])
    ours = torch.cat([tables.sin[:rows], tables.cos[:rows]], dim=-1).cpu()
    tol = float_tol if own.dtype in (torch.float32, torch.float64) else 1e-2
    own = own[:rows].detach().float().cpu()
    if ours.shape != own.shape or not torch.allclose(ours, own, rtol=0, atol=tol):
        raise refuse(
            model_type, f"the sinusoid tables built for theta {THETA} do not match {owner}"
        )
