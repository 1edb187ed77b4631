"""The dashboard query executor: Grafana's macro and escaping rules, and every panel against live backends."""

import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from tests import dashboard_queries as dq
from tests.support import ROOT, free_ports

# Sockets on ephemeral ports, its own files, no CPU measured: beside other tests (tests/conftest.py).
pytestmark = pytest.mark.parallel

RUN = "20250101T000000Z-test"
PROFILE = "small"
CONNECTIONS = "10x1"  # the connection model label the runner adds (observe.labels)
CHURN = "never"  # and the churn label
COMPRESSION = "identity"  # and the compression label
# Scenario id -> (target, runner's protocol tag, kind of k6 script).
SCENARIOS = {
    "aiohttp-h1.small": ("aiohttp-h1", "h1", "rest"),
    "grpc.small": ("grpc", "grpc", "unary"),
    "grpc-stream.small": ("grpc-stream", "grpc", "stream"),
}
LOAD_SECONDS = 20
REQUESTS_PER_SECOND = 20


# Pure rules ------------------------------------------------------------------------------------------


def test_round_interval_and_text_follow_grafana():
    assert dq.round_interval(40) == 50
    assert dq.round_interval(1_200) == 1_000
    assert dq.round_interval(100_000) == 120_000
    assert [dq.interval_text(ms) for ms in (500, 2_000, 120_000, 86_400_000)] == ["500ms", "2s", "2m", "1d"]


def test_single_value_is_not_escaped_for_influxdb_but_quoted_for_prometheus():
    run = dq.Variable(multi=False, include_all=False, values=("a.b'c",))
    assert dq.format_variable(run, "influxdb", None) == "a.b'c"
    assert dq.format_variable(run, "prometheus", None) == "a.b\\\\'c"


def test_multi_values_become_an_escaped_alternation():
    scenario = dq.Variable(multi=True, include_all=True, values=("a.b", "c/d"))
    assert dq.format_variable(scenario, "influxdb", None) == "(a\\.b|c\\/d)"
    # PromQL strings need the regex backslash doubled.
    assert dq.format_variable(scenario, "prometheus", None) == "(a\\\\.b|c/d)"
    assert dq.format_variable(scenario, "prometheus", "regex") == "(a\\.b|c\\/d)"
    assert dq.format_variable(scenario, "influxdb", "pipe") == "a.b|c/d"


def test_custom_all_value_is_used_verbatim():
    scenario = dq.Variable(multi=True, include_all=True, values=("a", "b"), all_value=".*")
    assert dq.format_variable(scenario, "influxdb", None) == ".*"


def test_interpolate_macros_and_all_syntaxes():
    variables = {"run": dq.Variable(False, False, ("r1",)), "scenario": dq.Variable(True, True, ("s1", "s2"))}
    macros = {"timeFilter": "time >= 1ms and time <= 2ms", "__interval": "2s", "__interval_ms": "2000"}
    query = (
        'SELECT sum("value") * 1000 / $__interval_ms WHERE $timeFilter AND "run" =~ /^$run$/'
        ' AND "scenario" =~ /^${scenario}$/ GROUP BY time($__interval), [[scenario:csv]] $unknown'
    )
    assert dq.interpolate(query, variables, macros, "influxdb") == (
        'SELECT sum("value") * 1000 / 2000 WHERE time >= 1ms and time <= 2ms AND "run" =~ /^r1$/'
        ' AND "scenario" =~ /^(s1|s2)$/ GROUP BY time(2s), s1,s2 $unknown'
    )


def test_variable_sort_orders():
    assert dq.sort_values(["b", "a", "c"], 1) == ["a", "b", "c"]
    assert dq.sort_values(["b", "a", "c"], 2) == ["c", "b", "a"]
    assert dq.sort_values(["x10", "x9"], 3) == ["x9", "x10"]


# Live: real Prometheus and InfluxDB fed with data shaped like the lab's ------------------------------


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed (Debian packages prometheus and influxdb)")
    return path


def _wait_http(url: str, process: subprocess.Popen[bytes], log: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"{process.args[0]} exited:\n{log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    pytest.fail(f"{url} not ready after {timeout}s:\n{log.read_text()[-2000:]}")


class FakeService(Collector):
    """The metrics a protolab service exposes, with counters growing as if under steady load."""

    def __init__(self, kind: str) -> None:
        self._kind = kind
        self._start = time.monotonic()

    def collect(self) -> Iterable[Metric]:
        t = time.monotonic() - self._start
        requests = REQUESTS_PER_SECOND * t
        if self._kind == "rest":
            histogram = HistogramMetricFamily(
                "http_server_request_duration_seconds",
                "Duration of HTTP server requests.",
                labels=[
                    "http_request_method",
                    "http_route",
                    "http_response_status_code",
                    "network_protocol_version",
                ],
            )
            histogram.add_metric(["GET", "/records", "200", "1.1"], _buckets(requests), requests * 0.004)
            yield histogram
        else:
            grpc = ["unary", "protolab.cars.v1.RecordService", "ListRecords"]
            names = ["grpc_type", "grpc_service", "grpc_method"]
            for name, value in (("started", requests), ("msg_received", requests), ("msg_sent", requests)):
                family = CounterMetricFamily(f"grpc_server_{name}", name, labels=names)
                family.add_metric(grpc, value)
                yield family
            handled = CounterMetricFamily("grpc_server_handled", "handled", labels=[*names, "grpc_code"])
            handled.add_metric([*grpc, "OK"], requests)
            yield handled
            histogram = HistogramMetricFamily("grpc_server_handling_seconds", "handling", labels=names)
            histogram.add_metric(grpc, _buckets(requests), requests * 0.004)
            yield histogram
        for name, value in (
            ("cpu_usage_seconds", 0.4 * t),
            ("cpu_periods", 10 * t),
            ("cpu_throttled_periods", 2 * t),
            ("cpu_throttled_seconds", 0.05 * t),
        ):
            yield CounterMetricFamily(f"protolab_cgroup_{name}", name, value=value)
        for name, value in (
            ("cpu_limit_cores", 0.5),
            ("memory_usage_bytes", 80e6),
            ("memory_peak_bytes", 90e6),
            ("memory_limit_bytes", 512e6),
        ):
            yield GaugeMetricFamily(f"protolab_cgroup_{name}", name, value=value)
        yield GaugeMetricFamily("protolab_workers", "workers", value=1)
        yield InfoMetricFamily("protolab_build", "versions", value={"service": self._kind, "python": "3.11"})


def _buckets(count: float) -> list[tuple[str, float]]:
    return [("0.001", count * 0.1), ("0.005", count * 0.6), ("0.01", count * 0.95), ("+Inf", count)]


def _k6_lines(now_ns: int) -> str:
    """Line protocol shaped like k6's InfluxDB output for each scenario, plus the runner's windows."""
    lines = []
    start_ns = now_ns - LOAD_SECONDS * 10**9
    for scenario, (target, protocol, kind) in SCENARIOS.items():
        tags = (
            f"run={RUN},scenario={scenario},target={target},protocol={protocol},profile={PROFILE},"
            f"connections={CONNECTIONS},churn={CHURN},compression={COMPRESSION}"
        )
        for event, ts in (("start", start_ns), ("end", now_ns)):
            lines.append(f'protolab_scenario,{tags} event="{event}",text="{scenario} {event}" {ts}')
        for second in range(LOAD_SECONDS):
            lines.append(f"vus,{tags} value=2 {start_ns + second * 10**9}")
        for i in range(LOAD_SECONDS * REQUESTS_PER_SECOND):
            ts = start_ns + i * 10**9 // REQUESTS_PER_SECOND
            duration = 2 + i % 7
            samples = [
                ("protolab_reqs", "", 1),
                ("protolab_req_failed", "", 0),
                ("data_received", "", 15_000),
                ("data_sent", "", 100),
                ("checks", r",check=status\ is\ 200", 1),
            ]
            if kind == "rest":
                # decoded=no: a request k6 did not decode for checking, which the lab's clock times.
                http = ",decoded=no,expected_response=true,method=GET,proto=HTTP/1.1,status=200"
                samples += [
                    ("http_reqs", http, 1),
                    ("http_req_failed", http, 0),
                    ("http_req_duration", http, duration),
                ]
                samples += [(phase, http, 0.1) for phase in ("http_req_blocked", "http_req_connecting")]
                samples += [(phase, http, 0.1) for phase in ("http_req_tls_handshaking", "http_req_sending")]
                samples += [(phase, http, duration) for phase in ("http_req_waiting", "http_req_receiving")]
            else:
                method = "ListRecords" if kind == "unary" else "StreamRecords"
                rpc = f",decoded=no,method={method}"
                samples.append(("grpc_req_duration", f"{rpc},status=0", duration))
                if kind == "stream":
                    samples += [("grpc_streams", rpc, 1), ("grpc_streams_msgs_sent", rpc, 1)]
                    samples.append(("grpc_streams_msgs_received", rpc, 100))
            lines.extend(f"{name},{tags}{extra} value={value} {ts}" for name, extra, value in samples)
    return "\n".join(lines)


@dataclass(frozen=True)
class Backends:
    prometheus: str
    influxdb: str
    start: datetime


@pytest.fixture(scope="module")
def backends(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backends]:
    """Real Prometheus scraping fake services and real InfluxDB holding k6-shaped points."""
    tmp = tmp_path_factory.mktemp("observability")
    start = datetime.now(UTC)
    servers = {}
    for kind in ("rest", "grpc"):
        registry = CollectorRegistry()
        registry.register(FakeService(kind))
        servers[kind] = start_http_server(0, addr="127.0.0.1", registry=registry)[0]
    static_configs = [
        {
            "targets": [f"127.0.0.1:{servers['rest' if kind == 'rest' else 'grpc'].server_port}"],
            "labels": {
                "run": RUN,
                "scenario": scenario,
                "target": target,
                "protocol": protocol,
                "profile": PROFILE,
                "connections": CONNECTIONS,
                "churn": CHURN,
                "compression": COMPRESSION,
                "service": "rest_aiohttp" if kind == "rest" else "grpc_aio",
            },
        }
        for scenario, (target, protocol, kind) in SCENARIOS.items()
    ]
    config = {
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [{"job_name": "fake", "static_configs": static_configs}],
    }
    (tmp / "prometheus.yml").write_text(json.dumps(config))
    prom_port, influx_port, influx_rpc_port = free_ports(3)
    prom_log, influx_log = tmp / "prometheus.log", tmp / "influxd.log"
    processes = []
    try:
        with prom_log.open("wb") as log:
            processes.append(
                subprocess.Popen(
                    [
                        _binary("prometheus"),
                        f"--config.file={tmp / 'prometheus.yml'}",
                        f"--storage.tsdb.path={tmp / 'tsdb'}",
                        f"--web.listen-address=127.0.0.1:{prom_port}",
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        env = {
            **os.environ,
            "INFLUXDB_HTTP_BIND_ADDRESS": f"127.0.0.1:{influx_port}",
            "INFLUXDB_BIND_ADDRESS": f"127.0.0.1:{influx_rpc_port}",
            "INFLUXDB_META_DIR": str(tmp / "influx" / "meta"),
            "INFLUXDB_DATA_DIR": str(tmp / "influx" / "data"),
            "INFLUXDB_DATA_WAL_DIR": str(tmp / "influx" / "wal"),
            "INFLUXDB_REPORTING_DISABLED": "true",
        }
        with influx_log.open("wb") as log:
            processes.append(
                subprocess.Popen(
                    [_binary("influxd"), "-config", str(ROOT / "influxdb" / "influxdb.conf")],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
            )
        prometheus, influxdb = f"http://127.0.0.1:{prom_port}", f"http://127.0.0.1:{influx_port}"
        _wait_http(f"{prometheus}/-/ready", processes[0], prom_log)
        _wait_http(f"{influxdb}/ping", processes[1], influx_log)
        _post(f"{influxdb}/query", urllib.parse.urlencode({"q": "CREATE DATABASE myk6db"}).encode())
        _post(f"{influxdb}/write?db=myk6db", _k6_lines(time.time_ns()).encode())
        _wait_scrapes(prometheus, len(SCENARIOS), samples=6)
        yield Backends(prometheus, influxdb, start - timedelta(seconds=LOAD_SECONDS + 5))
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=20)
        for server in servers.values():
            server.shutdown()


def _post(url: str, body: bytes) -> None:
    with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=30) as response:
        assert response.status < 300


def _wait_scrapes(prometheus: str, targets: int, samples: int, timeout: float = 30) -> None:
    """Until every target has enough samples for rate() over Grafana's smallest $__rate_interval."""
    query = urllib.parse.urlencode({"query": f"count_over_time(protolab_workers[1m]) >= {samples}"})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{prometheus}/api/v1/query?{query}", timeout=5) as response:
            if len(json.load(response)["data"]["result"]) == targets:
                return
        time.sleep(0.5)
    pytest.fail(f"Prometheus did not scrape {targets} targets {samples} times in {timeout}s")


@pytest.mark.paired  # real Prometheus and InfluxDB fed fake services and k6-shaped points: data or not
def test_every_query_of_every_dashboard_returns_data(backends: Backends):
    results = dq.run_dashboards(
        backends.prometheus, backends.influxdb, backends.start, datetime.now(UTC), {"run": RUN}
    )
    dashboards = {r.dashboard for r in results}
    assert dashboards == {
        "protolab-k6-http",
        "protolab-k6-grpc",
        "protolab-service",
        "protolab-grpc-server",
        "protolab-matrix",
    }
    failures = [str(r) for r in results if not r.ok]
    assert not failures, "\n".join(failures)


@pytest.mark.paired  # real Prometheus and InfluxDB fed fake services and k6-shaped points: data or not
def test_variables_default_to_all_and_narrow_in_order(backends: Backends):
    path = ROOT / "grafana" / "dashboards" / "k6-grpc.json"
    results = dq.run_dashboards(
        backends.prometheus, backends.influxdb, backends.start, datetime.now(UTC), {"run": RUN}, [path]
    )
    scenario = next(r for r in results if r.location == "variable scenario")
    # The two gRPC scenarios only, filtered by the targets the target variable found.
    assert scenario.series == 2
    assert '"target" =~ /^(grpc|grpc-stream)$/' in scenario.query


@pytest.mark.paired  # real Prometheus and InfluxDB fed fake services and k6-shaped points: data or not
def test_dead_panels_bad_queries_and_unknown_datasources_are_failures(backends: Backends, tmp_path: Path):
    prometheus = {"type": "prometheus", "uid": "protolab-prometheus"}
    influxdb = {"type": "influxdb", "uid": "protolab-influxdb"}
    targets = {
        "alive": (prometheus, {"expr": 'protolab_workers{run="$run"}'}),
        "dead": (prometheus, {"expr": "no_such_metric"}),
        "broken": (prometheus, {"expr": "rate(protolab_workers["}),
        "dead influx": (
            influxdb,
            {"query": 'SELECT sum("value") FROM "nothing" WHERE $timeFilter', "rawQuery": True},
        ),
        "unknown": ({"type": "prometheus", "uid": "elsewhere"}, {"expr": "up"}),
    }
    run_variable = {"name": "run", "type": "query", "datasource": prometheus, "query": "label_values(run)"}
    dashboard = {
        "uid": "test",
        "templating": {"list": [run_variable]},
        "panels": [
            {"type": "timeseries", "title": title, "datasource": ds, "targets": [{"refId": "A", **target}]}
            for title, (ds, target) in targets.items()
        ],
    }
    path = tmp_path / "dashboard.json"
    path.write_text(json.dumps(dashboard))
    failures = dq.check_dashboards(
        backends.prometheus, backends.influxdb, backends.start, datetime.now(UTC), None, [path]
    )
    reasons = {f.location: f.reason for f in failures}
    assert set(reasons) == {
        "panel 'dead' A",
        "panel 'broken' A",
        "panel 'dead influx' A",
        "panel 'unknown' A",
    }
    assert reasons["panel 'dead' A"] == "no data"
    assert "parse error" in reasons["panel 'broken' A"]
    assert "not provisioned" in reasons["panel 'unknown' A"]
