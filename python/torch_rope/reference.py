# SPDX-License-Identifier: BSD-3-Clause
"""Deprecated name of :mod:`torch_rope.eager` (the plain-PyTorch baseline), kept importable for
one release; "reference" now means only the test oracles."""

import warnings

from .eager import apply, apply_qk  # noqa: F401

warnings.warn(
    "torch_rope.reference is deprecated and will be removed in the next release; "
    "use torch_rope.eager (same functions)",
    DeprecationWarning,
    stacklevel=2,
)
