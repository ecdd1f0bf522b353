# SPDX-License-Identifier: BSD-3-Clause
"""diffusers' attention processors (and forwards) rebuilt so that their rotation is ours, on one
model instance.

diffusers rotates q and k inside each attention module's ``processor``, calling its rotation
function in one of three forms: a global of the processor's module (FLUX's ``apply_rotary_emb``,
imported at the top of the file, or a function the file defines), a name imported inside
``__call__`` (``from ..embeddings import apply_rotary_emb``: HunyuanVideo, CogVideoX), or a
function defined inside ``__call__`` (Wan's ``apply_rotary_emb``). :class:`ProcessorPatcher`
rebuilds the processor's ``__call__`` over a copy of its module's globals in which:

* a global rotation function is ours (the name rebound in the copy);
* an imported one is read from an attribute of the imported module that holds ours, under a name
  of this patch's own (the code's import renamed; torch.compile follows imports itself, so a
  patched ``__import__`` would not do);
* a nested one is a stub of the same name that calls ours (the code constant replaced);

and module-level helpers that rotate one call down (Qwen-Image 2.1's ``_qwenimage21_prepare_qkv``)
are rebuilt the same way. Each attention module then gets, through ``set_processor``, a shallow
copy of its processor whose class is a subclass of the original (``isinstance`` holds, the
signature that FLUX-style ``forward``\\ s filter their kwargs by is the same) with the rebuilt
``__call__``. Nothing is changed on the processor classes or the library's modules, so other
models and other instances keep diffusers' rotation. :meth:`ProcessorPatcher.patch_forward` does
the same for a module's ``forward`` (models that build their RoPE in their own forward).

Every change is recorded (:class:`~torch_rope._patching.record.PatchRecord`) and undone by
unpatch: a processor is put back only if it is still the one patch installed (a processor set
since, by ``set_attn_processor`` or ``fuse_qkv_projections``, is left alone).
"""

import copy
import dis
import functools
import importlib.util
import itertools
import types
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Tuple

from torch import nn

from .._patching.namespace import rebuild, register_copy, release_copy
from .._patching.record import PatchRecord, bind

CALLER = "torch_rope.diffusers.patch"

_SERIALS = itertools.count()
# The opcodes whose argument is a co_names entry: renaming an entry must touch only imports and
# global loads of the rotation function.
_RENAMABLE = {"IMPORT_FROM", "LOAD_GLOBAL"}


class Swap(NamedTuple):
    """One rotation function of diffusers and ours in its place. ``original``: what the name must
    be in the module (global form) or in the module it is imported from (import form); None for a
    function defined inside ``__call__`` (the nested form), which has no identity to check."""

    function: Callable
    original: Optional[Callable] = None


Swaps = Mapping[str, Swap]


def _imports(code: types.CodeType, package: Optional[str]) -> Dict[str, str]:
    """``{name: absolute module}`` of the ``from module import name`` statements in ``code``."""
    found: Dict[str, str] = {}
    instructions = list(dis.get_instructions(code))
    module, level = None, 0
    for i, ins in enumerate(instructions):
        if ins.opname == "IMPORT_NAME":
            module = ins.argval
            level = instructions[i - 2].argval if i >= 2 else 0
        elif ins.opname == "IMPORT_FROM" and module is not None:
            relative = "." * (level or 0) + module
            try:
                found[ins.argval] = importlib.util.resolve_name(relative, package)
            except (ImportError, ValueError):
                continue
    return found


def _imported(code: types.CodeType, globals_: Mapping[str, Any], name: str, swap: Swap) -> Any:
    """The module ``code`` imports ``name`` from, if that name is the swapped function."""
    source = _imports(code, globals_.get("__package__")).get(name)
    if source is None:
        return None
    module = importlib.import_module(source)
    if swap.original is not None and getattr(module, name, None) is not swap.original:
        return None
    return module


def _nested(code: types.CodeType, name: str) -> bool:
    return any(isinstance(c, types.CodeType) and c.co_name == name for c in code.co_consts)


def _global(code: types.CodeType, globals_: Mapping[str, Any], name: str, swap: Swap) -> bool:
    if name not in code.co_names or name not in globals_:
        return False
    return swap.original is None or globals_[name] is swap.original


def _direct_use(function: types.FunctionType, swaps: Swaps) -> bool:
    code, globals_ = function.__code__, function.__globals__
    for name, swap in swaps.items():
        if _global(code, globals_, name, swap) or _nested(code, name):
            return True
        if name in code.co_names and _imported(code, globals_, name, swap) is not None:
            return True
    return False


def _helpers(globals_: Mapping[str, Any], swaps: Swaps) -> Dict[str, types.FunctionType]:
    """The module-level functions of a module that rotate, directly or through each other."""
    source = globals_.get("__name__")
    functions = {
        n: f
        for n, f in globals_.items()
        if isinstance(f, types.FunctionType) and f.__module__ == source and n not in swaps
    }
    found = {n: f for n, f in functions.items() if _direct_use(f, swaps)}
    grew = True
    while grew:
        grew = False
        for n, f in functions.items():
            if n not in found and any(c in found for c in f.__code__.co_names):
                found[n] = f
                grew = True
    return found


def _unwrapped(function: Callable) -> Callable:
    """The function a decorator (``functools.wraps``: diffusers' ``apply_lora_scale``) wraps."""
    while isinstance(getattr(function, "__wrapped__", None), types.FunctionType):
        function = function.__wrapped__
    return function


def uses(function: Callable, swaps: Swaps) -> bool:
    """Whether ``function`` rotates through one of ``swaps``' names, itself or one helper down (a
    decorated function: the function it wraps)."""
    function = _unwrapped(function)
    if not isinstance(function, types.FunctionType):
        return False
    if _direct_use(function, swaps):
        return True
    helpers = _helpers(function.__globals__, swaps)
    return any(name in helpers for name in function.__code__.co_names)


def _stub(name: str, qualname: str, target: str) -> types.CodeType:
    """The code of ``def name(*args, **kwargs): return target(*args, **kwargs)``."""
    source = f"def {name}(*args, **kwargs):\n    return {target}(*args, **kwargs)\n"
    module = compile(source, f"<torch_rope.diffusers {name}>", "exec")
    code = next(c for c in module.co_consts if isinstance(c, types.CodeType))
    return code.replace(co_qualname=qualname)


def library_function(function: types.FunctionType, name: str) -> Optional[Callable]:
    """The library's rotation function that ``function`` (a processor's ``__call__``) calls as
    ``name``, whatever its form: the global, the imported module's attribute, or the nested
    function made anew from its code (for the self-check to run diffusers' own rotation)."""
    if not isinstance(function, types.FunctionType):
        return None
    code, globals_ = function.__code__, function.__globals__
    for const in code.co_consts:
        if isinstance(const, types.CodeType) and const.co_name == name:
            return types.FunctionType(const, globals_, name)
    if name in code.co_names:
        source = _imports(code, globals_.get("__package__")).get(name)
        if source is not None:
            return getattr(importlib.import_module(source), name, None)
        return globals_.get(name)
    return None


def _holds(cell: types.CellType, value: Any) -> bool:
    try:
        return cell.cell_contents is value
    except ValueError:  # an empty cell
        return False


def _drop_attribute(owner: Any, name: str) -> None:
    if name in vars(owner):
        delattr(owner, name)


def _restore_processor(attention: nn.Module, original: Any, installed: Any) -> None:
    if getattr(attention, "processor", None) is installed:
        attention.set_processor(original)


class ProcessorPatcher:
    """Rebuilds processors and forwards for one patch of one model. ``key`` (a short string)
    separates the rotations of one model that need different tables (a video and an audio
    stream): each key gets copies of its own."""

    def __init__(self, record: PatchRecord) -> None:
        self.record = record
        self.serial = next(_SERIALS)
        self._copies: Dict[Tuple[str, str], types.ModuleType] = {}
        self._functions: Dict[Tuple[int, str], types.FunctionType] = {}
        self._classes: Dict[Tuple[type, str], type] = {}
        #: (attention module, installed processor) of every processor this patch installed.
        self.installed: List[Tuple[nn.Module, Any]] = []

    def _attribute(self, key: str, name: str) -> str:
        return f"_torch_rope_{self.serial}_{key}_{name}"

    def _namespace(self, globals_: Mapping[str, Any], swaps: Swaps, key: str) -> Dict[str, Any]:
        source = globals_["__name__"]
        found = self._copies.get((source, key))
        if found is not None:
            return found.__dict__
        replacements: Dict[str, Any] = {}
        for name, swap in swaps.items():
            if name in globals_ and (swap.original is None or globals_[name] is swap.original):
                replacements[name] = swap.function
            replacements[self._attribute(key, name)] = swap.function
        module_name = f"torch_rope_diffusers_patched__{self.serial}_{key}__" + source.replace(
            ".", "_"
        )
        module = register_copy(module_name, globals_, replacements)
        self.record.on_undo(functools.partial(release_copy, module))
        self._copies[(source, key)] = module
        for name, helper in _helpers(globals_, swaps).items():
            module.__dict__[name] = self.rebuilt(helper, swaps, key)
        return module.__dict__

    def _edited(self, function: types.FunctionType, swaps: Swaps, key: str) -> types.CodeType:
        """``function``'s code with its imported and nested rotation functions ours."""
        code, globals_ = function.__code__, function.__globals__
        names = list(code.co_names)
        for name, swap in swaps.items():
            if name not in names:
                continue
            module = _imported(code, globals_, name, swap)
            if module is None:
                continue
            uses_of_name = [
                ins.opname
                for ins in dis.get_instructions(code)
                if ins.opcode in dis.hasname and ins.argval == name
            ]
            if any(op not in _RENAMABLE for op in uses_of_name):
                raise NotImplementedError(
                    f"{CALLER}: {function.__qualname__} uses the name {name!r} other than as an "
                    "import or a global; not patching"
                )
            attribute = self._attribute(key, name)
            if getattr(module, attribute, None) is not swap.function:
                setattr(module, attribute, swap.function)
                self.record.on_undo(functools.partial(_drop_attribute, module, attribute))
            names[names.index(name)] = attribute
        consts = [
            _stub(c.co_name, c.co_qualname, self._attribute(key, c.co_name))
            if isinstance(c, types.CodeType) and c.co_name in swaps
            else c
            for c in code.co_consts
        ]
        return code.replace(co_names=tuple(names), co_consts=tuple(consts))

    def rebuilt(self, function: types.FunctionType, swaps: Swaps, key: str) -> types.FunctionType:
        """``function`` rebuilt so that it (and the helpers it calls) rotates with ``swaps``; a
        decorator's wrapper keeps wrapping, its closure pointing at the rebuilt function."""
        cached = self._functions.get((id(function), key))
        if cached is not None:
            return cached
        wrapped = getattr(function, "__wrapped__", None)
        if isinstance(wrapped, types.FunctionType) and not _direct_use(function, swaps):
            inner = self.rebuilt(wrapped, swaps, key)
            cells = tuple(
                types.CellType(inner) if _holds(cell, wrapped) else cell
                for cell in function.__closure__ or ()
            )
            result = types.FunctionType(
                function.__code__,
                function.__globals__,
                function.__name__,
                function.__defaults__,
                cells,
            )
            result.__kwdefaults__ = function.__kwdefaults__
            result.__dict__.update(function.__dict__)
            result.__wrapped__ = inner
            result.__qualname__ = function.__qualname__
        else:
            namespace = self._namespace(function.__globals__, swaps, key)
            result = rebuild(function, namespace, self._edited(function, swaps, key))
        self._functions[(id(function), key)] = result
        return result

    def patch_processor(self, attention: nn.Module, swaps: Swaps, key: str = "") -> bool:
        """Install on ``attention`` a copy of its processor that rotates with ``swaps``; False
        (nothing changed) when its processor does not rotate with any of them."""
        original = attention.processor
        cls = type(original)
        base = vars(cls).get("_torch_rope_base")
        if base is not None:
            # A copy an earlier patch installed, left in place after that patch was undone (the
            # processors set_attn_processor was handed were the patched model's own, or new
            # instances of their classes, as loading an IP adapter makes): patched as the
            # diffusers processor it is a copy of, and that is what unpatch restores.
            original = copy.copy(original)
            original.__class__ = cls = base
        call = vars(cls).get("__call__") or next(
            (vars(c)["__call__"] for c in cls.__mro__ if "__call__" in vars(c)), None
        )
        if not uses(call, swaps):
            return False
        patched_class = self._classes.get((cls, key))
        if patched_class is None:
            patched_class = type(
                "TorchRope" + cls.__name__,
                (cls,),
                {
                    "__call__": self.rebuilt(call, swaps, key),
                    "__module__": cls.__module__,
                    "_torch_rope_base": cls,
                },
            )
            self._classes[(cls, key)] = patched_class
        installed = copy.copy(original)
        installed.__class__ = patched_class
        attention.set_processor(installed)
        self.record.on_undo(functools.partial(_restore_processor, attention, original, installed))
        self.installed.append((attention, installed))
        self.record.attention.append(attention)
        return True

    def patch_forward(self, module: nn.Module, swaps: Swaps, key: str = "") -> bool:
        """Give ``module`` an instance ``forward``: its class's, rebuilt to rotate with
        ``swaps``; False when that forward does not use them."""
        forward = type(module).forward
        if not uses(forward, swaps):
            return False
        self.record.set(module, "forward", bind(self.rebuilt(forward, swaps, key), module))
        return True

    def still_installed(self) -> bool:
        """Whether every processor this patch installed is still in place."""
        return all(getattr(a, "processor", None) is p for a, p in self.installed)
