#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Write the generated part of docs/diffusers_models.md from torch_rope.diffusers' registry.

The registry (python/torch_rope/diffusers/registry.py, and refused.py for its refusals) is the
only place a model class is listed; the document's tables are made from it here, between two
marker lines, and tests/python/integrations/test_diffusers_registry.py fails when the document is
not current.

    PYTHONPATH=python .venv/bin/python scripts/diffusers_models_table.py          # rewrite it
    PYTHONPATH=python .venv/bin/python scripts/diffusers_models_table.py --check  # exit 1 if stale
"""

import sys
from pathlib import Path
from typing import Dict, List, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
import generated_doc  # noqa: E402

DOC = generated_doc.RegistryDoc(
    script="diffusers_models_table.py",
    document=Path(__file__).resolve().parent.parent / "docs" / "diffusers_models.md",
    families="../python/torch_rope/diffusers/families",
    supported="supported classes, by the family that patches them",
    group_header=("family", "model classes"),
    every="Every RoPE model class",
    status_header=("model class", "status", "family, or why refused"),
)
DOCUMENT = DOC.document
FAMILIES = DOC.families


def _family(row) -> str:
    link = f"[{row.family}]({FAMILIES}/{row.family}.py)"
    return f"{link} ({row.variant})" if row.variant else link


def generated() -> str:
    """The generated part of the document, markers included."""
    from torch_rope.diffusers.registry import REGISTRY

    groups: Dict[Tuple[str], List[str]] = {}
    for name, row in REGISTRY.rows.items():
        groups.setdefault((_family(row),), []).append(name)
    statuses = {name: ("supported", _family(row)) for name, row in REGISTRY.rows.items()}
    statuses.update((name, ("refused", why)) for name, why in REGISTRY.refused.items())
    return generated_doc.registry_part(DOC, groups, statuses)


def current(text: str) -> str:
    """``text`` (the document) with its generated part made anew."""
    return generated_doc.current_document(DOC, text, generated())


def main() -> int:
    return generated_doc.main(DOCUMENT, DOC.script, current)


if __name__ == "__main__":
    sys.exit(main())
