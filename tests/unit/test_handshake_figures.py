"""The handshake benchmark's figures (labrunner.report.handshakes) from fixed numbers, worked out by hand
from printed t tables; its document; the pieces that read /proc and HTTP/2 frames. The benchmark
against the real servers: tests/integration/test_handshake_bench.py."""

import functools
import json
import math
import os
import socket

import pytest
from labrunner.report import handshakes
from labrunner.report.handshakes import (
    FULL,
    NO_HANDSHAKE,
    RESUMED,
    Cpus,
    Seen,
    cpu_between,
    mean_interval,
    open_connections,
    resumed_over_full,
    summarize_case,
)
from labrunner.report.payload_model import Estimate

T_975_DF4 = 2.7764  # two-sided 95%, 4 degrees of freedom (printed tables)
T_975_DF2 = 4.3027
FULL_ROUNDS = [700.0, 720.0, 740.0, 760.0, 780.0]  # mean 740, deviations ±20, ±40, 0: sd √1000


def test_a_mean_and_its_student_t_interval() -> None:
    estimate = mean_interval(FULL_ROUNDS)
    margin = T_975_DF4 * math.sqrt(1000) / math.sqrt(5)  # 39.26
    assert estimate.value == pytest.approx(740)
    assert estimate.low == pytest.approx(740 - margin, rel=1e-4)
    assert estimate.high == pytest.approx(740 + margin, rel=1e-4)
    assert mean_interval([5.0, 5.0, 5.0]) == Estimate(5.0, 5.0, 5.0)
    assert mean_interval([5.0]) == Estimate(5.0, None, None)  # one round: no interval
    with pytest.raises(ValueError, match="at least one"):
        mean_interval([])


def test_resumed_over_full_pairs_the_rounds() -> None:
    """Each round's ratio e^-0.1, e^-0.2, e^-0.3 while the host moved both phases by 2x: the ratio is
    their geometric mean e^-0.2, its interval exp(-0.2 ± t·0.1/√3); the host's moves cancel."""
    full = [500.0, 1000.0, 750.0]
    resumed = [f * math.exp(d) for f, d in zip(full, (-0.1, -0.2, -0.3), strict=True)]
    r = resumed_over_full(resumed, full)
    margin = T_975_DF2 * 0.1 / math.sqrt(3)
    assert r.value == pytest.approx(math.exp(-0.2))
    assert r.low == pytest.approx(math.exp(-0.2 - margin), rel=1e-4)
    assert r.high == pytest.approx(math.exp(-0.2 + margin), rel=1e-4)
    same = resumed_over_full([0.8 * f for f in FULL_ROUNDS], FULL_ROUNDS)
    assert (same.value, same.low, same.high) == pytest.approx((0.8, 0.8, 0.8))  # no spread: exact
    assert resumed_over_full([400.0], [500.0]) == Estimate(0.8, None, None)


def case() -> handshakes.HandshakeCase:
    rounds = {FULL: FULL_ROUNDS, RESUMED: [0.8 * f for f in FULL_ROUNDS], NO_HANDSHAKE: [60.0] * 5}
    seen = Seen(worker=1, counted=(520, 520), client_resumed=520, version="TLSv1.3", alpn="h2")
    seen.idle_ns, seen.idle_s = 2_000_000, 5.0  # 2 ms of the worker's CPU in 5 s of checks
    seen.phases_s, seen.others_s = 4.0, 0.2  # others took 5% of the host's CPUs during the phases
    return summarize_case("grpc_grpclib", rounds, seen, handshakes=100, warmup=20, cpus=Cpus(1, 0))


def test_a_case_from_its_rounds_and_its_document() -> None:
    c = case()
    assert (c.service, c.tls_version, c.alpn, c.rounds, c.handshakes, c.warmup) == (
        "grpc_grpclib", "TLSv1.3", "h2", 5, 100, 20,
    )  # fmt: skip
    assert c.full_us == mean_interval(FULL_ROUNDS)
    assert c.resumed_us.value == pytest.approx(0.8 * 740)
    assert c.no_handshake_us == Estimate(60.0, 60.0, 60.0)
    assert c.resumed_over_full.value == pytest.approx(0.8)
    assert (c.counted_full, c.counted_resumed, c.client_resumed) == (520, 520, 520)
    assert (c.server_cpu, c.client_cpu) == (1, 0)
    assert (c.idle_us_per_s, c.others_share) == (pytest.approx(400.0), pytest.approx(0.05))
    document = json.loads(json.dumps(handshakes.as_document([c])))
    assert document["schema"] == handshakes.SCHEMA
    assert document["cases"][0]["full_us"] == {
        "value": c.full_us.value,
        "low": c.full_us.low,
        "high": c.full_us.high,
    }
    assert handshakes.cases_of(document) == [c]
    assert handshakes.cases_of({"schema": "protolab.serialization/2", "cases": []}) == []
    assert handshakes.cases_of([]) == []


def test_cpu_between_readings_of_each_thread() -> None:
    """A thread that started in between counts whole; one that ended took its time with it."""
    assert cpu_between({1: 100, 2: 50}, {1: 400, 3: 70}) == 300 + 70
    assert handshakes.cpu_ns(1)  # schedstat is readable here: the benchmark's clock


@pytest.mark.parametrize(
    ("data", "whole"),
    [
        (b"", False),
        (bytes(9), True),  # one empty frame
        (bytes.fromhex("000006040000000000") + bytes(6), True),  # SETTINGS with one setting
        (bytes.fromhex("000006040000000000") + bytes(3), False),  # its payload not all there
        (bytes(9) + bytes(4), False),  # a second frame's header not all there
    ],
)
def test_whole_http2_frames(data: bytes, whole: bool) -> None:
    assert handshakes._whole_frames(data) is whole


def test_open_connections_are_those_the_server_still_holds() -> None:
    """Established and half-closed (the client gone, the server not yet closed) count; the listener and
    a connection the server closed do not."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        held = functools.partial(open_connections, os.getpid(), port)
        assert held() == 0
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = listener.accept()
        assert held() == 1
        client.close()
        assert accepted.recv(1) == b""  # the client's FIN: half-closed, the server holds it
        assert held() == 1
        accepted.close()
        assert held() == 0
