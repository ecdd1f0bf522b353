# SPDX-License-Identifier: BSD-3-Clause
"""Which attention layers each rotary module of a transformers model feeds, when it has several.

Two layouts have a rotary module per part of the model, each feeding only that part's layers:

* an encoder-decoder (T5Gemma) builds one per stack, ``encoder.rotary_emb`` and
  ``decoder.rotary_emb``, each from its own stack's config;
* RecurrentGemma builds one inside each attention layer (``self_attn.rotary_emb``), which the
  layer calls on the positions itself.

:func:`torch_rope.hf.patch` then patches each part as it patches a model with one rotary module:
that rotary module and the attention layers under the sub-module that holds it.

A third has several rotary modules side by side (:func:`side_by_side`): Granite SWA's model holds
one per RoPE theta (in a ModuleList, beside an unused one at the global theta) and hands each
layer the cos/sin of its theta's module, a choice made in its forward, not by where the modules
sit; Molmo 2's text model holds a scaled and an unscaled one, chosen per layer by
``rope_scaling_layers``. Every one of them is patched, and every layer checked against the
unpatched layer with each.
"""

from typing import List, Optional, Tuple

from torch import nn


def stacks(
    model: nn.Module, rotaries: List[nn.Module], attentions: List[nn.Module]
) -> Optional[List[Tuple[nn.Module, List[nn.Module]]]]:
    """``[(rotary module, the attention layers it feeds)]``, one per part, for a model with
    several rotary modules each held by a sub-module of its own (a stack, or the attention layer
    itself); None for a model with one rotary module, or none (patch then checks that it has one).

    A layer belongs to the rotary module whose holder is the deepest sub-module that contains the
    layer (or is it). A layer that no holder contains, or a holder with no layer, returns None:
    patch then refuses the model, as it refuses several rotary modules it cannot tell apart."""
    if len(rotaries) < 2:
        return None
    names = {id(m): name for name, m in model.named_modules()}
    holders = {}  # the holder's module path, with a trailing dot ("model.encoder.") -> its rotary
    for rotary in rotaries:
        holder = names[id(rotary)].rpartition(".")[0]
        if not holder or holder + "." in holders:
            return None  # a rotary module at the top, or two in one sub-module
        holders[holder + "."] = rotary
    grouped = {holder: [] for holder in holders}
    for attention in attentions:
        path = names[id(attention)] + "."
        containing = [holder for holder in holders if path.startswith(holder)]
        if not containing:
            return None
        grouped[max(containing, key=len)].append(attention)
    if not all(grouped.values()):
        return None
    return [(holders[holder], grouped[holder]) for holder in holders]


def side_by_side(
    model: nn.Module, rotaries: List[nn.Module], attentions: List[nn.Module]
) -> Optional[List[nn.Module]]:
    """``rotaries`` when they are several modules of one class held by one module (directly, or
    in a ModuleList or ModuleDict of it) that also holds every attention layer, none held by a
    layer or a stack of its own: the model's forward picks one per layer. None otherwise."""
    if len(rotaries) < 2 or len({type(r) for r in rotaries}) != 1 or not attentions:
        return None
    names = {id(m): name for name, m in model.named_modules()}
    modules = dict(model.named_modules())
    owners = set()
    for rotary in rotaries:
        holder = names[id(rotary)].rpartition(".")[0]
        if isinstance(modules[holder], (nn.ModuleList, nn.ModuleDict)):
            holder = holder.rpartition(".")[0]
        owners.add(holder)
    if len(owners) != 1:
        return None
    (owner,) = owners
    prefix = owner + "." if owner else ""
    if not all(names[id(a)].startswith(prefix) for a in attentions):
        return None
    return rotaries
