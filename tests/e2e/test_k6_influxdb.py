"""k6's metrics reach InfluxDB with only the tags the dashboards group by: a real k6 run of k6/rest.js
against an in-test REST server, into a local InfluxDB.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from labrunner.observe import local_stack
from labrunner.observe.labels import INFLUXDB_DATABASE

from tests.e2e.k6_servers import RecordsServer, free_port, rest_env, run_k6

pytestmark = [pytest.mark.parallel, pytest.mark.timeout(120)]  # answers checked, nothing measured


def influx_series(influx_url: str, query: str) -> list[dict[str, Any]]:
    params = urllib.parse.urlencode({"db": INFLUXDB_DATABASE, "q": query})
    with urllib.request.urlopen(f"{influx_url}/query?{params}", timeout=10) as resp:
        series: list[dict[str, Any]] = json.load(resp)["results"][0].get("series", [])
    return series


def influx_count(influx_url: str, query: str) -> int:
    series = influx_series(influx_url, query)
    return int(series[0]["values"][0][1]) if series else 0


def test_k6_metrics_reach_influxdb(tmp_path: Path) -> None:
    ports = local_stack.Ports(prometheus=free_port(), influxdb=free_port(), influxdb_rpc=free_port())
    obs_dir = tmp_path / "obs"
    try:
        urls = local_stack.start(obs_dir, targets_dir=tmp_path / "targets", ports=ports)
        with RecordsServer() as server:
            result = run_k6(
                "rest.js",
                rest_env(server),
                "--out",
                f"influxdb={urls['influxdb']}/{INFLUXDB_DATABASE}",
                "--tag",
                "scenario=influx-test",
            )
        assert result.returncode == 0, result.stderr
        count = influx_count(
            urls["influxdb"], """SELECT sum("value") FROM "protolab_reqs" WHERE "scenario" = 'influx-test'"""
        )
        assert count > 0
        # Each point carries the tags the dashboards group by and nothing constant besides the
        # runner's: no url or name (the URL, as a tag and as a string field), group, tls_version;
        # decoded: whether k6 decoded the reply, which the lab's latency clock leaves out.
        [tags] = influx_series(urls["influxdb"], 'SHOW TAG KEYS FROM "http_req_duration"')
        kept = {"decoded", "expected_response", "method", "proto", "scenario", "status"}
        assert {key for [key] in tags["values"]} == kept
        [fields] = influx_series(urls["influxdb"], 'SHOW FIELD KEYS FROM "http_req_duration"')
        assert fields["values"] == [["value", "float"]]
    finally:
        local_stack.stop(obs_dir)
