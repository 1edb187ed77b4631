#!/usr/bin/env bash
# Set up everything the tests need (scripts/setup.sh), lint (ruff), then run the suite in four phases
# (docs/testing.md), with the type check (mypy) and the layers (import-linter) beside the third: the
# tests that may run beside each other, on PROTOLAB_TEST_WORKERS pytest-xdist workers (default 3 for the lab's 2 vCPUs, as the
# tests wait on sockets and subprocesses a fifth of the time; 2 beside the docker tests),
# and beside them the docker tests one at a time (with PROTOLAB_DOCKER_TESTS=1: they wait on the
# engine and judge no figure); then the paired ones three at a time (load or CPU quotas, but no figure
# judged: marked `paired`); then the serial ones one at a time, alone (they measure CPU, set cgroup
# quotas or drive k6 load: marked `serial`, or under tests/e2e/; tests/conftest.py decides).
# Arguments go to pytest, in every phase: `scripts/test.sh tests/unit` runs one kind (unit,
# integration, e2e); a phase that selects nothing is no failure unless none selects anything.
set -euo pipefail
cd "$(dirname "$0")/.."
# Bytecode caches (__pycache__, ignored by git) even where the environment turns them off: without
# them every pytest process rewrote and compiled the suite again (about 8 s per collection) and every
# run_matrix.py, service and k6 helper the tests start compiled the lab's modules again.
unset PYTHONDONTWRITEBYTECODE
scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .

NO_TESTS=5  # pytest's exit code when nothing was selected
# The docker phase only when its tests are asked for (tests/conftest.py); its output waits in a file
# until the parallel phase is done, then is shown whole.
docker=$NO_TESTS
if [[ ${PROTOLAB_DOCKER_TESTS:-} == 1 ]]; then
    docker_log=$(mktemp)
    .venv/bin/python -m pytest --phase docker "$@" >"$docker_log" 2>&1 &
    docker_pid=$!
    trap 'kill "$docker_pid" 2>/dev/null || true; rm -f "$docker_log"' EXIT
fi
parallel=0
# Three workers alone (277 s on two, 235 s on three here); two beside the docker phase, which then
# took 350 s against 281 s (docs/testing.md).
workers=3
[[ ${PROTOLAB_DOCKER_TESTS:-} == 1 ]] && workers=2
.venv/bin/python -m pytest --phase parallel -n "${PROTOLAB_TEST_WORKERS:-$workers}" --dist loadfile "$@" || parallel=$?
if [[ ${PROTOLAB_DOCKER_TESTS:-} == 1 ]]; then
    docker=0
    wait "$docker_pid" || docker=$?
    cat "$docker_log"
fi
# The type check and the layers (about 13 s of one CPU on a fresh clone) beside the paired phase, whose
# tests judge no figure and leave CPU idle (63% busy on two workers); their output waits in a file until
# it ends.
checks_log=$(mktemp)
{ .venv/bin/mypy && .venv/bin/lint-imports; } >"$checks_log" 2>&1 &
checks_pid=$!
# Three workers, a test file to a worker: a module's run (a module-scoped fixture) happens once, where
# tests handed out one by one ran it once per worker, and two at once took the same run id (299 s
# against 336-345 s on two workers, docs/testing.md).
paired=0
.venv/bin/python -m pytest --phase paired -n 3 --dist loadfile "$@" || paired=$?
checks=0
wait "$checks_pid" || checks=$?
cat "$checks_log"
rm -f "$checks_log"
serial=0
.venv/bin/python -m pytest --phase serial "$@" || serial=$?
# Every phase runs whatever the others gave, so one run shows every failure.
[[ $checks -eq 0 ]] || exit "$checks"  # mypy's or lint-imports' code, never pytest's "nothing selected"
codes=("$parallel" "$docker" "$paired" "$serial")
for code in "${codes[@]}"; do
    if [[ $code -ne 0 && $code -ne $NO_TESTS ]]; then
        exit "$code"
    fi
done
for code in "${codes[@]}"; do
    [[ $code -eq $NO_TESTS ]] || exit 0
done
exit "$NO_TESTS"
