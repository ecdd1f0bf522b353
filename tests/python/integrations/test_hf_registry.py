# SPDX-License-Identifier: BSD-3-Clause
"""torch_rope.hf's registry is the one list of model types: what follows from it is current.

No transformers needed: the registry and the families import without it.
"""

import ast
import importlib.util
import os
from pathlib import Path

import torch_rope.hf
from torch_rope.hf import families
from torch_rope.hf.registry import REGISTRY

REPO = Path(__file__).resolve().parents[3]


def _load_script(name):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_table_is_generated_from_the_current_registry():
    """docs/hf_models.md's tables are scripts/hf_models_table.py's output for this registry."""
    script = _load_script("hf_models_table")
    text = script.DOCUMENT.read_text(encoding="utf-8")
    assert text == script.current(text), "run scripts/hf_models_table.py"


def test_supported_model_types_are_the_registry_rows():
    assert torch_rope.hf.SUPPORTED_MODEL_TYPES == tuple(REGISTRY.rows)
    assert torch_rope.hf._REFUSED == REGISTRY.refused


def test_every_row_names_families_that_exist():
    for model_type, row in REGISTRY.rows.items():
        assert row.text is not None or row.vision is not None, model_type
        chosen = families.for_row(row)
        assert chosen and all(callable(f.patch) for f in chosen), model_type


def test_the_registry_is_the_only_place_a_model_type_is_listed():
    """No string of python/torch_rope/ outside the registry (registry.py, refused.py) is a model
    type's name, but the family names that are model types too (gptj, roformer)."""
    names = set(REGISTRY.rows) | set(REGISTRY.refused)
    allowed = set(families.FAMILIES)
    package = REPO / "python" / "torch_rope"
    found = []
    for path in sorted(package.rglob("*.py")):
        if path.relative_to(package).as_posix() in ("hf/registry.py", "hf/refused.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            value = getattr(node, "value", None)
            if isinstance(node, ast.Constant) and value in names and value not in allowed:
                found.append(f"{os.path.relpath(path, REPO)}:{node.lineno}: {value!r}")
    assert not found, found


def test_no_python_file_of_the_package_is_over_450_lines():
    package = REPO / "python" / "torch_rope"
    long = {
        str(p.relative_to(package)): n
        for p in package.rglob("*.py")
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > 450
    }
    assert not long, long
