# SPDX-License-Identifier: BSD-3-Clause
"""What most families do once they have built a RoPE module's tables and its patched forward:
check both against diffusers' on probe inputs, then install them and the processors.

``check(rope, unpatched, patched)`` runs the self-check (:mod:`..self_check`); ``install(...)``
sets the tables (``rope.torch_rope``) and the forward on the RoPE module, installs the rotating
processors (:class:`..processors.ProcessorPatcher`) and refuses a model where an attention module
that takes a RoPE argument was left unpatched (:func:`..model_parts.require_patched`);
``install_embeddings_apply(...)`` is ``install`` for the families whose processors call diffusers'
``embeddings.apply_rotary_emb`` with the ``image_rotary_emb`` pair.
"""

import functools
from typing import Callable, Iterable, List, Mapping

from torch import nn

from ..._patching.record import PatchRecord, bind
from ..model_parts import attention_modules, require_patched
from ..processors import ProcessorPatcher, Swap
from ..rotate import embeddings_apply
from ..tables import Tables


def install(
    model: nn.Module,
    ropes: Iterable[nn.Module],
    tables: Tables,
    forward: Callable,
    swaps: Mapping[str, Swap],
    rotary_arguments: Iterable[str],
    record: PatchRecord,
    patcher: ProcessorPatcher,
) -> List[nn.Module]:
    """Patch the RoPE modules ``ropes`` (sharing ``tables``; ``forward(rope, *args)`` their new
    forward) and every processor that rotates with ``swaps``; returns the attention modules
    patched."""
    for rope in ropes:
        record.set(rope, "torch_rope", tables)
        record.set(rope, "forward", bind(forward, rope))
    patched = [m for m in attention_modules(model) if patcher.patch_processor(m, swaps)]
    require_patched(model, patched, tuple(rotary_arguments))
    return patched


def install_embeddings_apply(
    model: nn.Module,
    rope: nn.Module,
    tables: Tables,
    forward: Callable,
    record: PatchRecord,
    patcher: ProcessorPatcher,
) -> List[nn.Module]:
    """:func:`install` for one RoPE module whose processors call diffusers'
    ``embeddings.apply_rotary_emb`` on the ``image_rotary_emb`` pair (FLUX-style ids, the
    HunyuanVideo and halves grids, OmniGen): that call rotates with
    :func:`..rotate.embeddings_apply` over ``tables`` instead."""
    from diffusers.models import embeddings

    apply = Swap(functools.partial(embeddings_apply, tables), embeddings.apply_rotary_emb)
    swaps = {"apply_rotary_emb": apply}
    return install(model, [rope], tables, forward, swaps, ("image_rotary_emb",), record, patcher)
