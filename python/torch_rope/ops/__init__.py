# SPDX-License-Identifier: BSD-3-Clause
"""Typed wrappers over ``torch.ops.rope.*``, one module per op family: :mod:`.rotation` (``apply``,
``apply_``; every form of their arguments), :mod:`.qk` (``apply_qk``), :mod:`.kv_cache`
(``apply_qk_cache``), :mod:`.rms_norm` (``rms_norm_apply_qk``), :mod:`.kv_cache_norm`
(``rms_norm_apply_qk_cache``), :mod:`.qk_fp8` (``apply_qk_fp8``, ``apply_qk_fp8_dynamic``),
:mod:`.mla` (``mla_apply_cache``), and :mod:`.tables` (``rope_tables`` and the scaling
variants). What they share: the eager fast path's one gate and the op arguments (in
:mod:`.rotation`), :mod:`._fusions` (the fused ops' source check and fp8 scales),
:mod:`._autograd` (``torch.func``), :mod:`._native` (the native module's one home).

Shared conventions (docs/api.md has the full contract: inputs, errors, every form):

* ``x`` (``q``, ``k``): float64/float32/float16/bfloat16, shape ``(..., head_dim)``, any strides
  (a last-dim stride of 1 is read without a copy; other layouts are copied once).
* ``cos``, ``sin``: ``(max_seq_len, rotary_dim // 2)`` float32 (or float64) tables, e.g. from
  :func:`rope_tables`. ``rotary_dim = 2 * cos.size(-1) <= head_dim``; the remaining features pass
  through unchanged.
* ``positions``: int32/int64, broadcastable (NumPy rules, aligned right) to ``x.shape[:-1]``:
  ``(S,)`` for ``(B, H, S, D)``, ``(B, 1, S)`` per sequence, ``(S, 1)`` for ``(B, S, H, D)``,
  ``(T, 1)`` for packed ``(T, H, D)``, ``start_pos + arange(S)`` when decoding with a KV cache.
  Values must be in ``[0, max_seq_len)``.
* ``interleaved=True`` rotates pairs ``(2k, 2k+1)`` (Meta Llama, GPT-J); ``False`` rotates
  ``(k, k + rotary_dim // 2)`` (HF ``rotate_half``, GPT-NeoX).
* ``inverse=True`` rotates by the negative angle: undoes the rotation; it is also the gradient.
* ``mrope_section`` (multi-axis positions, M-RoPE: Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4V, 2-D
  vision RoPE): the number of planes that read each axis, adding up to ``rotary_dim // 2`` (at
  most 4 axes). ``positions`` then has a trailing axis dim of size ``len(mrope_section)``
  (``positions[..., a]`` is axis ``a``) and ``positions.shape[:-1]`` broadcasts to
  ``x.shape[:-1]``. ``mrope_interleaved=False``: contiguous runs of planes per axis (Qwen2-VL);
  ``True`` (Qwen3-VL, 3 axes): plane ``k`` reads axis 1 if ``k % 3 == 1 and k < 3 *
  mrope_section[1]``, axis 2 if ``k % 3 == 2 and k < 3 * mrope_section[2]``, else axis 0. Both are
  independent of ``interleaved`` (the pair layout).
* Gradients flow to ``x``/``q``/``k`` only, never to ``cos``, ``sin`` or ``positions``.
* ``torch.func`` (``grad``, ``vjp``, ``jvp``, ``vmap``, ``jacrev``, ``jacfwd``, ...) works through
  these functions; the raw ``torch.ops.rope.*`` support ``vmap`` only.
"""

# First: loading the native module registers the ops, which the modules below read at import.
from . import _native  # noqa: F401
from .kv_cache import apply_qk_cache  # noqa: F401  (RoPE into a KV cache)
from .kv_cache_norm import rms_norm_apply_qk_cache  # noqa: F401  (QK-RMSNorm + RoPE + cache)
from .mla import mla_apply_cache  # noqa: F401  (MLA cache rows)
from .qk import apply_qk  # noqa: F401
from .qk_fp8 import apply_qk_fp8, apply_qk_fp8_dynamic  # noqa: F401  (RoPE with float8 q and k)
from .rms_norm import rms_norm_apply_qk  # noqa: F401  (fused QK-RMSNorm + RoPE)
from .rotation import apply, apply_, eager_fast_path  # noqa: F401
from .tables import rope_tables  # noqa: F401
