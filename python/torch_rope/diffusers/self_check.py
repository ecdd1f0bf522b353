# SPDX-License-Identifier: BSD-3-Clause
"""The self-check of a patched diffusers RoPE, before anything is installed.

diffusers' processors rotate with the cos/sin their RoPE module computes; a patched processor
rotates with our tables at the positions the patched RoPE module returns. Each family checks, for
each RoPE module it patches, that the two agree on a probe: the RoPE module's own forward and the
library's rotation function, against our positions and our rotation, on probe q/k drawn from a
seeded generator (:func:`torch_rope._patching.self_check.probe`), in eval mode without autograd
(:func:`torch_rope._patching.self_check.check_against_unpatched`). A disagreement (another
frequency rule, another pair layout, axes in another order) refuses the model instead of patching
it wrongly. The probe positions are small, so diffusers' float32 angles are exact enough there;
where they are not (LTX-Video's angles reach 1.6e4 rad), diffusers' formula is run in float64
(:class:`InFloat64`).
"""

import inspect
from typing import Callable

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from .._patching.self_check import check_against_unpatched

CALLER = "torch_rope.diffusers.patch"


def check(
    module: nn.Module, what: str, unpatched: Callable[[], Tensor], patched: Callable[[], Tensor]
) -> None:
    """Refuse (``NotImplementedError`` naming ``what``) unless ``patched()`` agrees with
    ``unpatched()``, each the probe rotated one way, within float32 rounding."""
    refusal = NotImplementedError(
        f"{CALLER}: {what}: torch_rope's rotation does not match diffusers' on a probe input "
        "(the self-check); not patching"
    )
    check_against_unpatched(module, unpatched, patched, torch.float32, refusal)


class InFloat64(TorchFunctionMode):
    """diffusers' code run in float64 where it asks for float32 by name (``dtype=torch.float32``,
    ``.float()``, ``.to(torch.float32)``): for the self-check of a RoPE whose float32 angles are
    large enough that their rounding shows (LTX-Video's reach 1.6e4 rad), diffusers' own formula
    evaluated exactly enough to judge ours by."""

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if kwargs.get("dtype") is torch.float32:
            kwargs["dtype"] = torch.float64
        if func is torch.Tensor.float:
            func = torch.Tensor.double
        elif func is torch.Tensor.to:
            args = tuple(torch.float64 if a is torch.float32 else a for a in args)
        return func(*args, **kwargs)


def as_built(module: nn.Module, what: str) -> nn.Module:
    """``module`` as its class builds it, to judge ours by: ``module`` itself when its floating
    buffers are float32 or float64; when a cast rounded them to 16 bits (``model.to(bfloat16)``
    before patch, or a bf16 load that does not keep the module in float32), a new instance of its
    class, built on the CPU from the same constructor arguments (its attributes of those names,
    the others at their defaults, as patch reads them), whose buffers must round to the module's
    own: what they were rounded from. Diffusers' rotation from the rounded buffers is no
    reference for ours (float32 tables, at least as accurate); this one is. Refuses
    (``NotImplementedError`` naming ``what``) a module it cannot rebuild that way."""
    buffers = {n: b for n, b in module.named_buffers(recurse=False) if b.is_floating_point()}
    if all(b.dtype in (torch.float32, torch.float64) for b in buffers.values()):
        return module
    refusal = NotImplementedError(
        f"{CALLER}: {what}: its RoPE buffers are {sorted({str(b.dtype) for b in buffers.values()})}"
        ", and rebuilding them from its constructor's arguments does not give what they were "
        "rounded from; patch the model before casting it, or keep its RoPE module in float32"
    )
    arguments = {}
    for parameter in list(inspect.signature(type(module).__init__).parameters.values())[1:]:
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if hasattr(module, parameter.name):
            arguments[parameter.name] = getattr(module, parameter.name)
        elif parameter.default is parameter.empty:
            raise refusal
    try:
        with torch.device("cpu"):
            built = type(module)(**arguments)
    except Exception as error:
        raise refusal from error
    for name, rounded in buffers.items():
        full = built._buffers.get(name)
        if full is None or full.shape != rounded.shape:
            raise refusal
        # Within one unit in the last place of the 16-bit dtype: the rounding, not another rule.
        step = torch.finfo(rounded.dtype).eps * max(1.0, full.abs().max().item())
        if (full.double() - rounded.detach().cpu().double()).abs().max().item() > step:
            raise refusal
    device = next(iter(buffers.values())).device
    return built.to(device)


class WithTables:
    """A RoPE module seen with the tables about to be installed, for the check (which runs before
    anything is set on the module): the module's attributes, ``torch_rope`` the tables, and the
    ``extra`` attributes given by name."""

    def __init__(self, rope: nn.Module, tables, **extra) -> None:
        self._rope = rope
        self.torch_rope = tables
        for name, value in extra.items():
            setattr(self, name, value)

    def __getattr__(self, name):
        return getattr(self._rope, name)
