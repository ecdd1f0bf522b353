# SPDX-License-Identifier: BSD-3-Clause
"""Modules inside an attention layer that rotate their own q/k too: DeepSeek Sparse Attention's
indexer (DeepSeek-V3.2 and the models built on it), which its attention layer calls with the
position embeddings it was handed, and which rotates a slice of its own queries and keys with them,
in a pair layout that need not be the layer's (DeepSeek-V3.2's indexer rotates rotate_half beside
its MLA's GPT-J pairs).

Patched, each such module gets a forward rebuilt over a copy of its modeling module's globals in
which transformers' rotation functions are :func:`.rotate.apply_with_tables` with the module's own
layout (:func:`forwards`: one set of copies per layout), so that it reads the positions and the
tables the patched layer is handed. Its layout is found by :func:`layout_of`, in the self-check of
the layer that holds it (:mod:`.families.rotary_module`).
"""

import functools
import inspect
from typing import Dict, List, Tuple

import torch
from torch import Tensor, nn

from .._patching.namespace import PatchedNamespaces, rebuild
from .._patching.self_check import close
from .model_parts import HF_NAMES
from .rotate import apply_with_tables

Layout = Tuple[bool, bool]  # torch_rope's (interleaved, inverse)

_FORWARDS: Dict[Layout, PatchedNamespaces] = {}


def _replacements(layout: Layout, original_globals) -> dict:
    rotate = functools.partial(apply_with_tables, layout=layout)
    return {name: rotate for name in HF_NAMES if name in original_globals}


def forwards(layout: Layout) -> PatchedNamespaces:
    """The patched copies (and forwards rebuilt over them) whose rotation functions turn with
    ``layout``, registered as ``torch_rope_hf_patched_inner_<layout>__<module>``."""
    found = _FORWARDS.get(layout)
    if found is None:
        tag = ("pairs" if layout[0] else "halves") + ("_inverse" if layout[1] else "")
        found = PatchedNamespaces(
            f"torch_rope_hf_patched_inner_{tag}__", functools.partial(_replacements, layout)
        )
        _FORWARDS[layout] = found
    return found


def patched_forward(inner: nn.Module, layout: Layout, *args, **kwargs):
    """The forward of a patched module inside an attention layer (bound to it with its layout)."""
    return forwards(layout).forward(type(inner))(inner, *args, **kwargs)


def nested(attentions: List[nn.Module]) -> Tuple[List[nn.Module], Dict[int, List[nn.Module]]]:
    """The attention layers that no other one holds, and, by the id of each that holds some, the
    rotating modules inside it."""
    ids = {id(a) for a in attentions}
    inner: Dict[int, List[nn.Module]] = {}
    for attention in attentions:
        held = [m for m in attention.modules() if m is not attention and id(m) in ids]
        if held:
            inner[id(attention)] = held
    held_ids = {id(m) for held in inner.values() for m in held}
    return [a for a in attentions if id(a) not in held_ids], inner


def layout_of(inner, attention, call, embeddings, dtype, layouts) -> Layout:
    """The first of ``layouts`` with which a module inside ``attention`` that rotates its own q/k
    rotates them as the unpatched one does: on the call the unpatched layer made of it in the
    probe run (``call``: its args and kwargs), every rotation it makes unpatched (with the layer's
    cos/sin) and patched (with the positions and tables: ``embeddings`` is the pair of what the
    layer was handed each way), compared by :func:`_scores`. Its output is not compared: an
    indexer's top-k choice does not depend on the rotation where it keeps every key (a probe no
    longer than its top-k). None passes (or it is not handed the layer's position embeddings as
    they are): refused."""
    refusal = NotImplementedError(
        f"torch_rope.hf.patch: the {type(inner).__name__} inside {type(attention).__name__} "
        "rotates its own q/k differently from torch_rope's RoPE in every pair layout, or does not "
        "get the position embeddings the layer was handed; not patching this model"
    )
    if call is None:
        raise refusal
    args, kwargs = call
    hf_embeddings, our_embeddings = embeddings
    handed = [False]

    def ours(value):
        if value is hf_embeddings:
            handed[0] = True
            return our_embeddings
        return value

    our_args = tuple(ours(a) for a in args)
    our_kwargs = {name: ours(value) for name, value in kwargs.items()}
    want = [_scores(out) for out in _rotations(inner, None, args, kwargs)]
    if not handed[0] or not want:
        raise refusal
    for layout in layouts:
        try:
            got = [_scores(out) for out in _rotations(inner, layout, our_args, our_kwargs)]
        except Exception:
            continue
        if len(got) == len(want) and all(close(w, g, dtype) for w, g in zip(want, got)):
            return layout
    raise refusal


def _scores(rotated: tuple) -> Tensor:
    """What a rotation's consumer sees of it: of a rotated (q, k), every query row's dot product
    with every key row (transformers' GPT-J-pair rotation returns its features de-interleaved,
    (evens, odds), and torch_rope's with the pairs in place: the same scores, the features in
    another order); of one rotated tensor, that tensor."""
    if len(rotated) != 2:
        return rotated[0]
    q, k = (x.reshape(-1, x.size(-1)).double() for x in rotated)
    return q @ k.T


def _rotations(inner: nn.Module, layout, args, kwargs) -> List[tuple]:
    """The outputs of every rotation ``inner``'s forward makes in one call, each a tuple (q, k),
    or (x,) for one tensor: transformers' own (``layout`` None), or torch_rope's with that pair
    layout."""
    function = inspect.unwrap(type(inner).forward)  # under its decorators (@torch.no_grad())
    namespace = dict(function.__globals__)
    rotated: List[tuple] = []
    for name in HF_NAMES:
        if name not in namespace:
            continue
        rotate = namespace[name]
        if layout is not None:
            rotate = functools.partial(apply_with_tables, layout=layout)

        def recording(*args, rotate=rotate, **kwargs):
            out = rotate(*args, **kwargs)
            rotated.append(out if isinstance(out, tuple) else (out,))
            return out

        namespace[name] = recording
    with torch.no_grad():
        rebuild(function, namespace)(inner, *args, **kwargs)
    return rotated
