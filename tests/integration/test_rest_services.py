"""Every REST service (aiohttp, Quart on Hypercorn, Quart on Granian) over real sockets: contract,
equal work, bad input, negotiated protocol, metrics and graceful shutdown."""

import asyncio
import functools
import signal
import ssl
import time
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import orjson
import pytest
from google.protobuf import json_format
from prometheus_client.parser import text_string_to_metric_families

from services.common.contract import RECORD_SHAPE
from services.common.metrics import FLUSH_SECONDS
from services.common.pb import cars_pb2
from services.common.records import generate_pool
from services.common.rest import ROUTES
from services.common.stacks import STACKS
from tests.support import CERTS, REST_SERVERS, RunningService, launch_at_once, launch_service, tls_env

POOL_SIZE = 2000
SEED = 42
MAX_COUNT = 1000
DEFAULT_COUNT = 100
BASE_ENV = {"RECORD_POOL_SIZE": str(POOL_SIZE), "RECORD_SEED": str(SEED), "MAX_COUNT": str(MAX_COUNT)}
SERVERS = REST_SERVERS
# The short name of each server module: rest_quart -> quart.
NAMES = {module: module.removeprefix("rest_") for module in SERVERS}
# The servers that speak HTTP/2 over TLS (ALPN_PROTOCOLS); the others offer http/1.1 only.
HTTP2 = tuple(stack.package for stack in STACKS if "http2" in stack.protocols)
# The servers the module shares, all started at once: name -> (module, TLS, extra env).
SHARED: dict[str, tuple[str, bool, dict[str, str]]] = {
    **{NAMES[m]: (m, False, {"WORKERS": "2"}) for m in SERVERS},
    **{f"{NAMES[m]}-tls": (m, True, {}) for m in SERVERS},
    **{f"{NAMES[m]}-tls-http11": (m, True, {"ALPN_PROTOCOLS": "http/1.1"}) for m in HTTP2},
    **{f"{NAMES[m]}-live": (m, False, {"RECORD_MODE": "live"}) for m in SERVERS},
    **{f"{NAMES[m]}-prebuilt": (m, False, {"RESPONSE_MODEL": "prebuilt"}) for m in SERVERS},
}
CLEAR = NAMES  # the two-worker cleartext servers
# The cleartext server of each module under each response model (RESPONSE_MODEL).
BY_MODEL = {"build": CLEAR, "prebuilt": {m: f"{NAMES[m]}-prebuilt" for m in SERVERS}}
EVERY_KIND = [name for m in SERVERS for name in (NAMES[m], f"{NAMES[m]}-tls")]

# Sockets on ephemeral ports, its own files, no CPU measured: beside other tests (tests/conftest.py).
pytestmark = [pytest.mark.timeout(60), pytest.mark.parallel]


@pytest.fixture(scope="module")
def ca_context() -> ssl.SSLContext:
    tls_env()  # generates certs/ when missing
    return ssl.create_default_context(cafile=CERTS / "ca.pem")


@pytest.fixture(scope="module")
def shared(ca_context: ssl.SSLContext) -> Iterator[dict[str, RunningService]]:
    """The shared servers, started in parallel; each must stop with exit code 0."""
    # The services' own 10 s grace, not the tests' 1 s: all of them stop at once here, on a host busy
    # with the other phases, and a Quart worker once took more than 1 s to stop (exit 1, killed).
    stop = {"SHUTDOWN_GRACE_SECONDS": "10"}
    services = launch_at_once(
        {
            name: functools.partial(
                launch_service, module, {**BASE_ENV, **stop, **(tls_env() if tls else {}), **env}
            )
            for name, (module, tls, env) in SHARED.items()
        }
    )
    yield services
    for service in services.values():
        service.process.send_signal(signal.SIGTERM)
    codes = {name: service.process.wait(timeout=20) for name, service in services.items()}
    assert set(codes.values()) == {0}, codes


@pytest.fixture(scope="module")
def pool() -> list[dict[str, Any]]:
    return generate_pool(POOL_SIZE, SEED)


def client(service: RunningService, ca_context: ssl.SSLContext, **kwargs: Any) -> httpx.Client:
    """An HTTP/2-capable client: ALPN offers h2 and http/1.1, so the server decides."""
    scheme = "https" if service.tls else "http"
    return httpx.Client(
        base_url=f"{scheme}://127.0.0.1:{service.port}",
        verify=ca_context,
        http2=True,
        trust_env=False,
        timeout=10,
        **kwargs,
    )


def records_of(response: httpx.Response) -> list[dict[str, Any]]:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    return response.json()["records"]


def window(pool: list[dict[str, Any]], offset: int, count: int) -> list[dict[str, Any]]:
    return [pool[(offset + i) % len(pool)] for i in range(count)]


def validate(document: dict[str, Any], schema: str, instance: Any) -> None:
    """instance against one of the OpenAPI document's component schemas."""
    jsonschema.validate(
        instance, {"$ref": f"#/components/schemas/{schema}", "components": document["components"]}
    )


# http_server_request_duration_seconds_count by (method, route, status, protocol version)
Counts = dict[tuple[str, str, str, str], float]


def request_counts(service: RunningService) -> Counts:
    """http_server_request_duration_seconds_count by (method, route, status, protocol version)."""
    text = httpx.get(f"http://127.0.0.1:{service.metrics_port}/metrics", trust_env=False).text
    counts = {}
    for family in text_string_to_metric_families(text):
        if family.name == "http_server_request_duration_seconds":
            for sample in family.samples:
                if sample.name.endswith("_count"):
                    labels = sample.labels
                    key = (
                        labels["http_request_method"],
                        labels["http_route"],
                        labels["http_response_status_code"],
                        labels["network_protocol_version"],
                    )
                    counts[key] = sample.value
    return counts


def settled_counts(service: RunningService) -> Counts:
    """request_counts once the workers have written every earlier request: two reads two
    flushes apart agree (at most 10 s)."""
    deadline = time.monotonic() + 10
    counts = request_counts(service)
    while True:
        time.sleep(2 * FLUSH_SECONDS)
        latest = request_counts(service)
        if latest == counts or time.monotonic() > deadline:
            return latest
        counts = latest


def moved_counts(service: RunningService, before: Counts, expected: Counts) -> Counts:
    """The request counts that moved since before, once they equal expected or 10 s passed:
    workers write their metrics every FLUSH_SECONDS."""
    deadline = time.monotonic() + 10
    while True:
        after = request_counts(service)
        moved = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
        if moved == expected or time.monotonic() > deadline:
            return moved
        time.sleep(FLUSH_SECONDS / 5)


def gauge(service: RunningService, name: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{service.metrics_port}/metrics", trust_env=False).text
    return next(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


@pytest.mark.parametrize("name", EVERY_KIND)
def test_healthy_and_serves_records(shared, ca_context, name) -> None:
    with client(shared[name], ca_context) as http:
        health = http.get("/healthz")
        assert (health.status_code, health.json()) == (200, {"status": "SERVING"})
        records = records_of(http.get("/records", params={"count": 3, "offset": 0}))
        default = records_of(http.get("/records"))
        document = http.get("/openapi.json").json()
    assert len(records) == 3
    assert len(default) == DEFAULT_COUNT
    for record in records:
        assert set(record) == {"car", "driver"}
        assert set(record["car"]) == set(RECORD_SHAPE["car"].fields)
        assert set(record["driver"]) == set(RECORD_SHAPE["driver"].fields)
    # Canonical JSON names: the body parses (unknown fields rejected) into the gRPC message.
    message = json_format.Parse(orjson.dumps({"records": records}), cars_pb2.ListRecordsResponse())
    assert len(message.records) == 3
    validate(document, "RecordList", {"records": default})
    validate(document, "Health", health.json())


@pytest.mark.parametrize("model", BY_MODEL)
@pytest.mark.parametrize(("count", "offset"), [(1, 0), (7, POOL_SIZE - 3), (MAX_COUNT, 123)])
def test_same_request_same_body_on_both_servers(shared, ca_context, pool, count, offset, model) -> None:
    bodies = set()
    for module in SERVERS:
        with client(shared[BY_MODEL[model][module]], ca_context) as http:
            response = http.get("/records", params={"count": count, "offset": offset})
        assert response.status_code == 200
        bodies.add(response.content)
    assert bodies == {orjson.dumps({"records": window(pool, offset, count)})}


@pytest.mark.parametrize("model", BY_MODEL)
@pytest.mark.parametrize("module", SERVERS)
def test_rotates_through_the_pool_without_offset(shared, ca_context, pool, module, model) -> None:
    # One keep-alive connection, so one worker and its cursor serve both requests.
    with client(shared[BY_MODEL[model][module]], ca_context) as http:
        first = records_of(http.get("/records", params={"count": 5}))
        second = records_of(http.get("/records", params={"count": 5}))
    start = pool.index(first[0])
    assert first == window(pool, start, 5)
    assert second == window(pool, start + 5, 5)


BAD_REQUESTS = [
    ("GET", "/records?count=abc", 400),
    ("GET", "/records?count=1.5", 400),
    ("GET", "/records?count=%207", 400),
    ("GET", "/records?count=-1", 400),
    ("GET", "/records?count=0", 400),
    ("GET", f"/records?count={MAX_COUNT + 1}", 400),
    ("GET", "/records?offset=-1", 400),
    ("GET", "/records?offset=x", 400),
    ("GET", "/no/such/route", 404),
    ("PUT", "/records", 405),
    ("DELETE", "/healthz", 405),
    ("OPTIONS", "/records", 405),
]


@pytest.mark.parametrize("name", EVERY_KIND)
def test_bad_input_is_a_json_4xx_and_the_server_keeps_serving(shared, ca_context, name) -> None:
    with client(shared[name], ca_context) as http:
        document = http.get("/openapi.json").json()
        for method, url, status in BAD_REQUESTS:
            response = http.request(method, url)
            assert response.status_code == status, (method, url, response.text)
            assert response.headers["content-type"] == "application/json"
            body = response.json()
            assert body["status"] == status and body["error"], body
            validate(document, "Error", body)
            if status == 405:
                assert "GET" in response.headers["allow"]
        assert http.get("/healthz").status_code == 200
        assert len(records_of(http.get("/records", params={"count": 2}))) == 2


@pytest.mark.parametrize("name", EVERY_KIND)
def test_openapi_document(shared, ca_context, name) -> None:
    with client(shared[name], ca_context) as http:
        document = http.get("/openapi.json").json()
    assert document["openapi"].startswith("3.")
    assert {"info", "paths", "components"} <= set(document)
    assert set(document["paths"]) == set(ROUTES)
    parameters = {p["name"]: p["schema"] for p in document["paths"]["/records"]["get"]["parameters"]}
    assert parameters["count"] == {"type": "integer", "minimum": 1, "maximum": MAX_COUNT, "default": 100}
    assert parameters["offset"] == {"type": "integer", "minimum": 0}
    assert set(document["paths"]["/healthz"]["get"]["responses"]) == {"200", "503"}
    assert set(document["paths"]["/records"]["get"]["responses"]) == {"200", "400"}


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("quart-tls", "HTTP/2"),
        ("quart-tls-http11", "HTTP/1.1"),
        ("quart", "HTTP/1.1"),  # cleartext has no ALPN: httpx speaks HTTP/1.1
        ("granian-tls", "HTTP/2"),
        ("granian-tls-http11", "HTTP/1.1"),
        ("granian", "HTTP/1.1"),
        ("aiohttp-tls", "HTTP/1.1"),
        ("aiohttp", "HTTP/1.1"),
    ],
)
def test_negotiated_protocol(shared, ca_context, name, expected) -> None:
    with client(shared[name], ca_context) as http:
        assert http.get("/records", params={"count": 1}).http_version == expected


@pytest.mark.parametrize("name", EVERY_KIND)
def test_request_metrics_move_with_traffic(shared, ca_context, name) -> None:
    service = shared[name]
    version = "2" if name in {f"{NAMES[m]}-tls" for m in HTTP2} else "1.1"
    before = settled_counts(service)
    with client(service, ca_context) as http:
        for _ in range(3):
            http.get("/records", params={"count": 1})
        http.get("/no/such/route")
        http.put("/records")
        http.request("PROPFIND", "/records")  # methods OpenTelemetry does not know share one label value
    expected = {
        ("GET", "/records", "200", version): 3,
        ("GET", "unmatched", "404", version): 1,
        ("PUT", "/records", "405", version): 1,
        ("_OTHER", "/records", "405", version): 1,
    }
    assert moved_counts(service, before, expected) == expected


@pytest.mark.parametrize("module", SERVERS)
def test_metric_totals_are_exact_with_two_workers(shared, ca_context, module) -> None:
    service = shared[CLEAR[module]]
    assert service.workers == 2
    assert gauge(service, "protolab_workers") == 2
    key = ("GET", "/records", "200", "1.1")
    before = settled_counts(service)
    # A fresh connection per request, so the requests spread over both workers.
    with client(service, ca_context, limits=httpx.Limits(max_keepalive_connections=0)) as http:
        for _ in range(200):
            assert http.get("/records", params={"count": 1}).status_code == 200
    assert moved_counts(service, before, {key: 200}) == {key: 200}


async def _load_through_shutdown(service: RunningService, drain_seconds: float) -> dict[str, Any]:
    """20 connections with a count=1000 request each in flight at SIGTERM. With a drain, each
    connection goes on, paced, until /healthz has answered 503, and sends one more request:
    as a load balancer would, it stops before the drain ends and the server stops accepting."""
    base_url = f"http://127.0.0.1:{service.port}"
    clients = [httpx.AsyncClient(base_url=base_url, trust_env=False, timeout=20) for _ in range(20)]
    await asyncio.gather(*(c.get("/healthz") for c in clients))  # connected before the first wave
    statuses: list[tuple[float, int]] = []
    saw_503 = asyncio.Event()
    sent: list[str] = []
    first_wave_sent = asyncio.Event()

    async def trace(event: str, _info: dict[str, Any]) -> None:
        if event == "http11.send_request_body.complete":
            sent.append(event)
            if len(sent) == len(clients):
                first_wave_sent.set()

    async def requests(http: httpx.AsyncClient) -> None:
        while True:
            started = time.monotonic()
            response = await http.get(
                "/records", params={"count": MAX_COUNT, "offset": 0}, extensions={"trace": trace}
            )
            assert response.content.count(b'"driverId"') == MAX_COUNT
            statuses.append((started, response.status_code))
            if drain_seconds == 0 or saw_503.is_set():
                return
            await asyncio.sleep(0.05)

    tasks = [asyncio.create_task(requests(c)) for c in clients]
    await asyncio.wait_for(first_wave_sent.wait(), timeout=10)  # every request written to its socket
    signalled = time.monotonic()
    service.process.send_signal(signal.SIGTERM)
    first_503 = None
    if drain_seconds:
        async with httpx.AsyncClient(base_url=base_url, trust_env=False, timeout=5) as probe:
            while first_503 is None and time.monotonic() < signalled + drain_seconds / 2:
                if (await probe.get("/healthz", headers={"connection": "close"})).status_code == 503:
                    first_503 = time.monotonic()
                await asyncio.sleep(0.01)
        saw_503.set()
    await asyncio.gather(*tasks)
    for http in clients:
        await http.aclose()
    return {"statuses": statuses, "signalled": signalled, "first_503": first_503}


# With a drain, clients must see /healthz's 503 and stop within it, which a busy host's scheduling can
# miss: that case runs alone (tests/conftest.py).
@pytest.mark.parametrize("drain_seconds", [0, pytest.param(1, marks=pytest.mark.serial)])
@pytest.mark.parametrize("module", SERVERS)
def test_sigterm_finishes_in_flight_requests(start_service, module, drain_seconds) -> None:
    env = {
        **BASE_ENV,
        "WORKERS": "2",
        "SHUTDOWN_DRAIN_SECONDS": str(drain_seconds),
        "SHUTDOWN_GRACE_SECONDS": "10",  # the in-flight requests' time to finish
    }
    service = start_service(module, env)
    outcome = asyncio.run(_load_through_shutdown(service, drain_seconds))
    assert service.process.wait(timeout=15) == 0
    statuses = outcome["statuses"]
    assert {status for _, status in statuses} == {200}
    assert len([s for s in statuses if s[0] < outcome["signalled"]]) == 20  # in flight at SIGTERM
    if drain_seconds:
        assert outcome["first_503"] is not None, "health never answered 503 during the drain"
        assert any(started > outcome["first_503"] for started, _ in statuses)


@pytest.mark.parametrize("name", [f"{NAMES[m]}-live" for m in SERVERS])
def test_live_mode_serves_valid_records(shared, ca_context, name) -> None:
    with client(shared[name], ca_context) as http:
        response = http.get("/records", params={"count": 5})
    assert len(records_of(response)) == 5
    json_format.Parse(response.content, cars_pb2.ListRecordsResponse())
