# SPDX-License-Identifier: BSD-3-Clause
"""patch's fused QK-RMSNorm: one ``rope::rms_norm_apply_qk`` instead of q_norm, k_norm and
``apply_qk`` in attention layers that RMS-normalise each head of q and k right before RoPE
(Qwen3, Qwen3-MoE, Qwen3-VL's text tower, Gemma 3, ...).

How it is wired, without touching transformers' code:

* At patch time each candidate attention layer's ``q_norm`` / ``k_norm`` is probed
  (:func:`norm_parameters`): it must compute ``x / sqrt(mean(x**2) + eps) * (w + offset)`` over a
  ``(head_dim,)`` weight, with ``offset`` 0 (Qwen) or 1 (Gemma's ``1 + w``). The probe runs the
  module itself on random inputs and a random weight, so a LayerNorm, a norm across heads
  (OLMo 2) or any other formula is left on the unfused path.
* The two norms' forwards are then deferred (:func:`defer`): on this model instance they return
  their input, and the patched attention forward hands the weights, ``eps`` and ``offset`` to
  its ``apply_rotary_pos_emb`` together with the tables (:class:`NormedTables`), which runs the
  fused op on the raw projections.
* The self-check runs the deferred layer against the unpatched one on a probe input (with the
  norms' own forwards restored for the unpatched run, :func:`norms_restored`) and the layer keeps
  the unfused path where they disagree (for example, an op between the norm and RoPE).
"""

import contextlib
import copy
import functools
import math
from typing import NamedTuple, Optional, Tuple

import torch
from torch import Tensor, nn

from ..ops import rms_norm_apply_qk

# The attribute of a patched attention layer that holds its fused norms' (eps, weight_offset).
ATTRIBUTE = "_torch_rope_qk_norm"
_NORMS = ("q_norm", "k_norm")


class NormedTables(NamedTuple):
    """What a fused attention layer passes as ``sin`` to its apply_rotary_pos_emb: the torch_rope
    tables and the two norms' weights and constants."""

    tables: nn.Module
    q_weight: Tensor
    k_weight: Tensor
    eps: float
    weight_offset: float


def _eps_of(norm: nn.Module) -> Optional[float]:
    for name in ("variance_epsilon", "eps", "epsilon"):
        value = getattr(norm, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def _probe_offset(norm: nn.Module, head_dim: int, eps: float) -> Optional[float]:
    """0.0 or 1.0 when ``norm`` computes x * rsqrt(mean(x**2) + eps) * (w + offset) over the last
    dim (checked in float32 with a random weight and a random input), else None."""
    generator = torch.Generator(device="cpu").manual_seed(0)
    weight = torch.randn(head_dim, generator=generator) * 0.5 + 0.25
    x = torch.randn(2, 3, head_dim, generator=generator) * 3.0
    try:
        with torch.no_grad():
            got = torch.func.functional_call(norm.float().cpu(), {"weight": weight}, (x,))
    except Exception:  # a norm that cannot run on a CPU float32 probe: not fused
        return None
    if not isinstance(got, Tensor) or got.shape != x.shape:
        return None
    normed = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)
    for offset in (0.0, 1.0):
        if torch.allclose(got.float(), normed * (weight + offset), rtol=1e-5, atol=1e-6):
            return offset
    return None


def norm_parameters(attention: nn.Module, head_dim: int) -> Optional[Tuple[float, float]]:
    """``(eps, weight_offset)`` when ``attention``'s ``q_norm`` and ``k_norm`` are per-head RMSNorms
    the fused op computes (one eps and one offset for both), else None. A layer whose forward
    takes ``position_embeddings=None`` (a NoPE layer of a model with layer types) still needs
    its norms when no RoPE comes: not fused."""
    annotation = type(attention).forward.__annotations__.get("position_embeddings", None)
    if annotation is None or "None" in str(annotation):
        return None
    found = []
    for name in _NORMS:
        norm = getattr(attention, name, None)
        weight = getattr(norm, "weight", None)
        if not isinstance(norm, nn.Module) or not isinstance(weight, Tensor):
            return None
        if weight.shape != (head_dim,) or not weight.is_floating_point():
            return None
        if "forward" in vars(norm):
            return None
        eps = _eps_of(norm)
        if eps is None or not math.isfinite(eps) or eps <= 0:
            return None
        # The probe runs a float32 CPU copy: the model's own norm keeps its dtype and device.
        offset = _probe_offset(copy.deepcopy(norm), head_dim, eps)
        if offset is None:
            return None
        found.append((eps, offset))
    return found[0] if found[0] == found[1] else None


def _deferred_norm(norm: nn.Module, x: Tensor) -> Tensor:
    """A deferred q_norm / k_norm: the fused op normalises later, in apply_rotary_pos_emb."""
    return x


def defer(attention: nn.Module, parameters: Tuple[float, float]) -> None:
    """Make ``attention`` fuse its q/k norms into RoPE (see the module docstring)."""
    for name in _NORMS:
        norm = getattr(attention, name)
        norm.forward = functools.partial(_deferred_norm, norm)
    object.__setattr__(attention, ATTRIBUTE, parameters)


def undo(attention: nn.Module) -> None:
    """Undo :func:`defer` (a no-op on a layer that was not deferred)."""
    if ATTRIBUTE not in vars(attention):
        return
    object.__delattr__(attention, ATTRIBUTE)
    for name in _NORMS:
        vars(getattr(attention, name)).pop("forward", None)


@contextlib.contextmanager
def norms_restored(attention: nn.Module):
    """The layer's own q_norm / k_norm forwards for the duration (the unpatched probe run)."""
    saved = {}
    if ATTRIBUTE in vars(attention):
        for name in _NORMS:
            norm = getattr(attention, name)
            saved[name] = vars(norm).pop("forward", None)
    try:
        yield
    finally:
        for name, forward in saved.items():
            if forward is not None:
                getattr(attention, name).forward = forward


@contextlib.contextmanager
def random_norm_weights(attention: nn.Module):
    """q_norm's and k_norm's weights replaced by random values for the duration (restored after):
    a rotation commutes with a norm whose weight is uniform, so only non-uniform weights show
    whether the layer normalises before RoPE, as the fused op does."""
    saved = []
    generator = torch.Generator(device="cpu").manual_seed(1)
    try:
        with torch.no_grad():
            for name in _NORMS:
                weight = getattr(attention, name).weight
                saved.append((weight, weight.detach().clone()))
                values = 1.0 + 0.5 * torch.randn(weight.shape, generator=generator)
                weight.copy_(values.to(weight.dtype))
        yield
    finally:
        with torch.no_grad():
            for weight, value in saved:
                weight.copy_(value)


def _position_embeddings_index(module: nn.Module) -> int:
    """Where ``position_embeddings`` sits among the positional arguments of the module's forward
    (after self), or -1."""
    code = type(module).forward.__code__
    names = code.co_varnames[1 : code.co_argcount]
    return names.index("position_embeddings") if "position_embeddings" in names else -1


def rewrap(module: nn.Module, args: tuple, kwargs: dict) -> Tuple[tuple, dict]:
    """A patched layer's forward arguments with its (positions, tables) position embeddings
    carrying its own fused norms (NormedTables) when it has them, and plain tables otherwise.

    A layer passes its position embeddings on to submodules (MiniMax-M3's indexer): another
    layer's norms must never reach them, so NormedTables arriving here are unwrapped first."""
    fused = getattr(module, ATTRIBUTE, None)
    if "position_embeddings" in kwargs:
        where = "position_embeddings"
        embeddings = kwargs[where]
    else:
        where = _position_embeddings_index(module)
        embeddings = args[where] if 0 <= where < len(args) else None
    if embeddings is None:
        if fused is not None:
            # The norms are deferred: without RoPE the layer would skip them silently.
            raise RuntimeError(
                f"torch_rope.hf: {type(module).__name__} was called with "
                "position_embeddings=None (or without them); its q/k norms are fused into RoPE"
            )
        return args, kwargs
    positions, tables = embeddings
    if isinstance(tables, NormedTables):
        tables = tables.tables
    elif fused is None:
        return args, kwargs  # the common case: nothing to change
    if fused is not None:
        eps, offset = fused
        tables = NormedTables(tables, module.q_norm.weight, module.k_norm.weight, eps, offset)
    if isinstance(where, str):
        return args, {**kwargs, where: (positions, tables)}
    return (*args[:where], (positions, tables), *args[where + 1 :]), kwargs


def norm_rotate(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, positions: Tensor, normed: NormedTables, flags
):
    """rms_norm_apply_qk of q and k at ``positions`` (already shaped for them) into ``cos``/``sin``
    (the tables' own, or per-call rows of them: rotate.alternating_rows), with ``flags``
    (interleaved and the multi-axis arguments) as _rotate_qk builds them."""
    return rms_norm_apply_qk(
        q,
        k,
        normed.q_weight,
        normed.k_weight,
        cos,
        sin,
        positions,
        eps=normed.eps,
        weight_offset=normed.weight_offset,
        **flags,
    )
