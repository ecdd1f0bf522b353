# SPDX-License-Identifier: BSD-3-Clause
"""Functions rebuilt over a patched copy of their module's globals.

A modeling library's attention code calls a module-level rotation function (transformers'
``apply_rotary_pos_emb``, diffusers' ``apply_rotary_emb``). Swapping that global in the library's
module would patch every model of the process; rebinding a class's method would patch every
instance. Instead the function's code is rebuilt as a new function over a *copy* of the module's
globals in which the rotation names are ours, and each patched instance calls that function. The
copy is registered as a module of its own (in ``sys.modules``), because torch.compile finds a
function's globals by their module's ``__name__``.

* :func:`register_copy` / :func:`release_copy`: one such copy, and its removal;
* :func:`rebuild`: a function's code (or an edited copy of it) over a copy;
* :class:`PatchedNamespaces`: one copy per modeling module, shared by every patched model of the
  process, and the classes' forwards rebuilt over it (what ``torch_rope.hf`` uses).
"""

import sys
import types
from typing import Any, Callable, Dict, Mapping, Optional


def register_copy(
    name: str, original_globals: Mapping[str, Any], replacements: Mapping[str, Any]
) -> types.ModuleType:
    """A module named ``name``, registered in ``sys.modules``, whose globals are a copy of
    ``original_globals`` with ``replacements`` on top."""
    module = types.ModuleType(name)
    fill_copy(module, original_globals, replacements)
    sys.modules[name] = module
    return module


def fill_copy(
    module: types.ModuleType, original_globals: Mapping[str, Any], replacements: Mapping[str, Any]
) -> None:
    """Refill ``module``'s globals from ``original_globals`` and ``replacements``, in place (the
    dict object stays the same, so functions built over it earlier see the new names)."""
    name = module.__name__
    module.__dict__.clear()
    module.__dict__.update(original_globals)
    module.__dict__["__name__"] = name
    module.__dict__.update(replacements)


def release_copy(module: types.ModuleType) -> None:
    """Remove a copy from ``sys.modules`` (functions built over it keep working: they hold its
    globals dict)."""
    if sys.modules.get(module.__name__) is module:
        del sys.modules[module.__name__]


def rebuild(
    original: types.FunctionType,
    namespace: Dict[str, Any],
    code: Optional[types.CodeType] = None,
) -> types.FunctionType:
    """``original`` as a new function over ``namespace`` (a registered copy's ``__dict__``), with
    its name, defaults, closure and attributes (so the same signature); ``code`` replaces its code
    object (an edited copy of it, with the same arguments)."""
    function = types.FunctionType(
        original.__code__ if code is None else code,
        namespace,
        original.__name__,
        original.__defaults__,
        original.__closure__,
    )
    function.__kwdefaults__ = original.__kwdefaults__
    function.__dict__.update(original.__dict__)
    function.__qualname__ = original.__qualname__
    return function


class PatchedNamespaces:
    """The patched copies of modeling modules' globals and the forwards rebuilt over them.

    ``replacements(original_globals)`` returns the names to replace in one module's copy (none for
    a module that defines no rotation function we know); ``prefix`` names the registered copies.
    """

    def __init__(self, prefix: str, replacements: Callable[[Dict[str, Any]], Dict[str, Any]]):
        self.prefix = prefix
        self.replacements = replacements
        self._namespaces: Dict[str, types.ModuleType] = {}
        self._forwards: Dict[type, types.FunctionType] = {}

    def _namespace(self, original_globals: Dict[str, Any], refresh: bool) -> Dict[str, Any]:
        """The patched copy of a modeling module's globals: its live globals with our rotation
        functions. ``refresh`` copies them again, so that a name rebound since the last patch
        (another patcher, transformers' hub-kernel swap) is seen; the dict object stays the same,
        so forwards built over it earlier see the refreshed names too."""
        source = original_globals["__name__"]
        module = self._namespaces.get(source)
        if module is None:
            name = self.prefix + source.replace(".", "_")
            module = register_copy(name, original_globals, self.replacements(original_globals))
            self._namespaces[source] = module
        elif refresh:
            fill_copy(module, original_globals, self.replacements(original_globals))
        return module.__dict__

    def forward(self, cls: type, refresh: bool = False) -> types.FunctionType:
        """``cls.forward`` rebuilt over the patched copy of its module's globals, so that its
        rotation function is ours while other models (and unpatched instances of the same class)
        keep the library's. Rebuilt from the live class and module when ``refresh`` (every patch);
        built on first use after unpickling in a new process."""
        function = self._forwards.get(cls)
        if function is None or refresh:
            function = self._rebuilt(cls.forward, refresh)
            self._forwards[cls] = function
        return function

    def _rebuilt(self, original: types.FunctionType, refresh: bool) -> types.FunctionType:
        """``original`` rebuilt over the patched copy of its module's globals; a decorated one
        (``functools.wraps``: ``@torch.no_grad()`` on an indexer's forward) is the decorator's
        wrapper again, around the function it wraps rebuilt so: the wrapper's own globals are the
        decorator's module, where no rotation name is looked up."""
        wrapped = getattr(original, "__wrapped__", None)
        if wrapped is None or not original.__closure__:
            return rebuild(original, self._namespace(original.__globals__, refresh))
        inner, cells = None, []
        for cell in original.__closure__:
            try:
                held = cell.cell_contents
            except ValueError:  # an empty cell
                held = None
            if held is wrapped:
                inner = inner or self._rebuilt(wrapped, refresh)
                cell = types.CellType(inner)
            cells.append(cell)
        if inner is None:  # a wrapper that does not hold the function it wraps: as before
            return rebuild(original, self._namespace(original.__globals__, refresh))
        function = types.FunctionType(
            original.__code__,
            original.__globals__,
            original.__name__,
            original.__defaults__,
            tuple(cells),
        )
        function.__kwdefaults__ = original.__kwdefaults__
        function.__dict__.update(original.__dict__)
        function.__qualname__ = original.__qualname__
        function.__wrapped__ = inner
        return function
