# SPDX-License-Identifier: BSD-3-Clause
"""The cache form of the inference engines' entry points: :func:`rotary_embedding` (vLLM's,
SGLang's), :func:`apply_rope_with_cos_sin_cache` and ``_inplace`` (FlashInfer's), as thin layers
over :func:`torch_rope.apply_` and :func:`torch_rope.apply_qk`. Re-exported by
:mod:`torch_rope.compat`.

vLLM, SGLang and FlashInfer share one calling convention::

    rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)

* ``query`` / ``key``: ``(..., num_heads * head_size)`` or ``(..., num_heads, head_size)``,
  rotated **in place**; ``key`` may be None. Strided views (slices of a fused qkv projection) are
  written through, without a copy, when their last dim is contiguous.
* ``positions``: int32/int64 of the leading shape ``...`` (``(num_tokens,)`` usually).
* ``cos_sin_cache``: ``(max_position, rotary_dim)``, cos in the first half of each row and sin in
  the second. Read in place, as two strided views (no copy) when float32 or float64, kept per
  cache tensor while its geometry is unchanged (see ``_tables``); a float16 or bfloat16 cache is
  converted to float32 once per call, with a warning (the conversion cannot give back the
  precision the 16-bit cache lost).
* ``is_neox``: True rotates ``(k, k + rotary_dim / 2)`` pairs (NeoX, ``rotate_half``), False
  adjacent ``(2k, 2k + 1)`` pairs (GPT-J). It defaults to True, as SGLang's does (vLLM's
  signature requires it, so its callers always pass it).
* In place, ``key``'s own checks run before ``query`` is written; an op's error names the
  engines' arguments (``query``, ``key``, ``cos_sin_cache``), not the op's.
* ``rotary_dim`` may be less than ``head_size``: the other features pass through.
  ``rope_dim_offset`` (keyword) moves the rotated run inside each head, e.g. to the rotary slice
  of an MLA head.

Math is float32 (float64 for float64 inputs) whatever the storage, rounded once.
"""

import warnings
import weakref
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

from ..ops._native import _C
from ..ops.qk import _fast_apply_qk, apply_qk
from ..ops.rotation import _fast_apply_inplace, _is_compiling, apply_, eager_fast_path
from .errors import _TRANSLATED, PeerNames, in_peer_words, peer_words

# The ops' names for the cache form's arguments -> the engines' names.
_CACHE_WORDS = {
    "2 * cos.size(-1)": "cos_sin_cache.size(-1)",
    "cos.size(-1)": "cos_sin_cache.size(-1) / 2",
    "cos.size(0)": "cos_sin_cache.size(0)",
}


def _in_place_words(peer: str) -> Tuple[PeerNames, PeerNames]:
    """(query's, key's): each is rotated by its own apply_ call, whose x it is."""
    return (
        PeerNames(peer, {**_CACHE_WORDS, "x": "query"}),
        PeerNames(peer, {**_CACHE_WORDS, "x": "key"}),
    )


_ROTARY_EMBEDDING_WORDS = _in_place_words("rotary_embedding")
_FLASHINFER_INPLACE_WORDS = _in_place_words("apply_rope_with_cos_sin_cache_inplace")
_FLASHINFER_WORDS = PeerNames(
    "apply_rope_with_cos_sin_cache", {**_CACHE_WORDS, "q": "query", "k": "key"}
)


_VIEW_CACHE_SIZE = 16
# id(cache) -> (weak reference to the cache, its geometry, (cos, sin)). One entry is one tuple,
# stored in one assignment: a thread sees an old entry or a new one, never half of one.
_VIEWS: Dict[int, tuple] = {}


def _geometry(cache: Tensor) -> tuple:
    """What the views depend on: where the cache's elements are and how they are laid out. Its
    values do not matter (a view reads whatever is there at call time)."""
    return (
        cache.data_ptr(),
        cache.storage_offset(),
        cache.shape,
        cache.stride(),
        cache.dtype,
        cache.device,
    )


def _check_cache(cos_sin_cache) -> None:
    if (
        not isinstance(cos_sin_cache, Tensor)
        or cos_sin_cache.dim() != 2
        or cos_sin_cache.size(-1) % 2
    ):
        got = (
            f"shape {list(cos_sin_cache.shape)}"
            if isinstance(cos_sin_cache, Tensor)
            else type(cos_sin_cache).__name__
        )
        raise ValueError(
            "cos_sin_cache must be (max_position, rotary_dim) with rotary_dim even (cos in the "
            f"first half of each row, sin in the second), got {got}"
        )


def _split(cos_sin_cache: Tensor) -> Tuple[Tensor, Tensor]:
    half = cos_sin_cache.size(-1) // 2
    # Views of a detached alias: they read the cache's memory without holding the cache tensor
    # itself (a view holds its base), so the weak reference below dies with the caller's cache.
    whole = cos_sin_cache.detach()
    return whole[:, :half], whole[:, half:]


def _forget(key: int):
    def callback(_ref):
        _VIEWS.pop(key, None)

    return callback


def _tables(cos_sin_cache: Tensor) -> Tuple[Tensor, Tensor]:
    """(cos, sin) as views of the cache's two halves.

    The engines pass the same cache tensor on every decode step, and building two views costs
    more than a decode step's rotation, so the views are kept per cache tensor: found by its
    identity (a weak reference: the entry goes with the tensor) and served only while its
    geometry (data pointer, storage offset, shape, strides, dtype, device) is the one they were
    made from. Views stay right whatever the cache's values become; a cache tensor re-pointed
    (``set_``, ``resize_``, ``.data =``) has another geometry and gets new views. A 16-bit cache
    is converted (values, not views) on every call, and nothing is kept while compiling."""
    if not _is_compiling() and type(cos_sin_cache) is Tensor:
        key = id(cos_sin_cache)
        entry = _VIEWS.get(key)
        if entry is not None and entry[0]() is cos_sin_cache:
            if entry[1] == _geometry(cos_sin_cache):
                return entry[2]
        _check_cache(cos_sin_cache)
        if cos_sin_cache.dtype in (torch.float32, torch.float64):
            views = _split(cos_sin_cache)
            if len(_VIEWS) >= _VIEW_CACHE_SIZE:
                _VIEWS.clear()
            _VIEWS[key] = (
                weakref.ref(cos_sin_cache, _forget(key)),
                _geometry(cos_sin_cache),
                views,
            )
            return views
    _check_cache(cos_sin_cache)
    if cos_sin_cache.dtype in (torch.float16, torch.bfloat16):
        warnings.warn(
            f"torch_rope.compat: cos_sin_cache is {cos_sin_cache.dtype}; converting it to float32 "
            "on every call. A 16-bit cache has already lost precision at long positions: build "
            "it in float32 (torch_rope.rope_tables) and keep it so.",
            stacklevel=4,
        )
        cos_sin_cache = cos_sin_cache.float()
    return _split(cos_sin_cache)


def _heads(name: str, x: Tensor, positions: Tensor, head_size: int) -> Tensor:
    """x as (..., num_heads, head_size), a view of the same memory; ``...`` is positions' shape."""
    shape, lead = x.shape, positions.shape
    if len(shape) == len(lead) + 2 and shape[-1] == head_size and shape[:-2] == lead:
        return x
    if len(shape) == len(lead) + 1 and shape[-1] % head_size == 0 and shape[:-1] == lead:
        # Integers, not a torch.Size plus a tuple: the argument parser takes them three times
        # faster, and this runs twice per decode step.
        if len(lead) == 1:
            return x.view(-1, shape[-1] // head_size, head_size)
        return x.view(*lead, shape[-1] // head_size, head_size)
    raise ValueError(
        f"{name} must be (..., num_heads * head_size) or (..., num_heads, head_size) with the "
        f"leading dims of positions {list(positions.shape)} and head_size = {head_size}, got "
        f"shape {list(x.shape)}"
    )


_FLOATING = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


def _check_key(key: Tensor, query: Tensor) -> None:
    """What the op would refuse in key but not in query (positions and tables are shared, so
    they fail on query first), checked before query is written: the in-place call then never
    rotates query and refuses key."""
    if key.dtype not in _FLOATING:
        raise ValueError(f"key must be float64, float32, float16 or bfloat16, got {key.dtype}")
    if key.device != query.device:
        raise ValueError(f"key must be on query's device {query.device}, got {key.device}")


def _over_heads(positions: Tensor) -> Tensor:
    """positions broadcast over the heads: (..., 1). One position (a decode step of one token)
    broadcasts as it is, without the view."""
    return positions if positions.numel() == 1 else positions.unsqueeze(-1)


# The caches the native entries take as they are (16-bit caches are converted in _tables).
_NATIVE_CACHE_DTYPES = (torch.float32, torch.float64)


def _native_call(positions, query, key, cos_sin_cache) -> bool:
    """Whether the call may take the native entry (csrc/engine_call.h): eager, plain tensors, a
    float32/float64 cache. The views and checks are then made in C++, where a view costs a few
    hundred nanoseconds instead of microseconds."""
    return (
        eager_fast_path(positions, query, cos_sin_cache)
        and (key is None or type(key) is Tensor)
        and cos_sin_cache.dtype in _NATIVE_CACHE_DTYPES
    )


def _rotate_in_place(words, positions, query, key, head_size, cos_sin_cache, is_neox, offset):
    if not offset and _native_call(positions, query, key, cos_sin_cache):
        try:
            _C._rotate_heads_in_place(positions, query, key, head_size, cos_sin_cache, not is_neox)
        except _TRANSLATED as error:
            # query's rotation names it x, as rope.apply_ does; key's checks name key.
            raise in_peer_words(error, words[0]) from None
        return
    cos, sin = _tables(cos_sin_cache)
    if offset:
        rotary_dim = 2 * cos.size(-1)
        if not 0 <= offset <= head_size - rotary_dim:
            raise ValueError(
                f"rope_dim_offset + rotary_dim must be within head_size = {head_size}, got "
                f"rope_dim_offset = {offset} and rotary_dim = {rotary_dim}"
            )
    elif 2 * cos.size(-1) > head_size:
        raise ValueError(
            f"rope_dim_offset + rotary_dim must be within head_size = {head_size}, got "
            f"rope_dim_offset = 0 and rotary_dim = {2 * cos.size(-1)}"
        )
    q = _heads("query", query, positions, head_size)
    k = None
    if key is not None:
        k = _heads("key", key, positions, head_size)
        _check_key(key, query)
    pos = _over_heads(positions)
    if offset:
        end = offset + 2 * cos.size(-1)
        q = q[..., offset:end]
        k = None if k is None else k[..., offset:end]
    # With no offset the whole head is handed over: the features past rotary_dim pass through.
    interleaved = not is_neox
    query_words, key_words = words
    if eager_fast_path(q, cos, sin, pos) and (k is None or type(k) is Tensor):
        try:
            _fast_apply_inplace(q, cos, sin, pos, interleaved, False)
        except _TRANSLATED as error:
            raise in_peer_words(error, query_words) from None
        if k is not None:
            try:
                _fast_apply_inplace(k, cos, sin, pos, interleaved, False)
            except _TRANSLATED as error:
                raise in_peer_words(error, key_words) from None
        return
    peer_words(query_words, apply_, q, cos, sin, pos, interleaved=interleaved)
    if k is not None:
        peer_words(key_words, apply_, k, cos, sin, pos, interleaved=interleaved)


def rotary_embedding(
    positions: Tensor,
    query: Tensor,
    key: Optional[Tensor],
    head_size: int,
    cos_sin_cache: Tensor,
    is_neox: bool = True,
    *,
    rope_dim_offset: int = 0,
) -> None:
    """vLLM's / SGLang's ``rotary_embedding``: rotate ``query`` and ``key`` in place.
    ``is_neox`` defaults to True, as SGLang's does (vLLM's callers always pass it)."""
    _rotate_in_place(_ROTARY_EMBEDDING_WORDS, positions, query, key, head_size, cos_sin_cache,
                     is_neox, rope_dim_offset)  # fmt: skip


def apply_rope_with_cos_sin_cache_inplace(
    positions: Tensor,
    query: Tensor,
    key: Tensor,
    head_size: int,
    cos_sin_cache: Tensor,
    is_neox: bool = True,
) -> None:
    """FlashInfer's ``apply_rope_with_cos_sin_cache_inplace``: the same as
    :func:`rotary_embedding`."""
    _rotate_in_place(_FLASHINFER_INPLACE_WORDS, positions, query, key, head_size, cos_sin_cache,
                     is_neox, 0)  # fmt: skip


def apply_rope_with_cos_sin_cache(
    positions: Tensor,
    query: Tensor,
    key: Tensor,
    head_size: int,
    cos_sin_cache: Tensor,
    is_neox: bool = True,
) -> Tuple[Tensor, Tensor]:
    """FlashInfer's ``apply_rope_with_cos_sin_cache``: rotated copies of ``query`` and ``key``
    (new contiguous tensors of their shapes), in one :func:`torch_rope.apply_qk` call."""
    if _native_call(positions, query, key, cos_sin_cache):
        try:
            return _C._rotate_heads(positions, query, key, head_size, cos_sin_cache, not is_neox)
        except _TRANSLATED as error:
            raise in_peer_words(error, _FLASHINFER_WORDS) from None
    cos, sin = _tables(cos_sin_cache)
    q = _heads("query", query, positions, head_size)
    k = _heads("key", key, positions, head_size)
    pos = _over_heads(positions)
    interleaved = not is_neox
    if eager_fast_path(q, k, cos, sin, pos):
        try:
            q_out, k_out = _fast_apply_qk(q, k, cos, sin, pos, interleaved, False)
        except _TRANSLATED as error:
            raise in_peer_words(error, _FLASHINFER_WORDS) from None
    else:
        q_out, k_out = peer_words(
            _FLASHINFER_WORDS, apply_qk, q, k, cos, sin, pos, interleaved=interleaved
        )
    # Back to the callers' shapes: (..., num_heads * head_size) inputs get flat heads back.
    if q is not query:
        q_out = q_out.view(-1, query.size(-1)) if q.dim() == 3 else q_out.flatten(-2)
    if k is not key:
        k_out = k_out.view(-1, key.size(-1)) if k.dim() == 3 else k_out.flatten(-2)
    return q_out, k_out
