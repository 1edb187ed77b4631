#!/usr/bin/env bash
# Set up everything the tests need (scripts/setup.sh), then lint and run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/python -m pytest "$@"
