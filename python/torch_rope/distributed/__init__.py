# SPDX-License-Identifier: BSD-3-Clause
"""DTensor sharding rules for the rope ops (``torch.distributed.tensor``).

With these rules registered, ``rope::apply``, ``rope::apply_``, ``rope::apply_qk`` and
``rope::apply.out`` accept DTensor arguments in any placement and give the single-process result.
Per mesh dimension the rules offer:

* ``x`` (``q``, ``k``) sharded on any dim but the last (batch, heads, sequence, packed tokens),
  unevenly too: each rank rotates its own rows. ``positions`` follow ``x``: where they vary along
  the sharded dim they are sharded the same way (DTensor slices replicated positions locally, no
  communication), elsewhere they are replicated.
* ``x`` replicated, or ``Partial("sum")`` / ``Partial("avg")``: rotation is linear in ``x``.
* ``cos`` and ``sin`` always replicated (a sharded table is all-gathered).
* A sharded ``head_dim`` is never offered (a rotation mixes features of one head), so DTensor
  redistributes ``x`` first: the only case that communicates.
* ``apply_`` and ``apply.out`` never change the placement of the tensor they write.
* Multi-axis positions (``mrope_section``): the trailing axis dim of ``positions`` aligns with
  nothing in ``x``; it is never sharded (a positions DTensor sharded there is gathered), and the
  dims before it follow ``x`` as above.

Backward is ``rope::apply`` with ``inverse`` flipped (C++ autograd), so the same rules cover it.

The frequency and packed-sequence forms (``rope.apply.freqs``, ``apply.varlen``,
``apply.freqs_varlen``, the same suffixes on ``apply_`` and ``apply_qk``, and the out= overloads)
have rules of their own, below the table form's: the frequency form places like the table form
(``freqs`` replicated, as ``cos`` and ``sin``). Packed sequences keep x's tokens on dim 0, where
``cu_seqlens`` counts them: x is never sharded there (a rank's slice of the tokens would no longer
match the boundaries); any other dim but head_dim is, and ``cu_seqlens`` and ``seq_offsets`` are
replicated.

The rules of every form are in :mod:`.rules`; :mod:`.dtensor_args` (:func:`as_dtensors_like`)
hands the module's tables and positions to the ops as DTensors on x's mesh
(``RotaryPositionalEmbedding.forward`` with a DTensor x), with no communication.

Nothing here imports ``torch.distributed.tensor`` at import time (it costs ~1.5 s): the package
registers the rules on its own once that module is loaded (at ``import torch_rope``, when a
:class:`~torch_rope.RotaryPositionalEmbedding` is built, and on the first eager call that sees a
DTensor). Call :func:`register_sharding_rules` yourself when your first rope call on DTensors is
inside ``torch.compile`` and nothing above has happened yet.
"""

import sys

import torch

from .dtensor_args import as_dtensors_like  # noqa: F401  (the module's DTensor arguments)
from .rules import (
    _apply_inplace_rule,
    _apply_qk_rule,
    _apply_rule,
    _key_on_mrope_section,
    _register_form_rules,
    _register_out_rule,
    _rms_norm_apply_qk_rule,
)

__all__ = ["register_sharding_rules"]

_registered = False


def register_sharding_rules() -> None:
    """Register the DTensor sharding rules of every rope op. Idempotent; cheap after the first call.

    Imports ``torch.distributed.tensor``. Raises ``RuntimeError`` when ``torch.distributed`` is
    not available in this build of PyTorch, or when it lacks DTensor's ``register_sharding``.
    """
    global _registered
    if _registered:
        return
    if not torch.distributed.is_available():
        raise RuntimeError(
            "torch_rope.distributed.register_sharding_rules: torch.distributed is not available "
            "in this build of PyTorch, so there is no DTensor to register rules for"
        )
    try:
        from torch.distributed.tensor.experimental import register_sharding
    except ImportError as e:  # torch < 2.5
        raise RuntimeError(
            "torch_rope.distributed.register_sharding_rules: needs "
            "torch.distributed.tensor.experimental.register_sharding (PyTorch >= 2.5), "
            f"PyTorch {torch.__version__} has none"
        ) from e

    ops = torch.ops.rope
    register_sharding(ops.apply.default)(_apply_rule)
    register_sharding(ops.apply_.default)(_apply_inplace_rule)
    register_sharding(ops.apply_qk.default)(_apply_qk_rule)
    register_sharding(ops.rms_norm_apply_qk.default)(_rms_norm_apply_qk_rule)
    for op in (ops.apply.default, ops.apply_.default, ops.apply_qk.default):
        _key_on_mrope_section(op)
    if hasattr(ops.apply, "out"):
        _register_out_rule(ops.apply.out)
    _register_form_rules(ops)
    _registered = True


def maybe_register_for(*tensors) -> None:
    """Register the rules if any of ``tensors`` is a DTensor (the ops' eager wrappers call this).

    After registration this is one global read. Before it, it costs a ``sys.modules`` lookup when
    ``torch.distributed.tensor`` was never imported (no DTensor can exist then). Under
    ``torch.compile`` it does nothing: registering is not traceable, so compiled first calls rely
    on the other triggers or an explicit :func:`register_sharding_rules`.
    """
    if _registered:
        return
    dtensor_module = sys.modules.get("torch.distributed.tensor")
    if dtensor_module is None or torch.compiler.is_compiling():
        return
    dtensor_type = dtensor_module.DTensor
    if any(isinstance(t, dtensor_type) for t in tensors):
        register_sharding_rules()


def register_if_loaded() -> None:
    """Register the rules when ``torch.distributed.tensor`` is already imported (else do nothing).

    Used at ``import torch_rope`` and when a module is built: a process that loaded DTensor gets
    the rules for free, and one that did not pays one dictionary lookup.
    """
    if _registered or "torch.distributed.tensor" not in sys.modules:
        return
    if torch.distributed.is_available():
        register_sharding_rules()
