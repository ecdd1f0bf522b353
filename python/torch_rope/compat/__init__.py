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
  engines' cache form (:mod:`.cos_sin_cache`).
* :func:`rope_quantize_fp8`, :func:`mla_rope_quantize_fp8`: FlashInfer's fused RoPE + float8
  (``cos_sin_cache``, ``quant_scale`` multiplies), over :func:`torch_rope.apply_qk_fp8`;
  :func:`rope_quantize_fp8_append_paged_kv_cache` (its paged NHD/HND caches, GQA or MLA), over
  :func:`torch_rope.mla_apply_cache`.
* :func:`concat_and_cache_mla`: vLLM's MLA cache rows ``[kv_c | k_pe]`` (copied, not rotated),
  over :func:`torch_rope.mla_apply_cache`.

Each peer's conventions are in its own module: :mod:`.transformer_engine`, :mod:`.flash_attn`,
:mod:`.flashinfer`, :mod:`.flashinfer_fp8`, :mod:`.vllm`, and :mod:`.cos_sin_cache` (the cache form
the inference engines share); :mod:`.errors` puts the ops' errors in each peer's words.
"""

from .cos_sin_cache import (
    apply_rope_with_cos_sin_cache,
    apply_rope_with_cos_sin_cache_inplace,
    rotary_embedding,
)
from .flash_attn import apply_rotary_emb
from .flashinfer import (
    apply_llama31_rope,
    apply_llama31_rope_inplace,
    apply_llama31_rope_pos_ids,
    apply_llama31_rope_pos_ids_inplace,
    apply_rope,
    apply_rope_inplace,
    apply_rope_pos_ids,
    apply_rope_pos_ids_inplace,
)
from .flashinfer_fp8 import (
    mla_rope_quantize_fp8,
    rope_quantize_fp8,
    rope_quantize_fp8_append_paged_kv_cache,
)
from .transformer_engine import apply_rotary_pos_emb
from .vllm import concat_and_cache_mla

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
    # the serving fusions: FlashInfer's fused RoPE + fp8, vLLM's MLA cache rows
    "rope_quantize_fp8",
    "mla_rope_quantize_fp8",
    "rope_quantize_fp8_append_paged_kv_cache",
    "concat_and_cache_mla",
]
