#!/usr/bin/env bash
# Install everything the test suite needs, then run all of it (unit, integration, fault, e2e).
# This is the README's test command and what CI runs (.ci/run). Extra arguments go to pytest,
# e.g. `scripts/test.sh -m "not e2e"` for the fast subset.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --disable-pip-version-check -e '.[dev]'
bash scripts/e2e_setup.sh
python3 -m pytest "$@"
