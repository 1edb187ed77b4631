#!/usr/bin/env bash
# Set up everything the tests need (scripts/setup.sh), then lint, type-check, check the layers
# (import-linter) and run the suite.
# Arguments go to pytest: `scripts/test.sh tests/unit` runs one kind (unit, integration, e2e).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/lint-imports
.venv/bin/python -m pytest "$@"
