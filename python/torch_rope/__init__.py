# SPDX-License-Identifier: BSD-3-Clause
"""torch-rope: rotary position embedding for PyTorch, as native CPU and CUDA custom ops.

Importing this package registers the ops with the dispatcher, each with its CPU, CUDA (when
built), Meta and autograd kernels, so ``torch.compile``, export and ``torch.func`` work: the
rotations ``torch.ops.rope.apply`` (with ``out=`` and the table-free and packed-sequence
overloads), ``apply_`` and ``apply_qk``, and the fused ones, ``apply_qk_cache``,
``rms_norm_apply_qk``, ``rms_norm_apply_qk_cache``, ``apply_qk_fp8``, ``apply_qk_fp8_dynamic``
and ``mla_apply_cache``. The functions of the same names here are their typed wrappers.

Integrations load on first use, so their libraries stay optional: ``torch_rope.hf`` (Hugging
Face transformers), ``torch_rope.hf_kernel`` (a layer for transformers' kernel hook),
``torch_rope.diffusers``, ``torch_rope.torchtune``, ``torch_rope.compat`` (the inference engines'
and training stacks' entry points under their own names) and ``torch_rope.functional`` (the
signatures proposed for PyTorch core) work after a bare ``import torch_rope``.
"""

from pathlib import Path as _Path

# DTensor sharding rules, registered now only if torch.distributed.tensor is already loaded.
from . import (
    distributed,  # cheap: imports torch.distributed.tensor only when registering
    eager,
    vision,
)
from ._version import __version__
from .nn import RotaryPositionalEmbedding
from .ops import (
    _native,  # the native module's one home (loads librope: registers the ops)
    apply,
    apply_,
    apply_qk,
    apply_qk_cache,  # RoPE into a KV cache
    apply_qk_fp8,  # RoPE with float8 q and k
    apply_qk_fp8_dynamic,  # the same with scales computed from the rows
    mla_apply_cache,  # MLA cache rows
    rms_norm_apply_qk,  # fused QK-RMSNorm + RoPE
    rms_norm_apply_qk_cache,  # QK-RMSNorm + RoPE + KV-cache write
    rope_tables,
)
from .ops.tables import rope_frequencies, rope_tables_from_inv_freq

distributed.register_if_loaded()


# Submodules loaded on first use as attributes (torch_rope.hf.patch(model) after a bare
# `import torch_rope`), so that importing torch_rope never imports transformers, kernels or
# torchtune.
_LAZY_SUBMODULES = ("compat", "diffusers", "functional", "hf", "hf_kernel", "torchtune")


def __getattr__(name):
    if name in _LAZY_SUBMODULES:
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY_SUBMODULES))


#: Prefix for CMake's find_package(TorchRope) in a pip-installed torch_rope:
#:   cmake -DCMAKE_PREFIX_PATH="$(python -c \
#:       'import torch_rope; print(torch_rope.cmake_prefix_path)')"
#: (add torch.utils.cmake_prefix_path too). None in a source checkout, which has no installed
#: package.
cmake_prefix_path = (
    str(_Path(__file__).parent / "lib" / "cmake")
    if (_Path(__file__).parent / "lib" / "cmake" / "TorchRope").is_dir()
    else None
)


def compiled_with_cuda() -> bool:
    """True when the native library was built with its CUDA kernels."""
    return _native._C.compiled_with_cuda()


__all__ = [
    "RotaryPositionalEmbedding",
    "__version__",
    "apply",
    "apply_",
    "apply_qk",
    "apply_qk_cache",
    "apply_qk_fp8",
    "apply_qk_fp8_dynamic",
    "cmake_prefix_path",
    "compiled_with_cuda",
    "distributed",
    "eager",
    "mla_apply_cache",
    "rms_norm_apply_qk",
    "rms_norm_apply_qk_cache",
    "rope_frequencies",
    "rope_tables",
    "rope_tables_from_inv_freq",
    "vision",
]
