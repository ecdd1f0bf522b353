"""torch-rope: rotary position embedding for PyTorch, as native CPU and CUDA custom ops.

Importing this package registers ``torch.ops.rope.apply``, ``torch.ops.rope.apply_`` and
``torch.ops.rope.apply_qk`` (with autograd and fake kernels, so ``torch.compile`` works).
"""

import torch  # noqa: F401  (libtorch must be loaded before our native library)

from . import _C  # noqa: F401  (loads librope: registers the ops with the dispatcher)
from . import _fake  # noqa: F401  (fake/meta kernels for torch.compile and export)
from . import reference
from ._version import __version__
from .nn import RotaryPositionalEmbedding
from .ops import apply, apply_, apply_qk, rope_tables


def compiled_with_cuda() -> bool:
    """True when the native library was built with its CUDA kernels."""
    return _C.compiled_with_cuda()


__all__ = [
    "RotaryPositionalEmbedding",
    "__version__",
    "apply",
    "apply_",
    "apply_qk",
    "compiled_with_cuda",
    "reference",
    "rope_tables",
]
