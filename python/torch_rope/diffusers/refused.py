# SPDX-License-Identifier: BSD-3-Clause
"""Why :func:`torch_rope.diffusers.patch` refuses each RoPE model class of diffusers it does not
support: one reason per class, shared by a family where the cause is the same.
docs/diffusers_models.md lists them (a test keeps the table and this dict in step), and another
test checks that every RoPE model class of the installed diffusers is either supported or here."""

from typing import Dict

REFUSED: Dict[str, str] = {}
