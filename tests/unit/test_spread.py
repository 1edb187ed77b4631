"""A throughput group whose repeats spread more than its window explains, judged by results.trust."""

from typing import Any

import pytest
from labrunner.report.summary import spread_notes
from labrunner.results.result import parse_results
from labrunner.results.trust import spread_threshold, unexplained_spread


def _repeat(rps: float, repeat: int, duration_s: float = 10.0, others: float = 0.01) -> dict[str, Any]:
    share = {"cpus": [1], "share": others, "others_cpu_seconds": others * 10}
    return {
        "scenario_id": f"grpc.quarter.c100.closed.r{repeat}",
        "status": "ok",
        "scenario": {
            "group": "grpc.quarter.c100.closed",
            "target": "grpc",
            "service": "grpc_aio",
            "protocol": "grpc",
            "tls": False,
            "profile": {"name": "quarter", "cpus": 0.25, "memory_bytes": 2**29},
            "count": 100,
            "duration_s": duration_s,
            "load_model": {"name": "closed", "executor": "constant-vus"},
            "repeat": repeat,
        },
        "k6": {"metrics": {"requests_per_second": rps}},
        "host": {
            "measured": True,
            "interference": {"service_cpus": share, "k6_cpus": {**share, "cpus": [0]}, "shared": False},
            "steal_share": 0.0,
            "steal_seconds": 0.0,
        },
    }


def test_the_issues_grpc_repeats_are_flagged_with_the_repeats_that_would_settle_them() -> None:
    # 606, 497, 526 req/s with others at 1%: CV 10.4%, above the 10% a 10 s window gives.
    spread = unexplained_spread(
        parse_results([_repeat(v, i) for i, v in enumerate((606, 497, 526), start=1)])
    )
    assert spread is not None
    assert spread.cv == pytest.approx(0.104, abs=0.001)
    # sd of log req/s 0.1021. The ratio pairs rounds, so the count is not doubled; t is the target
    # count's: t(19) 2.093 x 0.1021 / √20 = 0.0478 is within ln 1.05 = 0.0488, t(18) 2.101 x 0.1021 /
    # √19 = 0.0492 is not: 20 (t(2) 4.303 kept and the count doubled, as before: 155).
    assert spread.repeats_needed == 20
    assert spread.reason == (
        "unexplained spread (CV 10.4%): about 20 repeats instead of 3 would bring the ratio interval to ±5%"
    )


def test_a_tight_group_a_short_window_and_an_explained_spread_are_not_flagged() -> None:
    assert (
        unexplained_spread(parse_results([_repeat(v, i) for i, v in enumerate((593, 577, 585), start=1)]))
        is None
    )
    # A 5 s window spreads twice as much: its threshold is 20%.
    assert spread_threshold(5.0) == pytest.approx(0.20)
    assert (
        unexplained_spread(
            parse_results([_repeat(v, i, 5.0) for i, v in enumerate((606, 497, 526), start=1)])
        )
        is None
    )
    # One repeat with others above 5% explains the spread: interference, not unexplained.
    noisy = [_repeat(606, 1), _repeat(497, 2, others=0.08), _repeat(526, 3)]
    assert unexplained_spread(parse_results(noisy)) is None
    assert unexplained_spread(parse_results([_repeat(606, 1)])) is None  # one repeat has no spread


def test_summary_lists_the_flagged_group() -> None:
    results = [_repeat(v, i) for i, v in enumerate((606, 497, 526), start=1)]
    assert spread_notes(parse_results(results)) == [
        "`grpc.quarter.c100.closed` (3 repeats): unexplained spread (CV 10.4%): about 20 repeats instead "
        "of 3 would bring the ratio interval to ±5%"
    ]
