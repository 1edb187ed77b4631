"""POST /records on every REST server and floor over real sockets: the reply counts and checksums
the records sent, every bad input gets its status and JSON message (the same on lab and floor),
the request metrics count the uploads, and each server keeps serving."""

import functools
import ssl
import time
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.common.metrics import FLUSH_SECONDS
from services.common.records import generate_pool
from services.common.stacks import STACKS
from tests.support import CERTS, REST_SERVERS, RunningService, launch_at_once, launch_service, tls_env

POOL_SIZE, SEED, MAX_COUNT = 2000, 42, 1000
# Above the largest body of MAX_COUNT + 1 pool records (about 185 KB), under the 1 MiB default: the
# servers must read MAX_REQUEST_BYTES, not keep their default.
MAX_REQUEST_BYTES = 250_000
ENV = {
    "RECORD_POOL_SIZE": str(POOL_SIZE),
    "RECORD_SEED": str(SEED),
    "MAX_COUNT": str(MAX_COUNT),
    "MAX_REQUEST_BYTES": str(MAX_REQUEST_BYTES),
}
FLOOR = "benchmarks.floor"
# name -> (package, module, TLS): every lab server and floor in cleartext HTTP/1.1, and the lab's
# HTTP/2 servers over TLS (Hypercorn and Granian read an HTTP/2 body their own way).
SERVERS: dict[str, tuple[str, str, bool]] = {
    **{module: ("services", module, False) for module in REST_SERVERS},
    **{f"floor_{module}": (FLOOR, module, False) for module in REST_SERVERS},
    **{
        f"{stack.package}-h2": ("services", stack.package, True)
        for stack in STACKS
        if "http2" in stack.protocols
    },
}
LAB = [name for name, (package, _, tls) in SERVERS.items() if package == "services" and not tls]
JSON = {"Content-Type": "application/json"}

# Sockets on ephemeral ports, its own files, no CPU measured: beside other tests (tests/conftest.py).
pytestmark = [pytest.mark.timeout(120), pytest.mark.parallel]


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, RunningService]]:
    """Every server, started in parallel; each must stop with exit code 0."""
    started = launch_at_once(
        {
            name: functools.partial(
                launch_service, module, {**ENV, **(tls_env() if tls else {})}, package=package
            )
            for name, (package, module, tls) in SERVERS.items()
        }
    )
    yield started
    codes = {name: service.stop() for name, service in started.items()}
    assert set(codes.values()) == {0}, codes


@pytest.fixture(scope="module")
def pool() -> list[dict[str, Any]]:
    return generate_pool(POOL_SIZE, SEED)


def client(service: RunningService) -> httpx.Client:
    """HTTP/2 over TLS where the server offers it (ALPN), else HTTP/1.1."""
    scheme = "https" if service.tls else "http"
    verify = ssl.create_default_context(cafile=CERTS / "ca.pem") if service.tls else False
    return httpx.Client(
        base_url=f"{scheme}://127.0.0.1:{service.port}",
        verify=verify,
        http2=True,
        trust_env=False,
        timeout=20,
    )


def expected_checksum(records: list[dict[str, Any]]) -> int:
    """The contract's checksum (proto/cars.proto CreateRecordsReply), from the JSON records: each
    record's two numbers and the lengths of its seven strings, summed modulo 2**32."""
    total = 0
    for record in records:
        car, driver = record["car"], record["driver"]
        total += car["year"] + car["mileage"]
        total += sum(len(car[name]) for name in ("make", "model", "trim", "color"))
        total += sum(len(value) for value in driver.values())
    return total % 2**32


def upload(records: list[Any]) -> bytes:
    return orjson.dumps({"records": records})


def window(pool: list[dict[str, Any]], offset: int, count: int) -> list[dict[str, Any]]:
    return [pool[(offset + i) % len(pool)] for i in range(count)]


def reply_of(response: httpx.Response) -> Any:
    assert response.headers["content-type"] == "application/json", response.headers
    return response.json()


# A record whose checksum is worked out by hand: 2020 + 7 + len("Ford", "Focus", "ST", "red", "Ada",
# "Lovelace", "D1") = 2027 + 4 + 5 + 2 + 3 + 3 + 8 + 2 = 2054.
ADA = {
    "car": {"make": "Ford", "model": "Focus", "trim": "ST", "color": "red", "year": 2020, "mileage": 7},
    "driver": {"firstname": "Ada", "lastname": "Lovelace", "driverId": "D1"},
}
# The int32 bounds are valid, and the sum wraps: 2 * (2**31 - 1) + 27 = 2**32 + 25.
EXTREME = {**ADA, "car": {**ADA["car"], "year": 2**31 - 1, "mileage": 2**31 - 1}}
LOWEST = {**ADA, "car": {**ADA["car"], "year": -(2**31), "mileage": 0}}


@pytest.mark.parametrize("name", SERVERS)
@pytest.mark.parametrize(("count", "offset"), [(1, 0), (100, 1950), (MAX_COUNT, 123)])
def test_the_reply_counts_and_checksums_the_records_sent(servers, pool, name, count, offset) -> None:
    records = window(pool, offset, count)
    with client(servers[name]) as http:
        response = http.post("/records", content=upload(records), headers=JSON)
    assert response.status_code == 200, response.text
    assert response.http_version == ("HTTP/2" if servers[name].tls else "HTTP/1.1")
    assert reply_of(response) == {"count": count, "checksum": expected_checksum(records)}


@pytest.mark.parametrize("name", SERVERS)
def test_the_checksum_is_the_contracts_at_the_int32_bounds(servers, name) -> None:
    cases = [([ADA], 2054), ([EXTREME], 25), ([ADA, EXTREME], 2079), ([LOWEST], 2**32 - 2**31 + 27)]
    with client(servers[name]) as http:
        for records, checksum in cases:
            response = http.post("/records", content=upload(records), headers=JSON)
            assert (response.status_code, reply_of(response)) == (
                200,
                {"count": len(records), "checksum": checksum},
            ), records
        # JSON's own media type parameters and letter case are still JSON.
        for content_type in ("application/json; charset=utf-8", "Application/JSON"):
            response = http.post("/records", content=upload([ADA]), headers={"Content-Type": content_type})
            assert (response.status_code, reply_of(response)["checksum"]) == (200, 2054), content_type


MISSING = object()


def _with(path: tuple[str | int, ...], value: Any, record: dict[str, Any] = ADA) -> dict[str, Any]:
    """ADA with the field at path (e.g. ("car", "year")) set to value, or removed for MISSING."""
    changed = orjson.loads(orjson.dumps(record))
    *parents, last = path
    target = changed
    for key in parents:
        target = target[key]
    if value is MISSING:
        del target[last]
    else:
        target[last] = value
    return changed


# (body, message): each a 400 {"error": message, "status": 400}, on every server.
BAD_BODIES: list[tuple[bytes, str]] = [
    (b"", "body is not valid JSON: Input is a zero-length, empty document: line 1 column 1 (char 0)"),
    (b'{"records": [', "body is not valid JSON: unexpected end of data: line 1 column 14 (char 13)"),
    (
        b'{"records": "\xff"}',
        "body is not valid JSON: str is not valid UTF-8: surrogates not allowed: line 1 column 1 (char 0)",
    ),
    (b"[]", "body: expected an object"),
    (b"null", "body: expected an object"),
    (b"{}", "records: missing"),
    (orjson.dumps({"records": [ADA], "owner": "x"}), "owner: unknown field"),
    (orjson.dumps({"records": {"0": ADA}}), "records: expected an array"),
    (upload([]), f"records: expected 1 to {MAX_COUNT} records, got 0"),
    (upload([ADA] * (MAX_COUNT + 1)), f"records: expected 1 to {MAX_COUNT} records, got {MAX_COUNT + 1}"),
    (upload([ADA, "x"]), "records[1]: expected an object"),
    (upload([ADA, ADA, [ADA]]), "records[2]: expected an object"),
    (upload([_with(("car",), MISSING)]), "records[0].car: missing"),
    (upload([{**ADA, "owner": "x"}]), "records[0].owner: unknown field"),
    (upload([_with(("car",), [])]), "records[0].car: expected an object"),
    (upload([_with(("driver",), "Ada")]), "records[0].driver: expected an object"),
    (upload([ADA, ADA, ADA, _with(("car", "year"), "2020")]), "records[3].car.year: expected an integer"),
    (upload([_with(("car", "year"), True)]), "records[0].car.year: expected an integer"),
    (upload([_with(("car", "year"), 2020.0)]), "records[0].car.year: expected an integer"),
    (upload([_with(("car", "year"), None)]), "records[0].car.year: expected an integer"),
    (upload([_with(("car", "year"), 2**31)]), "records[0].car.year: expected a 32-bit integer"),
    (upload([_with(("car", "mileage"), -(2**31) - 1)]), "records[0].car.mileage: expected a 32-bit integer"),
    (upload([_with(("car", "make"), 5)]), "records[0].car.make: expected a string"),
    (upload([_with(("car", "color"), None)]), "records[0].car.color: expected a string"),
    (upload([_with(("car", "speed"), 1)]), "records[0].car.speed: unknown field"),
    (upload([_with(("car", "trim"), MISSING)]), "records[0].car.trim: missing"),
    (upload([_with(("driver", "driverId"), MISSING)]), "records[0].driver.driverId: missing"),
    # The proto's field name is not its JSON name; unknown fields are named before missing ones.
    (
        upload([_with(("driver", "driver_id"), "D1", _with(("driver", "driverId"), MISSING))]),
        "records[0].driver.driver_id: unknown field",
    ),
    # The first wrong place in the record, in the contract's order: car before driver.
    (
        upload([_with(("car", "year"), "x", _with(("driver", "lastname"), 1))]),
        "records[0].car.year: expected an integer",
    ),
]
WRONG_CONTENT_TYPES = [None, "text/plain", "application/jsonx", "application/x-www-form-urlencoded"]


def _post(http: httpx.Client, body: Any, content_type: str | None = "application/json") -> httpx.Response:
    headers = {} if content_type is None else {"Content-Type": content_type}
    return http.post("/records", content=body, headers=headers)


def _assert_refused(response: httpx.Response, status: int, message: str) -> None:
    assert (response.status_code, reply_of(response)) == (status, {"error": message, "status": status})


def _assert_still_serving(http: httpx.Client) -> None:
    assert http.get("/healthz").status_code == 200
    assert len(http.get("/records", params={"count": 2}).json()["records"]) == 2
    assert reply_of(_post(http, upload([ADA]))) == {"count": 1, "checksum": 2054}


@pytest.mark.parametrize("name", SERVERS)
def test_a_bad_body_is_a_400_naming_the_place(servers, name) -> None:
    with client(servers[name]) as http:
        for body, message in BAD_BODIES:
            _assert_refused(_post(http, body), 400, message)
        _assert_still_serving(http)


@pytest.mark.parametrize("name", SERVERS)
def test_a_body_that_is_not_json_by_its_content_type_is_a_415(servers, name) -> None:
    with client(servers[name]) as http:
        for content_type in WRONG_CONTENT_TYPES:
            response = _post(http, upload([ADA]), content_type)
            _assert_refused(response, 415, "Content-Type must be application/json")
        _assert_still_serving(http)


@pytest.mark.parametrize("name", SERVERS)
def test_a_body_over_max_request_bytes_is_a_413(servers, name) -> None:
    limit = MAX_REQUEST_BYTES
    body = upload([ADA])
    at_limit = body + b" " * (limit - len(body))  # JSON may end in white space
    over = at_limit + b" "
    too_large = f"request body larger than {limit} bytes"

    def chunked(data: bytes) -> Iterator[bytes]:  # no Content-Length: the server counts as it reads
        yield from (data[start : start + 16384] for start in range(0, len(data), 16384))

    with client(servers[name]) as http:
        assert reply_of(_post(http, at_limit)) == {"count": 1, "checksum": 2054}
        assert reply_of(_post(http, chunked(at_limit))) == {"count": 1, "checksum": 2054}
        _assert_refused(_post(http, over), 413, too_large)
        _assert_refused(_post(http, chunked(over)), 413, too_large)
        _assert_refused(_post(http, over + over, "text/plain"), 413, too_large)  # the size first
        # The same client goes on: an HTTP/2 connection lives on (Hypercorn's once dropped, see
        # services/rest_quart/app.py), an HTTP/1.1 one the server cannot reuse it closes (Granian
        # once dropped or stalled the next request on it, about one time in ten).
        for _ in range(20):
            _assert_refused(_post(http, over), 413, too_large)
            _assert_refused(_post(http, chunked(over)), 413, too_large)
            _assert_refused(_post(http, b"x" * (4 * limit)), 413, too_large)
            assert http.get("/healthz").status_code == 200
        _assert_still_serving(http)


@pytest.mark.parametrize("name", SERVERS)
def test_other_methods_are_a_405_whose_allow_lists_post_on_records(servers, name) -> None:
    with client(servers[name]) as http:
        for method, path in (("PUT", "/records"), ("DELETE", "/records"), ("POST", "/healthz")):
            response = http.request(method, path)
            assert response.status_code == 405, (method, path)
            allowed = {m.strip() for m in response.headers["allow"].split(",")}
            if path == "/records":
                assert {"GET", "POST"} <= allowed, allowed
            else:
                assert "GET" in allowed and "POST" not in allowed, allowed
            if name in LAB:  # the lab's 405s are JSON; a floor's are its framework's
                _assert_refused(response, 405, "Method Not Allowed")
        _assert_still_serving(http)


# http_server_request_duration_seconds_count by (method, route, status, protocol version)
Counts = dict[tuple[str, str, str, str], float]


def _request_counts(service: RunningService) -> Counts:
    text = httpx.get(f"http://127.0.0.1:{service.metrics_port}/metrics", trust_env=False).text
    return {
        (
            sample.labels["http_request_method"],
            sample.labels["http_route"],
            sample.labels["http_response_status_code"],
            sample.labels["network_protocol_version"],
        ): sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "http_server_request_duration_seconds"
        for sample in family.samples
        if sample.name.endswith("_count")
    }


def _settled(service: RunningService) -> Counts:
    """The counts once every earlier request is written: two reads two flushes apart agree (at most
    10 s)."""
    deadline = time.monotonic() + 10
    counts = _request_counts(service)
    while True:
        time.sleep(2 * FLUSH_SECONDS)
        latest = _request_counts(service)
        if latest == counts or time.monotonic() > deadline:
            return latest
        counts = latest


def _moved(service: RunningService, before: Counts, expected: Counts) -> Counts:
    """The counts that moved since before, once they equal expected or 10 s passed (workers write
    their metrics every FLUSH_SECONDS)."""
    deadline = time.monotonic() + 10
    while True:
        after = _request_counts(service)
        moved = {
            key: value - before.get(key, 0) for key, value in after.items() if value != before.get(key, 0)
        }
        if moved == expected or time.monotonic() > deadline:
            return moved
        time.sleep(FLUSH_SECONDS / 5)


@pytest.mark.parametrize("name", LAB)
def test_uploads_are_timed_as_post_records(servers, name) -> None:
    service = servers[name]
    before = _settled(service)
    uploads = [
        (upload([ADA]), "application/json"),
        (upload([ADA] * 3), "application/json"),
        (b"[]", "application/json"),
        (upload([ADA]), "text/plain"),
        (b" " * (MAX_REQUEST_BYTES + 1), "application/json"),
    ]
    with client(service) as http:
        statuses = [_post(http, body, content_type).status_code for body, content_type in uploads]
    assert statuses == [200, 200, 400, 415, 413]
    expected = {
        ("POST", "/records", "200", "1.1"): 2,
        ("POST", "/records", "400", "1.1"): 1,
        ("POST", "/records", "415", "1.1"): 1,
        ("POST", "/records", "413", "1.1"): 1,
    }
    assert _moved(service, before, expected) == expected
