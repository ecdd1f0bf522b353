# SPDX-License-Identifier: BSD-3-Clause
"""The comparison report shared by the examples/cpp check scripts."""


def report(title: str, errors: dict, tolerance: float) -> int:
    """Print each max |difference| against `tolerance` and a closing count; return the failures."""
    failures = 0
    for name, err in errors.items():
        ok = err < tolerance
        failures += not ok
        print(f"  {name:45s} max |diff| = {err:.2e}  {'ok' if ok else 'MISMATCH'}")
    print(f"{title}: {len(errors) - failures} passed, {failures} failed")
    return failures
