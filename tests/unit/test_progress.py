"""What a person sees while a run goes: the per-scenario line, plain output off a terminal, the live
line's text, --version, --list, the backend's sentence and the Grafana URL at the end of a docker run."""

import io
import json
import re
import subprocess
import sys
import tomllib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from labrunner.backends.base import Endpoint, ServiceHandle, ServiceUsage
from labrunner.cli import grafana, listing
from labrunner.cli import live as live_line
from labrunner.cli.progress import outcome_line
from labrunner.model.matrix import expand, load_matrix
from labrunner.model.scenario import Scenario
from labrunner.results import trust
from labrunner.results.record import judge_outcome
from labrunner.run import live
from labrunner.run.k6.invocation import K6Setup
from labrunner.run.k6.result import K6Run
from labrunner.run.live import Counts, Window
from labrunner.run.outcome import ScenarioOutcome

from tests.support import ROOT

# A terminal's line, about: the longest id of every preset (an upload's, aiohttp-h1-tls...c1000
# .closed.upload in the payload preset's 240 scenarios) with one flag fits.
MAX_LINE = 155
ANSI_ESCAPE = re.compile(r"\x1b\[")


def _longest_lines() -> dict[str, str]:
    """Each preset's longest "[n/n] id" on either backend (the floor preset's prebuilt ids are
    longer still: its lines run to about 160 characters)."""
    matrix = load_matrix(ROOT / "matrix.toml")
    found: dict[str, str] = {}
    for backend in ("local", "docker"):
        for preset in matrix.presets:
            if preset == "floor":
                continue
            scenarios = expand(matrix, backend, preset).scenarios
            longest = max(scenarios, key=lambda s: len(s.id))
            prefix = f"[{len(scenarios)}/{len(scenarios)}] {longest.id}"
            if len(prefix) > len(found.get(preset, "")):
                found[preset] = prefix
    return found


def _scenario() -> Scenario:
    return expand(load_matrix(ROOT / "matrix.toml"), "local", "default").scenarios[0]


def _summary(requests: int, failed: int, p99_ms: float) -> dict[str, Any]:
    attempts = requests + failed
    return {
        "metrics": {
            "protolab_reqs": {"values": {"count": requests, "rate": requests / 10.0}},
            "protolab_req_failed": {
                "values": {"rate": failed / attempts, "passes": failed, "fails": requests}
            },
            "protolab_req_duration": {"values": {"avg": p99_ms / 3, "p(99)": p99_ms, "max": p99_ms * 2}},
        },
        "state": {"testRunDurationMs": 10_000.0},
    }


def _host(service: float, k6: float, steal: float, relay: float | None) -> dict[str, Any]:
    k6_figure: dict[str, Any] = {"cpus": [0], "share": k6, "others_cpu_seconds": k6 * 10}
    if relay is not None:
        k6_figure |= {"relay_share": relay, "relay_cpu_seconds": relay * 10}
    return {
        "measured": True,
        "interference": {
            "service_cpus": {"cpus": [1], "share": service, "others_cpu_seconds": service * 10},
            "k6_cpus": k6_figure,
            "shared": False,
        },
        "steal_share": steal,
        "steal_seconds": steal * 20,
    }


def _outcome(
    scenario: Scenario,
    *,
    requests: int = 9_120,
    failed: int = 0,
    p99_ms: float = 95.1,
    service_cpu_s: float = 2.5,
    k6_cpu: float = 0.31,
    host: dict[str, Any] | None = None,
) -> ScenarioOutcome:
    address = Endpoint("127.0.0.1", 40000)
    handle = ServiceHandle(
        scenario.id, scenario.target.service, address, address, None, None, 1, "cgroup-v2", (1,), (0,), ()
    )
    usage = ServiceUsage(10.2, service_cpu_s, 0.25, 100, 90, 5.0, 2**27, "window", 2**29, 0, "")
    k6_run = K6Run(0, _summary(requests, failed, p99_ms), 10.5, k6_cpu * 10, 1, "")
    return ScenarioOutcome(
        run_id="r",
        backend="local",
        scenario=scenario,
        started_at=datetime(2026, 1, 1, tzinfo=UTC),
        finished_at=datetime(2026, 1, 1, 0, 0, 15, tzinfo=UTC),
        failure=None,
        handle=handle,
        verification=None,
        k6_run=k6_run,
        usage=usage,
        timings_s={"warmup": 3.0, "measure": 10.5, "overhead": 1.8, "total": 15.3},
        host=host if host is not None else _host(0.008, 0.021, 0.0, None),
    )


def test_the_result_line_fits_a_terminal_suspect_or_not() -> None:
    scenario = _scenario()
    cases = {
        "clean": _outcome(scenario),
        "interference": _outcome(scenario, host=_host(0.123, 0.021, 0.0, None)),
        "relay and steal": _outcome(scenario, host=_host(0.061, 0.125, 0.062, 0.1)),
        "k6 saturated, not CPU-bound": _outcome(scenario, requests=123_456, service_cpu_s=1.0, k6_cpu=0.97),
        "errors": _outcome(scenario, requests=9_000, failed=1_234, p99_ms=1_234.5),
    }
    bodies = {name: (outcome_line(o, judge_outcome(o)), judge_outcome(o)) for name, o in cases.items()}
    for preset, prefix in _longest_lines().items():
        for name, (body, verdict) in bodies.items():
            line = f"{prefix}: {body}"
            # At most MAX_LINE with one flag, on the longest id of every preset; a few more when
            # two kinds of reason make it suspect.
            limit = MAX_LINE if len(verdict.flags) <= 1 else MAX_LINE + 10
            assert len(line) <= limit, (preset, name, len(line), line)
            assert "\n" not in line
    for name, (body, verdict) in bodies.items():
        if verdict.suspect:  # the reasons' words are for summary.md; the line has their flags
            assert body.endswith(f" SUSPECT:{','.join(verdict.flags)}"), name
            assert not any(reason in body for reason in verdict.suspect)
    lines = {name: body for name, (body, _) in bodies.items()}
    assert lines["clean"] == "ok 912 req/s, p99 95.1 ms, 0 err, svc 100%, k6 31%, others 0.8/2.1% (15.3 s)"
    assert lines["interference"].endswith(f"SUSPECT:{trust.FLAG_INTERFERENCE}")
    assert "others 6.1/12.5% (15.3 s)" in lines["relay and steal"]  # relay and steal: in summary.md
    assert lines["relay and steal"].endswith(f"SUSPECT:{trust.FLAG_INTERFERENCE},{trust.FLAG_STEAL}")
    saturated = lines["k6 saturated, not CPU-bound"]
    assert "ok >=12346 req/s" in saturated  # a lower bound says so
    assert saturated.endswith(f"SUSPECT:{trust.FLAG_K6_SATURATED},{trust.FLAG_NOT_CPU_BOUND}")
    assert "1234 err" in lines["errors"] and lines["errors"].endswith(f"SUSPECT:{trust.FLAG_ERRORS}")


def test_every_reason_the_judge_gives_has_a_flag() -> None:
    scenario = _scenario()
    outcome = _outcome(
        scenario, failed=5_000, service_cpu_s=1.0, k6_cpu=0.97, host=_host(0.2, 0.2, 0.2, None)
    )
    verdict = judge_outcome(outcome)
    assert len(verdict.suspect) == 6  # interference on each CPU set: two sentences, one flag
    assert verdict.flags == (
        trust.FLAG_K6_SATURATED,
        trust.FLAG_ERRORS,
        trust.FLAG_NOT_CPU_BOUND,
        trust.FLAG_INTERFERENCE,
        trust.FLAG_STEAL,
    )


def test_off_a_terminal_there_is_no_live_line_and_no_escape_codes() -> None:
    assert live_line.watch_for(io.StringIO()) is None
    # The entry point in a pipe: every line plain.
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "run_matrix.py"), "--dry-run", "--preset", "ci"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    assert out.startswith("backend: ") and not ANSI_ESCAPE.search(out)


def test_the_live_line_text() -> None:
    window = Window("grpc.quarter.c100.closed.r1", 30.0, ("127.0.0.1:1",))
    assert live_line.line(window, 12.4, None) == "  measuring grpc.quarter.c100.closed.r1: 12/30 s"
    assert live_line.line(window, 12.4, Counts(14_436, 1203.2, 0)).endswith(
        ": 12/30 s, 1,203 req/s, 0 errors"
    )
    assert live_line.line(window, 3, Counts(0, 0.0, None)).endswith("every request failing")


def test_the_live_line_on_a_terminal_is_transient(tmp_path: Path) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    watch = live_line.watch_for(terminal)
    assert watch is not None
    with watch(Window("grpc.quarter.c100.closed.r1", 2.0, ())):
        pass
    shown = terminal.getvalue()
    assert "measuring grpc.quarter.c100.closed.r1: 0/2 s" in shown
    assert "\x1b[" in shown  # drawn, then erased: nothing of it stays in the scrollback


@pytest.mark.parametrize("script", ["run_matrix.py", "report.py"])
def test_version_names_the_package_version_and_the_commit(script: str) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / script), "--version"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout.strip()
    sha = subprocess.run(
        ["git", "rev-parse", "--short=7", "HEAD"], capture_output=True, text=True, cwd=ROOT, check=True
    )
    release = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    pattern = rf"{re.escape(script)} {re.escape(release)} \(git [0-9a-f]{{7}}(, uncommitted changes)?\)"
    assert re.fullmatch(pattern, out), out
    assert sha.stdout.strip() in out


def test_list_has_aligned_columns_and_no_python_reprs() -> None:
    text = listing.describe_matrix(load_matrix(ROOT / "matrix.toml"))
    assert not re.search(r"[{}\[\]']", text), text
    sections = text.split("\n\n")[1:]
    assert len(sections) == 5
    for section in sections:
        rows = [line for line in section.splitlines()[1:]]
        # Each column starts where the header-less table says: the second column at one offset.
        starts = {re.match(r"  \S+\s+", row).end() for row in rows if re.match(r"  \S+\s+\S", row)}  # type: ignore[union-attr]
        assert len(starts) == 1, section
    assert "local profiles=quarter" in text


def test_the_grafana_url_of_a_docker_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(grafana.URL_VARIABLE, raising=False)
    manifest = {
        "run_id": "20260101-120000",
        "backend": {"name": "docker", "reason": "requested"},
        "started_at": "2026-01-01T12:00:00+00:00",
        "finished_at": "2026-01-01T12:07:30.500000+00:00",
    }
    url = grafana.dashboard_url(manifest)
    assert url is not None
    parts = urlsplit(url)
    dashboard = json.loads((ROOT / "grafana" / "dashboards" / "matrix.json").read_text())
    assert f"{parts.scheme}://{parts.netloc}" == "http://127.0.0.1:3000"
    assert parts.path == f"/d/{dashboard['uid']}"
    query = parse_qs(parts.query)
    assert query == {"var-run": ["20260101-120000"], "from": ["1767268800000"], "to": ["1767269250500"]}
    assert "run" in [v["name"] for v in dashboard["templating"]["list"]]
    monkeypatch.setenv(grafana.URL_VARIABLE, "https://grafana.example.org/")
    assert (grafana.dashboard_url(manifest) or "").startswith("https://grafana.example.org/d/")
    assert grafana.dashboard_url({**manifest, "backend": {"name": "local"}}) is None


def test_the_measured_invocation_serves_k6s_api_on_a_local_port_per_instance(tmp_path: Path) -> None:
    scenario = _scenario()
    handle = _outcome(scenario).handle
    assert handle is not None

    def build(api: bool, instances: int) -> Any:
        return K6Setup(
            scenario,
            handle,
            run_id="r",
            root=ROOT,
            ca_file=tmp_path / "ca.pem",
            k6_dir=tmp_path,
            log_file=tmp_path / "k6.log",
            influxdb_url=None,
            instances=instances,
            api=api,
        ).window()

    assert live.api_addresses(build(False, 1)) == ()  # off unless a live line shows it
    (one,) = live.api_addresses(build(True, 1))
    split = live.api_addresses(build(True, 2))
    assert len(split) == 2 and len(set(split)) == 2
    assert all(re.fullmatch(r"127\.0\.0\.1:\d+", a) for a in (one, *split))
