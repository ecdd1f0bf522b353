# SPDX-License-Identifier: BSD-3-Clause
"""The one place an integration lists the model types it knows.

A :class:`Registry` holds one row per supported model type (a frozen record of what the
integration needs to know of that type: which family patches it, its position rule, ...) and the
reason each other known type is refused. Everything else follows from it: the supported types, the
dispatch of ``patch`` (the row it looks up), and the documentation table (generated from it).
"""

from typing import Dict, Generic, Mapping, Tuple, TypeVar

Row = TypeVar("Row")

#: The reason given for a model type (or class: ``{kind}``) the registry has never heard of.
UNKNOWN = "not one of the {kind}s this project tests"


class Registry(Generic[Row]):
    """``rows``: model type -> its row; ``refused``: model type -> why it is refused. ``caller``
    starts every refusal (``"torch_rope.hf.patch"``); ``kind`` names the keys in it (``"model
    type"``: transformers' ``config.model_type``; ``"model class"``: a diffusers class name)."""

    def __init__(
        self,
        caller: str,
        rows: Mapping[str, Row],
        refused: Mapping[str, str],
        kind: str = "model type",
    ) -> None:
        both = set(rows) & set(refused)
        if both:
            raise ValueError(f"{caller}: {kind}s both supported and refused: {sorted(both)}")
        self.caller = caller
        self.kind = kind
        self.rows: Dict[str, Row] = dict(rows)
        self.refused: Dict[str, str] = dict(refused)

    @property
    def supported(self) -> Tuple[str, ...]:
        """The supported model types, in the registry's order."""
        return tuple(self.rows)

    def row(self, model_type: str) -> Row:
        """The row of ``model_type``; ``NotImplementedError`` naming the reason for any other."""
        row = self.rows.get(model_type)
        if row is None:
            reason = self.refused.get(model_type, UNKNOWN.format(kind=self.kind))
            raise NotImplementedError(
                f"{self.caller}: {self.kind} {model_type!r} is not supported: {reason} "
                f"(supported: {', '.join(self.rows)})"
            )
        return row
