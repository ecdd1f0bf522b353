"""pytest setup for the torch_rope suite: import path, seeding."""

import os
import sys

import pytest
import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO_PYTHON = os.path.normpath(os.path.join(_HERE, "..", "..", "python"))

# The tests' own modules (references, helpers) import by bare name.
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

# Run from a source checkout without PYTHONPATH=python: fall back to the in-tree package (built by
# scripts/build.sh). An installed torch_rope, or one on PYTHONPATH, takes precedence.
try:
    import torch_rope  # noqa: F401
except ImportError:
    sys.path.insert(0, _REPO_PYTHON)
    import torch_rope  # noqa: F401


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a heavy test; the full test command still runs it")


@pytest.fixture(autouse=True)
def _seed():
    """Every test starts from the same random state, whatever ran before it."""
    torch.manual_seed(0)
    yield
