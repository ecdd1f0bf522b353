# SPDX-License-Identifier: BSD-3-Clause
"""Drop-in replacements for torchtune's RoPE modules, computed by the torch_rope kernel.

    from torch_rope.torchtune import RotaryPositionalEmbeddings
    rope = RotaryPositionalEmbeddings(dim=128, max_seq_len=8192, base=500_000)
    for layer in model.layers:
        layer.attn.pos_embeddings = rope

Same constructors and the same ``forward(x, *, input_pos=None)`` on ``[b, s, n_h, h_d]`` as
``torchtune.modules.RotaryPositionalEmbeddings`` and
``torchtune.models.llama3_1.Llama3ScaledRoPE``: adjacent pairs ``(2k, 2k+1)`` rotate, positions
default to ``arange(s)``, ``input_pos`` is ``[b, s]`` or ``[s]``. Autograd, KV-cache decoding and
``torch.compile`` work as with the torchtune modules. The tables are float32 from torch_rope's
float64 builder (torchtune builds its cache in float32 arithmetic), non-persistent buffers like
torchtune's ``cache``.

torchtune itself is not imported: this module only mirrors its interface.
"""

from typing import Optional

from torch import Tensor

from .nn import RotaryPositionalEmbedding

__all__ = ["RotaryPositionalEmbeddings", "Llama3ScaledRoPE"]


class RotaryPositionalEmbeddings(RotaryPositionalEmbedding):
    """``torchtune.modules.RotaryPositionalEmbeddings(dim, max_seq_len=4096, base=10_000)``."""

    def __init__(self, dim: int, max_seq_len: int = 4096, base: float = 10_000) -> None:
        super().__init__(base, dim, max_seq_len, interleaved=True, seq_dim=-3)
        self.dim = dim
        self.base = base

    def rope_init(self) -> None:
        """Rebuild the tables where they are (torchtune recipes call this after building the model
        on the meta device and materialising it)."""
        device = self.cos.device
        self._build(self.max_seq_len, None if device.type == "meta" else device)

    def forward(self, x: Tensor, *, input_pos: Optional[Tensor] = None) -> Tensor:
        """``x``: ``[b, s, n_h, h_d]``; ``input_pos``: ``[b, s]``, ``[s]`` or None
        (``arange(s)``)."""
        return super().forward(x, input_pos)


class Llama3ScaledRoPE(RotaryPositionalEmbeddings):
    """``torchtune.models.llama3_1.Llama3ScaledRoPE``: Llama 3.1's frequency scaling."""

    def __init__(
        self,
        dim: int,
        max_seq_len: int = 4096,
        base: float = 10_000,
        scale_factor: float = 8,
        low_freq_factor: float = 1,
        high_freq_factor: float = 4,
        old_context_len: int = 8192,
    ) -> None:
        scaling = {
            "rope_type": "llama3",
            "factor": scale_factor,
            "low_freq_factor": low_freq_factor,
            "high_freq_factor": high_freq_factor,
            "original_max_position_embeddings": old_context_len,
        }
        # The base class's __init__ with this scaling (RotaryPositionalEmbeddings takes none).
        RotaryPositionalEmbedding.__init__(
            self, base, dim, max_seq_len, interleaved=True, scaling=scaling, seq_dim=-3
        )
        self.dim = dim
        self.base = base
        self.scale_factor = scale_factor
        self.low_freq_factor = low_freq_factor
        self.high_freq_factor = high_freq_factor
        self.old_context_len = old_context_len
        self.is_cache_built = True
