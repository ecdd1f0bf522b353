#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The demo: installs what is needed, builds, and runs examples/attention_demo.py.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
PYTHONPATH="$PWD/python" .venv/bin/python examples/attention_demo.py
