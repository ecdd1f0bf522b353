# SPDX-License-Identifier: BSD-3-Clause
"""FlashInfer's fused RoPE + fp8 entry points under their names and signatures
(``flashinfer.rope``, 0.7.2), each a thin layer over torch-rope's ops that converts the arguments
at the boundary. Re-exported by :mod:`torch_rope.compat` (FlashInfer's table-free ``apply_rope*``
are in ``_compat_flashinfer``); documented in docs/api.md, "Peers' entry points".

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

from ._mla_ops import mla_apply_cache
from ._qk_fp8_ops import apply_qk_fp8

_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


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
        q_o, k_o, qn_o, kn_o = apply_qk_fp8(q_rope, k, cos, sin, positions, dtype=dtype, **kw)
    else:

        def buffer(out, like):
            return torch.empty(like.shape, dtype=dtype, device=like.device) if out is None else out

        q_o = buffer(q_rope_out, q_rope)
        k_o = buffer(k_rope_out, k_rope)
        qn_o = None if q_nope is None else buffer(q_nope_out, q_nope)
        kn_o = None if k_nope is None else buffer(k_nope_out, k_nope)
        apply_qk_fp8(q_rope, k, cos, sin, positions, out=(q_o, _heads(k_o), qn_o, _heads(kn_o)),
                     **kw)  # fmt: skip
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
    return rope_quantize_fp8(
        q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox, quantize_dtype,
        quant_scale_q, quant_scale_kv, q_rope_out, k_rope_out, q_nope_out, k_nope_out, enable_pdl,
    )  # fmt: skip


def _paged_slots(kv_indices, kv_indptr, batch_indices, positions, page_size) -> Tensor:
    """int64 slot of every token (-1 for batch_indices < 0): page
    ``kv_indices[g // page_size]``, entry ``g % page_size``, ``g = kv_indptr[b] * page_size +
    positions[t]``. Tensor ops only: no host sync; a page index past kv_indices raises (CPU) or
    trips torch's device assert (CUDA)."""
    b = batch_indices.to(torch.int64)
    valid = b >= 0
    g = kv_indptr.to(torch.int64)[b.clamp(min=0)] * page_size + positions.to(torch.int64)
    if kv_indices.numel() == 0:
        return torch.full_like(b, -1)
    page = kv_indices.to(torch.int64)[torch.where(valid, g // page_size, 0)]
    return torch.where(valid, page * page_size + g % page_size, -1)


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
    slots = _paged_slots(kv_indices, kv_indptr, batch_indices, positions, page_size)
    if slots.numel() != T:
        raise ValueError(
            f"batch_indices and positions must have one entry per token ({T}), got "
            f"{batch_indices.numel()} and {positions.numel()}"
        )
    q_o, qn_o = mla_apply_cache(
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
