"""The judge of trust (results/trust.py) at its thresholds, sentence by sentence: what a user reads on
the progress line, in summary.md and the report. Every threshold is met exactly once (not suspect)
and passed once (suspect), and a stored result written before the verdict was kept is judged from
its figures as the live outcome was."""

import json
from dataclasses import replace
from typing import Any

import pytest
from labrunner.model.matrix import expand, load_matrix
from labrunner.model.scenario import Overrides
from labrunner.results import trust
from labrunner.results.record import build_result, judge_outcome
from labrunner.results.result import parse_result, parse_results
from labrunner.results.trust import Figures, Host, K6Instance, Others, Requests, Step, judge, verdict_of

from tests.support import ROOT
from tests.unit.test_results import _outcome, _summary

# A quarter-CPU closed-model result nobody would doubt: k6 at 30%, the service at 90% of its quota.
CALM = Figures(
    executor="constant-vus",
    iterations=None,
    duration_s=10.0,
    profile_cpus=0.25,
    k6_cpu_utilisation=0.3,
    k6_instances=(),
    requests=Requests(dropped_iterations=0, error_rate=0.0, attempts=1000),
    service_cpu_utilisation=0.9,
    host=None,
    steps=(),
)
QUIET = Others(cpus=(1,), share=0.01, others_cpu_seconds=0.1, relay_cpu_seconds=None)


def _host(service: Others | None = QUIET, k6: Others | None = QUIET, **kwargs: Any) -> Host:
    return Host(
        service,
        k6,
        kwargs.get("shared", False),
        kwargs.get("steal_share", 0.0),
        kwargs.get("steal_seconds", 0.0),
    )


def test_a_calm_result_has_no_reason_and_is_the_services_throughput() -> None:
    verdict = judge(CALM)
    assert (verdict.suspect, verdict.lower_bound, verdict.flags, verdict.limited_by) == ((), None, (), None)


@pytest.mark.parametrize(
    ("k6", "suspect", "lower_bound"),
    [
        (0.80, (), None),  # at the threshold: not saturated
        (
            0.81,
            ("k6 used 81% of its CPUs (load generator saturated)",),
            "k6 used 81% of its CPUs",
        ),
    ],
)
def test_k6_is_saturated_above_eighty_percent(k6: float, suspect: tuple[str, ...], lower_bound: str) -> None:
    verdict = judge(replace(CALM, k6_cpu_utilisation=k6))
    assert verdict.suspect == suspect and verdict.lower_bound == lower_bound
    assert verdict.flags == (("k6-bound",) if suspect else ())
    assert verdict.limited_by == ("k6" if suspect else None)


def test_a_split_k6_is_judged_by_each_instance_not_by_the_merged_figure() -> None:
    instances = (K6Instance(0.5, (2,)), K6Instance(0.85, (3, 4)), K6Instance(0.9, (5,)))
    verdict = judge(replace(CALM, k6_cpu_utilisation=0.95, k6_instances=instances))
    assert verdict.suspect == (
        "k6 instance 2 of 3 used 85% of its CPU 3,4 (load generator saturated)",
        "k6 instance 3 of 3 used 90% of its CPU 5 (load generator saturated)",
    )
    assert verdict.flags == ("k6-bound",)  # one flag for the kind, however many instances
    assert verdict.lower_bound == "k6 instance 2 of 3 used 85% of its CPU" and verdict.limited_by == "k6"
    # Every instance under the threshold: the busy merged figure alone says nothing.
    calm_split = judge(replace(CALM, k6_cpu_utilisation=0.95, k6_instances=instances[:1]))
    assert (calm_split.suspect, calm_split.lower_bound) == ((), None)


@pytest.mark.parametrize(
    ("service", "suspect"),
    [
        (0.50, False),  # half the quota: CPU-bound enough
        (0.49, True),
    ],
)
def test_an_idle_service_under_a_closed_model_is_a_lower_bound(service: float, suspect: bool) -> None:
    verdict = judge(replace(CALM, service_cpu_utilisation=service))
    if not suspect:
        assert (verdict.suspect, verdict.lower_bound, verdict.limited_by) == ((), None, None)
        return
    assert verdict.suspect == (
        "service used 49% of its 0.25-CPU quota under a closed model: not CPU-bound, so something "
        "else limited throughput",
    )
    assert verdict.flags == ("svc-idle",)
    assert verdict.lower_bound == "the service used 49% of its quota" and verdict.limited_by == "other"
    # An offered load (open model) leaves a service idle by design: neither suspect nor a bound.
    offered = judge(replace(CALM, executor="constant-arrival-rate", service_cpu_utilisation=0.49))
    assert (offered.suspect, offered.lower_bound) == ((), None)
    ramp = judge(replace(CALM, executor="ramping-vus", service_cpu_utilisation=0.49))
    assert ramp.limited_by == "other"


def test_errors_above_one_percent_are_suspect() -> None:
    at = judge(replace(CALM, requests=Requests(0, 0.01, 1000)))
    assert at.suspect == ()
    above = judge(replace(CALM, requests=Requests(0, 0.0125, 1000)))
    assert above.suspect == ("error rate 1.25%",) and above.flags == ("errors",)
    assert above.lower_bound is None  # errors make a result suspect, not a bound


def test_dropped_iterations_are_suspect_unless_a_request_cap_cut_them() -> None:
    dropped = judge(replace(CALM, requests=Requests(7, 0.0, 1000)))
    assert dropped.suspect == ("7 iterations dropped",) and dropped.flags == ("dropped",)
    # shared-iterations: what the cap cut off k6 counts as dropped; the cap's own sentence says it.
    capped = judge(replace(CALM, executor="shared-iterations", iterations=100, requests=Requests(7, 0.0, 93)))
    assert capped.suspect == ("only 93 of 100 requests within the 10s cap",)
    assert capped.flags == ("capped",)
    full = judge(replace(CALM, executor="shared-iterations", iterations=100, requests=Requests(0, 0.0, 100)))
    assert full.suspect == ()


def test_a_result_without_a_k6_summary_is_not_judged_on_requests() -> None:
    verdict = judge(replace(CALM, requests=None, service_cpu_utilisation=0.1))
    assert verdict.suspect == ()  # no svc-idle sentence without a summary to judge
    assert verdict.limited_by == "other"  # but the throughput is still no more than a bound


@pytest.mark.parametrize(
    ("service", "k6", "expected"),
    [
        # Exactly 5% is allowed; the lab's daemons' share is taken off before comparing.
        (replace(QUIET, share=0.05), QUIET, ()),
        (replace(QUIET, share=0.08, lab_share=0.04, lab_cpu_seconds=0.1), QUIET, ()),
        (
            QUIET,
            Others((0,), 0.08, 0.4, relay_cpu_seconds=0.2, lab_cpu_seconds=0.1, lab_share=0.02),
            (
                "other processes used 8.0% of k6's CPUs 0 (0.40 CPU s, of which the userspace link "
                "emulator 0.20, of which the lab's Prometheus and InfluxDB 0.10, not counted) during "
                "the measured window (> 5%): host interference",
            ),
        ),
        (
            Others((1, 2), 0.061, 1.22, relay_cpu_seconds=None),
            None,
            (
                "other processes used 6.1% of the service's CPUs 1,2 (1.22 CPU s) during the measured "
                "window (> 5%): host interference",
            ),
        ),
    ],
)
def test_other_processes_beyond_five_percent_make_a_result_suspect(
    service: Others, k6: Others | None, expected: tuple[str, ...]
) -> None:
    verdict = judge(replace(CALM, host=_host(service, k6)))
    assert verdict.suspect == expected
    assert verdict.flags == (("others",) if expected else ())
    assert verdict.lower_bound is None


def test_cpus_shared_by_the_service_and_k6_give_one_sentence() -> None:
    busy = Others((0, 1), 0.2, 2.0, relay_cpu_seconds=None)
    verdict = judge(replace(CALM, host=_host(busy, busy, shared=True)))
    assert verdict.suspect == (
        "other processes used 20.0% of the CPUs the service shares with k6, 0,1 (2.00 CPU s) during "
        "the measured window (> 5%): host interference",
    )


def test_steal_above_five_percent_is_suspect() -> None:
    assert judge(replace(CALM, host=_host(steal_share=0.05, steal_seconds=0.5))).suspect == ()
    verdict = judge(replace(CALM, host=_host(steal_share=0.075, steal_seconds=0.75)))
    assert verdict.suspect == (
        "the hypervisor took 7.5% of the scenario's CPUs (steal, 0.75 s) during the measured window (> 5%)",
    )
    assert verdict.flags == ("steal",)


def test_a_capacity_search_is_judged_at_its_lowest_failing_rate() -> None:
    steps = (Step(100, True, 0.95), Step(400, False, 0.5), Step(200, False, 0.85), Step(300, False, 0.4))
    verdict = judge(replace(CALM, executor="constant-arrival-rate", steps=steps))
    assert verdict.suspect == (
        "k6 used 85% of its CPUs at 200/s, the rate that failed: the capacity found may be the load "
        "generator's",
    )
    assert verdict.flags == ("search-k6-bound",)
    # A busy k6 at a rate that passed, or at a higher failing one, did not limit what was found.
    assert judge(replace(CALM, steps=(Step(100, True, 0.95), Step(200, False, 0.8)))).suspect == ()
    assert judge(replace(CALM, steps=(Step(200, False, 0.3), Step(400, False, 0.95)))).suspect == ()


def test_flags_are_each_kind_once_in_the_order_of_the_sentences() -> None:
    figures = replace(
        CALM,
        k6_instances=(K6Instance(0.9, (2,)), K6Instance(0.95, (3,))),
        requests=Requests(3, 0.02, 1000),
        service_cpu_utilisation=0.3,
        host=_host(steal_share=0.1, steal_seconds=1.0),
    )
    verdict = judge(figures)
    assert verdict.flags == ("k6-bound", "dropped", "errors", "svc-idle", "steal")
    assert len(verdict.suspect) == 6
    # A stored verdict keeps the sentences only: equal when they are.
    assert verdict == trust.Verdict(verdict.suspect, verdict.lower_bound)


# What a scenario section names besides the figures the judge reads (store.scenario_dict).
IDENTITY = {
    "group": "grpc.small.c100.closed",
    "target": "grpc",
    "service": "grpc_aio",
    "protocol": "grpc",
    "tls": False,
    "count": 100,
    "repeat": 1,
}


def _legacy(**sections: Any) -> dict[str, Any]:
    """A result written before its verdict was stored (no lower_bound key): judged from its figures."""
    return {
        "scenario_id": "grpc.small.c100.closed.r1",
        "status": "ok",
        "scenario": {
            **IDENTITY,
            "duration_s": 30.0,
            "profile": {"name": "small", "cpus": 0.5, "memory_bytes": 2**29},
            "load_model": {"executor": "constant-vus"},
            **sections.pop("scenario", {}),
        },
        "k6": {
            "cpu_utilisation": 0.3,
            "metrics": {"dropped_iterations": 0, "error_rate": 0.0, "attempts": 500},
            **sections.pop("k6", {}),
        },
        "service": {"usage": {"cpu_utilisation": 0.9}},
        **sections,
    }


def test_a_result_from_before_the_stored_verdict_is_judged_from_its_figures() -> None:
    assert verdict_of(parse_result(_legacy())) == trust.Verdict((), None)
    split = verdict_of(
        parse_result(
            _legacy(
                k6={
                    "cpu_utilisation": 0.95,
                    "instances": [
                        {"cpu_utilisation": 0.4, "cpus": [2]},
                        {"cpu_utilisation": 0.9, "cpus": [3]},
                    ],
                }
            )
        )
    )
    assert split.suspect == ("k6 instance 2 of 2 used 90% of its CPU 3 (load generator saturated)",)
    assert split.lower_bound == "k6 instance 2 of 2 used 90% of its CPU" and split.limited_by == "k6"
    requests = verdict_of(
        parse_result(_legacy(k6={"metrics": {"dropped_iterations": 4, "error_rate": 0.05, "attempts": 9}}))
    )
    assert requests.suspect == ("4 iterations dropped", "error rate 5.00%")
    capped = verdict_of(
        parse_result(
            _legacy(
                scenario={"load_model": {"executor": "shared-iterations", "iterations": 10}},
                k6={"metrics": {"dropped_iterations": 1, "error_rate": 0.0, "attempts": 9}},
            )
        )
    )
    assert capped.suspect == ("only 9 of 10 requests within the 30s cap",)
    idle = verdict_of(parse_result(_legacy(service={"usage": {"cpu_utilisation": 0.2}})))
    assert idle.suspect == (
        "service used 20% of its 0.5-CPU quota under a closed model: not CPU-bound, so something else "
        "limited throughput",
    )
    assert idle.limited_by == "other"
    searched = verdict_of(
        parse_result(_legacy(capacity={"steps": [{"rate": 50, "passed": False, "k6_cpu_utilisation": 0.99}]}))
    )
    assert searched.suspect == (
        "k6 used 99% of its CPUs at 50/s, the rate that failed: the capacity found may be the load "
        "generator's",
    )
    stolen = verdict_of(
        parse_result(_legacy(host={"measured": True, "steal_share": 0.2, "steal_seconds": 6.0}))
    )
    assert stolen.flags == ("steal",)
    assert verdict_of(parse_result(_legacy(host={"measured": False, "steal_share": 0.2}))).suspect == ()


def test_a_stored_verdict_keeps_its_sentences_and_says_what_limited_a_lower_bound() -> None:
    stored = _legacy(suspect=["as the run judged it"], lower_bound="k6 used 95% of its CPUs")
    stored["k6"]["cpu_utilisation"] = 0.95
    verdict = verdict_of(parse_result(stored))
    assert verdict.suspect == ("as the run judged it",) and verdict.lower_bound == "k6 used 95% of its CPUs"
    assert verdict.limited_by == "k6"
    # A bound the figures no longer show (the thresholds moved): still a bound, by something else.
    moved = verdict_of(parse_result(_legacy(suspect=[], lower_bound="k6 used 79% of its CPUs")))
    assert (moved.lower_bound, moved.limited_by) == ("k6 used 79% of its CPUs", "other")
    none = verdict_of(
        parse_result(_legacy(suspect=None, lower_bound=None, service={"usage": {"cpu_utilisation": 0.1}}))
    )
    assert (none.suspect, none.lower_bound, none.limited_by) == ((), None, None)


def test_a_result_without_its_executor_is_not_judged_as_closed() -> None:
    result = _legacy(service={"usage": {"cpu_utilisation": 0.1}})
    del result["scenario"]["load_model"]["executor"]
    assert verdict_of(parse_result(result)) == trust.Verdict((), None)


def test_the_judge_of_a_live_outcome_and_of_its_stored_figures_agree() -> None:
    """judge_outcome (the progress line) judges the typed result the outcome stores (record.unjudged),
    the one path verdict_of takes for a result without its stored verdict: a capped sequential run
    and a closed one, judged live and again from the written JSON, agree."""
    matrix = load_matrix(ROOT / "matrix.toml")
    [sequential] = expand(
        matrix, "local", "ci", Overrides(targets=("grpc",), load_models=("seq-100",))
    ).scenarios
    [closed] = expand(matrix, "local", "ci", Overrides(targets=("grpc",))).scenarios
    capped = _outcome(sequential, summary=_summary(requests=90), k6_cpu=0.3)  # 90 of 100 in time
    verdict = judge_outcome(capped)
    assert verdict.suspect == (f"only 90 of 100 requests within the {sequential.duration_s:g}s cap",)
    busy = _outcome(closed, summary=_summary(requests=3000, failed=60, dropped=5), k6_cpu=0.9)
    busy_verdict = judge_outcome(busy)
    assert busy_verdict.flags == ("k6-bound", "dropped", "errors")
    for outcome, live in ((capped, verdict), (busy, busy_verdict)):
        result = build_result(outcome, live)
        del result["lower_bound"], result["suspect"]
        stored = verdict_of(parse_result(json.loads(json.dumps(result))))
        assert (stored, stored.flags, stored.limited_by) == (live, live.flags, live.limited_by)


def _repeats(*windows_and_rates: tuple[float, float]) -> list[dict[str, Any]]:
    return [
        {
            "scenario_id": f"grpc.small.c100.closed.r{repeat}",
            "status": "ok",
            "scenario": {
                **IDENTITY,
                "repeat": repeat,
                "profile": {"name": "small", "cpus": 0.5, "memory_bytes": 2**29},
                "duration_s": window,
                "load_model": {"executor": "constant-vus"},
            },
            "k6": {"metrics": {"requests_per_second": rps}},
        }
        for repeat, (window, rps) in enumerate(windows_and_rates, start=1)
    ]


def _spread(rates: list[float], duration_s: float = 10.0) -> trust.Spread | None:
    return trust.unexplained_spread(parse_results(_repeats(*((duration_s, rps) for rps in rates))))


def test_a_spread_at_exactly_the_threshold_is_explained_by_the_window() -> None:
    # 90, 100, 110: mean 100, sample variance (100 + 0 + 100) / 2 = 100, CV exactly 10%.
    assert _spread([90.0, 100.0, 110.0]) is None
    # Two repeats are enough to flag: 80 and 120, CV 40 / √2 / 100 = 28.3%.
    two = _spread([80.0, 120.0])
    assert two is not None and two.cv == pytest.approx(0.2828, abs=1e-4) and two.repeats == 2


def test_the_first_repeats_window_sets_the_threshold() -> None:
    # CV 14.1% (90 and 110): above 10% for a 10 s window, under the 20% a 5 s window allows.
    assert _spread([90.0, 110.0], duration_s=10.0) is not None
    assert _spread([90.0, 110.0], duration_s=5.0) is None
    assert trust.unexplained_spread(parse_results(_repeats((5.0, 90.0), (10.0, 110.0)))) is None
    assert trust.unexplained_spread(parse_results(_repeats((10.0, 90.0), (5.0, 110.0)))) is not None
    assert trust.spread_threshold(5.0) == pytest.approx(0.2) and trust.spread_threshold(10.0) == 0.1
    assert trust.spread_threshold(None) == trust.spread_threshold(60.0) == 0.1
