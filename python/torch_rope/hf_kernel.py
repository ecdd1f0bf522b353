# SPDX-License-Identifier: BSD-3-Clause
"""Alias of :mod:`torch_rope.hf.kernel_hook` (a layer for transformers' ``rotary_pos_emb`` kernel
hook), under the name it was first published as."""

from .hf.kernel_hook import *  # noqa: F401, F403
from .hf.kernel_hook import DEFAULT_DEVICES, __all__  # noqa: F401
