#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Records the signatures of the peers' entry points that torch_rope.compat mirrors, from the
peers' own packages, into tests/python/support/peer_signatures.json, which
tests/python/integrations/test_compat_serving.py holds torch_rope.compat to on every machine
(the packages are too large for the test command to install: flashinfer-python alone unpacks to
over 500 MB).

    /path/to/python-with-flashinfer scripts/record_peer_signatures.py

Run it with an interpreter where the peer imports (flashinfer-python imports without a GPU); a
peer that does not import keeps its recorded entry. Each entry names the package version.
"""

import importlib
import importlib.metadata
import inspect
import json
from pathlib import Path

OUT = (
    Path(__file__).resolve().parent.parent / "tests" / "python" / "support" / "peer_signatures.json"
)
PEERS = {
    # package (distribution) -> (module, [functions])
    "flashinfer-python": (
        "flashinfer.rope",
        ["rope_quantize_fp8", "mla_rope_quantize_fp8", "rope_quantize_fp8_append_paged_kv_cache"],
    ),
}


def parameters(fn):
    """[(name, repr of the default or None when there is none)] in order."""
    return [
        [p.name, None if p.default is inspect.Parameter.empty else repr(p.default)]
        for p in inspect.signature(fn).parameters.values()
    ]


def main():
    recorded = json.loads(OUT.read_text()) if OUT.exists() else {}
    for dist, (module_name, functions) in PEERS.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            print(f"{dist}: not importable here ({e}); its recorded entry is kept")
            continue
        version = importlib.metadata.version(dist)
        recorded[dist] = {
            "version": version,
            "module": module_name,
            "functions": {name: parameters(getattr(module, name)) for name in functions},
        }
        print(f"{dist} {version}: recorded {', '.join(functions)}")
    OUT.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
