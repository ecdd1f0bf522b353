# SPDX-License-Identifier: BSD-3-Clause
"""FlashInfer's fused RoPE + fp8 entry points under their names and signatures
(``flashinfer.rope``, 0.7.2), each a thin layer over torch-rope's ops that converts the arguments
at the boundary. Re-exported by :mod:`torch_rope.compat` (FlashInfer's table-free ``apply_rope*``
are in :mod:`.flashinfer`); documented in docs/api.md, "Peers' entry points".

What the conversion does, from FlashInfer's own definitions (flashinfer/rope.py,
include/flashinfer/pos_enc.cuh):

* ``cos_sin_cache`` ``(max_seq_len, rope_dim)`` float32, cos in the first half of each row and sin
  in the second, for both pair layouts: two strided views, ``cos = cache[:, :R/2]``,
  ``sin = cache[:, R/2:]`` (no copy); ``is_neox=True`` is the half split (torch-rope's
  ``interleaved=False``).
* The scale **multiplies**: stored = ``(float32 rotated value * quant_scale).clamp(±max)``,
  rounded to nearest even (torch-rope's ``multiply_by_scale=True``; dividing by ``1 / scale``
  would round differently).
* ``k_rope`` of 2 dims is MLA's one shared key head: passed as a ``(T, 1, R)`` view.
* The paged cache of ``rope_quantize_fp8_append_paged_kv_cache`` is addressed by ``kv_indptr``
  (in pages), ``kv_indices`` (the page table), ``batch_indices`` and ``positions`` (the token's
  index in its request's KV sequence, not its RoPE position, which is ``pos_ids``): slot =
  ``kv_indices[g // page_size] * page_size + g % page_size`` with ``g = kv_indptr[b] * page_size
  + positions[t]``, computed with tensor ops (no host sync); ``batch_indices[t] < 0`` (padding)
  writes nothing for the token. FlashInfer leaves that token's q outputs unwritten too; these
  write them (a superset).
* ``enable_pdl`` (a launch attribute) and ``backend`` change nothing here.

Differences, by design: inputs may also be float32; a ``cos_sin_cache`` whose width is not q's
rope_dim is refused (FlashInfer reads past it); out-of-range positions and slots raise (CPU) or trip
a device assert (CUDA) instead of reading or writing out of bounds.
"""

from typing import Optional, Tuple

import torch
from torch import Tensor

from ..ops.mla import mla_apply_cache
from ..ops.qk_fp8 import apply_qk_fp8
from ..ops.rotation import _is_compiling
from .errors import PeerNames, peer_words

_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)

# The ops' names -> FlashInfer's. The table's width and length are cos_sin_cache's; the op's
# positions are pos_ids (FlashInfer's own positions are the KV-cache entries, checked here).
_TABLE_WORDS = {
    "positions": "pos_ids",
    "2 * cos.size(-1)": "cos_sin_cache.size(-1)",
    "cos.size(-1)": "cos_sin_cache.size(-1) / 2",
    "cos.size(0)": "cos_sin_cache.size(0)",
}
_QUANTIZE_WORDS = {
    **_TABLE_WORDS,
    "q": "q_rope",
    "k": "k_rope",
    "q_scale": "quant_scale_q",
    "k_scale": "quant_scale_kv",
    "q_out": "q_rope_out",
    "k_out": "k_rope_out",
}
_APPEND_WORDS = {
    **_TABLE_WORDS,
    "q_pe": "q_rope",
    "k_pe": "k_rope",
    "kv_c": "k_nope",
    "q_scale": "quant_scale_q",
    "kv_scale": "quant_scale_kv",
    "v_scale": "quant_scale_kv",
    "slot_mapping": "the tokens' cache slots (kv_indices[...] * page_size + entry)",
}
_QUANTIZE = PeerNames("rope_quantize_fp8", _QUANTIZE_WORDS)
_QUANTIZE_MLA = PeerNames("mla_rope_quantize_fp8", _QUANTIZE_WORDS)
_APPEND = "rope_quantize_fp8_append_paged_kv_cache"
_APPEND_MLA = PeerNames(
    _APPEND, {**_APPEND_WORDS, "kv_cache": "paged_kv_cache[0]", "kpe_cache": "paged_kv_cache[1]"}
)
_APPEND_GQA = PeerNames(
    _APPEND,
    {
        **_APPEND_WORDS,
        "kv_cache": "paged_kv_cache[0][..., R:]",
        "kpe_cache": "paged_kv_cache[0][..., :R]",
        "v_cache": "paged_kv_cache[1]",
    },
)


def _tables(cos_sin_cache: Tensor, rope_dim: int) -> Tuple[Tensor, Tensor]:
    """(cos, sin) as views of FlashInfer's float32 cache, whose width must be the rope_dim."""
    if cos_sin_cache.dtype != torch.float32:
        raise ValueError("cos_sin_cache should be float32")
    if cos_sin_cache.dim() != 2 or cos_sin_cache.size(1) != rope_dim or rope_dim % 2:
        raise ValueError(
            f"cos_sin_cache must be (max_seq_len, rope_dim) with rope_dim = q_rope.size(-1) = "
            f"{rope_dim} (even; cos in the first half of each row, sin in the second), got shape "
            f"{list(cos_sin_cache.shape)}"
        )
    half = rope_dim // 2
    return cos_sin_cache[:, :half], cos_sin_cache[:, half:]


def _fp8_dtype(quantize_dtype, *outs) -> torch.dtype:
    """quantize_dtype, else the dtype of the first output given, else float8_e4m3fn."""
    if quantize_dtype is None:
        quantize_dtype = next((o.dtype for o in outs if o is not None), torch.float8_e4m3fn)
    if quantize_dtype not in _FP8:
        raise ValueError(
            f"quantize_dtype must be torch.float8_e4m3fn or torch.float8_e5m2, got {quantize_dtype}"
        )
    return quantize_dtype


def _check_backend(backend: str) -> None:
    if backend not in ("cuda", "cutile"):
        raise ValueError(f"backend must be 'cuda' or 'cutile', got {backend!r}")


def _heads(x: Optional[Tensor]) -> Optional[Tensor]:
    """A 2-D (T, W) part of MLA's key as (T, 1, W), a view."""
    return x.unsqueeze(1) if x is not None and x.dim() == 2 else x


def rope_quantize_fp8(
    q_rope: Tensor,
    k_rope: Tensor,
    q_nope: Optional[Tensor],
    k_nope: Optional[Tensor],
    cos_sin_cache: Tensor,
    pos_ids: Tensor,
    is_neox: bool = True,
    quantize_dtype: Optional[torch.dtype] = None,
    quant_scale_q: float = 1.0,
    quant_scale_kv: float = 1.0,
    q_rope_out: Optional[Tensor] = None,
    k_rope_out: Optional[Tensor] = None,
    q_nope_out: Optional[Tensor] = None,
    k_nope_out: Optional[Tensor] = None,
    enable_pdl: bool = False,
    backend: str = "cuda",
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """FlashInfer's ``rope_quantize_fp8``: ``(q_rope_out, k_rope_out, q_nope_out, k_nope_out)``.

    ``q_rope`` ``(T, Hq, R)`` and ``k_rope`` ``(T, Hk, R)`` (or ``(T, R)``, MLA) rotated at
    ``pos_ids`` ``(T,)``, ``q_nope`` / ``k_nope`` (or None: a size-0 output) quantized as they
    are; every output float8, ``value * quant_scale`` saturated. Outputs given are written in place
    and returned."""
    _check_backend(backend)
    return _quantize(
        _QUANTIZE, q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox, quantize_dtype,
        quant_scale_q, quant_scale_kv, q_rope_out, k_rope_out, q_nope_out, k_nope_out,
    )  # fmt: skip


def _quantize(
    words, q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox, quantize_dtype,
    quant_scale_q, quant_scale_kv, q_rope_out, k_rope_out, q_nope_out, k_nope_out,
):  # fmt: skip
    dtype = _fp8_dtype(quantize_dtype, q_rope_out, k_rope_out, q_nope_out, k_nope_out)
    cos, sin = _tables(cos_sin_cache, q_rope.size(-1))
    positions = pos_ids.reshape(-1, 1)
    mla = k_rope.dim() == 2
    k = _heads(k_rope)
    kn = _heads(k_nope)
    kw = dict(
        q_nope=q_nope,
        k_nope=kn,
        q_scale=float(quant_scale_q),
        k_scale=float(quant_scale_kv),
        interleaved=not is_neox,
        multiply_by_scale=True,
    )
    outs = (q_rope_out, k_rope_out, q_nope_out, k_nope_out)
    if all(o is None for o in outs):
        q_o, k_o, qn_o, kn_o = peer_words(
            words, apply_qk_fp8, q_rope, k, cos, sin, positions, dtype=dtype, **kw
        )
    else:

        def buffer(out, like):
            return torch.empty(like.shape, dtype=dtype, device=like.device) if out is None else out

        q_o = buffer(q_rope_out, q_rope)
        k_o = buffer(k_rope_out, k_rope)
        qn_o = None if q_nope is None else buffer(q_nope_out, q_nope)
        kn_o = None if k_nope is None else buffer(k_nope_out, k_nope)
        peer_words(words, apply_qk_fp8, q_rope, k, cos, sin, positions,
                   out=(q_o, _heads(k_o), qn_o, _heads(kn_o)), **kw)  # fmt: skip
        if qn_o is None:
            qn_o = torch.empty((*q_rope.shape[:-1], 0), dtype=dtype, device=q_rope.device)
        if kn_o is None:
            kn_o = torch.empty((*k_rope.shape[:-1], 0), dtype=dtype, device=k_rope.device)
        return q_o, k_o, qn_o, kn_o
    if mla:
        k_o = k_o.squeeze(1)
        kn_o = kn_o.squeeze(1)
    return q_o, k_o, qn_o, kn_o


def mla_rope_quantize_fp8(
    q_rope: Tensor,
    k_rope: Tensor,
    q_nope: Tensor,
    k_nope: Tensor,
    cos_sin_cache: Tensor,
    pos_ids: Tensor,
    is_neox: bool = True,
    quantize_dtype: Optional[torch.dtype] = None,
    quant_scale_q: float = 1.0,
    quant_scale_kv: float = 1.0,
    q_rope_out: Optional[Tensor] = None,
    k_rope_out: Optional[Tensor] = None,
    q_nope_out: Optional[Tensor] = None,
    k_nope_out: Optional[Tensor] = None,
    enable_pdl: bool = False,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """FlashInfer's ``mla_rope_quantize_fp8``: :func:`rope_quantize_fp8` with the same arguments
    (``k_rope`` ``(T, R)``, ``k_nope`` ``(T, kv_lora_rank)``)."""
    return _quantize(
        _QUANTIZE_MLA, q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox,
        quantize_dtype, quant_scale_q, quant_scale_kv, q_rope_out, k_rope_out, q_nope_out,
        k_nope_out,
    )  # fmt: skip


def _paged_slots(kv_indices, kv_indptr, batch_indices, positions, page_size) -> Tensor:
    """int64 slot of every token (-1 for batch_indices < 0): page
    ``kv_indices[g // page_size]``, entry ``g % page_size``, ``g = kv_indptr[b] * page_size +
    positions[t]``, where ``0 <= positions[t] < (kv_indptr[b + 1] - kv_indptr[b]) * page_size``
    (the request's own pages: a negative position would index kv_indices from its end, one past
    the request's pages would write the next request's page). Checked before anything is
    written: on the CPU an error naming the argument; on CUDA (no host sync) a token out of its
    pages is sent past the end of kv_indices, where torch's indexing trips its device assert."""
    b = batch_indices.to(torch.int64)
    valid = b >= 0
    bc = b.clamp(min=0)
    indptr = kv_indptr.to(torch.int64)
    if valid.device.type == "cpu" and not _is_compiling():
        _check_paged_tokens(b, valid, indptr, positions, page_size)
    pos = positions.to(torch.int64)
    first_page = indptr[bc]
    page_count = indptr[(bc + 1).clamp(max=indptr.numel() - 1)] - first_page
    inside = (pos >= 0) & (pos < page_count * page_size)
    g = first_page * page_size + pos
    # One entry past kv_indices stands for "no page" (read by padding tokens, so that an empty
    # kv_indices is never indexed); a token outside its pages reads one past that.
    pages = torch.cat(
        [kv_indices.to(torch.int64), kv_indices.new_full((1,), -1, dtype=torch.int64)]
    )
    no_page = pages.numel() - 1
    page_index = torch.where(valid, torch.where(inside, g // page_size, no_page + 1), no_page)
    page = pages[page_index]
    return torch.where(valid, page * page_size + g % page_size, -1)


def _check_paged_tokens(b, valid, indptr, positions, page_size) -> None:
    """On the CPU: every token that is not padding names a request of kv_indptr and an entry
    inside that request's pages."""
    requests = indptr.numel() - 1
    bad = valid & (b >= requests)
    if bool(bad.any()):
        t = int(torch.nonzero(bad)[0, 0])
        raise ValueError(
            f"{_APPEND}: batch_indices[{t}] = {int(b[t])} must be < the number of requests, "
            f"kv_indptr.size(0) - 1 = {requests} (or < 0: padding)"
        )
    pos = positions.to(torch.int64)
    bc = b.clamp(min=0, max=max(requests - 1, 0))
    if requests > 0:
        pages = indptr[bc + 1] - indptr[bc]
    else:
        pages = torch.zeros_like(bc)
    bad = valid & ((pos < 0) | (pos >= pages * page_size))
    if bool(bad.any()):
        t = int(torch.nonzero(bad)[0, 0])
        r = int(b[t])
        n = int(pages[t])
        raise ValueError(
            f"{_APPEND}: positions[{t}] = {int(pos[t])} must be in [0, {n * page_size}): the "
            f"entries of request batch_indices[{t}] = {r}'s {n} pages (kv_indptr[{r + 1}] - "
            f"kv_indptr[{r}] = {int(indptr[r + 1])} - {int(indptr[r])}, page_size = {page_size})"
        )


def rope_quantize_fp8_append_paged_kv_cache(
    q_rope: Tensor,
    k_rope: Tensor,
    q_nope: Optional[Tensor],
    k_nope: Optional[Tensor],
    v: Optional[Tensor],
    cos_sin_cache: Tensor,
    pos_ids: Tensor,
    paged_kv_cache: Tuple[Tensor, Tensor],
    kv_indices: Tensor,
    kv_indptr: Tensor,
    batch_indices: Tensor,
    positions: Tensor,
    is_neox: bool = True,
    quantize_dtype: Optional[torch.dtype] = None,
    quant_scale_q: float = 1.0,
    quant_scale_kv: float = 1.0,
    page_size: int = 16,
    kv_layout: str = "NHD",
    q_rope_out: Optional[Tensor] = None,
    q_nope_out: Optional[Tensor] = None,
    enable_pdl: bool = False,
) -> Tuple[Tensor, Tensor]:
    """FlashInfer's ``rope_quantize_fp8_append_paged_kv_cache``: ``(q_rope_out, q_nope_out)``,
    the rotated k and v quantized into the paged caches in place.

    GQA/MHA (``k_rope`` ``(T, Hk, R)``, ``v`` ``(T, Hk, R + N)``): ``paged_kv_cache = (k_cache,
    v_cache)``, ``(num_pages, page_size, Hk, R + N)`` (``kv_layout="NHD"``) or ``(num_pages,
    Hk, page_size, R + N)`` (``"HND"``), k rows ``[rotated k_rope | k_nope]``. MLA (``k_rope``
    ``(T, R)``, ``v`` None): ``(ckv_cache, kpe_cache)``, ``(num_pages, page_size, N)`` and
    ``(num_pages, page_size, R)``. One ``mla_apply_cache`` call (one launch on CUDA)."""
    mla = k_rope.dim() == 2
    if mla and v is not None:
        raise ValueError("MLA (k_rope of 2 dims) takes no v: pass v=None")
    if not mla and v is None:
        raise ValueError("GQA/MHA (k_rope of 3 dims) needs v (num_tokens, num_kv_heads, head_dim)")
    if kv_layout not in ("NHD", "HND"):
        raise ValueError(f"kv_layout must be 'NHD' or 'HND', got {kv_layout!r}")
    dtype = _fp8_dtype(quantize_dtype, q_rope_out, q_nope_out)
    cache_0, cache_1 = paged_kv_cache
    for name, cache in (("paged_kv_cache[0]", cache_0), ("paged_kv_cache[1]", cache_1)):
        if cache.dtype != dtype:
            raise ValueError(f"{name} must have quantize_dtype {dtype}, got {cache.dtype}")
    cos, sin = _tables(cos_sin_cache, q_rope.size(-1))
    R = q_rope.size(-1)
    T = q_rope.size(0)
    kv_c = k_nope if k_nope is not None else k_rope[..., :0]
    if mla:
        ckv, kpe, v_cache = cache_0, cache_1, None
    else:
        if (
            kv_layout == "HND"
        ):  # (num_pages, Hk, page_size, D) read as (num_pages, page_size, Hk, D)
            cache_0, cache_1 = cache_0.transpose(1, 2), cache_1.transpose(1, 2)
        kpe, ckv, v_cache = cache_0[..., :R], cache_0[..., R:], cache_1
    if kpe.dim() < 3 or kpe.size(1) != page_size:
        raise ValueError(
            f"page_size = {page_size} must be the caches' page dim, got a cache of shape "
            f"{list(paged_kv_cache[0].shape)} ({kv_layout})"
        )
    if batch_indices.shape != (T,) or positions.shape != (T,):
        raise ValueError(
            f"batch_indices and positions must have one entry per token, ({T},), got shapes "
            f"{list(batch_indices.shape)} and {list(positions.shape)}"
        )
    slots = _paged_slots(kv_indices, kv_indptr, batch_indices, positions, page_size)
    q_o, qn_o = peer_words(
        _APPEND_MLA if mla else _APPEND_GQA, mla_apply_cache,
        q_rope, k_rope, kv_c, cos, sin, pos_ids.reshape(-1, 1), ckv, kpe, slots, q_nope=q_nope,
        v=v, v_cache=v_cache, interleaved=not is_neox, kv_scale=float(quant_scale_kv),
        v_scale=None if v is None else float(quant_scale_kv), q_dtype=dtype,
        q_scale=float(quant_scale_q), multiply_by_scale=True,
    )  # fmt: skip
    if q_rope_out is not None:
        q_o = q_rope_out.copy_(q_o)
    if q_nope_out is not None and q_nope is not None:
        qn_o = q_nope_out.copy_(qn_o)
    return q_o, qn_o
