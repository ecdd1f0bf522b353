# SPDX-License-Identifier: BSD-3-Clause
"""A class's ``forward`` rebuilt over a patched copy of its module's globals.

A modeling library's attention layer calls a module-level rotation function (transformers'
``apply_rotary_pos_emb``) from its ``forward``. Swapping that global in the library's module would
patch every model of the process; rebinding the class's forward would patch every instance. Instead
the forward's code is rebuilt as a new function over a *copy* of the module's globals in which the
rotation names are ours, and each patched instance calls that function. The copy is registered as
a module of its own (``<prefix><module name>``), because torch.compile finds a function's globals
by their module's ``__name__``.
"""

import sys
import types
from typing import Any, Callable, Dict


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
            module = types.ModuleType(name)
            sys.modules[name] = module
            self._namespaces[source] = module
            refresh = True
        if refresh:
            name = module.__name__
            module.__dict__.clear()
            module.__dict__.update(original_globals)
            module.__dict__["__name__"] = name
            module.__dict__.update(self.replacements(original_globals))
        return module.__dict__

    def forward(self, cls: type, refresh: bool = False) -> types.FunctionType:
        """``cls.forward`` rebuilt over the patched copy of its module's globals, so that its
        rotation function is ours while other models (and unpatched instances of the same class)
        keep the library's. Rebuilt from the live class and module when ``refresh`` (every patch);
        built on first use after unpickling in a new process."""
        function = self._forwards.get(cls)
        if function is None or refresh:
            original = cls.forward
            namespace = self._namespace(original.__globals__, refresh)
            function = types.FunctionType(
                original.__code__,
                namespace,
                original.__name__,
                original.__defaults__,
                original.__closure__,
            )
            function.__kwdefaults__ = original.__kwdefaults__
            function.__dict__.update(original.__dict__)
            function.__qualname__ = original.__qualname__
            self._forwards[cls] = function
        return function
