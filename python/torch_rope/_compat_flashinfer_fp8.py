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
* ``enable_pdl`` (a launch attribute) and ``backend`` change nothing here.

Differences, by design: inputs may also be float32; a ``cos_sin_cache`` whose width is not q's
rope_dim is refused (FlashInfer reads past it); out-of-range positions raise (CPU) or trip a device
assert (CUDA) instead of reading out of bounds.
"""

from typing import Optional, Tuple

import torch
from torch import Tensor

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
