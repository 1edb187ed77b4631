"""Where a forked worker's records are made: in the worker, after the fork, never in the supervisor
(a pool loaded before the fork cost an aiohttp worker 13% more CPU per request: docs/results.md)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support import ROOT

# Sockets on ephemeral ports, its own files, no CPU measured: beside other tests (tests/conftest.py).
pytestmark = pytest.mark.parallel

# A supervisor with two workers that each read their records once, report a port, and end; every call
# of record_source is logged with the pid it ran in.
SCRIPT = textwrap.dedent(
    """
    import os, sys
    from services.common import supervisor
    from services.common.config import load_settings

    log = sys.argv[1]
    build = supervisor.record_source

    def logged(settings):
        with open(log, "a") as file:
            file.write(f"{os.getpid()}\\n")
        return build(settings)

    supervisor.record_source = logged

    def worker_main(context):
        assert len(context.records.records(5, 0)) == 5
        assert context.records is context.records  # loaded once per worker
        context.report_listening(1234)

    print("supervisor", os.getpid(), flush=True)
    supervisor.run_service("rest_aiohttp", "test", load_settings("rest_aiohttp"), worker_main,
                           serve_metrics=False)
    """
)


def test_each_worker_loads_its_records_after_the_fork(tmp_path: Path) -> None:
    log = tmp_path / "record_source.log"
    env = {**os.environ, "WORKERS": "2", "RECORD_POOL_SIZE": "50", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(log)],
        check=False,
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    supervisor_pid = int(done.stdout.split()[1])
    loaded_in = [int(line) for line in log.read_text().split()]
    assert len(loaded_in) == 2, done.stderr  # one load per worker
    assert supervisor_pid not in loaded_in, "the supervisor built the records before forking"
    assert len(set(loaded_in)) == 2
