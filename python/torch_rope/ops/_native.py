# SPDX-License-Identifier: BSD-3-Clause
"""The native module ``torch_rope._C`` (its typed face: ``torch_rope/_C.pyi``) and its one home in
Python.

Loading ``_C`` loads librope, whose static initialisers register every ``torch.ops.rope.*`` op
(CPU, CUDA when built, Meta and Autograd kernels) with the dispatcher; libtorch must be loaded
before it. This is the only module of the package that imports ``_C``, by its full name: the op
wrappers here in :mod:`torch_rope.ops`, the package's lowest layer over the native module, take it
from here as siblings (``from ._native import _C``), and the layers above (``nn``, ``compat``, the
package's ``__init__``) import it downward from ``torch_rope.ops``. No module reaches up to the
package root for it.
"""

import torch  # noqa: F401  (libtorch must be loaded before our native library)

import torch_rope._C as _C  # noqa: F401  (loads librope: registers the ops with the dispatcher)
