# SPDX-License-Identifier: BSD-3-Clause
"""``RotaryPositionalEmbedding``: the ``nn.Module`` form of :func:`torch_rope.apply`.

Its modes: tables (``cos``/``sin`` buffers, the default) or table-free (``tables=False``: only the
float64 frequencies as buffers), each with positions or packed sequences (``forward(x,
cu_seqlens=...)``). The eager path of plain tensors is one C++ call (csrc/rules.h:
module_apply, module_apply_frequencies, module_apply_packed); the path torch.compile and
torch.func trace runs the Python mirrors of those rules (:mod:`.forward`, the forward of each
mode), with the same messages (tests/python/module pins them to the C++ functions).
"""

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

from .. import distributed as _distributed
from ..distributed import as_dtensors_like  # noqa: F401  (torch_rope.nn's names, as before)
from ..ops._native import _C
from ..ops.rotation import apply, eager_fast_path  # noqa: F401  (apply: as before)
from ..ops.tables import _integer, _number, parse_scaling
from . import forward as _forward
from .forward import (  # noqa: F401  (the mirrors of csrc/rules.h, torch_rope.nn's names)
    check_module_input,
    long_rope_positions,
    module_positions,
)

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


# The floating buffers that keep their dtype when a module is cast: the tables, or the table-free
# mode's float64 frequencies.
_KEPT_BUFFERS = ("cos", "sin", "freqs", "long_freqs")


def apply_keeping_table_dtypes(module: nn.Module, apply_fn, fn, recurse) -> nn.Module:
    """``nn.Module._apply`` for a module with ``cos``/``sin`` table buffers (or the table-free
    ``freqs``): device moves apply to them, dtype casts do not. The exact originals are kept and
    only follow the device the cast sent them to (no bf16 round trip)."""
    tables = {name: module._buffers[name] for name in _KEPT_BUFFERS if name in module._buffers}
    apply_fn(fn, recurse)
    for name, original in tables.items():
        moved = module._buffers[name]
        if moved.dtype != original.dtype:
            module._buffers[name] = original.to(device=moved.device)
    return module


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
            if token_positions is not None:
                raise ValueError(
                    f"{_forward._MODULE}: give token_positions or cu_seqlens, not both"
                )
            packed = _forward.Packed(cu_seqlens, seq_offsets, cp_size, cp_rank)
            return _forward.forward_packed(self, x, packed)
        if not self.tables:
            return _forward.forward_frequencies(self, x, token_positions)
        if (
            not self._long_offset
            and self.mrope_section is None
            and eager_fast_path(x)
            and (token_positions is None or type(token_positions) is Tensor)
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
        return _forward.forward_tables(self, x, token_positions)

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
