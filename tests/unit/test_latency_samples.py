"""Latency on synthetic results: one clock per script, percentiles pooled over repeats, and a
percentile only where the pooled samples support it."""

from typing import Any

import pytest
from labrunner.report.compare import compare_groups, group_results
from labrunner.report.stats import pooled_quantile, samples_needed, supports
from labrunner.run.k6 import DEFAULT_LATENCY_METRIC, parse_summary
from labrunner.run.k6_stats import quantile_grid, quantiles


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


def test_pooled_percentiles_weigh_each_repeat_by_its_samples() -> None:
    uniform_0_1 = [(0.0, 0.0), (1.0, 1.0)]
    uniform_1_2 = [(0.0, 1.0), (1.0, 2.0)]
    # Equal counts: half the pooled samples below 1.
    assert pooled_quantile([(100, uniform_0_1), (100, uniform_1_2)], 0.5) == pytest.approx(1.0)
    assert pooled_quantile([(100, uniform_0_1), (100, uniform_1_2)], 0.9) == pytest.approx(1.8)
    # Three times the samples below 1: the pooled 75th percentile is 1, not the mean of the two.
    assert pooled_quantile([(300, uniform_0_1), (100, uniform_1_2)], 0.75) == pytest.approx(1.0)
    assert pooled_quantile([(300, uniform_0_1), (0, uniform_1_2)], 0.5) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        pooled_quantile([(0, uniform_0_1)], 0.5)


def test_pooling_one_repeat_gives_its_own_percentile() -> None:
    samples = [0.1 * i**1.5 for i in range(1, 2001)]
    grid = quantiles(samples)
    for fraction in (0.5, 0.9, 0.99):
        own = dict(grid)[fraction]
        assert pooled_quantile([(len(samples), grid)], fraction) == pytest.approx(own, rel=1e-9)


def test_a_percentile_needs_ten_samples_beyond_it() -> None:
    assert samples_needed(0.99) == 1000 and samples_needed(0.999) == 10_000 and samples_needed(0.5) == 20
    assert supports(1000, 0.99) and not supports(999, 0.99)
    assert not supports(9_999, 0.999) and supports(10_000, 0.999)


def _result(
    target: str, protocol: str, repeat: int, scale: float, count: int, executor: str
) -> dict[str, Any]:
    metrics = parse_summary({"metrics": {"protolab_req_duration": {"values": _trend(scale, count)}}})
    return {
        "status": "ok",
        "scenario": {
            "group": f"{target}.quarter.c100.{executor}",
            "target": target,
            "service": target,
            "script": "k6/grpc_unary.js" if protocol == "grpc" else "k6/rest.js",
            "protocol": protocol,
            "tls": False,
            "profile": {"name": "quarter", "cpus": 0.25},
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


def test_a_group_shows_the_pooled_percentile_and_compares_only_what_its_samples_support() -> None:
    open_model = "constant-arrival-rate"
    results = [
        _result("grpc", "grpc", 1, 2.0, 600, open_model),
        _result("grpc", "grpc", 2, 4.0, 600, open_model),
        _result("aiohttp-h1", "http1.1", 1, 3.0, 600, open_model),
        _result("aiohttp-h1", "http1.1", 2, 3.0, 600, open_model),
    ]
    grpc, rest = group_results(results)
    summary = grpc.summary("p50")
    assert summary is not None
    # Pooled U(0, 2) and U(0, 4): half the samples lie below 4/3, not at the repeats' mean of 1.5.
    assert summary.centre == pytest.approx(4 / 3, rel=1e-6) and summary.note == "pooled"
    assert grpc.samples == 1200 and grpc.supports("p99") and not grpc.supports("p99.9")
    (comparison,) = compare_groups([grpc, rest])
    # An open model: latency only, no ratio of req/s that echoes the offered rate.
    assert set(comparison.ratios) == {"p50", "p99"}


def test_a_percentile_beyond_the_samples_enters_no_ratio() -> None:
    open_model = "constant-arrival-rate"
    results = [
        _result(t, p, r, 2.0, 400, open_model)
        for t, p in (("grpc", "grpc"), ("aiohttp-h1", "http1.1"))
        for r in (1, 2)
    ]
    (comparison,) = compare_groups(group_results(results))
    assert set(comparison.ratios) == {"p50"}  # 800 samples: p99 needs 1,000
