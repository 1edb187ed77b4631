"""The questions a run answers: which two sides of a run form a compared pair, and why.

One list for the planner (which closed scenarios run side by side: model.duet) and the report
(which groups compare: report.compare), so the pairs dueted are exactly the pairs the findings read.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from labrunner.model.scenario import DRIVER_SCRIPT


class Side(Protocol):
    """What a question reads of one side: a report's group or a planned scenario."""

    @property
    def target(self) -> str: ...
    @property
    def service(self) -> str: ...
    @property
    def protocol(self) -> str: ...
    @property
    def script(self) -> str: ...
    @property
    def tls(self) -> bool: ...
    @property
    def instrumented(self) -> bool: ...
    @property
    def profile(self) -> str: ...
    @property
    def count(self) -> int: ...
    @property
    def load_model(self) -> str: ...
    @property
    def response_model(self) -> str: ...
    @property
    def direction(self) -> str: ...
    @property
    def shape(self) -> str: ...
    @property
    def network(self) -> str: ...
    @property
    def streams(self) -> int: ...  # requests at once on each connection
    @property
    def churn(self) -> int | None: ...  # calls a connection carries before it is replaced; None: never
    @property
    def compression(self) -> str: ...  # what the service compresses its responses with
    @property
    def order(self) -> int: ...  # the target's position in the run (matrix order)


@dataclass(frozen=True)
class Question:
    """A question answered by pairs of sides that differ in one attribute only."""

    kind: str
    same: tuple[str, ...]  # attributes both sides share
    is_pair: Callable[[Side, Side], bool]  # (candidate, baseline)

    def asks(self, candidate: Side, baseline: Side) -> bool:
        if (self.kind == LAB_VS_FLOOR) != (is_floor(candidate) or is_floor(baseline)):
            return False  # a floor answers lab vs floor only
        if (self.kind == DRIVER_VS_K6) != (is_python_driven(candidate) != is_python_driven(baseline)):
            return False  # two load generators' sides answer the comparison of their clocks only
        return all(getattr(candidate, a) == getattr(baseline, a) for a in self.same) and self.is_pair(
            candidate, baseline
        )


S = TypeVar("S", bound=Side)


# A floor target (benchmarks/floor/) is its lab target's bare server, named after it: it answers one
# question, lab vs floor, and enters no other (the questions between targets are the lab's servers').
FLOOR_PREFIX = "floor-"
LAB_VS_FLOOR = "lab vs floor"


def is_floor(side: Side) -> bool:
    return side.target.startswith(FLOOR_PREFIX)


# The Python driver (scripts/drive_http.py) and k6 time requests on different clocks: their sides are
# compared with each other in this question only, which measures the difference.
DRIVER_VS_K6 = "Python driver vs k6"


def is_python_driven(side: Side) -> bool:
    return side.script == DRIVER_SCRIPT


def is_streaming(side: Side) -> bool:
    """Whether the side's k6 script streams its records (one message each) instead of one response."""
    return "stream" in side.script.rsplit("/", 1)[-1]


# Every question compares like with like: same scenario, and instrumented with instrumented.
_SCENARIO = (
    "profile", "count", "load_model", "response_model", "direction", "shape", "network", "instrumented",
    "streams", "churn", "compression",
)  # fmt: skip
_ANY_STREAMS = tuple(a for a in _SCENARIO if a != "streams")  # the same load, on however many connections
_ANY_CHURN = tuple(a for a in _SCENARIO if a != "churn")  # the same load, however often reconnected
_ANY_COMPRESSION = tuple(a for a in _SCENARIO if a != "compression")  # the same load, however encoded
QUESTIONS = (
    # The harness each lab server carries over its bare server, all else the same.
    Question(
        LAB_VS_FLOOR,
        ("service", "protocol", "script", "tls", *_SCENARIO),
        lambda c, b: b.target == FLOOR_PREFIX + c.target,
    ),
    # What building each response costs over sending prebuilt objects, per server and protocol.
    Question(
        "build vs prebuilt",
        ("target", "profile", "count", "load_model", "direction", "shape", "network"),
        lambda c, b: c.response_model == "build" and b.response_model == "prebuilt",
    ),
    # The same script too: a stream with metrics is no "on" side for unary without.
    Question(
        "metrics on vs off",
        ("service", "protocol", "script", "tls", "profile", "count", "load_model", "direction", "shape"),
        lambda c, b: c.instrumented and not b.instrumented,
    ),
    Question(
        "HTTP/2 vs HTTP/1.1",
        ("service", "tls", *_SCENARIO),
        lambda c, b: c.protocol == "http2" and b.protocol == "http1.1",
    ),
    # HTTP/3 (the Python driver's: k6 has none) against the same server over TCP.
    Question(
        "HTTP/3 vs HTTP/2",
        ("service", "tls", *_SCENARIO),
        lambda c, b: c.protocol == "http3" and b.protocol == "http2",
    ),
    Question(
        "HTTP/3 vs HTTP/1.1",
        ("service", "tls", *_SCENARIO),
        lambda c, b: c.protocol == "http3" and b.protocol == "http1.1",
    ),
    # The same server and protocol loaded by the Python driver and by k6: how the two clocks (and the
    # two clients' limits) differ, so that neither driver's figures are read as the other's.
    Question(
        DRIVER_VS_K6,
        ("service", "protocol", "tls", *_SCENARIO),
        lambda c, b: is_python_driven(c) and not is_python_driven(b),
    ),
    # Unary only: a stream of N messages is not one response of N records.
    Question(
        "gRPC vs REST",
        ("tls", *_SCENARIO),
        lambda c, b: c.protocol == "grpc" and b.protocol != "grpc" and not is_streaming(c),
    ),
    # The like-for-like comparison for streaming: unary gRPC on the same server and records.
    Question(
        "gRPC streaming vs unary",
        ("service", "tls", *_SCENARIO),
        lambda c, b: is_streaming(c) and b.protocol == "grpc" and not is_streaming(b),
    ),
    # One connection carrying `streams` requests at once against as many connections carrying one each,
    # at the same closed model's VUs: what multiplexing costs or saves a server.
    Question(
        "multiplexed vs connections",
        ("target", *_ANY_STREAMS),
        lambda c, b: c.streams > 1 and b.streams == 1,
    ),
    # HTTP/2 as it is sold: its streams on few connections, against HTTP/1.1's one connection per request
    # in flight (the same VUs), on the same server and TLS.
    Question(
        "HTTP/2 multiplexed vs HTTP/1.1",
        ("service", "tls", *_ANY_STREAMS),
        lambda c, b: c.protocol == "http2" and c.streams > 1 and b.protocol == "http1.1",
    ),
    # A new connection every N calls against connections kept for the run, on the same target: what
    # connecting (and with TLS a full handshake) costs per call. The report fits it against 1/N.
    Question(
        "new connections vs kept",
        ("target", *_ANY_CHURN),
        lambda c, b: c.churn is not None and b.churn is None,
    ),
    # The same target compressing its responses against sending them as they are: what gzip costs a
    # server in CPU and saves on the wire (bytes per call), and what that does to req/s on the link.
    Question(
        "compressed vs identity",
        ("target", *_ANY_COMPRESSION),
        lambda c, b: c.compression != "identity" and b.compression == "identity",
    ),
    # Servers compare in matrix order (aiohttp before Quart): ratio = earlier / later target.
    Question(
        "REST server vs REST server",
        ("protocol", "tls", *_SCENARIO),
        lambda c, b: c.protocol != "grpc" and c.service != b.service and c.order < b.order,
    ),
    # The same script too: a streaming target is no baseline for a unary one.
    Question(
        "gRPC server vs gRPC server",
        ("protocol", "script", "tls", *_SCENARIO),
        lambda c, b: c.protocol == "grpc" and c.service != b.service and c.order < b.order,
    ),
)


def pairs(sides: Sequence[S]) -> list[tuple[Question, S, S]]:
    """Every (question, candidate, baseline) among the sides, in question then side order."""
    return [(q, c, b) for q in QUESTIONS for c in sides for b in sides if c is not b and q.asks(c, b)]
