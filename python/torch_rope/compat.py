# SPDX-License-Identifier: BSD-3-Clause
"""Other libraries' RoPE entry points under their own names and argument meanings, as thin layers
over :func:`torch_rope.apply`, :func:`torch_rope.apply_` and :func:`torch_rope.apply_qk`:

* :func:`apply_rotary_pos_emb`: TransformerEngine's (angles ``(s2, 1, 1, d2)`` in TE's duplicated
  layout; ``sbhd``/``bshd``/``thd``; start positions; context-parallel zigzag). Differentiable.
* :func:`apply_rotary_emb`: flash-attn's (cos/sin tables, ``seqlen_offsets``, varlen with
  ``cu_seqlens``/``max_seqlen``, ``inplace``). Differentiable.
* :func:`apply_rope`, :func:`apply_rope_pos_ids`, :func:`apply_llama31_rope`,
  :func:`apply_llama31_rope_pos_ids` and their ``_inplace`` variants: FlashInfer's table-free ops
  (``rope_theta``, ``rope_scale``, Llama 3.1's factors; ``indptr``/``offsets`` or ``pos_ids``).
* :func:`rotary_embedding`, :func:`apply_rope_with_cos_sin_cache` and ``_inplace``: the inference
  engines' cache form, below.
* :func:`rope_quantize_fp8`, :func:`mla_rope_quantize_fp8`: FlashInfer's fused RoPE + float8
  (``cos_sin_cache``, ``quant_scale`` multiplies), over :func:`torch_rope.apply_qk_fp8`;
  :func:`rope_quantize_fp8_append_paged_kv_cache` (its paged NHD/HND caches, GQA or MLA), over
  :func:`torch_rope.mla_apply_cache`.
* :func:`concat_and_cache_mla`: vLLM's MLA cache rows ``[kv_c | k_pe]`` (copied, not rotated),
  over :func:`torch_rope.mla_apply_cache`.

Each peer's own conventions are in its module (``_compat_transformer_engine``,
``_compat_flash_attn``, ``_compat_flashinfer``, ``_compat_flashinfer_fp8``, ``_compat_vllm``); the
rest of this docstring is the cache form.

vLLM, SGLang and FlashInfer share one calling convention::

    rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)

* ``query`` / ``key``: ``(..., num_heads * head_size)`` or ``(..., num_heads, head_size)``,
  rotated **in place**; ``key`` may be None. Strided views (slices of a fused qkv projection) are
  written through, without a copy, when their last dim is contiguous.
* ``positions``: int32/int64 of the leading shape ``...`` (``(num_tokens,)`` usually).
* ``cos_sin_cache``: ``(max_position, rotary_dim)``, cos in the first half of each row and sin in
  the second. Read in place, as two strided views (no copy) when float32 or float64; a float16 or
  bfloat16 cache is converted to float32 once per call, with a warning (the conversion cannot give
  back the precision the 16-bit cache lost).
* ``is_neox``: True rotates ``(k, k + rotary_dim / 2)`` pairs (NeoX, ``rotate_half``), False
  adjacent ``(2k, 2k + 1)`` pairs (GPT-J).
* ``rotary_dim`` may be less than ``head_size``: the other features pass through.
  ``rope_dim_offset`` (keyword) moves the rotated run inside each head, e.g. to the rotary slice
  of an MLA head.

Math is float32 (float64 for float64 inputs) whatever the storage, rounded once.
"""

import warnings
from typing import Optional, Tuple

import torch
from torch import Tensor

from ._compat_flash_attn import apply_rotary_emb
from ._compat_flashinfer import (
    apply_llama31_rope,
    apply_llama31_rope_inplace,
    apply_llama31_rope_pos_ids,
    apply_llama31_rope_pos_ids_inplace,
    apply_rope,
    apply_rope_inplace,
    apply_rope_pos_ids,
    apply_rope_pos_ids_inplace,
)
from ._compat_flashinfer_fp8 import (
    mla_rope_quantize_fp8,
    rope_quantize_fp8,
    rope_quantize_fp8_append_paged_kv_cache,
)
from ._compat_transformer_engine import apply_rotary_pos_emb
from ._compat_vllm import concat_and_cache_mla
from .ops import apply_

__all__ = [
    "rotary_embedding",
    "apply_rope_with_cos_sin_cache",
    "apply_rope_with_cos_sin_cache_inplace",
    "apply_rotary_pos_emb",
    "apply_rotary_emb",
    "apply_rope",
    "apply_rope_inplace",
    "apply_rope_pos_ids",
    "apply_rope_pos_ids_inplace",
    "apply_llama31_rope",
    "apply_llama31_rope_inplace",
    "apply_llama31_rope_pos_ids",
    "apply_llama31_rope_pos_ids_inplace",
    # the serving fusions (issue 33): FlashInfer's fused RoPE + fp8, vLLM's MLA cache rows
    "rope_quantize_fp8",
    "mla_rope_quantize_fp8",
    "rope_quantize_fp8_append_paged_kv_cache",
    "concat_and_cache_mla",
]


def _tables(cos_sin_cache: Tensor) -> Tuple[Tensor, Tensor]:
    """(cos, sin) as views of the cache's two halves."""
    if cos_sin_cache.dim() != 2 or cos_sin_cache.size(-1) % 2:
        raise ValueError(
            "cos_sin_cache must be (max_position, rotary_dim) with rotary_dim even (cos in the "
            f"first half of each row, sin in the second), got shape {list(cos_sin_cache.shape)}"
        )
    if cos_sin_cache.dtype in (torch.float16, torch.bfloat16):
        warnings.warn(
            f"torch_rope.compat: cos_sin_cache is {cos_sin_cache.dtype}; converting it to float32 "
            "on every call. A 16-bit cache has already lost precision at long positions: build "
            "it in float32 (torch_rope.rope_tables) and keep it so.",
            stacklevel=3,
        )
        cos_sin_cache = cos_sin_cache.float()
    half = cos_sin_cache.size(-1) // 2
    return cos_sin_cache[:, :half], cos_sin_cache[:, half:]


def _heads(name: str, x: Tensor, positions: Tensor, head_size: int) -> Tensor:
    """x as (..., num_heads, head_size), a view of the same memory."""
    if x.dim() == positions.dim() + 2 and x.size(-1) == head_size:
        return x
    if x.dim() == positions.dim() + 1 and x.size(-1) % head_size == 0:
        return x.view(*x.shape[:-1], x.size(-1) // head_size, head_size)
    raise ValueError(
        f"{name} must be (..., num_heads * head_size) or (..., num_heads, head_size) with the "
        f"leading dims of positions {list(positions.shape)} and head_size = {head_size}, got "
        f"shape {list(x.shape)}"
    )


def rotary_embedding(
    positions: Tensor,
    query: Tensor,
    key: Optional[Tensor],
    head_size: int,
    cos_sin_cache: Tensor,
    is_neox: bool,
    *,
    rope_dim_offset: int = 0,
) -> None:
    """vLLM's / SGLang's ``rotary_embedding``: rotate ``query`` and ``key`` in place."""
    cos, sin = _tables(cos_sin_cache)
    rotary_dim = 2 * cos.size(-1)
    if not 0 <= rope_dim_offset <= head_size - rotary_dim:
        raise ValueError(
            f"rope_dim_offset + rotary_dim must be within head_size = {head_size}, got "
            f"rope_dim_offset = {rope_dim_offset} and rotary_dim = {rotary_dim}"
        )
    pos = positions.unsqueeze(-1)  # broadcast over the heads
    for name, x in (("query", query), ("key", key)):
        if x is None:
            continue
        rotated = _heads(name, x, positions, head_size)
        if rope_dim_offset or rotary_dim != head_size:
            rotated = rotated[..., rope_dim_offset : rope_dim_offset + rotary_dim]
        apply_(rotated, cos, sin, pos, interleaved=not is_neox)


def apply_rope_with_cos_sin_cache_inplace(
    positions: Tensor,
    query: Tensor,
    key: Tensor,
    head_size: int,
    cos_sin_cache: Tensor,
    is_neox: bool = True,
) -> None:
    """FlashInfer's ``apply_rope_with_cos_sin_cache_inplace``: the same as
    :func:`rotary_embedding` (``is_neox`` defaults to True)."""
    rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)


def apply_rope_with_cos_sin_cache(
    positions: Tensor,
    query: Tensor,
    key: Tensor,
    head_size: int,
    cos_sin_cache: Tensor,
    is_neox: bool = True,
) -> Tuple[Tensor, Tensor]:
    """FlashInfer's ``apply_rope_with_cos_sin_cache``: rotated copies of ``query`` and ``key``."""
    query_out, key_out = query.clone(), key.clone()
    rotary_embedding(positions, query_out, key_out, head_size, cos_sin_cache, is_neox)
    return query_out, key_out
