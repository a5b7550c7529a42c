#!/usr/bin/env bash
# The whole suite with every case of the sampled cross-products (the default `pytest -q`
# runs a covering sample of each: tests/helpers.py, `sampled`). Extra pytest arguments
# pass through, e.g. `tests/run_exhaustive.sh -m exhaustive` for the sampled-out cases only.
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTEST:-.venv/bin/pytest}" -q --exhaustive "$@"
