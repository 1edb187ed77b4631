#!/usr/bin/env bash
# Set up everything the tests need (scripts/setup.sh), then lint, type-check, check the layers
# (import-linter) and run the suite in two phases (docs/testing.md): first the tests that may run
# beside each other, on PROTOLAB_TEST_WORKERS pytest-xdist workers (default 2, one per vCPU of the
# lab's VM), then the serial ones one at a time (they measure CPU, set cgroup quotas, drive k6 load or
# need Docker: marked `serial`, or under tests/e2e/; tests/conftest.py decides).
# Arguments go to pytest, in both phases: `scripts/test.sh tests/unit` runs one kind (unit,
# integration, e2e); a phase that selects nothing is no failure unless neither selects anything.
set -euo pipefail
cd "$(dirname "$0")/.."
# Bytecode caches (__pycache__, ignored by git) even where the environment turns them off: without
# them every pytest process rewrote and compiled the suite again (about 8 s per collection) and every
# run_matrix.py, service and k6 helper the tests start compiled the lab's modules again.
unset PYTHONDONTWRITEBYTECODE
scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/lint-imports

NO_TESTS=5  # pytest's exit code when nothing was selected
parallel=0
.venv/bin/python -m pytest --phase parallel -n "${PROTOLAB_TEST_WORKERS:-2}" --dist loadfile "$@" || parallel=$?
serial=0
.venv/bin/python -m pytest --phase serial "$@" || serial=$?
# Both phases run whatever the first gave, so one run shows every failure.
for code in "$parallel" "$serial"; do
    if [[ $code -ne 0 && $code -ne $NO_TESTS ]]; then
        exit "$code"
    fi
done
if [[ $parallel -eq $NO_TESTS && $serial -eq $NO_TESTS ]]; then
    exit "$NO_TESTS"
fi
