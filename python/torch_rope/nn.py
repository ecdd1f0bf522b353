# SPDX-License-Identifier: BSD-3-Clause
"""``RotaryPositionalEmbedding``: the ``nn.Module`` form of :func:`torch_rope.apply`."""

import copy
import math
from typing import Any, Mapping, Optional

import torch
from torch import Tensor, nn

# nn.Module's registries of global hooks (mutated in place by register_module_*_hook), read by
# RotaryPositionalEmbedding.__call__ to decide whether nn.Module.__call__ has anything to do.
from torch.nn.modules.module import (  # noqa: E402
    _global_backward_hooks,
    _global_backward_pre_hooks,
    _global_forward_hooks,
    _global_forward_pre_hooks,
)

from . import _C
from . import distributed as _distributed
from ._scaling import _integer, _number, parse_scaling, rope_type_of
from .ops import _function_mode_active, _functorch_active, _is_compiling, apply

_jit_tracing = torch._C._get_tracing_state

# Positions are exact in float64 up to 2**53: a table longer than that could never be built
# (nor allocated); refuse it with a ValueError before it reaches C++ as an overflow.
_MAX_TABLE_ELEMENTS = 2**53


class RotaryPositionalEmbedding(nn.Module):
    """Rotary position embedding for inputs of shape ``(..., seq_len, d_k)`` (or ``[b, s, h, d]``).

    The constructor is the CS336 signature plus keyword options::

        RotaryPositionalEmbedding(theta, d_k, max_seq_len, device=None, *, rotary_dim=None,
                                  interleaved=True, scaling=None, dtype=torch.float32, seq_dim=-2)

    Args:
        theta: base of the frequencies (10000 in most models).
        d_k: head dimension of the inputs; ``x.size(-1)`` must equal it.
        max_seq_len: number of positions the cos/sin tables cover (see :meth:`extend_tables`).
        device: where to build the tables (default: torch's default device, normally CPU;
            ``.to(device)`` moves them later).
        rotary_dim: features rotated per head (even, ``<= d_k``; default ``d_k``); the rest pass
            through unchanged (partial rotary, as in GPT-NeoX / Phi).
        interleaved: ``True`` rotates pairs ``(2k, 2k+1)`` (Meta Llama reference, CS336,
            torchtune); ``False`` rotates ``(k, k + rotary_dim // 2)`` (HF ``rotate_half``).
        scaling: a transformers ``rope_parameters`` dict (``{"rope_type": "llama3", ...}``), or
            ``None`` for plain RoPE. ``longrope`` without a ``seq_len`` keeps its short and long
            tables and switches per call on the device, as transformers does.
        dtype: table dtype, ``torch.float32`` (default) or ``torch.float64`` (float64 inputs are
            then accurate to the float64 rounding of the angle).
        seq_dim: the sequence axis of ``x`` counted from the end: ``-2`` for
            ``(..., seq_len, d_k)`` and ``[b, h, s, d]``, ``-3`` for ``[b, s, h, d]``.

    The tables are buffers named ``cos`` and ``sin``, built once by the shared C++ builder. They
    are not persistent (absent from ``state_dict()``: they are derived from the arguments above),
    and they keep their dtype when the model is cast with ``.to(torch.bfloat16)`` or ``.half()``.
    No parameters.
    """

    cos: Tensor
    sin: Tensor

    def __init__(
        self,
        theta: float,
        d_k: int,
        max_seq_len: int,
        device: Optional[torch.device] = None,
        *,
        rotary_dim: Optional[int] = None,
        interleaved: bool = True,
        scaling: Optional[Mapping[str, Any]] = None,
        dtype: torch.dtype = torch.float32,
        seq_dim: int = -2,
    ) -> None:
        super().__init__()
        _distributed.register_if_loaded()  # DTensor rules, if DTensor is already loaded
        theta = _number("theta", theta)
        if not (math.isfinite(theta) and theta > 0):
            raise ValueError(
                f"RotaryPositionalEmbedding: theta must be a positive finite number, got {theta}"
            )
        d_k = _integer("d_k", d_k)
        if d_k < 1:
            raise ValueError(f"RotaryPositionalEmbedding: d_k must be >= 1, got {d_k}")
        rotary_dim = d_k if rotary_dim is None else _integer("rotary_dim", rotary_dim)
        if rotary_dim % 2 != 0 or not 2 <= rotary_dim <= d_k:
            raise ValueError(
                "RotaryPositionalEmbedding: rotary_dim must be even and in [2, d_k = "
                f"{d_k}] (features rotate in pairs), got {rotary_dim}"
            )
        self._check_max_seq_len(_integer("max_seq_len", max_seq_len), rotary_dim)
        if not isinstance(interleaved, bool):
            raise TypeError(f"interleaved must be a bool, got {type(interleaved).__name__}")
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(
                f"RotaryPositionalEmbedding: dtype (of the tables) must be "
                f"torch.float32 or torch.float64, got {dtype}"
            )
        seq_dim = _integer("seq_dim", seq_dim)
        if seq_dim > -2:
            raise ValueError(
                "RotaryPositionalEmbedding: seq_dim must be a negative axis before the feature "
                f"axis (-2 for (..., seq_len, d_k), -3 for [b, s, h, d]), got {seq_dim}"
            )
        self.theta = theta
        self.d_k = d_k
        self.max_seq_len = max_seq_len
        self.rotary_dim = rotary_dim
        self.interleaved = interleaved
        self.scaling = copy.deepcopy(dict(scaling)) if scaling is not None else None
        self.dtype = dtype
        self.seq_dim = seq_dim
        parse_scaling(scaling, theta)  # validate now; _build parses the stored plain copy
        # Dims of x.shape[:-1] after the sequence axis (the heads of [b, s, h, d]).
        self._trailing = -seq_dim - 2
        # Like nn.Linear, follow `with torch.device(...)` / set_default_device when no device is
        # given (torchtune builds models on the meta device that way).
        self._build(
            max_seq_len, torch.get_default_device() if device is None else torch.device(device)
        )

    @staticmethod
    def _check_max_seq_len(max_seq_len: int, rotary_dim: int) -> None:
        if max_seq_len < 1:
            raise ValueError(
                f"RotaryPositionalEmbedding: max_seq_len must be >= 1, got {max_seq_len}"
            )
        if max_seq_len * rotary_dim > _MAX_TABLE_ELEMENTS:
            raise ValueError(
                "RotaryPositionalEmbedding: max_seq_len * rotary_dim must be <= 2**53 (the "
                f"tables could never be allocated), got max_seq_len = {max_seq_len} with "
                f"rotary_dim = {rotary_dim}"
            )

    def _build(self, max_seq_len: int, device: Optional[torch.device]) -> None:
        # The C++ option object is made per build and never stored: the module stays picklable
        # and deep-copyable (torch.save(model), copy.deepcopy, FSDP/TP model copies).
        cos, sin, self._long_offset, self._long_after = _C.module_tables(
            self.theta,
            self.rotary_dim,
            max_seq_len,
            parse_scaling(self.scaling, self.theta),
            self.dtype,
            device,
        )
        self.max_seq_len = max_seq_len
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def extend_tables(self, max_seq_len: int) -> None:
        """Rebuild the tables with ``max_seq_len`` rows, where they are now and in their dtype.

        Positions up to ``max_seq_len - 1`` then work (extrapolation, or Meta's
        ``max_seq_len * 2`` habit). Explicit on purpose: ``forward`` never grows the tables, so it
        never reads positions back from the device. A position past the tables still raises
        (``IndexError`` on CPU, a device assert on CUDA). ``dynamic`` scaling without a fixed
        ``seq_len`` is re-evaluated at the new length, as transformers does when a sequence grows.
        """
        max_seq_len = _integer("max_seq_len", max_seq_len)
        self._check_max_seq_len(max_seq_len, self.rotary_dim)
        self._build(max_seq_len, self.cos.device)

    # True while a class's forward is this one (a subclass with its own forward, such as the
    # torchtune drop-in, always goes through nn.Module.__call__).
    _plain_forward = True

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls._plain_forward = cls.forward is RotaryPositionalEmbedding.forward

    def __call__(self, *args, **kwargs):
        # Decode calls the module twice per layer per token, where nn.Module.__call__'s
        # bookkeeping and forward's checks are half of the call. With no hooks anywhere, no
        # module.compile(), no tracing, no Dynamo, no functorch transform or __torch_function__
        # mode, and plain tensors, nn.Module.__call__ would only call forward, and forward would
        # take this same C++ call: go there at once. Anything else takes nn.Module's own path.
        if kwargs or not self._plain_forward or "forward" in self.__dict__:
            return super().__call__(*args, **kwargs)
        if len(args) == 2:
            x, positions = args
        elif len(args) == 1:
            x, positions = args[0], None
        else:
            return super().__call__(*args)
        if (
            not _is_compiling()  # first: Dynamo folds it to True and looks no further
            and type(x) is Tensor
            and (positions is None or type(positions) is Tensor)
            and not self._long_offset
            and self._compiled_call_impl is None
            and not (
                self._forward_pre_hooks
                or self._forward_hooks
                or self._backward_pre_hooks
                or self._backward_hooks
                or _global_forward_pre_hooks
                or _global_forward_hooks
                or _global_backward_pre_hooks
                or _global_backward_hooks
            )
            and not _functorch_active()
            and not _function_mode_active()
            and not _jit_tracing()
        ):
            buffers = self._buffers
            return _C._module_forward(
                x, positions, buffers["cos"], buffers["sin"], self.d_k, self.seq_dim,
                self.interleaved,
            )  # fmt: skip
        return super().__call__(*args)

    def forward(self, x: Tensor, token_positions: Optional[Tensor] = None) -> Tensor:
        """Rotate ``x`` by ``token_positions`` (int32/int64).

        ``None`` means ``arange`` along ``seq_dim``. Positions of shape ``(S,)`` or ``(B, S)`` are
        aligned with the sequence axis (and ``B`` with ``x``'s first axis) whatever the layout;
        positions of 3 or more dims broadcast to ``x.shape[:-1]`` as the op does. Returns a new
        tensor of ``x``'s shape and dtype.
        """
        if (
            not _is_compiling()  # first: Dynamo folds it to True and looks no further
            and type(x) is Tensor
            and (token_positions is None or type(token_positions) is Tensor)
            and not self._long_offset
            and not _functorch_active()
            and not _function_mode_active()
        ):
            # Eager plain tensors (decode calls this twice per layer per token): the checks below,
            # the positions' alignment and the rotation in one C++ call (rope::module_positions).
            buffers = self._buffers
            return _C._module_forward(
                x,
                token_positions,
                buffers["cos"],
                buffers["sin"],
                self.d_k,
                self.seq_dim,
                self.interleaved,
            )
        shape = x.shape
        rank = len(shape) - 1
        if rank < 0 or shape[-1] != self.d_k:
            raise ValueError(
                f"RotaryPositionalEmbedding: x.size(-1) must equal d_k = {self.d_k}, got x of "
                f"shape {tuple(shape)}"
            )
        trailing = self._trailing
        if token_positions is None:
            if rank < trailing + 1:
                raise ValueError(
                    "RotaryPositionalEmbedding: without token_positions, x needs a sequence axis "
                    f"at seq_dim = {self.seq_dim}, got x of shape {tuple(shape)}"
                )
            positions = torch.arange(shape[self.seq_dim], device=x.device)
        elif isinstance(token_positions, Tensor):
            positions = token_positions
            if positions.dim() == 2 and rank >= 2 + trailing:
                # (B, S): B on x's first axis, S on its sequence axis.
                for _ in range(rank - 2 - trailing):
                    positions = positions.unsqueeze(1)
        else:
            raise TypeError(
                "RotaryPositionalEmbedding: token_positions must be an int32/int64 Tensor or "
                f"None, got {type(token_positions).__name__}"
            )
        if trailing and positions.dim() <= 2:
            for _ in range(trailing):
                positions = positions.unsqueeze(-1)
        if token_positions is not None:
            self._check_positions_fit(x, token_positions, positions)
        if self._long_offset:
            positions = self._long_rope_switch(positions)
        cos, sin = self._buffers["cos"], self._buffers["sin"]
        if type(x) is not Tensor:  # a DTensor x gets DTensor tables and positions, no communication
            cos, sin, positions = _distributed._as_dtensors_like(x, cos, sin, positions)
        return apply(x, cos, sin, positions, interleaved=self.interleaved)

    def _check_positions_fit(self, x: Tensor, given: Tensor, aligned: Tensor) -> None:
        """The module's positions rule, in its own words (the op's message would recommend the
        op's layouts). The same words as rope::module_positions, which the eager path runs."""
        rows = x.shape[:-1]
        fits = len(aligned.shape) <= len(rows) and all(
            p == 1 or p == r for p, r in zip(reversed(aligned.shape), reversed(rows))
        )
        if not fits:
            raise ValueError(
                f"RotaryPositionalEmbedding: token_positions of shape {list(given.shape)} do not "
                f"fit x of shape {list(x.shape)} with seq_dim = {self.seq_dim}. The module reads "
                "1-D positions as (S,) along x's sequence axis (seq_dim), 2-D positions as (B, S) "
                "with B on x's first axis, and positions of 3 or more dims as broadcastable to "
                "x.shape[:-1]. For x laid out (B, S, H, D) construct the module with seq_dim=-3, "
                "for (B, H, S, D) with seq_dim=-2"
                + (
                    ""
                    if type(x) is Tensor
                    else " (x is a DTensor: these are global shapes, so positions must be global "
                    "and broadcastable to the global shape)"
                )
            )

    def _long_rope_switch(self, positions: Tensor) -> Tensor:
        """Table rows for ``positions``: the positions, shifted to the long-factor rows when the
        tables hold LongRoPE's both variants and this call reaches past the original context
        (transformers' rule: ``max(positions) + 1 > original_max_position_embeddings``). Decided
        on the device, so no host sync."""
        if positions.numel() == 0:
            return positions
        is_long = (positions.max() >= self._long_after).to(positions.dtype)
        return positions + is_long * self._long_offset

    def _apply(self, fn, recurse=True):
        # Device moves apply to the tables; dtype casts do not. Keep the exact originals and only
        # follow the device the cast sent them to (no bf16 round trip).
        tables = {"cos": self.cos, "sin": self.sin}
        super()._apply(fn, recurse)
        for name, original in tables.items():
            moved = self._buffers[name]
            if moved.dtype != original.dtype:
                self._buffers[name] = original.to(device=moved.device)
        return self

    def extra_repr(self) -> str:
        text = (
            f"theta={self.theta}, d_k={self.d_k}, max_seq_len={self.max_seq_len}, "
            f"rotary_dim={self.rotary_dim}, interleaved={self.interleaved}"
        )
        if self.scaling is not None:
            text += f", scaling={rope_type_of(self.scaling)!r}"
        if self.dtype != torch.float32:
            text += f", dtype={self.dtype}"
        if self.seq_dim != -2:
            text += f", seq_dim={self.seq_dim}"
        return text
