# SPDX-License-Identifier: BSD-3-Clause
"""FlashInfer's table-free RoPE entry points over the frequency forms of
:func:`torch_rope.apply_qk` / :func:`torch_rope.apply_` (re-exported by :mod:`torch_rope.compat`).

FlashInfer computes each plane's frequency from ``rope_theta`` in the kernel; so do these, through
``rope_frequencies`` (float64, exact angles at any position, where FlashInfer's float32
``__sincosf`` drifts at long positions):

* ``apply_rope*``: ``freq_j = rope_theta^(-2j/R) / rope_scale`` (FlashInfer's ``rope_scale``
  divides the frequency: linear position interpolation, the ``"linear"`` rope type).
* ``apply_llama31_rope*``: Llama 3.1's smoothing (the ``"llama3"`` rope type) with
  ``factor = rope_scale``, ``low_freq_factor``, ``high_freq_factor`` and
  ``original_max_position_embeddings = old_context_len``.

Positions are described, not materialised: ``indptr``/``offsets`` become ``cu_seqlens`` /
``seq_offsets`` (row ``t`` of sequence ``b`` at ``offsets[b] + t - indptr[b]``); ``pos_ids``
``(nnz,)`` are per-row positions. The plain names return ``(q_rope, k_rope)``, the ``_inplace``
ones write ``q`` and ``k`` and return None.

Beyond FlashInfer (which takes float16/bfloat16 on CUDA, without gradients): every float dtype,
CPU and CUDA, and the out-of-place names are differentiable. Positions must be >= 0 and
``indptr[-1]`` must equal ``nnz`` (checked; FlashInfer does not check).
"""

import functools
import numbers
from typing import Optional, Tuple

import torch
from torch import Tensor

from ..ops.qk import apply_qk
from ..ops.rotation import apply_
from ..ops.tables import rope_frequencies
from .errors import PeerNames, peer_words

_FLOATING = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
# The ops' names -> FlashInfer's: the ragged batch's indptr/offsets are the op's cu_seqlens /
# seq_offsets, pos_ids its positions; an in-place call rotates q and k each as the op's x.
_RAGGED = {"cu_seqlens": "indptr", "seq_offsets": "offsets", "x.size(0)": "nnz"}
_POS_IDS = {"positions": "pos_ids"}


def _words(peer: str, where: dict) -> tuple:
    """(PeerNames of the out-of-place call, of q's in-place call, of k's)."""
    return (
        PeerNames(peer, {**where, "x": "q"}),  # the ragged batch's checks name q's tokens x
        PeerNames(peer + "_inplace", {**where, "x": "q"}),
        PeerNames(peer + "_inplace", {**where, "x": "k"}),
    )


_WORDS = {
    "apply_rope": _words("apply_rope", _RAGGED),
    "apply_rope_pos_ids": _words("apply_rope_pos_ids", _POS_IDS),
    "apply_llama31_rope": _words("apply_llama31_rope", _RAGGED),
    "apply_llama31_rope_pos_ids": _words("apply_llama31_rope_pos_ids", _POS_IDS),
}


def _build_frequencies(rotary_dim, theta, scaling_items, device) -> Tensor:
    scaling = dict(scaling_items) if scaling_items else None
    freqs, attention_factor = rope_frequencies(theta, rotary_dim, scaling=scaling)
    assert attention_factor == 1.0  # linear and llama3 do not scale the outputs
    return freqs.to(device)


@functools.lru_cache(maxsize=64)
def _cached_frequencies(rotary_dim, theta, scaling_items, device) -> Tensor:
    # A normal tensor even when the first call runs under inference_mode: the op saves freqs for
    # backward, which an inference tensor refuses.
    with torch.inference_mode(False):
        return _build_frequencies(rotary_dim, theta, scaling_items, device)


# Traced as a constant: the builder is C++ (Dynamo cannot look inside it) and its result depends
# on Python numbers only, so a compiled graph holds the frequencies like a buffer.
@torch.compiler.assume_constant_result
def _frequencies(rotary_dim, theta, scaling_items, device) -> Tensor:
    """The float64 frequencies on ``device``, built once per parameter set (no host-to-device
    copy per call)."""
    return _cached_frequencies(rotary_dim, theta, scaling_items, device)


def _number(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    return float(value)


def _check_qk(q: Tensor, k: Tensor, rotary_dim: Optional[int]) -> int:
    """The shape rules of FlashInfer's q and k; returns the rotary dim. Run before anything is
    written, so that the in-place variants never rotate q and then refuse k."""
    for name, t in (("q", q), ("k", k)):
        if not isinstance(t, Tensor) or t.dim() != 3:
            raise ValueError(
                f"{name} must be (nnz, num_heads, head_dim), got "
                + (f"shape {list(t.shape)}" if isinstance(t, Tensor) else type(t).__name__)
            )
    if k.size(0) != q.size(0) or k.size(2) != q.size(2) or k.device != q.device:
        raise ValueError(
            f"k must be (nnz, num_kv_heads, head_dim) with q's nnz and head_dim "
            f"({q.size(0)}, ., {q.size(2)}) on q's device {q.device}, got shape {list(k.shape)} "
            f"on {k.device}"
        )
    for name, t in (("q", q), ("k", k)):
        if t.dtype not in _FLOATING:
            raise ValueError(f"{name} must be float64, float32, float16 or bfloat16, got {t.dtype}")
    head_dim = q.size(-1)
    if rotary_dim is None:
        return head_dim
    if isinstance(rotary_dim, bool) or not isinstance(rotary_dim, numbers.Integral):
        raise TypeError(f"rotary_dim must be an int or None, got {rotary_dim!r}")
    if not 0 < rotary_dim <= head_dim or rotary_dim % 2:
        raise ValueError(
            f"rotary_dim must be even and in (0, head_dim = {head_dim}], got {rotary_dim}"
        )
    return int(rotary_dim)


def _positions(q: Tensor, pos_ids: Tensor) -> Tensor:
    if not isinstance(pos_ids, Tensor) or pos_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(
            "pos_ids must be an int32 or int64 tensor, got "
            + (str(pos_ids.dtype) if isinstance(pos_ids, Tensor) else type(pos_ids).__name__)
        )
    if pos_ids.shape != (q.size(0),):
        raise ValueError(
            f"pos_ids must be (nnz,) = ({q.size(0)},), one position per row, got "
            f"{list(pos_ids.shape)}"
        )
    return pos_ids.unsqueeze(-1)  # over the heads


def _rope(peer, q, k, where: dict, rotary_dim, interleave, theta, scaling_items, inplace):
    """Rotate q and k by the frequencies of ``scaling_items`` at the positions ``where`` gives
    (``positions=`` or ``cu_seqlens=``/``seq_offsets=``); the ops' errors in FlashInfer's words
    (``peer``: the entry point's name without ``_inplace``)."""
    rotary_dim = _check_qk(q, k, rotary_dim)
    freqs = _frequencies(rotary_dim, _number("rope_theta", theta), scaling_items, q.device)
    if "positions" in where:
        where = {"positions": _positions(q, where["positions"])}
    kw = dict(freqs=freqs, interleaved=bool(interleave), **where)
    # rotary_dim = 2 * freqs.numel(): the features past it pass through.
    words, q_words, k_words = _WORDS[peer]
    if not inplace:
        return peer_words(words, apply_qk, q, k, **kw)
    # q's and k's checks are the same but for the tensor itself (_check_qk ran on both): k
    # cannot be refused after q is written.
    peer_words(q_words, apply_, q, **kw)
    peer_words(k_words, apply_, k, **kw)
    return None


def _linear(rope_scale) -> tuple:
    rope_scale = _number("rope_scale", rope_scale)
    if not rope_scale > 0 or rope_scale == float("inf"):
        raise ValueError(f"rope_scale must be a finite number > 0, got {rope_scale}")
    return () if rope_scale == 1.0 else (("factor", rope_scale), ("rope_type", "linear"))


def _llama31(rope_scale, low_freq_factor, high_freq_factor, old_context_len) -> tuple:
    rope_scale = _number("rope_scale", rope_scale)
    if not rope_scale > 0 or rope_scale == float("inf"):
        raise ValueError(f"rope_scale must be a finite number > 0, got {rope_scale}")
    return (
        ("factor", rope_scale),
        ("high_freq_factor", _number("high_freq_factor", high_freq_factor)),
        ("low_freq_factor", _number("low_freq_factor", low_freq_factor)),
        ("original_max_position_embeddings", _number("old_context_len", old_context_len)),
        ("rope_type", "llama3"),
    )


def _ragged(indptr: Tensor, offsets: Tensor) -> dict:
    return {"cu_seqlens": indptr, "seq_offsets": offsets}


def apply_rope(
    q: Tensor,
    k: Tensor,
    indptr: Tensor,
    offsets: Tensor,
    rotary_dim: Optional[int] = None,
    interleave: bool = False,
    rope_scale: float = 1,
    rope_theta: float = 1e4,
) -> Tuple[Tensor, Tensor]:
    """FlashInfer's ``apply_rope``: rotated copies ``(q_rope, k_rope)`` of the ragged batch
    ``q (nnz, Hq, D)``, ``k (nnz, Hk, D)``; sequence ``b`` owns rows ``indptr[b] ..
    indptr[b+1] - 1`` and starts at position ``offsets[b]``. ``interleave=False`` rotates
    ``(k, k + R/2)``, ``True`` ``(2k, 2k + 1)``."""
    return _rope(
        "apply_rope",
        q,
        k,
        _ragged(indptr, offsets),
        rotary_dim,
        interleave,
        rope_theta,
        _linear(rope_scale),
        inplace=False,
    )


def apply_rope_inplace(
    q: Tensor,
    k: Tensor,
    indptr: Tensor,
    offsets: Tensor,
    rotary_dim: Optional[int] = None,
    interleave: bool = False,
    rope_scale: float = 1,
    rope_theta: float = 1e4,
) -> None:
    """FlashInfer's ``apply_rope_inplace``: :func:`apply_rope` written into q and k."""
    return _rope(
        "apply_rope",
        q,
        k,
        _ragged(indptr, offsets),
        rotary_dim,
        interleave,
        rope_theta,
        _linear(rope_scale),
        inplace=True,
    )


def apply_rope_pos_ids(
    q: Tensor,
    k: Tensor,
    pos_ids: Tensor,
    rotary_dim: Optional[int] = None,
    interleave: bool = False,
    rope_scale: float = 1,
    rope_theta: float = 1e4,
) -> Tuple[Tensor, Tensor]:
    """FlashInfer's ``apply_rope_pos_ids``: as :func:`apply_rope`, row ``t`` at position
    ``pos_ids[t]`` (``(nnz,)`` int32/int64)."""
    return _rope(
        "apply_rope_pos_ids",
        q,
        k,
        {"positions": pos_ids},
        rotary_dim,
        interleave,
        rope_theta,
        _linear(rope_scale),
        inplace=False,
    )


def apply_rope_pos_ids_inplace(
    q: Tensor,
    k: Tensor,
    pos_ids: Tensor,
    rotary_dim: Optional[int] = None,
    interleave: bool = False,
    rope_scale: float = 1,
    rope_theta: float = 1e4,
) -> None:
    """FlashInfer's ``apply_rope_pos_ids_inplace``: :func:`apply_rope_pos_ids` written into q
    and k."""
    return _rope(
        "apply_rope_pos_ids",
        q,
        k,
        {"positions": pos_ids},
        rotary_dim,
        interleave,
        rope_theta,
        _linear(rope_scale),
        inplace=True,
    )


def apply_llama31_rope(
    q: Tensor,
    k: Tensor,
    indptr: Tensor,
    offsets: Tensor,
    rotary_dim: Optional[int] = None,
    interleave: bool = False,
    rope_scale: float = 8,
    rope_theta: float = 5e5,
    low_freq_factor: float = 1,
    high_freq_factor: float = 4,
    old_context_len: int = 8192,
) -> Tuple[Tensor, Tensor]:
    """FlashInfer's ``apply_llama31_rope``: as :func:`apply_rope` with Llama 3.1's frequencies
    (wavelengths shorter than ``old_context_len / high_freq_factor`` keep their frequency, longer
    than ``old_context_len / low_freq_factor`` are divided by ``rope_scale``, smoothed between)."""
    scaling = _llama31(rope_scale, low_freq_factor, high_freq_factor, old_context_len)
    return _rope(
        "apply_llama31_rope",
        q,
        k,
        _ragged(indptr, offsets),
        rotary_dim,
        interleave,
        rope_theta,
        scaling,
        inplace=False,
    )


def apply_llama31_rope_inplace(
    q: Tensor,
    k: Tensor,
    indptr: Tensor,
    offsets: Tensor,
    rotary_dim: Optional[int] = None,
    interleave: bool = False,
    rope_scale: float = 8,
    rope_theta: float = 5e5,
    low_freq_factor: float = 1,
    high_freq_factor: float = 4,
    old_context_len: int = 8192,
) -> None:
    """FlashInfer's ``apply_llama31_rope_inplace``: :func:`apply_llama31_rope` written into q
    and k."""
    scaling = _llama31(rope_scale, low_freq_factor, high_freq_factor, old_context_len)
    return _rope(
        "apply_llama31_rope",
        q,
        k,
        _ragged(indptr, offsets),
        rotary_dim,
        interleave,
        rope_theta,
        scaling,
        inplace=True,
    )


def apply_llama31_rope_pos_ids(
    q: Tensor,
    k: Tensor,
    pos_ids: Tensor,
    rotary_dim: Optional[int] = None,
    interleave: bool = False,
    rope_scale: float = 8,
    rope_theta: float = 5e5,
    low_freq_factor: float = 1,
    high_freq_factor: float = 4,
    old_context_len: int = 8192,
) -> Tuple[Tensor, Tensor]:
    """FlashInfer's ``apply_llama31_rope_pos_ids``: :func:`apply_llama31_rope` at ``pos_ids``."""
    scaling = _llama31(rope_scale, low_freq_factor, high_freq_factor, old_context_len)
    return _rope(
        "apply_llama31_rope_pos_ids",
        q,
        k,
        {"positions": pos_ids},
        rotary_dim,
        interleave,
        rope_theta,
        scaling,
        inplace=False,
    )


def apply_llama31_rope_pos_ids_inplace(
    q: Tensor,
    k: Tensor,
    pos_ids: Tensor,
    rotary_dim: Optional[int] = None,
    interleave: bool = False,
    rope_scale: float = 8,
    rope_theta: float = 5e5,
    low_freq_factor: float = 1,
    high_freq_factor: float = 4,
    old_context_len: int = 8192,
) -> None:
    """FlashInfer's ``apply_llama31_rope_pos_ids_inplace``: :func:`apply_llama31_rope_pos_ids`
    written into q and k."""
    scaling = _llama31(rope_scale, low_freq_factor, high_freq_factor, old_context_len)
    return _rope(
        "apply_llama31_rope_pos_ids",
        q,
        k,
        {"positions": pos_ids},
        rotary_dim,
        interleave,
        rope_theta,
        scaling,
        inplace=True,
    )
