# SPDX-License-Identifier: BSD-3-Clause
"""``RotaryPositionalEmbedding``: the ``nn.Module`` form of :func:`torch_rope.apply`."""

import copy
from typing import Any, Mapping, Optional, Sequence

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

from . import _C, _module_forms
from . import distributed as _distributed
from ._dtensor_args import as_dtensors_like
from ._module_forms import apply_keeping_table_dtypes  # noqa: F401  (also torch_rope.hf's)
from ._scaling import _integer, _number, parse_scaling
from .ops import apply, eager_fast_path

_jit_tracing = torch._C._get_tracing_state

# The hook registries nn.Module._call_impl reads, and how __call__ below covers each: it skips
# nn.Module.__call__ only while every "checked" registry is empty; the others hold a subset of the
# keys of a checked one (flags of hooks registered there), so they are empty with it.
# test_module.py fails when torch's _call_impl reads a registry not listed here.
CALL_HOOK_REGISTRIES = {
    "_forward_pre_hooks": "checked",
    "_forward_hooks": "checked",
    "_backward_pre_hooks": "checked",
    "_backward_hooks": "checked",
    "_global_forward_pre_hooks": "checked",
    "_global_forward_hooks": "checked",
    "_global_backward_pre_hooks": "checked",
    "_global_backward_hooks": "checked",
    "_forward_pre_hooks_with_kwargs": "subset of _forward_pre_hooks",
    "_forward_hooks_with_kwargs": "subset of _forward_hooks",
    "_forward_hooks_always_called": "subset of _forward_hooks",
    "_global_forward_hooks_with_kwargs": "subset of _global_forward_hooks",
    "_global_forward_hooks_always_called": "subset of _global_forward_hooks",
}


class RotaryPositionalEmbedding(nn.Module):
    """Rotary position embedding for inputs of shape ``(..., seq_len, d_k)`` (or ``[b, s, h, d]``).

    The constructor is the CS336 signature plus keyword options::

        RotaryPositionalEmbedding(theta, d_k, max_seq_len, device=None, *, rotary_dim=None,
                                  interleaved=True, scaling=None, dtype=torch.float32, seq_dim=-2,
                                  mrope_section=None, mrope_interleaved=False)

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
        mrope_section: multi-axis positions (M-RoPE: Qwen2-VL, Qwen3-VL, GLM-4V; 2-D vision
            RoPE): the planes that read each axis, adding up to ``rotary_dim // 2``.
            ``token_positions`` then carry a trailing axis dim (``(S, A)``, ``(B, S, A)``, ...;
            ``None`` gives every axis the ``arange``). See :func:`torch_rope.apply`.
        mrope_interleaved: Qwen3-VL's interleaved assignment of planes to 3 axes.

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
        mrope_section: Optional[Sequence[int]] = None,
        mrope_interleaved: bool = False,
        tables: bool = True,
    ) -> None:
        super().__init__()
        _distributed.register_if_loaded()  # DTensor rules, if DTensor is already loaded
        # Python types here (TypeError, as Python's own functions raise); every value rule is the
        # C++ module's (csrc/rules.h), so both modules accept and refuse the same arguments.
        theta = _number("theta", theta)
        d_k = _integer("d_k", d_k)
        rotary_dim = d_k if rotary_dim is None else _integer("rotary_dim", rotary_dim)
        max_seq_len = _integer("max_seq_len", max_seq_len)
        if not isinstance(interleaved, bool):
            raise TypeError(f"interleaved must be a bool, got {type(interleaved).__name__}")
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype, got {type(dtype).__name__}")
        seq_dim = _integer("seq_dim", seq_dim)
        if mrope_section is not None:
            mrope_section = [_integer("mrope_section[]", s) for s in mrope_section]
        if not isinstance(mrope_interleaved, bool):
            raise TypeError(
                f"mrope_interleaved must be a bool, got {type(mrope_interleaved).__name__}"
            )
        if not isinstance(tables, bool):
            raise TypeError(f"tables must be a bool, got {type(tables).__name__}")
        _C.check_module_arguments(theta, d_k, rotary_dim, max_seq_len, dtype, seq_dim, tables)
        _C.check_module_multi_axis(rotary_dim, mrope_section, mrope_interleaved)
        self.mrope_section = mrope_section
        self.mrope_interleaved = mrope_interleaved
        self.theta = theta
        self.d_k = d_k
        self.max_seq_len = max_seq_len
        self.rotary_dim = rotary_dim
        self.interleaved = interleaved
        self.scaling = copy.deepcopy(dict(scaling)) if scaling is not None else None
        self.dtype = dtype
        self.seq_dim = seq_dim
        self.tables = tables
        self.attention_factor = 1.0  # the table-free mode's; tables carry theirs in cos and sin
        parse_scaling(scaling, theta)  # validate now; _build parses the stored plain copy
        # Like nn.Linear, follow `with torch.device(...)` / set_default_device when no device is
        # given (torchtune builds models on the meta device that way).
        self._build(
            max_seq_len, torch.get_default_device() if device is None else torch.device(device)
        )

    def _build(self, max_seq_len: int, device: Optional[torch.device]) -> None:
        # The C++ option object is made per build and never stored: the module stays picklable
        # and deep-copyable (torch.save(model), copy.deepcopy, FSDP/TP model copies).
        if not self.tables:
            # Table-free: the float64 frequencies (LongRoPE's two sets), nothing per position.
            freqs, long_freqs, self.attention_factor, self._long_after = _C.module_frequencies(
                self.theta,
                self.rotary_dim,
                max_seq_len,
                parse_scaling(self.scaling, self.theta),
                device,
            )
            self._long_offset = 0
            self.max_seq_len = max_seq_len
            self.register_buffer("freqs", freqs, persistent=False)
            if long_freqs is not None:
                self.register_buffer("long_freqs", long_freqs, persistent=False)
            return
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
        if not self.tables:  # nothing to grow: only a dynamic variant is re-evaluated
            _C.check_position_count("RotaryPositionalEmbedding.extend_tables", max_seq_len)
            self._build(max_seq_len, self.freqs.device)
            return
        _C.check_table_length(
            "RotaryPositionalEmbedding.extend_tables", max_seq_len, self.rotary_dim
        )
        self._build(max_seq_len, self.cos.device)

    @property
    def long_offset(self) -> int:
        """Row offset of LongRoPE's long-factor tables (0 when the tables have no switch)."""
        return self._long_offset

    @property
    def long_after(self) -> int:
        """A call whose largest position is >= this uses the long-factor tables."""
        return self._long_after

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
        if (
            kwargs
            or not self._plain_forward
            or "forward" in self.__dict__
            or self.mrope_section is not None
            or not self.tables
        ):
            return super().__call__(*args, **kwargs)
        if len(args) == 2:
            x, positions = args
        elif len(args) == 1:
            x, positions = args[0], None
        else:
            return super().__call__(*args)
        if (eager_fast_path(x) if positions is None else eager_fast_path(x, positions)) and (
            not self._long_offset
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
            and not _jit_tracing()
        ):
            buffers = self._buffers
            return _C._module_forward(
                x, positions, buffers["cos"], buffers["sin"], self.d_k, self.seq_dim,
                self.interleaved,
            )  # fmt: skip
        return super().__call__(*args)

    def forward(
        self,
        x: Tensor,
        token_positions: Optional[Tensor] = None,
        *,
        cu_seqlens: Optional[Tensor] = None,
        seq_offsets: Optional[Tensor] = None,
        cp_size: int = 1,
        cp_rank: int = 0,
    ) -> Tensor:
        """Rotate ``x`` by ``token_positions`` (int32/int64).

        ``None`` means ``arange`` along ``seq_dim``. Positions of shape ``(S,)`` or ``(B, S)`` are
        aligned with the sequence axis (and ``B`` with ``x``'s first axis) whatever the layout;
        positions of 3 or more dims broadcast to ``x.shape[:-1]`` as the op does. Returns a new
        tensor of ``x``'s shape and dtype.

        ``cu_seqlens`` (with ``seq_offsets``, ``cp_size``, ``cp_rank``): packed sequences instead
        of positions, ``x`` ``(T, ..., d_k)`` with its tokens on dim 0 (see
        :func:`torch_rope.apply`).
        """
        if cu_seqlens is not None or seq_offsets is not None or cp_size != 1 or cp_rank != 0:
            if cu_seqlens is None:
                raise TypeError(
                    "RotaryPositionalEmbedding: seq_offsets, cp_size and cp_rank describe packed "
                    "sequences; they need cu_seqlens="
                )
            return _module_forms.forward_packed(
                self, x, token_positions, cu_seqlens, seq_offsets, cp_size, cp_rank
            )
        if not self.tables:
            return _module_forms.forward_frequencies(self, x, token_positions)
        if (
            not self._long_offset
            and self.mrope_section is None
            and (
                eager_fast_path(x)
                if token_positions is None
                else eager_fast_path(x, token_positions)
            )
        ):
            # Eager plain tensors (decode calls this twice per layer per token): the module's
            # checks, the positions' alignment and the rotation in one C++ call (csrc/rules.h).
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
        if token_positions is not None and not isinstance(token_positions, Tensor):
            raise TypeError(
                "RotaryPositionalEmbedding: token_positions must be an int32/int64 Tensor or "
                f"None, got {type(token_positions).__name__}"
            )
        # The path torch.compile and torch.func trace: the C++ rules above, mirrored.
        check_module_input(x, self.d_k, self.seq_dim, token_positions is not None)
        num_axes = 0 if self.mrope_section is None else len(self.mrope_section)
        positions = module_positions(x, token_positions, self.seq_dim, num_axes)
        positions = long_rope_positions(positions, self._long_offset, self._long_after)
        cos, sin = self._buffers["cos"], self._buffers["sin"]
        if type(x) is not Tensor:  # a DTensor x gets DTensor tables and positions, no communication
            cos, sin, positions = as_dtensors_like(x, cos, sin, positions)
        if num_axes:
            return apply(
                x,
                cos,
                sin,
                positions,
                interleaved=self.interleaved,
                mrope_section=self.mrope_section,
                mrope_interleaved=self.mrope_interleaved,
            )
        return apply(x, cos, sin, positions, interleaved=self.interleaved)

    def _apply(self, fn, recurse=True):
        return apply_keeping_table_dtypes(self, super()._apply, fn, recurse)

    def extra_repr(self) -> str:
        text = (
            f"theta={self.theta}, d_k={self.d_k}, max_seq_len={self.max_seq_len}, "
            f"rotary_dim={self.rotary_dim}, interleaved={self.interleaved}"
        )
        if self.scaling is not None:
            text += f", scaling={parse_scaling(self.scaling, self.theta).rope_type!r}"
        if not self.tables:
            text += ", tables=False"
        elif self.dtype != torch.float32:
            text += f", dtype={self.dtype}"
        if self.seq_dim != -2:
            text += f", seq_dim={self.seq_dim}"
        if self.mrope_section is not None:
            text += f", mrope_section={self.mrope_section}"
            if self.mrope_interleaved:
                text += ", mrope_interleaved=True"
        return text


# ---- the module's rules on the traced path --------------------------------------------------
# torch.compile and torch.func cannot trace into a pybind11 call, so the path they take runs
# these mirrors of csrc/rules.h (check_module_input, module_positions, long_rope_positions), with
# the same messages. tests/python pins each to its C++ original over the sample inputs.

_MODULE = "RotaryPositionalEmbedding"


def check_module_input(x: Tensor, d_k: int, seq_dim: int, has_positions: bool) -> None:
    """rope::detail::check_module_input: x is (..., d_k), with a sequence axis when positions
    are not given."""
    if x.dim() < 1 or x.shape[-1] != d_k:
        raise ValueError(
            f"{_MODULE}: x.size(-1) must equal d_k = {d_k}, got x of shape {list(x.shape)}"
        )
    if not has_positions and x.dim() - 1 < -seq_dim - 1:
        raise ValueError(
            f"{_MODULE}: without token_positions, x needs a sequence axis at seq_dim = {seq_dim}, "
            f"got x of shape {list(x.shape)}"
        )


def module_positions(
    x: Tensor, token_positions: Optional[Tensor], seq_dim: int, num_axes: int = 0
) -> Tensor:
    """rope::detail::module_positions: the positions the module passes to rope.apply for x.
    Multi-axis modules (``num_axes > 0``) keep the trailing axis dim last."""
    trailing = -seq_dim - 2  # dims of x.shape[:-1] after the sequence axis
    rank = x.dim() - 1
    axis_dims = 1 if num_axes else 0
    # (S,) and (B, S) get the trailing unit dims, decided on the dims the caller gave (the (B, S)
    # rule below first inserts unit dims between B and S).
    one_or_two_dims = True
    if token_positions is None:
        if rank < trailing + 1:
            raise ValueError(
                f"{_MODULE}: without token_positions, x needs a sequence axis at seq_dim = "
                f"{seq_dim}, got x of shape {list(x.shape)}"
            )
        positions = torch.arange(x.shape[seq_dim], device=x.device)
        if num_axes:
            positions = positions.unsqueeze(-1).expand(positions.shape[0], num_axes)
    else:
        positions = token_positions
        if num_axes and (positions.dim() < 1 or positions.shape[-1] != num_axes):
            raise ValueError(
                f"{_MODULE}: token_positions must have a trailing axis dim of size "
                f"len(mrope_section) = {num_axes} (token_positions[..., a] is axis a), got "
                f"token_positions of shape {list(positions.shape)}"
            )
        one_or_two_dims = positions.dim() - axis_dims <= 2
        if positions.dim() - axis_dims == 2 and rank >= 2 + trailing:
            for _ in range(rank - 2 - trailing):  # (B, S): B on x's first axis
                positions = positions.unsqueeze(1)
    if one_or_two_dims:
        for _ in range(trailing):
            positions = positions.unsqueeze(-1 - axis_dims)
    if token_positions is not None and rank >= 0:
        rows = x.shape[:-1]
        row_shape = positions.shape[: positions.dim() - axis_dims]
        fits = len(row_shape) <= len(rows) and all(
            p == 1 or p == r for p, r in zip(reversed(row_shape), reversed(rows))
        )
        if not fits:
            raise ValueError(
                f"{_MODULE}: token_positions of shape {list(token_positions.shape)} do not fit x "
                f"of shape {list(x.shape)} with seq_dim = {seq_dim}. The module reads 1-D "
                "positions as (S,) along x's sequence axis (seq_dim), 2-D positions as (B, S) "
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
    return positions


def long_rope_positions(positions: Tensor, long_offset: int, long_after: int) -> Tensor:
    """rope::detail::long_rope_positions: LongRoPE's switch on the device (no host sync). Rows
    shift to the long-factor tables when the call's largest position is >= long_after
    (transformers' rule: ``max(positions) + 1 > original_max_position_embeddings``)."""
    if not long_offset or positions.numel() == 0:
        return positions
    is_long = (positions.max() >= long_after).to(positions.dtype)
    return positions + is_long * long_offset
