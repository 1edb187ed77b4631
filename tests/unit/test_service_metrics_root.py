"""The tests' services share one metrics root per pytest process (tests/support.py), however they start."""

import tempfile
import threading
from pathlib import Path

import pytest

from tests import support


def test_services_started_from_threads_at_once_share_one_metrics_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As test_compose_native.py's fixture starts its services: from threads, at the same moment. Each
    # thread's directory lies under the one root pytest_unconfigure removes, and no other root is made.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(support, "_SERVICE_METRICS_ROOT", [])
    barrier = threading.Barrier(16)
    made: list[str] = []

    def start() -> None:
        barrier.wait()
        made.append(support._service_metrics_dir())

    threads = [threading.Thread(target=start) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    root = support.service_metrics_root()
    assert root is not None and list(tmp_path.iterdir()) == [root]
    assert sorted(Path(d).parent for d in made) == [root] * 16
