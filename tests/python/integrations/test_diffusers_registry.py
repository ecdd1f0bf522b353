# SPDX-License-Identifier: BSD-3-Clause
"""torch_rope.diffusers' registry is the one list of model classes: what follows from it is
current, and it covers every RoPE model class of the installed diffusers.

Only the discovery test needs diffusers; the rest imports the registry without it.
"""

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

import torch_rope.diffusers
from torch_rope.diffusers import families
from torch_rope.diffusers.registry import REGISTRY

REPO = Path(__file__).resolve().parents[3]


def _load_script(name):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_table_is_generated_from_the_current_registry():
    """docs/diffusers_models.md's tables are scripts/diffusers_models_table.py's output for this
    registry."""
    script = _load_script("diffusers_models_table")
    text = script.DOCUMENT.read_text(encoding="utf-8")
    assert text == script.current(text), "run scripts/diffusers_models_table.py"


def test_every_rope_model_class_is_supported_or_refused():
    """Every ModelMixin class of the installed diffusers whose module applies RoPE (found from
    the source, independently of the registry) is a registry row or has a refusal reason; and the
    registry names no class diffusers does not have."""
    pytest.importorskip("diffusers", reason="diffusers is not installed")
    import diffusers_models

    found = set(diffusers_models.rope_model_classes())
    known = set(REGISTRY.rows) | set(REGISTRY.refused)
    assert sorted(found - known) == [], "RoPE classes in neither the registry nor refused.py"
    assert sorted(known - found) == [], "registry classes the installed diffusers does not have"


def test_supported_model_classes_are_the_registry_rows():
    assert torch_rope.diffusers.SUPPORTED_MODEL_CLASSES == tuple(REGISTRY.rows)
    assert all(reason.strip() for reason in REGISTRY.refused.values())


def test_every_row_names_a_family_that_exists():
    for name, row in REGISTRY.rows.items():
        assert row.family in families.FAMILIES, name
        assert callable(families.FAMILIES[row.family].patch), name


def test_the_registry_is_the_only_place_a_model_class_is_listed():
    """No string of python/torch_rope/ outside the registry (registry.py, refused.py) is a
    diffusers model class's name."""
    names = set(REGISTRY.rows) | set(REGISTRY.refused)
    package = REPO / "python" / "torch_rope"
    found = []
    for path in sorted(package.rglob("*.py")):
        if path.relative_to(package).as_posix() in (
            "diffusers/registry.py",
            "diffusers/refused.py",
        ):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and getattr(node, "value", None) in names:
                found.append(f"{os.path.relpath(path, REPO)}:{node.lineno}: {node.value!r}")
    assert not found, found


def test_importing_torch_rope_never_imports_diffusers():
    """``import torch_rope`` and ``import torch_rope.diffusers`` leave diffusers unimported (it is
    imported by patch only); ``torch_rope.diffusers`` is a lazy submodule."""
    code = (
        "import sys, torch_rope\n"
        "assert 'diffusers' not in sys.modules\n"
        "assert 'diffusers' in dir(torch_rope)\n"
        "torch_rope.diffusers.SUPPORTED_MODEL_CLASSES\n"
        "assert 'diffusers' not in sys.modules, 'torch_rope.diffusers imported diffusers'\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
