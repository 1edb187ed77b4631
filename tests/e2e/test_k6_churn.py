"""Connection churn (CHURN, k6/lib/common.js) with real k6 against in-test servers on 127.0.0.1: with
CHURN=N each VU replaces its connection after every N calls it made on it, so a server accepts, per VU,
its calls / N connections rounded up; without CHURN, one per VU. Each server sits behind a relay that
counts the TCP connections k6 opens (CountingRelay: grpcio cannot count its own), and k6's
protolab_connections says the same number. REST over HTTP/1.1 and over HTTP/2 (TLS) sends
`Connection: close` on a connection's last request (the HTTP/1.1 servers say it back, as the lab's do:
k6_servers.send_json), gRPC (unary, over TLS too, and streaming) closes its client. A fixed number of
calls (shared-iterations), never a duration, so every count is exact;
how many of them each VU took, k6's own points say (`--out json`, tagged by VU). A CHURN that is no
positive integer, or beside STREAMS > 1, stops k6 before any load."""

import json
import math
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson
import pytest

from services.common.records import checksum, load_pool, record_from_json
from tests.e2e.k6_servers import (
    K6_SCRIPT_EXCEPTION,
    CountingRelay,
    GrpcServer,
    RecordsServer,
    hypercorn_tls,
    load_summary,
    run_k6,
    send_json,
    write_h2_app,
)
from tests.support import ROOT, fixed_calls, stream_end_lost

pytestmark = [pytest.mark.parallel, pytest.mark.timeout(180)]  # connections counted, nothing measured

VUS, CALLS, COUNT = 2, 40, 5
# Decoded: each VU's requests 0, 3, 6, 9, ...: with CHURN=10 its 10th (index 9), a decoded one, and
# its 20th (19), an undecoded one, carry Connection: close.
CHECK_EVERY = 3
# CHURN as k6 gets it, and the calls per connection it plans (None: one connection per VU).
CHURNS: dict[str, tuple[str | None, int | None]] = {"1": ("1", 1), "10": ("10", 10), "never": (None, None)}
# The script's system tags (k6/lib/common.js SYSTEM_TAGS), and vu: k6's points say which VU made each
# iteration (in their metadata). Set from the command line, over the script's, so it keeps its own.
SYSTEM_TAGS = "proto,status,method,check,error,error_code,expected_response,vu"


@dataclass
class Target:
    script: str
    port: int  # the server's, behind the relay
    env: Callable[[int], dict[str, str]]  # k6's env for the relay's port


def rest_env(scheme: str, expect: str, **extra: str) -> Callable[[int], dict[str, str]]:
    return lambda port: {"BASE_URL": f"{scheme}://127.0.0.1:{port}", "EXPECT_PROTO": expect, **extra}


def grpc_env(**extra: str) -> Callable[[int], dict[str, str]]:
    return lambda port: {"GRPC_ADDR": f"127.0.0.1:{port}", "PROTO_DIR": str(ROOT / "proto"), **extra}


@pytest.fixture(scope="module")
def h2_port(tmp_path_factory: pytest.TempPathFactory, tls_material: tuple[Path, Path, Path]) -> Iterator[int]:
    app_dir = tmp_path_factory.mktemp("h2app")
    with hypercorn_tls(app_dir, write_h2_app(app_dir), tls_material) as port:
        yield port


TARGETS = ["rest-h1", "rest-h2-tls", "grpc-unary", "grpc-unary-tls", "grpc-stream"]


@pytest.fixture(scope="module", params=TARGETS)
def target(
    request: pytest.FixtureRequest, pb: tuple[ModuleType, ModuleType], tls_material: tuple[Path, Path, Path]
) -> Iterator[Target]:
    ca, cert, key = tls_material
    tls = {"TLS": "1", "SSL_CERT_FILE": str(ca)}
    name = request.param
    if name == "rest-h1":
        with RecordsServer() as rest:
            yield Target(
                "rest.js", rest.httpd.server_address[1], rest_env("http", "HTTP/1.1", GODEBUG="http2client=0")
            )
    elif name == "rest-h2-tls":
        yield Target("rest.js", request.getfixturevalue("h2_port"), rest_env("https", "HTTP/2.0", **tls))
    else:
        script = "grpc_stream.js" if name == "grpc-stream" else "grpc_unary.js"
        with GrpcServer(pb, tls=(cert, key) if name.endswith("-tls") else None) as server:
            port = int(server.addr.rsplit(":", 1)[1])
            yield Target(script, port, grpc_env(**(tls if name.endswith("-tls") else {})))


def fixed_run(summary: Path, churn: str | None, **settings: str) -> dict[str, str]:
    """CALLS calls shared by VUS VUs, one at a time each (STREAMS=1); CHURN set unless None."""
    return {
        **fixed_calls(CALLS, VUS),
        "COUNT": str(COUNT),
        "CHECK_EVERY": str(CHECK_EVERY),
        "SUMMARY_FILE": str(summary),
        **({} if churn is None else {"CHURN": churn}),
        **settings,
    }


@dataclass
class Churned:
    accepted: int  # the connections the relay accepted
    most_open: int  # the most of them open at once (CountingRelay)
    per_vu: list[int]  # the calls (iterations) each VU made, from k6's points
    metrics: dict[str, Any]  # k6's summary


def run_through_relay(
    script: str, port: int, env: Callable[[int], dict[str, str]], settings: dict[str, str]
) -> Churned:
    points = Path(settings["SUMMARY_FILE"]).with_name("points.json")
    with CountingRelay(port) as relay:
        completed = run_k6(
            script, env(relay.port) | settings, "--out", f"json={points}", "--system-tags", SYSTEM_TAGS
        )
        accepted, most_open = relay.accepted, relay.most_open
    assert completed.returncode == 0, completed.stdout + completed.stderr[-2000:]
    per_vu: Counter[str] = Counter()
    for line in points.read_text().splitlines():
        point = json.loads(line)
        if point["type"] == "Point" and point["metric"] == "iterations":
            per_vu[point["data"]["metadata"]["vu"]] += 1
    return Churned(accepted, most_open, sorted(per_vu.values()), load_summary(Path(settings["SUMMARY_FILE"])))


def planned(per_vu: list[int], churn: int | None) -> int:
    """The connections the plan opens: per VU, its calls / churn rounded up, or one."""
    return sum(1 if churn is None else math.ceil(calls / churn) for calls in per_vu)


def count(metrics: dict[str, Any], name: str) -> int:
    return int(metrics[name]["values"]["count"]) if name in metrics else 0


def assert_churned(run: Churned, script: str, churn: int | None) -> None:
    # Every VU took some of the CALLS (a VU that took none would open no connection).
    assert sum(run.per_vu) == CALLS and len(run.per_vu) == VUS, run.per_vu
    plan = planned(run.per_vu, churn)
    assert run.accepted == plan, (run.accepted, plan, run.per_vu)
    assert count(run.metrics, "protolab_connections") == plan
    if churn == 1:
        # The VUs closed their connections as they went: k6's gRPC connect replaces an open connection
        # without closing it, and all CALLS would then be open at the end. When a close reaches the
        # relay varies (grpc-go may send GOAWAY first; the relay's threads race), up to 7 open at once
        # seen on a busy host, so the bound is loose.
        assert run.most_open < CALLS // 2, run.most_open
    # Every call answered and counted, none failed, every check passed.
    assert CALLS - stream_end_lost(script) <= count(run.metrics, "protolab_reqs") <= CALLS
    assert run.metrics["protolab_req_failed"]["values"]["rate"] == 0
    assert run.metrics["checks"]["values"]["fails"] == 0 and run.metrics["checks"]["values"]["passes"] > 0


@pytest.mark.parametrize("churn", list(CHURNS))
def test_each_vu_opens_a_connection_every_churn_calls(target: Target, tmp_path: Path, churn: str) -> None:
    raw, every = CHURNS[churn]
    run = run_through_relay(target.script, target.port, target.env, fixed_run(tmp_path / "summary.json", raw))
    assert_churned(run, target.script, every)
    if every is None:
        assert run.accepted == VUS
    if every == 1:
        assert run.accepted == CALLS


def test_an_empty_churn_is_never(tmp_path: Path) -> None:
    with RecordsServer() as rest:
        env = rest_env("http", "HTTP/1.1", GODEBUG="http2client=0")
        run = run_through_relay(
            "rest.js", rest.httpd.server_address[1], env, fixed_run(tmp_path / "summary.json", "")
        )
    assert_churned(run, "rest.js", None)
    assert run.accepted == VUS


class UploadServer:
    """POST /records over HTTP/1.1 (keep-alive): replies with the count and checksum of the records
    sent, and says Connection: close when asked, as the lab's servers do."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def do_POST(self) -> None:
                records = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["records"]
                reply = {"count": len(records), "checksum": checksum(map(record_from_json, records))}
                send_json(self, json.dumps(reply).encode())

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]

    def __enter__(self) -> "UploadServer":
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize("churn", ["1", "10"])
def test_rest_uploads_churn_too(tmp_path: Path, churn: str) -> None:
    upload = tmp_path / "upload.json"
    upload.write_bytes(orjson.dumps({"records": load_pool(2000, 42)[:COUNT]}))
    settings = fixed_run(tmp_path / "summary.json", churn, UPLOAD_FILE=str(upload), UPLOAD_COUNT=str(COUNT))
    with UploadServer() as server:
        env = rest_env("http", "HTTP/1.1", GODEBUG="http2client=0")
        run = run_through_relay("rest.js", server.port, env, settings)
    assert_churned(run, "rest.js", int(churn))


# --- Refused before any load ---


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"CHURN": "0"}, "protolab: env CHURN=0 is not a positive integer"),
        ({"CHURN": "abc"}, "protolab: env CHURN=abc is not a positive integer"),
        ({"CHURN": "2", "STREAMS": "2"}, "protolab: CHURN=2 needs STREAMS=1, not STREAMS=2"),
    ],
    ids=["zero", "abc", "with-streams"],
)
@pytest.mark.parametrize("script", ["rest.js", "grpc_unary.js", "grpc_stream.js"])
def test_a_churn_k6_cannot_follow_stops_k6(script: str, settings: dict[str, str], message: str) -> None:
    # No server: k6 stops in its init code, before it connects anywhere. REST over HTTP/2, whose
    # STREAMS alone would pass.
    env = (rest_env("https", "HTTP/2.0") if script == "rest.js" else grpc_env())(1)
    completed = run_k6(script, env | {"VUS": "1", "DURATION": "1s", **settings})
    assert completed.returncode == K6_SCRIPT_EXCEPTION, completed.stdout + completed.stderr[-2000:]
    assert message in completed.stderr


@pytest.mark.parametrize("script", ["rest.js", "grpc_unary.js"])
def test_streams_without_churn_hold_one_connection_per_vu(
    script: str,
    tmp_path: Path,
    pb: tuple[ModuleType, ModuleType],
    tls_material: tuple[Path, Path, Path],
    request: pytest.FixtureRequest,
) -> None:
    # STREAMS=5 (multiplexed, REST over HTTP/2): protolab_connections counts each VU's one connection.
    # 20 iterations of 5 requests: enough that each VU takes some.
    iterations = 20
    settings = fixed_run(tmp_path / "summary.json", None, STREAMS="5", ITERATIONS=str(iterations))
    if script == "rest.js":
        env = rest_env("https", "HTTP/2.0", TLS="1", SSL_CERT_FILE=str(tls_material[0]))
        run = run_through_relay(script, request.getfixturevalue("h2_port"), env, settings)
    else:
        with GrpcServer(pb) as server:
            run = run_through_relay(script, int(server.addr.rsplit(":", 1)[1]), grpc_env(), settings)
    assert len(run.per_vu) == VUS and sum(run.per_vu) == iterations, run.per_vu
    assert run.accepted == VUS and count(run.metrics, "protolab_connections") == VUS
    assert count(run.metrics, "protolab_reqs") == iterations * 5
