# SPDX-License-Identifier: BSD-3-Clause
"""The self-check every patched layer passes before it is patched, and what it needs of a model.

One probe forward of the layer unpatched and one patched must agree, or the model is refused
(``NotImplementedError``) rather than patched wrongly. The probe is made the same way for every
family of layers: in eval mode (two forwards in training mode would drop differently), with
autograd off, from inputs drawn from a seeded generator of their own (the same verdict every time,
and the caller's global RNG untouched); the layer is handed back in the modes its modules had.
"""

import contextlib
from typing import Callable, Iterator, Sequence

import torch
from torch import Tensor, nn


def require_weights(model: nn.Module, caller: str) -> None:
    """Refuse a model whose parameters or buffers are not all materialised: on the meta device it
    has no values to run the self-check with, and a model patched unchecked could rotate wrongly
    (the pair layout, for one, is found by the check)."""
    for kind, named in (("parameter", model.named_parameters), ("buffer", model.named_buffers)):
        for name, tensor in named():
            if tensor.device.type == "meta":
                raise ValueError(
                    f"{caller}: model has tensors on the meta device (the {kind} {name!r}, ...); "
                    "the self-check runs every patched layer against the unpatched one, which "
                    "needs the weights: patch after the weights are materialised (loaded with "
                    "from_pretrained, or to_empty() then load_state_dict())"
                )


def probe(shape: Sequence[int], device: torch.device, dtype: torch.dtype, seed: int = 0) -> Tensor:
    """Standard-normal probe input of ``shape``, drawn on the CPU from a generator of its own
    seeded with ``seed`` (the caller's global RNG is untouched), then moved to ``device``."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(*shape, generator=generator).to(device=device, dtype=dtype)


@contextlib.contextmanager
def eval_mode(module: nn.Module) -> Iterator[None]:
    """``module`` and every submodule in eval mode for the duration; each gets its own mode back."""
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


def close(want: Tensor, got: Tensor, dtype: torch.dtype) -> bool:
    """Whether two probe outputs agree for a layer of ``dtype``: float32 rotations differ by float32
    rounding; 16-bit layers also round q and k to their dtype at different points."""
    tol = 1e-4 if dtype in (torch.float32, torch.float64) else 5e-2
    scale = want.abs().max().item() or 1.0
    return want.shape == got.shape and (want - got).abs().max().item() <= tol * scale


def check_against_unpatched(
    layer: nn.Module,
    unpatched: Callable[[], Tensor],
    patched: Callable[[], Tensor],
    dtype: torch.dtype,
    refusal: Exception,
) -> None:
    """Run ``unpatched()`` then ``patched()`` (each one probe forward of ``layer``, returning its
    output tensor) with ``layer`` in eval mode and autograd off; raise ``refusal`` when either
    raises (a layer that slices or reshapes what patch hands it) or their outputs are not
    :func:`close`."""
    with eval_mode(layer), torch.no_grad():
        try:
            want = unpatched()
            got = patched()
        except Exception as error:
            raise refusal from error
    if not close(want, got, dtype):
        raise refusal
