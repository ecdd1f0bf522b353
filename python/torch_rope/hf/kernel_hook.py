# SPDX-License-Identifier: BSD-3-Clause
"""torch_rope behind transformers' own kernel hook for RoPE, ``"rotary_pos_emb"``.

transformers decorates ``apply_rotary_pos_emb`` (``q, k, cos, sin, unsqueeze_dim=1``) of about
120 models with ``use_kernel_forward_from_hub("rotary_pos_emb")``: the ``kernels`` package turns
the function into a stateless ``nn.Module`` instance, and ``use_kernelized_func`` attaches it to
each attention layer, so that ``kernelize`` can swap its ``forward`` for a layer taken from the
kernel mapping. transformers' default mapping has Hub kernels for CUDA, ROCm and XPU in
inference mode only. This module provides a layer for that mapping that runs on CPU and CUDA,
with backward, partial rotary and ``torch.compile``, and a repository object that hands it to
``kernels`` without the Hub::

    import kernels
    import torch_rope.hf_kernel

    kernels.register_kernel_mapping(torch_rope.hf_kernel.kernel_mapping())
    kernels.kernelize(model, mode=kernels.Mode.INFERENCE, device="cpu")  # or TRAINING, "cuda"

The layer is a thin layer over :func:`torch_rope.hf.apply_rotary_pos_emb` (HF's signature and
results, computed by ``rope::apply_qk``); it brings no kernel of its own. Neither transformers
nor ``kernels`` is imported by ``import torch_rope.hf_kernel``: only :func:`kernel_mapping` and
:func:`register` import ``kernels``.

Caveat: the mapping is keyed by the layer name alone, and two of the 120 models (``gpt_oss``,
``openai_privacy_filter``) use the same name for a different rotation (half-width, not
duplicated, cos/sin): do not kernelize those with this mapping.
"""

from typing import Any, Dict, Iterable, Tuple

from torch import Tensor, nn

from .rotate import apply_rotary_pos_emb

__all__ = ["LAYER_NAME", "RotaryPosEmb", "TorchRopeRepository", "kernel_mapping", "register"]

#: The name transformers gives its hook: ``@use_kernel_forward_from_hub("rotary_pos_emb")``.
LAYER_NAME = "rotary_pos_emb"

#: Devices for which :func:`kernel_mapping` registers the layer by default: those torch_rope's
#: native library has kernels for.
DEFAULT_DEVICES = ("cpu", "cuda")


class RotaryPosEmb(nn.Module):
    """``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)`` as a ``kernels`` layer.

    ``kernels`` requires a layer to be stateless (no ``__init__``, no members beyond the two
    capability flags) and its ``forward`` to take the hooked function's arguments; it binds this
    ``forward`` to the hooked module instance, so ``self`` is transformers' object, not ours.

    ``cos``/``sin`` are HF's gathered ``(B, S, R)`` tables with duplicated halves, ``R <= head_dim``
    (partial rotary); see :func:`torch_rope.hf.apply_rotary_pos_emb`.
    """

    # Read by kernels: the layer has a backward (rope::apply_qk's autograd formula) and traces
    # under torch.compile (the op has Meta kernels), so TRAINING and TORCH_COMPILE modes keep it.
    can_torch_compile = True
    has_backward = True

    def forward(
        self, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1
    ) -> Tuple[Tensor, Tensor]:
        return apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)


class TorchRopeRepository:
    """A ``kernels`` repository (its ``RepositoryProtocol``: a ``load()`` that returns the layer
    class) that serves :class:`RotaryPosEmb` from this package: nothing is downloaded, nothing is
    read from disk. Equal instances hash alike, as ``kernels`` caches loaded layers per repository.
    """

    layer_name = "RotaryPosEmb"

    def load(self) -> type:
        return RotaryPosEmb

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TorchRopeRepository)

    def __hash__(self) -> int:
        return hash((TorchRopeRepository, self.layer_name))

    def __str__(self) -> str:
        return f"torch_rope (layer `{self.layer_name}`)"

    __repr__ = __str__


def kernel_mapping(devices: Iterable[str] = DEFAULT_DEVICES) -> Dict[str, Dict[str, Any]]:
    """The kernel mapping that sends transformers' ``rotary_pos_emb`` hook to torch_rope, for
    ``kernels.register_kernel_mapping`` or ``kernels.use_kernel_mapping``.

    Every mode is mapped (inference, training, each with and without ``TORCH_COMPILE``), for each
    of ``devices`` (``"cpu"``, ``"cuda"``). Imports ``kernels``.
    """
    from kernels import Mode

    repo = TorchRopeRepository()
    modes = (
        Mode.INFERENCE,
        Mode.TRAINING,
        Mode.INFERENCE | Mode.TORCH_COMPILE,
        Mode.TRAINING | Mode.TORCH_COMPILE,
    )
    devices = tuple(devices)
    unknown = set(devices) - set(DEFAULT_DEVICES)
    if unknown:
        raise ValueError(
            f"torch_rope.hf_kernel: torch_rope runs on {DEFAULT_DEVICES}, not {sorted(unknown)}"
        )
    return {LAYER_NAME: {device: {mode: repo for mode in modes} for device in devices}}


def register(devices: Iterable[str] = DEFAULT_DEVICES) -> None:
    """``kernels.register_kernel_mapping(kernel_mapping(devices))``: from now on, ``kernelize``
    (``kernels``' or transformers') puts torch_rope under the ``rotary_pos_emb`` hook of the
    models it is given, on those devices. It replaces what was registered for that hook on those
    devices before (on CUDA, transformers' inference-only Hub kernel), so register after
    anything that registers transformers' default mapping (``model.set_use_kernels(True)``
    does, on every call)."""
    from kernels import register_kernel_mapping

    register_kernel_mapping(kernel_mapping(devices))
