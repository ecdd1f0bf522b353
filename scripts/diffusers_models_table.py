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
from typing import Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent))
import generated_doc  # noqa: E402

DOCUMENT = Path(__file__).resolve().parent.parent / "docs" / "diffusers_models.md"
BEGIN = generated_doc.begin_marker("diffusers_models_table.py")
FAMILIES = "../python/torch_rope/diffusers/families"


def _family(row) -> str:
    link = f"[{row.family}]({FAMILIES}/{row.family}.py)"
    return f"{link} ({row.variant})" if row.variant else link


def generated() -> str:
    """The generated part of the document, markers included."""
    from torch_rope.diffusers.registry import REGISTRY

    groups: Dict[str, List[str]] = {}
    for name, row in REGISTRY.rows.items():
        groups.setdefault(_family(row), []).append(name)
    lines = [
        BEGIN,
        "",
        f"{len(REGISTRY.rows)} supported classes, by the family that patches them "
        f"([python/torch_rope/diffusers/families/]({FAMILIES}/__init__.py)):",
        "",
    ]
    lines += generated_doc.table(
        ("family", "model classes"),
        (
            (family, f"{len(names)}: " + ", ".join(f"`{n}`" for n in names))
            for family, names in generated_doc.grouped(groups)
        ),
    )
    statuses = {name: ("supported", _family(row)) for name, row in REGISTRY.rows.items()}
    statuses.update((name, ("refused", why)) for name, why in REGISTRY.refused.items())
    lines += [
        "",
        f"Every RoPE model class, {len(REGISTRY.rows)} supported and {len(REGISTRY.refused)} "
        "refused:",
        "",
    ]
    lines += generated_doc.table(
        ("model class", "status", "family, or why refused"),
        ((f"`{n}`", *statuses[n]) for n in sorted(statuses)),
    )
    return "\n".join(lines + ["", generated_doc.END])


def current(text: str) -> str:
    """``text`` (the document) with its generated part made anew."""
    return generated_doc.with_part(text, BEGIN, generated(), DOCUMENT)


def main() -> int:
    return generated_doc.main(DOCUMENT, "diffusers_models_table.py", current)


if __name__ == "__main__":
    sys.exit(main())
