"""What mutation testing found unchecked in the findings and the caller's trust (docs/testing.md): an
upload pair read in records/s accepted with uploads held fixed, an upload group that is only a lower
bound named as one, latency compared at the highest rate both carried whatever the order the groups
came in, and the caller's thresholds met exactly (not over them)."""

from typing import Any

from labrunner.results.trust import caller_lower_bound, caller_suspect

from tests.unit.test_findings import _find, _one, _run
from tests.unit.test_findings_sentences import LATENCY, _loaded

CLOSED = {"grpc": [600, 610, 590], "quart-h1": [400, 405, 395]}  # req/s 1.50x in every round


def _uploads(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for result in results:
        result["scenario"]["direction"] = "upload"
    return results


def test_an_upload_pair_is_read_in_records_accepted_and_holds_uploads_fixed() -> None:
    finding = _one(_find(_uploads(_run(CLOSED))), "gRPC vs REST", "grpc vs quart-h1")
    assert finding.sentence.startswith("grpc vs quart-h1, uploading: records/s accepted 1.50x [1.48, 1.52], ")
    assert (
        finding.held_fixed == "quarter profile (0.25 CPU), 100 records, build, uploads, closed model, no TLS"
    )


def test_a_download_pair_is_read_in_req_s_without_uploads() -> None:
    finding = _one(_find(_run(CLOSED)), "gRPC vs REST", "grpc vs quart-h1")
    assert finding.sentence.startswith("grpc vs quart-h1: req/s 1.50x [1.48, 1.52], ")
    assert finding.held_fixed == "quarter profile (0.25 CPU), 100 records, build, closed model, no TLS"


def test_a_lower_bound_says_whether_it_uploaded() -> None:
    k6_bound = {"grpc": [600, 610], "quart-h1": [400, 405]}
    uploads = [
        f.sentence for f in _find(_uploads(_run(k6_bound, k6_cpu=0.95))) if "lower bound" in f.sentence
    ]
    downloads = [f.sentence for f in _find(_run(k6_bound, k6_cpu=0.95)) if "lower bound" in f.sentence]
    assert any(
        s.startswith("grpc (quarter, 100 records, uploads): throughput only a lower bound, ") for s in uploads
    )
    assert any(
        s.startswith("grpc (quarter, 100 records): throughput only a lower bound, ") for s in downloads
    )


def test_latency_is_compared_at_the_highest_rate_whatever_the_order() -> None:
    for rates in ((200, 50), (50, 200)):
        loaded = [result for rate in rates for result in _loaded(LATENCY, rate)]
        finding = _one(_find(_run(CLOSED) + loaded), "gRPC vs REST", "vs quart-h1")
        assert finding.load == "200 req/s", rates


def test_the_callers_thresholds_met_exactly_are_not_crossed() -> None:
    # Half the server's CPU is not yet busy; half the caller's quota used is its own figure.
    assert caller_lower_bound(0.50, 0.99) is None
    assert caller_lower_bound(0.20, 0.50) is None
    # 5% of the caller's CPUs taken by others or by steal is still within what the lab accepts.
    assert caller_suspect(0.05, 0.05, 0.0) == []
    assert len(caller_suspect(0.051, 0.051, 0.0)) == 2
