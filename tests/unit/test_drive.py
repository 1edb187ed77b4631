"""The Python driver's parts without a server: its plan from rest.js's environment (execution segments
included), its summary read back by the runner's k6 parser, its raw CSV; and what the matrix does with
its targets (HTTP/3 only through it, its unsupported axes left out and said once, its questions kept
apart from k6's)."""

import asyncio
import itertools
import math
import subprocess
import sys
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import pytest
from labrunner.model.duet import PlannedSide
from labrunner.model.matrix import expand, load_matrix
from labrunner.model.questions import DRIVER_VS_K6, pairs
from labrunner.model.scenario import DRIVER_SCRIPT, Overrides
from labrunner.model.schema import MatrixError
from labrunner.run.drive import load
from labrunner.run.drive.connection import Connection, Reply
from labrunner.run.drive.load import DriveError, Tally, plan_from
from labrunner.run.drive.summary import CLOCK, document, write_csv
from labrunner.run.k6.output import parse_summary, take_latency_samples
from labrunner.run.k6_stats import latency_stats, trend_stats

from tests.support import ROOT

CLOSED = {"BASE_URL": "https://127.0.0.1:8082/", "EXPECT_PROTO": "HTTP/3", "VUS": "5", "DURATION": "1m30s"}
OPEN = {
    "BASE_URL": "https://h:1",
    "LOAD_MODEL": "constant-arrival-rate",
    "RATE": "90",
    "PRE_ALLOCATED_VUS": "7",
}


def test_a_closed_plan_reads_rest_js_environment() -> None:
    plan = plan_from(CLOSED)
    assert (plan.base_url, plan.protocol, plan.vus, plan.max_vus, plan.rate, plan.duration_s) == (
        "https://127.0.0.1:8082", "HTTP/3", 5, 5, None, 90.0,
    )  # fmt: skip
    assert plan.path == "/records?count=100"


def test_a_closed_plan_churns_every_n_requests() -> None:
    assert plan_from(CLOSED | {"CHURN": "10"}).churn == 10
    assert plan_from(CLOSED).churn is None


class _SlowToClose:
    """A connection that replies at once and whose close lasts until `released` is set (as a QUIC
    connection's closing period lasts three probe timeouts); what the run did with it, in `log`."""

    def __init__(self, number: int, released: asyncio.Event, log: list[str]) -> None:
        self.number, self.released, self.log = number, released, log

    async def get(self, path: str) -> Reply:
        self.log.append(f"get {self.number}")
        await asyncio.sleep(0)
        return Reply(200, b'{"records": []}', 0, "HTTP/3")

    async def close(self) -> None:
        self.log.append(f"closing {self.number}")
        await self.released.wait()
        self.log.append(f"closed {self.number}")


def test_a_churning_vu_opens_its_next_connection_while_the_last_one_closes() -> None:
    """The VU goes on to its next connection and requests while the old one is in its closing period;
    the run ends only once every close has ended."""
    log: list[str] = []

    async def churn() -> None:
        released = asyncio.Event()
        asyncio.get_running_loop().call_later(1.0, released.set)  # a VU that waited for a close: no hang
        numbers = itertools.count()

        async def open_connection() -> Connection:
            number = next(numbers)
            if number == 3:  # two churned connections are closing: let them end
                asyncio.get_running_loop().call_later(0.05, released.set)
            return _SlowToClose(number, released, log)

        plan = replace(plan_from(CLOSED | {"CHURN": "1", "VUS": "1", "COUNT": "0"}), duration_s=0.3)
        tally, _ = await load.run(plan, open_connection)
        assert tally.connections >= 3

    asyncio.run(churn())
    assert log.index("get 1") < log.index("closed 0") and log.index("get 2") < log.index("closed 1")
    # Nothing left closing: every connection the run opened was closed, each once.
    opened = {line.split()[1] for line in log if line.startswith("get")}
    for verb in ("closing", "closed"):
        assert sorted(line.split()[1] for line in log if line.startswith(verb)) == sorted(opened), verb


def test_an_open_plan_preallocates_and_may_grow_to_max_vus() -> None:
    assert (plan_from(OPEN).vus, plan_from(OPEN).max_vus, plan_from(OPEN).rate) == (7, 7, 90.0)
    grown = plan_from(OPEN | {"MAX_VUS": "20"})
    assert (grown.vus, grown.max_vus) == (7, 20)


@pytest.mark.parametrize("instances", [2, 3, 4])
def test_execution_segments_share_the_vus_and_the_rate_exactly(instances: int) -> None:
    bounds = [Fraction(i, instances) for i in range(instances + 1)]
    closed = [plan_from(CLOSED, segment) for segment in itertools.pairwise(bounds)]
    opened = [plan_from(OPEN, segment) for segment in itertools.pairwise(bounds)]
    assert sum(p.vus for p in closed) == 5
    assert math.isclose(sum(p.rate or 0 for p in opened), 90.0)
    assert all(p.vus >= 1 for p in closed + opened)


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ({"CHURN": "1", **OPEN}, "CHURN=1 under constant-arrival-rate"),
        ({"CHURN": "never"}, "bad load settings"),
        ({"COMPRESSION": "gzip"}, "COMPRESSION is set"),
        ({"UPLOAD_FILE": "x"}, "UPLOAD_FILE is set"),
        ({"STREAMS": "10"}, "STREAMS is set"),
        ({"LOAD_MODEL": "ramping-vus"}, "LOAD_MODEL=ramping-vus"),
        ({"BASE_URL": ""}, "BASE_URL is not set"),
        ({"VUS": "ten"}, "bad load settings"),
    ],
)
def test_what_the_driver_does_not_run_is_refused_by_name(extra: dict[str, str], said: str) -> None:
    with pytest.raises(DriveError, match=said):
        plan_from(CLOSED | extra)


def test_the_summary_reads_back_as_k6s_with_k6s_statistics(tmp_path: Path) -> None:
    samples = [float(v) for v in (5, 1, 9, 3, 7, 2, 8)]
    tally = Tally(
        latency_ms=samples, failed=1, received_bytes=700, checks_passed=3, iterations=8, connections=6, vus=4
    )
    metrics = parse_summary(document(tally, ran_s=2.0, stats=trend_stats()))
    assert (metrics.requests, metrics.attempts, metrics.errors) == (7, 8, 1)
    assert metrics.requests_per_second == 3.5 and metrics.data_received_bytes == 700
    assert metrics.latency_metric == CLOCK and metrics.latency_count == 7
    assert metrics.latency_ms == latency_stats(samples)  # the same interpolation as k6's
    assert metrics.vus_max == 4 and metrics.connections_opened == 6 and metrics.test_run_seconds == 2.0
    assert metrics.failed_thresholds == ("protolab_req_failed rate<0.01",)  # 1 of 8 failed
    write_csv(tmp_path / "raw.csv", samples)
    assert take_latency_samples(tmp_path / "raw.csv", CLOCK) == samples


def test_a_clean_run_crosses_no_threshold_and_a_failed_check_does() -> None:
    clean = parse_summary(document(Tally(latency_ms=[1.0], checks_passed=2), 1.0, trend_stats()))
    checked = parse_summary(document(Tally(latency_ms=[1.0], checks_failed=1), 1.0, trend_stats()))
    assert clean.failed_thresholds == ()
    assert checked.failed_thresholds == ("checks rate==1.0",)


def test_the_http3_preset_runs_the_three_versions_through_the_driver() -> None:
    plan = expand(load_matrix(ROOT / "matrix.toml"), "local", "http3")
    targets = {s.target.name: s.target for s in plan.scenarios}
    assert set(targets) == {"quart-h1-tls-py", "quart-h2-tls-py", "quart-h3"}
    assert {t.script for t in targets.values()} == {DRIVER_SCRIPT}
    assert targets["quart-h3"].protocol == "http3" and dict(targets["quart-h3"].env) == {"HTTP3": "1"}
    assert {s.network.name for s in plan.scenarios} == {"loopback", "lossy"}


def test_the_driver_leaves_out_what_it_cannot_run_and_says_so_once() -> None:
    matrix = load_matrix(ROOT / "matrix.toml")
    overrides = Overrides(targets=("quart-h3", "quart-h2-tls"), directions=("download", "upload"))
    plan = expand(matrix, "local", "http3", overrides)
    assert {(s.target.name, s.direction) for s in plan.scenarios if s.target.name == "quart-h3"} == {
        ("quart-h3", "download")
    }
    assert ("quart-h2-tls", "upload") in {(s.target.name, s.direction) for s in plan.scenarios}
    assert any(
        "Python driver's targets (quart-h3)" in note and "direction upload" in note for note in plan.notes
    )


def test_the_callers_refuse_the_drivers_targets() -> None:
    matrix = load_matrix(ROOT / "matrix.toml")
    with pytest.raises(MatrixError, match="driven by the Python driver"):
        expand(matrix, "local", "caller", Overrides(targets=("quart-h3",)))


def _pairs(names: tuple[str, ...]) -> set[tuple[str, str, str]]:
    plan = expand(load_matrix(ROOT / "matrix.toml"), "local", "http3", Overrides(targets=names, repeats=1))
    first = [s for s in plan.scenarios if s.network.name == "loopback" and s.profile.name == "quarter"]
    sides = [PlannedSide(s, order) for order, s in enumerate(first)]
    return {(q.kind, c.target, b.target) for q, c, b in pairs(sides)}


def test_questions_compare_the_drivers_targets_with_each_other_and_k6_only_by_its_clock() -> None:
    found = _pairs(("quart-h1-tls-py", "quart-h2-tls-py", "quart-h3", "quart-h1-tls", "quart-h2-tls"))
    assert ("HTTP/3 vs HTTP/2", "quart-h3", "quart-h2-tls-py") in found
    assert ("HTTP/3 vs HTTP/1.1", "quart-h3", "quart-h1-tls-py") in found
    assert ("HTTP/2 vs HTTP/1.1", "quart-h2-tls-py", "quart-h1-tls-py") in found
    assert ("HTTP/2 vs HTTP/1.1", "quart-h2-tls", "quart-h1-tls") in found  # k6's own pair stays
    assert (DRIVER_VS_K6, "quart-h1-tls-py", "quart-h1-tls") in found
    assert (DRIVER_VS_K6, "quart-h2-tls-py", "quart-h2-tls") in found
    # Never across the two clocks for any other question.
    driven = {"quart-h1-tls-py", "quart-h2-tls-py", "quart-h3"}
    across = {(k, c, b) for k, c, b in found if (c in driven) != (b in driven)}
    assert {k for k, _, _ in across} == {DRIVER_VS_K6}


# What a driver of each protocol imports besides the standard library and its own client: its start
# counts in its CPU share (docs/http3.md), and the matrix's pydantic, Faker and the other protocols'
# clients cost it about 0.3 s of CPU.
HEAVY = ("pydantic", "faker", "aiohttp", "h2", "aioquic")
OWN_CLIENT = {"HTTP/1.1": "aiohttp", "HTTP/2.0": "h2", "HTTP/3": "aioquic"}


@pytest.mark.parametrize("protocol", OWN_CLIENT)
def test_a_driver_imports_only_its_own_protocols_client(protocol: str) -> None:
    probe = (
        "import sys; from labrunner.run.drive import main, clients; "
        f"clients.opener({protocol!r}, 'https://127.0.0.1:1', None); "
        f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    completed = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT / "scripts", capture_output=True, text=True, check=True
    )
    assert completed.stdout.split() == [OWN_CLIENT[protocol]], completed.stdout
