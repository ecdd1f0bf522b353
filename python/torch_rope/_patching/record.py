# SPDX-License-Identifier: BSD-3-Clause
"""What a patch changed on one model, kept on the model so that unpatch can undo exactly that.

Each change is made through a :class:`PatchRecord`, which keeps a callback that undoes it; undo runs
them last first. The callbacks are ``functools.partial``s of module-level functions, so a patched
model saved whole (``torch.save(model)``) pickles its record too and can be unpatched after it is
loaded in another process.
"""

import functools
from typing import Any, Callable, List, Optional

from torch import nn

# The attribute of a patched model that holds its PatchRecord.
_ATTRIBUTE = "_torch_rope_patch"


def _remove_attribute(module: nn.Module, name: str) -> None:
    # An instance attribute (a forward bound to this instance), or a submodule or buffer; never
    # the class's own attribute of that name.
    if name in vars(module) or name in module._modules or name in module._buffers:
        delattr(module, name)


class ForwardOnInstance(NotImplementedError):
    """A module patch would give a forward of its own already has one set on the instance (a
    wrapper, a hook's forward, an ad-hoc change such as a position interpolation): patch would
    replace it, and the self-check runs the class's forward, not the instance's, so the patched
    model would not compute what the unpatched one does. :meth:`refusal` says so for the user."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__(f"a {type(module).__name__} has a forward set on the instance")
        self.module = module

    def refusal(self, model: nn.Module, caller: str) -> NotImplementedError:
        """The error ``caller``'s user gets: which module of ``model``, what was found, and what
        to do."""
        path = next((name for name, m in model.named_modules() if m is self.module), None)
        where = f"{path!r}" if path else "the model itself"
        found = vars(self.module)["forward"]
        name = getattr(found, "__qualname__", None) or type(found).__name__
        return NotImplementedError(
            f"{caller}: the {type(self.module).__name__} at {where} has a forward set on the "
            f"instance ({name}), which replaces its class's; patch replaces that forward with "
            "its own and checks the class's, so the patched model would not compute what this "
            "one does: not patching. Patch before wrapping the forward (or before adding hooks "
            "that wrap it: accelerate's dispatch and offloading, diffusers' hooks), or delete "
            "it first (del module.forward); a change made in a subclass is checked instead"
        )


def refuse_forward_on_instance(module: nn.Module) -> None:
    """Raise :class:`ForwardOnInstance` when ``module`` has a forward set on the instance."""
    if "forward" in vars(module):
        raise ForwardOnInstance(module)


class PatchRecord:
    """The undo callbacks of one patch, and the attention layers it rebound (``attention``: the
    layers whose rotations tests count)."""

    def __init__(self) -> None:
        self._undo: List[Callable[[], Any]] = []
        self.attention: List[nn.Module] = []
        #: Callables that say whether the patch is still whole (diffusers: every processor it
        #: installed is still in place); none for a patch nothing can undo from outside.
        self.checks: List[Callable[[], bool]] = []
        #: ids of the pipelines this patch also changed (diffusers: their RoPE helpers).
        self.pipelines: set = set()

    def on_undo(self, callback: Callable[[], Any]) -> None:
        """Run ``callback`` on undo (a picklable one: a partial of a module-level function)."""
        self._undo.append(callback)

    def set(self, module: nn.Module, name: str, value: Any) -> None:
        """``setattr(module, name, value)``, removed again on undo: an instance ``forward`` (the
        class's is then used again), a submodule of tables, a marker attribute. A ``forward``
        replaces only the class's: a module with a forward set on the instance is refused
        (:class:`ForwardOnInstance`), never overwritten."""
        if name == "forward":
            refuse_forward_on_instance(module)
        setattr(module, name, value)
        self.on_undo(functools.partial(_remove_attribute, module, name))

    def undo(self) -> None:
        """Undo every change, last first (also after a patch that failed half-way)."""
        while self._undo:
            self._undo.pop()()


def bind(function: Callable, module: nn.Module, *more: Any) -> Callable:
    """``function`` bound to this one module (a patched ``forward``). A partial of a module-level
    function, not a bound method: a bound method pickles as ``getattr(module, name)``, which
    torch.load cannot resolve, while the partial pickles by reference, so a patched model saved
    whole loads patched."""
    return functools.partial(function, module, *more)


def attach(model: nn.Module, record: PatchRecord) -> None:
    object.__setattr__(model, _ATTRIBUTE, record)


def attached(model: nn.Module) -> Optional[PatchRecord]:
    """The record of the patch applied to ``model``, or None."""
    return getattr(model, _ATTRIBUTE, None)


def detach(model: nn.Module) -> Optional[PatchRecord]:
    """Remove and return ``model``'s record (None when it is not patched)."""
    record = attached(model)
    if record is not None:
        object.__delattr__(model, _ATTRIBUTE)
    return record
