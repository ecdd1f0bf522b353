# SPDX-License-Identifier: BSD-3-Clause
"""pytest setup for the torch_rope suite: import path, seeding and the hypothesis profiles. (The
`slow` mark is registered in pyproject.toml.)"""

import os
import sys

import pytest
import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO_PYTHON = os.path.normpath(os.path.join(_HERE, "..", "..", "python"))
_SUPPORT = os.path.join(_HERE, "support")

# The tests' own modules (support/: references, helpers, samples, ...) import by bare name.
if _SUPPORT not in sys.path:
    sys.path.insert(0, _SUPPORT)

# Run from a source checkout without PYTHONPATH=python: fall back to the in-tree package (built by
# scripts/build.sh). An installed torch_rope, or one on PYTHONPATH, takes precedence.
try:
    import torch_rope  # noqa: F401
except ImportError:
    sys.path.insert(0, _REPO_PYTHON)
    import torch_rope  # noqa: F401


try:
    from hypothesis import HealthCheck, settings

    # Seeded (derandomize): a run is reproducible and a failure shrinks to the same example.
    # "fast" runs in every test run; tests marked slow ask for more examples themselves.
    settings.register_profile(
        "fast",
        derandomize=True,
        deadline=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fast"))
except ImportError:  # the property tests skip themselves, visibly
    pass


@pytest.fixture(autouse=True)
def _seed():
    """Every test starts from the same random state, whatever ran before it."""
    torch.manual_seed(0)
    yield


def pytest_collection_modifyitems(config, items):
    """The tests marked slow run first (in their collected order), then the rest.

    pytest-xdist hands the tests out in this order, so a worker that draws one of the longest
    tests (a distributed run, an exact-angle sweep: 15 to 30 s each) does so while the others
    still have work, not at the end, when one worker would finish them alone."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
