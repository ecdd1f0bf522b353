"""``RotaryPositionalEmbedding``: the ``nn.Module`` form of :func:`torch_rope.apply`."""

from typing import Optional

import torch
from torch import Tensor, nn

from . import distributed as _distributed
from .ops import apply, rope_tables


class RotaryPositionalEmbedding(nn.Module):
    """Rotary position embedding for inputs of shape ``(..., seq_len, d_k)``.

    Args:
        theta: base of the frequencies (10000 in most models).
        d_k: head dimension of the inputs.
        max_seq_len: number of positions the cos/sin tables cover.
        rotary_dim: features rotated per head (even, ``<= d_k``; default ``d_k``); the rest pass
            through unchanged (partial rotary, as in GPT-NeoX / Phi).
        interleaved: ``True`` rotates pairs ``(2k, 2k+1)`` (Meta Llama reference, CS336);
            ``False`` rotates ``(k, k + rotary_dim // 2)`` (HF ``rotate_half``).
        device: where to build the tables (default CPU; ``.to(device)`` moves them later).

    The tables are float32 buffers named ``cos`` and ``sin``, built once by the shared C++
    builder. They are not persistent (absent from ``state_dict()``: they are derived from the
    arguments above), and they stay float32 when the model is cast with ``.to(torch.bfloat16)`` or
    ``.half()``, because half-precision angles lose accuracy at long context. No parameters.
    """

    cos: Tensor
    sin: Tensor

    def __init__(
        self,
        theta: float,
        d_k: int,
        max_seq_len: int,
        *,
        rotary_dim: Optional[int] = None,
        interleaved: bool = True,
        device: Optional[torch.device] = None,
    ) -> None:
        super().__init__()
        _distributed.register_if_loaded()  # distributed: DTensor rules if DTensor is loaded
        rotary_dim = d_k if rotary_dim is None else rotary_dim
        if d_k < 1:
            raise ValueError(f"RotaryPositionalEmbedding: d_k must be >= 1, got {d_k}")
        if rotary_dim % 2 != 0 or not 2 <= rotary_dim <= d_k:
            raise ValueError(
                "RotaryPositionalEmbedding: rotary_dim must be even and in [2, d_k = "
                f"{d_k}] (features rotate in pairs), got {rotary_dim}"
            )
        self.theta = float(theta)
        self.d_k = d_k
        self.max_seq_len = max_seq_len
        self.rotary_dim = rotary_dim
        self.interleaved = interleaved
        cos, sin = rope_tables(theta, rotary_dim, max_seq_len, device)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: Tensor, token_positions: Optional[Tensor] = None) -> Tensor:
        """Rotate ``x`` (``(..., seq_len, d_k)``) by ``token_positions``.

        ``token_positions`` is int32/int64 and broadcastable to ``x.shape[:-1]``; ``None`` means
        ``arange(x.size(-2))``. Returns a new tensor of ``x``'s shape and dtype.
        """
        if token_positions is None:
            token_positions = torch.arange(x.size(-2), device=x.device)
        cos, sin = self.cos, self.sin
        if type(x) is not Tensor:  # distributed: a DTensor x gets DTensor tables and positions
            cos, sin, token_positions = _distributed._as_dtensors_like(x, cos, sin, token_positions)
        return apply(x, cos, sin, token_positions, interleaved=self.interleaved)

    def _apply(self, fn, recurse=True):
        # Device moves apply to the tables; dtype casts do not. Keep the exact float32 originals
        # and only follow the device the cast sent them to (no bf16 round trip).
        tables = {"cos": self.cos, "sin": self.sin}
        super()._apply(fn, recurse)
        for name, original in tables.items():
            moved = self._buffers[name]
            if moved.dtype != original.dtype:
                self._buffers[name] = original.to(device=moved.device)
        return self

    def extra_repr(self) -> str:
        return (
            f"theta={self.theta}, d_k={self.d_k}, max_seq_len={self.max_seq_len}, "
            f"rotary_dim={self.rotary_dim}, interleaved={self.interleaved}"
        )
