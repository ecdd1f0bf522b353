#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Write the generated part of docs/hf_models.md from torch_rope.hf's registry.

The registry (python/torch_rope/hf/registry.py, and refused.py for its refusals) is the only
place a model type is listed; the document's tables are made from it here, between two marker
lines, and tests/python/integrations/test_hf_registry.py fails when the document is not current.

    PYTHONPATH=python .venv/bin/python scripts/hf_models_table.py          # rewrite the document
    PYTHONPATH=python .venv/bin/python scripts/hf_models_table.py --check  # exit 1 if stale
"""

import sys
from pathlib import Path
from typing import Dict, List, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
import generated_doc  # noqa: E402

DOC = generated_doc.RegistryDoc(
    script="hf_models_table.py",
    document=Path(__file__).resolve().parent.parent / "docs" / "hf_models.md",
    families="../python/torch_rope/hf/families",
    supported="supported types, by the families that patch their text and vision RoPE",
    group_header=("text RoPE", "vision tower", "model types"),
    every="Every rotary model type",
    status_header=("model type", "status", "why refused"),
)
DOCUMENT = DOC.document
FAMILIES = DOC.families


def _family(name: str) -> str:
    return f"[{name}]({FAMILIES}/{name}.py)"


def _text(row) -> str:
    if row.text is None:
        return "none (a vision tower alone, or a text tower without RoPE)"
    if row.multi_axis is None:
        return _family(row.text)
    pairs = "GPT-J pairs" if row.multi_axis.interleaved else "rotate_half"
    rule = "interleaved axes" if row.multi_axis.mrope_interleaved else "contiguous sections"
    if row.multi_axis.alternating:
        rule = "2 axes alternating plane by plane"
    return f"{_family(row.text)}, multi-axis: {rule}, {pairs}"


def _vision(row) -> str:
    vision = row.vision
    if vision is None:
        return "-"
    if vision.family is None:
        return "no RoPE: not patched"
    details = []
    if vision.axes != 2:
        details.append(f"{vision.axes} axes")
    if vision.interleaved:
        details.append("GPT-J pairs")
    if vision.column_first:
        details.append("column first")
    if vision.alternating:
        details.append("axes alternating plane by plane")
    if vision.text_apply:
        details.append("through apply_rotary_pos_emb")
    return _family(vision.family) + (f" ({', '.join(details)})" if details else "")


def generated() -> str:
    """The generated part of the document, markers included."""
    from torch_rope.hf.registry import REGISTRY

    groups: Dict[Tuple[str, str], List[str]] = {}
    for model_type, row in REGISTRY.rows.items():
        groups.setdefault((_text(row), _vision(row)), []).append(model_type)
    statuses = {t: ("supported", "") for t in REGISTRY.rows}
    statuses.update((t, ("refused", reason)) for t, reason in REGISTRY.refused.items())
    return generated_doc.registry_part(DOC, groups, statuses)


def current(text: str) -> str:
    """``text`` (the document) with its generated part made anew."""
    return generated_doc.current_document(DOC, text, generated())


def main() -> int:
    return generated_doc.main(DOCUMENT, DOC.script, current)


if __name__ == "__main__":
    sys.exit(main())
