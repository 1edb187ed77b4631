"""End to end: run_matrix.py --backend local with real k6, Prometheus and InfluxDB, then the dashboards."""

import json
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from labrunner.observe import local_stack

from tests.dashboard_queries import check_dashboards
from tests.e2e.local_runs import quick_benchmark
from tests.support import ALL_TARGETS, QUICK_CALIBRATION, ROOT, free_ports

pytestmark = pytest.mark.e2e


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def _influx(url: str, query: str) -> list[dict[str, Any]]:
    params = urllib.parse.urlencode({"db": "myk6db", "q": query})
    return _get_json(f"{url}/query?{params}")["results"][0].get("series", [])


def _run_matrix(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "scripts/run_matrix.py", "--backend", "local", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def obs(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Real Prometheus and InfluxDB on free loopback ports, reading a private targets dir."""
    base = tmp_path_factory.mktemp("obs")
    targets = base / "targets"
    targets.mkdir()
    ports = local_stack.Ports(*free_ports(3))
    urls = local_stack.start(base / "data", targets_dir=targets, ports=ports)
    yield {"targets": targets, **urls}
    local_stack.stop(base / "data")


@pytest.fixture(scope="module")
def ci_run(obs: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The ci preset: every target on the small profile, a few seconds each."""
    out = tmp_path_factory.mktemp("run") / "e2e-ci"
    began = datetime.now(UTC)
    completed = _run_matrix(
        "--preset", "ci",
        # Quick calibrations, taken at once: Prometheus and InfluxDB, just started by the obs fixture,
        # used 45% of the host, and each calibration waited 5 s, twice. The default 40 rounds are an
        # interrupt moment's (test_interrupt_moments.py).
        *QUICK_CALIBRATION,
        "--out", str(out),
        "--influxdb", obs["influxdb"],
        "--prometheus", obs["prometheus"],
        "--prometheus-targets", str(obs["targets"]),
    )  # fmt: skip
    time.sleep(4)  # two scrape intervals: the last scenario's final samples reach Prometheus
    results = {
        r["scenario"]["target"]: r
        for r in (json.loads(p.read_text()) for p in (out / "scenarios").glob("*.json"))
    }
    return {
        "completed": completed,
        "out": out,
        "results": results,
        "run_id": out.name,
        "began": began,
        "ended": datetime.now(UTC),
    }


def test_every_target_succeeds_with_its_protocol_verified(ci_run: dict[str, Any]) -> None:
    completed = ci_run["completed"]
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-4000:]
    assert sorted(ci_run["results"]) == sorted(ALL_TARGETS)
    for target, result in ci_run["results"].items():
        assert result["status"] == "ok", (target, result["failure"])
        assert result["verification"]["ok"], target
        metrics = result["k6"]["metrics"]
        assert metrics["requests"] > 0, target
        assert metrics["errors"] == 0, target
    manifest = json.loads((ci_run["out"] / "manifest.json").read_text())
    assert manifest["complete"] is True and manifest["all_ok"] is True
    summary = (ci_run["out"] / "summary.csv").read_text().splitlines()
    assert len(summary) == 1 + len(ALL_TARGETS)
    # Provenance per scenario: the Python build that served and k6's path to it.
    for target, result in ci_run["results"].items():
        build = result["service"]["interpreter"]
        assert build["executable"] == os.path.realpath(sys.executable), (target, build)
        assert result["service"]["network_path"] == "loopback 127.0.0.1: k6 process to service process"
    # One repeat per group: summary.md says so instead of giving an interval.
    assert "(one repeat)" in (ci_run["out"] / "summary.md").read_text()


def test_services_stop_without_a_drain_and_with_a_short_grace_once_k6_is_done(ci_run: dict[str, Any]) -> None:
    logs = sorted((ci_run["out"] / "logs").glob("*.service.log"))
    assert len(logs) == len(ALL_TARGETS)
    for log in logs:
        assert "stopping: draining 0.0 s, grace 1.0 s" in log.read_text(), log.name


def test_service_cpu_stays_within_its_quota_and_is_throttled_when_saturated(ci_run: dict[str, Any]) -> None:
    for target, result in ci_run["results"].items():
        usage = result["service"]["usage"]
        assert result["service"]["limits"].startswith("cgroup"), target
        assert usage["cpu_limit_cores"] == pytest.approx(0.5), target
        # The CFS quota is enforced per 100 ms period: allow one period of slack at the ends.
        assert usage["cpu_utilisation"] <= 1.1, (target, usage)
    # Ten closed-model VUs against half a CPU keep Quart busy: the quota bites. (aiohttp can be
    # bounded by k6 on one CPU instead, more so on a busy host, so it proves nothing here.)
    throttled = [t for t, r in ci_run["results"].items() if r["service"]["usage"]["throttled_periods"] > 0]
    assert "quart-h1" in throttled, throttled


def test_influxdb_holds_the_uniform_metrics_tagged_by_scenario(
    obs: dict[str, Any], ci_run: dict[str, Any]
) -> None:
    run_id = ci_run["run_id"]
    for measurement in ("protolab_reqs", "protolab_req_failed"):
        series = _influx(
            obs["influxdb"],
            f'SELECT count("value") FROM "{measurement}" WHERE "run" = \'{run_id}\' GROUP BY "target"',
        )
        assert sorted(s["tags"]["target"] for s in series) == sorted(ALL_TARGETS), measurement
    marks = _influx(
        obs["influxdb"],
        f'SELECT count("text") FROM "protolab_scenario" WHERE "run" = \'{run_id}\' GROUP BY "scenario"',
    )
    assert len(marks) == len(ALL_TARGETS)
    assert all(s["values"][0][1] == 2 for s in marks), marks  # a start and an end per scenario


def test_prometheus_holds_each_targets_series_with_scenario_labels(
    obs: dict[str, Any], ci_run: dict[str, Any]
) -> None:
    query = f'count by (target, scenario, profile, protocol) (protolab_workers{{run="{ci_run["run_id"]}"}})'
    params = urllib.parse.urlencode(
        {
            "query": query,
            "start": ci_run["began"].timestamp(),
            "end": ci_run["ended"].timestamp(),
            "step": "2",
        }
    )
    series = _get_json(f"{obs['prometheus']}/api/v1/query_range?{params}")["data"]["result"]
    assert sorted(s["metric"]["target"] for s in series) == sorted(ALL_TARGETS)
    for s in series:
        assert s["metric"]["profile"] == "small"
        assert s["metric"]["scenario"].startswith(s["metric"]["target"] + ".")


def test_every_dashboard_panel_has_data_for_the_run(obs: dict[str, Any], ci_run: dict[str, Any]) -> None:
    failures = check_dashboards(
        obs["prometheus"],
        obs["influxdb"],
        ci_run["began"] - timedelta(seconds=5),
        ci_run["ended"],
        {"run": ci_run["run_id"]},
    )
    assert not failures, "\n".join(str(f) for f in failures)


@pytest.mark.paired  # what the run decided: one target failed, the other ran
def test_a_target_that_fails_verification_fails_alone(tmp_path: Path) -> None:
    matrix = tmp_path / "matrix.toml"
    matrix.write_text(
        (ROOT / "matrix.toml").read_text()
        # Hypercorn told to offer HTTP/1.1 only, under a target that expects HTTP/2.
        + '\n[targets.quart-claims-h2]\nservice = "rest_quart"\nscript = "k6/rest.js"\n'
        'protocol = "http2"\ntls = true\nexpect_proto = "HTTP/2.0"\nenv = { ALPN_PROTOCOLS = "http/1.1" }\n'
    )
    out = tmp_path / "broken"
    completed = _run_unobserved(
        matrix, out, "--preset", "ci", "--target", "quart-claims-h2,aiohttp-h1", "--duration", "2s"
    )
    assert completed.returncode == 1, completed.stdout
    results = {
        r["scenario"]["target"]: r
        for r in (json.loads(p.read_text()) for p in (out / "scenarios").glob("*.json"))
    }
    assert results["aiohttp-h1"]["status"] == "ok"
    broken = results["quart-claims-h2"]
    assert broken["status"] == "failed"
    assert broken["failure"]["phase"] == "verify"
    assert "HTTP/1.1" in broken["failure"]["message"], broken["failure"]
    assert "FAILED in verify" in completed.stdout


@pytest.mark.paired  # what the run decided: a duet side failed its check, and its partner with it
def test_a_duet_side_that_fails_verification_fails_its_partner_too(tmp_path: Path) -> None:
    # Hypercorn told to offer HTTP/1.1 only under quart-h2-tls: its check fails, and Quart over
    # HTTP/1.1 beside it is not measured alone (run/duet.py).
    matrix = tmp_path / "matrix.toml"
    text = (ROOT / "matrix.toml").read_text()
    h2_target = '[targets.quart-h2-tls]\nservice = "rest_quart"\nscript = "k6/rest.js"\nprotocol = "http2"\n'
    h2_target += 'tls = true\nexpect_proto = "HTTP/2.0"\nenv = { ALPN_PROTOCOLS = "h2" }\n'
    assert text.count(h2_target) == 1
    matrix.write_text(text.replace(h2_target, h2_target.replace('"h2"', '"http/1.1"')))
    out = tmp_path / "broken-duet"
    completed = _run_unobserved(
        matrix,
        out,
        *("--target", "quart-h2-tls,quart-h1-tls", "--load-model", "closed", "--repeats", "1"),
        *("--duet", "on", "--control", "quart-h1-tls", "--warmup", "0", "--duration", "2s", "--budget", "0s"),
    )
    assert completed.returncode == 1, completed.stdout
    results = {p.stem: json.loads(p.read_text()) for p in (out / "scenarios").glob("*.json")}
    h2 = results["quart-h2-tls.quarter.c100.closed.vs-quart-h1-tls.r1"]
    h1 = results["quart-h1-tls.quarter.c100.closed.vs-quart-h2-tls.r1"]
    assert h2["failure"]["phase"] == "verify", h2["failure"]
    assert h1["status"] == "failed"
    assert h1["failure"]["phase"] == "duet"
    assert f"its partner {h2['scenario_id']} failed in verify" in h1["failure"]["message"]
    # The A/A control of quart-h1-tls ran, both sides at once.
    assert [results[f"quart-h1-tls.quarter.c100.closed.aa{side}.r1"]["status"] for side in (1, 2)] == [
        "ok"
    ] * 2


def _run_unobserved(matrix: Path, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """A quick run of `matrix` into `out` without Prometheus or InfluxDB: what it decided is under
    test, not its observation, its serialization benchmark or its calibration."""
    quick_benchmark(out)
    return _run_matrix(
        *QUICK_CALIBRATION,
        "--matrix", str(matrix),
        *args,
        "--out", str(out),
        "--influxdb", "none",
        "--prometheus", "none",
        "--prometheus-targets", "",
    )  # fmt: skip
