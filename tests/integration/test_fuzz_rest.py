"""Fuzz every REST service from its own /openapi.json with schemathesis: no 5xx, every response
conforms to the document (status code, content type, body schema), valid input is accepted and
invalid input rejected with a 4xx.

Generation is derandomized (a fixed Hypothesis seed per test), so CI runs the same cases every
time; a failure prints the case to replay. Schemathesis' own pytest plugin (from_fixture) does
not run on pytest 9, so each operation is driven through the Python API with @given.
"""

from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.generation.modes import GenerationMode

from tests.support import REST_SERVERS, RunningService, launch_service

SERVERS = REST_SERVERS
MAX_EXAMPLES = 100
# (path, method, mode): only /records takes input (GET its parameters, POST its body), so only it
# has invalid input to generate.
OPERATIONS = [
    ("/records", "GET", GenerationMode.POSITIVE),
    ("/records", "GET", GenerationMode.NEGATIVE),
    ("/records", "POST", GenerationMode.POSITIVE),
    ("/records", "POST", GenerationMode.NEGATIVE),
    ("/healthz", "GET", GenerationMode.POSITIVE),
    ("/openapi.json", "GET", GenerationMode.POSITIVE),
]
FUZZ_SETTINGS = settings(
    max_examples=MAX_EXAMPLES,
    derandomize=True,
    deadline=None,  # latency is not under test; a CI hiccup must not fail a case
    database=None,  # no .hypothesis/ directory in the tree
    suppress_health_check=list(HealthCheck),
)

# Sockets on ephemeral ports, its own files, no CPU measured: beside other tests (tests/conftest.py).
pytestmark = [pytest.mark.timeout(120), pytest.mark.parallel]


@dataclass
class Tally:
    """Status codes the fuzzer saw, so a run that generated nothing cannot pass."""

    statuses: dict[int, int] = field(default_factory=dict)

    def add(self, status: int) -> None:
        self.statuses[status] = self.statuses.get(status, 0) + 1

    @property
    def total(self) -> int:
        return sum(self.statuses.values())


@pytest.fixture(scope="module", params=SERVERS)
def service(request: pytest.FixtureRequest) -> Iterator[RunningService]:
    started = launch_service(request.param)
    yield started
    assert started.process.poll() is None, f"{request.param} died while being fuzzed"
    assert started.stop() == 0


@pytest.mark.parametrize(
    ("path", "method", "mode"), OPERATIONS, ids=[f"{m} {p}-{g.value}" for p, m, g in OPERATIONS]
)
def test_fuzzed_requests_get_conforming_responses(
    service: RunningService, path: str, method: str, mode: GenerationMode
) -> None:
    schema = schemathesis.openapi.from_url(f"http://127.0.0.1:{service.port}/openapi.json")
    operation = schema[path][method]
    tally = Tally()

    @given(case=operation.as_strategy(generation_mode=mode))
    @FUZZ_SETTINGS
    def fuzz(case: schemathesis.Case) -> None:
        # Every default check: not_a_server_error, status code, content type, headers and body
        # against the document, positive_data_acceptance and negative_data_rejection.
        response = case.call_and_validate(timeout=10)
        tally.add(response.status_code)

    fuzz()
    assert tally.total >= 1, "schemathesis generated no case"
    assert all(status < 500 for status in tally.statuses), tally.statuses
    if path == "/records":
        expected = 200 if mode is GenerationMode.POSITIVE else 400
        # A fuzzer that never reached the handler's accept (or reject) branch proves nothing.
        assert tally.statuses.get(expected, 0) >= MAX_EXAMPLES // 4, tally.statuses
