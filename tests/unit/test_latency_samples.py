"""Latency on synthetic results: one clock per script, a group's percentile the geometric mean of its
repeats' own, and a percentile only where each repeat's samples support it."""

import math
from typing import Any

import pytest
from labrunner.report.compare import compare_groups, group_results
from labrunner.report.stats import samples_needed, supports
from labrunner.results.result import parse_results
from labrunner.run.k6.output import DEFAULT_LATENCY_METRIC, parse_summary
from labrunner.run.k6_stats import quantile_grid


def _trend(scale: float, count: int) -> dict[str, Any]:
    """k6 trend values on the summary's grid for a uniform distribution on [0, scale]."""
    values: dict[str, Any] = {"min": 0.0, "max": scale, "avg": scale / 2, "count": count}
    return values | {stat: fraction * scale for stat, fraction in quantile_grid().items()}


def test_the_latency_clock_is_the_metric_the_script_names() -> None:
    summary = {
        "protolab": {"latency_metric": "grpc_req_duration"},
        "metrics": {
            "grpc_req_duration": {"values": _trend(2.0, 300)},
            "protolab_req_duration": {"values": _trend(9.0, 300)},
        },
    }
    metrics = parse_summary(summary)
    assert metrics.latency_metric == "grpc_req_duration" and metrics.latency_count == 300
    assert metrics.latency_ms["p50"] == pytest.approx(1.0) and metrics.latency_ms["max"] == 2.0
    assert metrics.latency_quantiles_ms[0] == (0.0, 0.0) and metrics.latency_quantiles_ms[-1] == (1.0, 2.0)
    # A summary written before the scripts named their clock: protolab_req_duration, as it was.
    del summary["protolab"]
    assert parse_summary(summary).latency_metric == DEFAULT_LATENCY_METRIC
    assert parse_summary(summary).latency_ms["p50"] == pytest.approx(4.5)


def test_a_summary_without_the_grid_gives_no_quantiles_to_pool() -> None:
    summary = {"metrics": {"protolab_req_duration": {"values": {"p(50)": 1.0, "max": 3.0, "count": 5}}}}
    assert parse_summary(summary).latency_quantiles_ms == ()


def test_a_percentile_needs_ten_samples_beyond_it() -> None:
    assert samples_needed(0.99) == 1000 and samples_needed(0.999) == 10_000 and samples_needed(0.5) == 20
    assert supports(1000, 0.99) and not supports(999, 0.99)
    assert not supports(9_999, 0.999) and supports(10_000, 0.999)


def _result(
    target: str, protocol: str, repeat: int, scale: float, count: int, executor: str
) -> dict[str, Any]:
    metrics = parse_summary({"metrics": {"protolab_req_duration": {"values": _trend(scale, count)}}})
    return {
        "scenario_id": f"{target}.quarter.c100.{executor}.r{repeat}",
        "status": "ok",
        "scenario": {
            "group": f"{target}.quarter.c100.{executor}",
            "target": target,
            "service": target,
            "script": "k6/grpc_unary.js" if protocol == "grpc" else "k6/rest.js",
            "protocol": protocol,
            "tls": False,
            "profile": {"name": "quarter", "cpus": 0.25, "memory_bytes": 2**29},
            "count": 100,
            "response_model": "build",
            "network": {"name": "loopback"},
            "load_model": {"name": executor, "executor": executor, "rate": 60},
            "repeat": repeat,
        },
        "k6": {
            "metrics": {
                "requests": count,
                "requests_per_second": count / 10,
                "latency_ms": metrics.latency_ms,
                "latency_count": count,
                "latency_quantiles_ms": metrics.latency_quantiles_ms,
                "data_received_bytes": count * 1000,
            }
        },
        "service": {"usage": {"cpu_seconds": count / 1000, "cpu_utilisation": 0.9}},
        "lower_bound": None,
    }


def test_a_group_shows_the_centre_its_ratios_pair_and_compares_only_what_its_repeats_support() -> None:
    open_model = "constant-arrival-rate"
    results = [
        _result("grpc", "grpc", 1, 2.0, 1200, open_model),
        _result("grpc", "grpc", 2, 4.0, 1500, open_model),
        _result("aiohttp-h1", "http1.1", 1, 3.0, 1200, open_model),
        _result("aiohttp-h1", "http1.1", 2, 3.0, 1200, open_model),
    ]
    grpc, rest = group_results(parse_results(results))
    summary = grpc.summary("p50")
    assert summary is not None
    # U(0, 2) and U(0, 4): the repeats' medians 1 and 2, their geometric mean √2 (the pooled median
    # of the two would be 4/3, a centre no ratio uses).
    assert summary.centre == pytest.approx(math.sqrt(2), rel=1e-9) and summary.note == ""
    assert grpc.fewest_samples == 1200 and grpc.supports("p99") and not grpc.supports("p99.9")
    (comparison,) = compare_groups([grpc, rest])
    # An open model: latency only, no ratio of req/s that echoes the offered rate.
    assert set(comparison.ratios) == {"p50", "p99"}
    # The ratio's centre (the geometric mean of the per-round ratios) is the ratio of the two
    # groups' centres the tables show: 1/1.5 and 2/1.5.
    rest_p50 = rest.summary("p50")
    assert rest_p50 is not None
    assert comparison.ratios["p50"].estimate == pytest.approx(summary.centre / rest_p50.centre, rel=1e-9)


def test_a_percentile_beyond_each_repeats_samples_enters_no_ratio() -> None:
    open_model = "constant-arrival-rate"
    results = [
        _result(t, p, r, 2.0, 600, open_model)
        for t, p in (("grpc", "grpc"), ("aiohttp-h1", "http1.1"))
        for r in (1, 2)
    ]
    grpc, rest = group_results(parse_results(results))
    (comparison,) = compare_groups([grpc, rest])
    # 1,200 samples over the two repeats, but each repeat's own p99 is what is paired: 600 a repeat
    # put 6 samples beyond it, and p99 needs 1,000 a repeat.
    assert grpc.samples == 1200 and not grpc.supports("p99")
    assert set(comparison.ratios) == {"p50"}
