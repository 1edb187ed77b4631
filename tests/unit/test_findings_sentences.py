"""The findings' sentences as a user reads them, whole: latency at load with both percentiles or why
one is missing, one-repeat ratios, what was held fixed, the caveats together, Holm's correction of
each metric's family, what could not be compared and why, and how they are ranked and printed.
Numbers are worked out by hand from the synthetic repeats (tests/unit/test_findings.py's builder)."""

from typing import Any

import pytest
from labrunner.report import findings
from labrunner.report.compare import group_results
from labrunner.report.findings import finding as finding_model
from labrunner.report.findings import run as run_findings
from labrunner.report.findings import text as findings_text
from labrunner.report.findings.finding import Finding
from labrunner.report.stats import Ratio
from labrunner.results.result import parse_results

from tests.unit.test_findings import _find, _one, _result, _run

CLOSED = {"grpc": [600, 610, 590], "quart-h1": [400, 405, 395]}  # req/s 1.50x in every round


def _loaded(
    p50s: dict[str, list[float]], rate: int, served: dict[str, float] | None = None
) -> list[dict[str, Any]]:
    """Open-model repeats at `rate` offered (each serving it unless `served` says less), p50 as given
    and p99 four times it; requests = 10 s x req/s, so 30 req/s gives 300 samples a repeat."""
    out = []
    for target, values in p50s.items():
        for repeat, p50 in enumerate(values, start=1):
            result = _result(
                target, repeat, (served or {}).get(target, rate), model=f"loaded-{rate}", p50=p50
            )
            result["scenario"]["load_model"].update(executor="constant-arrival-rate", rate=rate)
            out.append(result)
    return out


# Each round's p50 ratio: 3.1/6.1, 3.2/6.2, 3.3/6.3 = 0.508, 0.516, 0.524; their logs' sd 0.0150, so
# exp(mean ± 4.303 x 0.0150/√3) = [0.50, 0.54] around 0.52; the p99s are 4x the p50s: the same ratios.
LATENCY = {"grpc": [3.1, 3.2, 3.3], "quart-h1": [6.1, 6.2, 6.3]}


def test_latency_at_load_gives_both_percentiles() -> None:
    finding = _one(_find(_run(CLOSED) + _loaded(LATENCY, 200)), "gRPC vs REST", "vs quart-h1")
    assert finding.sentence == (
        "grpc vs quart-h1: req/s 1.50x [1.48, 1.52], CPU/req 1.00x, p50 0.52x [0.50, 0.54], "
        "p99 0.52x [0.50, 0.54]"
    )
    assert finding.load == "200 req/s"
    assert finding.caveats == ["grpc at 200 req/s: CPU 98%", "quart-h1 at 200 req/s: CPU 98%"]


def test_a_percentile_with_too_few_samples_says_whose_and_how_many() -> None:
    # 300 samples a repeat put 3 beyond each repeat's p99, fewer than the 10 it needs: no p99 ratio.
    finding = _one(_find(_run(CLOSED) + _loaded(LATENCY, 30)), "gRPC vs REST", "vs quart-h1")
    assert finding.sentence.endswith(", p50 0.52x [0.50, 0.54], p99 —")
    assert "p99 —: no p99 (grpc: 300 samples in a repeat, too few)" in finding.caveats


def test_one_repeat_a_side_shows_its_ratios_without_intervals() -> None:
    results = _run({"grpc": [600]}, cpu_per_request_s=0.0008) + _run({"quart-h1": [400]})
    finding = _one(_find(results + _loaded({"grpc": [3.0], "quart-h1": [6.0]}, 50)), "gRPC vs REST", "vs")
    assert finding.sentence == "grpc vs quart-h1: req/s 1.50x, CPU/req 0.80x, p50 0.50x, p99 —"
    assert finding.caveats[2:4] == [
        "no interval: grpc vs quart-h1 req/s (n/a: one repeat)",
        "no interval: grpc vs quart-h1 p50 (n/a: one repeat)",
    ]
    assert finding.effect == 0.0


def test_a_ratio_without_interval_or_note_says_so() -> None:
    for r in (Ratio(1.2, None, None, None, None), Ratio(1.2, 0.9, None, None, None)):
        cell, [note] = finding_model.glance(r, "req/s", "a vs b")
        assert (cell, note.alone) == ("req/s 1.20x", "no interval: a vs b req/s (none)")
    cell, [note] = finding_model.glance(None, "p99", "a vs b")
    assert (cell, note.alone) == ("p99 —", "p99 —: a vs b: no figure")


def test_an_unmeasured_service_cpu_is_a_question_mark() -> None:
    loaded = _loaded(LATENCY, 200)
    for result in loaded:
        del result["service"]["usage"]["cpu_utilisation"]
    finding = _one(_find(_run(CLOSED) + loaded), "gRPC vs REST", "vs quart-h1")
    assert ", p50 0.52x" in finding.sentence
    assert "grpc at 200 req/s: CPU ?" in finding.caveats


def test_each_metric_is_corrected_over_the_runs_tests_of_it() -> None:
    # grpc and aiohttp-h1 measured alike, quart-h1 9% slower and its p50 9% higher: per metric two
    # tests of p = 0.03 and one of p = 1. Holm over the three (x 3, x 2) takes both away, for req/s,
    # p50 and p99 each (tests/unit/test_findings.py holds the req/s arithmetic).
    closed = _run({"grpc": [600, 640, 620], "quart-h1": [560, 569, 578], "aiohttp-h1": [600, 640, 620]})
    p50s = {"grpc": [3.0, 3.2, 3.1], "quart-h1": [3.3, 3.38, 3.46], "aiohttp-h1": [3.0, 3.2, 3.1]}
    found = _find(closed + _loaded(p50s, 100))
    grpc = _one(found, "gRPC vs REST", "grpc vs quart-h1")
    assert grpc.sentence == "grpc vs quart-h1: req/s 1.09x [1.02, 1.17] ?, CPU/req 1.00x, p50 ?, p99 ?"
    after = "(significant alone, not after Holm's correction): grpc vs quart-h1"
    assert [c for c in grpc.caveats if "Holm" in c] == [f"{m} ? {after}" for m in ("req/s", "p50", "p99")]
    same = _one(found, "gRPC vs REST", "grpc vs aiohttp-h1")
    assert ", p50 ≈, p99 ≈" in same.sentence
    # One pair alone: req/s (p = 0.03) and p50 (p = 0.03) are tests of different metrics, each
    # significant in its own family of one.
    [alone] = [
        f
        for f in _find(_run({"grpc": [600, 640, 620], "quart-h1": [560, 569, 578]}) + _loaded(p50s, 100))
        if f.question == "gRPC vs REST"
    ]
    assert alone.sentence.startswith("grpc vs quart-h1: req/s 1.09x [1.02, 1.17], ")
    assert alone.sentence.endswith(", p50 0.92x [0.85, 0.98], p99 0.92x [0.85, 0.98]")


def test_a_capacity_search_is_no_offered_load_to_compare_latency_at() -> None:
    # An open model too (constant-arrival-rate), but its rate is where the search began.
    search = _loaded(LATENCY, 50)
    for result in search:
        result["scenario"]["load_model"].update(name="capacity", search={"slo_p99": 0.1})
        result["scenario"]["group"] = result["scenario"]["group"].replace("loaded-50", "capacity")
    found = _find(_run(CLOSED) + search)
    finding = _one(found, "gRPC vs REST", "vs quart-h1")
    assert finding.sentence == "grpc vs quart-h1: req/s 1.50x [1.48, 1.52], CPU/req 1.00x"
    _one(found, "run", "Latency is not compared")


def test_tls_on_both_sides_is_held_fixed_and_a_missing_response_model_is_not() -> None:
    found = _find(_run({"quart-h2-tls": [300, 290, 310], "quart-h1-tls": [400, 405, 395]}))
    h2 = _one(found, "HTTP/2 vs HTTP/1.1", "quart-h2-tls vs quart-h1-tls")
    assert h2.held_fixed == "quarter profile (0.25 CPU), 100 records, build, closed model, TLS"
    # Results written before the response model was recorded: nothing to say about it.
    older = _run(CLOSED)
    for result in older:
        result["scenario"]["response_model"] = ""
    finding = _one(_find(older), "gRPC vs REST", "vs quart-h1")
    assert finding.held_fixed == "quarter profile (0.25 CPU), 100 records, closed model, no TLS"


def test_a_suspect_group_and_a_rate_not_carried_are_both_in_the_caveat() -> None:
    closed = _run({"grpc": [600, 610, 590]}) + _run(
        {"quart-h1": [400, 405, 395]}, suspect=("other processes used 7.0% of the service's CPUs",)
    )
    loaded = _loaded(LATENCY, 50, served={"quart-h1": 30})
    finding = _one(_find(closed + loaded), "gRPC vs REST", "vs quart-h1")
    assert finding.caveats[:4] == [
        "quart-h1, closed model: 3 of 3 repeats suspect, see summary.md",
        "grpc at 50 req/s: CPU 98%",
        "quart-h1 at 50 req/s: did not carry it (served 30): its latency is a queue's",
        "quart-h1 at 50 req/s: CPU 98%",
    ]
    # Read together, the notes about one target at one load are one note.
    assert findings_text.markdown([finding])[-3:-1] == [
        "- [2] grpc at 50 req/s: CPU 98%",
        "- [3] quart-h1 at 50 req/s: did not carry it (served 30): its latency is a queue's; CPU 98%",
    ]


def test_serving_ninety_five_percent_of_the_rate_is_carrying_it() -> None:
    exactly = _loaded(LATENCY, 40, served={"quart-h1": 38})  # 38 = 0.95 x 40
    carried = _one(_find(_run(CLOSED) + exactly), "gRPC vs REST", "vs quart-h1").caveats
    assert not [c for c in carried if "did not carry" in c]
    short = _loaded(LATENCY, 40, served={"quart-h1": 37})
    assert (
        "quart-h1 at 40 req/s: did not carry it (served 37): its latency is a queue's"
        in _one(_find(_run(CLOSED) + short), "gRPC vs REST", "vs quart-h1").caveats
    )


def test_a_run_of_lower_bounds_says_what_limited_it_and_what_would_answer() -> None:
    k6_bound = group_results(parse_results(_run({"grpc": [600, 610], "aiohttp-h1": [900, 910]}, k6_cpu=0.95)))
    [finding] = run_findings.cannot_compare(k6_bound)
    assert finding.question == "run"
    assert finding.sentence == (
        "No comparison between targets: every one of 2 closed-model groups is only a lower bound of its "
        "service (2 of 2 repeats not service-bound (k6 used 95% of its CPUs)), so this run measured its "
        "load generator or host, not the servers; give k6 CPUs of its own (--load-engine) or run a "
        "smaller profile (--profile quarter)."
    )
    idle = _run({"grpc": [600, 610], "aiohttp-h1": [900, 910]})
    for result in idle:
        result["service"]["usage"]["cpu_utilisation"] = 0.3
    [finding] = run_findings.cannot_compare(
        group_results(parse_results(idle + _loaded(LATENCY, 50)))
    )  # open groups aside
    assert finding.sentence.endswith(
        "; run a profile whose quota the service fills (--profile quarter locally), or a host or engine "
        "with CPUs to spare for k6."
    )
    # One closed group the service's: the run compares that one, and says nothing of the kind.
    mixed = _run({"grpc": [600, 610]}, k6_cpu=0.95) + _run({"aiohttp-h1": [900, 910]})
    assert run_findings.cannot_compare(group_results(parse_results(mixed))) == []


def test_the_questions_not_asked_name_their_presets() -> None:
    asked = [Finding("gRPC vs REST", "grpc vs quart-h1: ..."), Finding("run", "a note")]
    [line] = findings.unasked(asked, "full")
    assert line.question == "run"
    assert line.sentence == (
        "Not asked: --preset default (HTTP/2 vs HTTP/1.1, gRPC streaming vs unary), implementations, "
        "metrics-overhead, multiplexing, churn, compression, http3, network, payload."
    )
    every = [Finding(q.name, "") for q in findings.QUESTIONS]
    assert findings.unasked(every, "default") == []


def test_what_was_not_compared_is_said_only_when_so() -> None:
    rest_only = _find(_run({"quart-h1": [400, 405, 395], "aiohttp-h1": [900, 905, 910]}))
    assert not [f for f in rest_only if "Streaming" in f.sentence]
    [latency] = [f for f in rest_only if f.question == "run"]
    assert latency.sentence == (
        "Latency is not compared: no target ran under an offered load (open model); latency at "
        "saturation says more about the CPU quota than the protocol."
    )
    streams = _find(_run({"grpc-stream": [60, 62, 61], "quart-h1": [400, 405, 395]}))
    [alone] = [f for f in streams if f.question == "gRPC streaming vs unary"]
    assert alone.sentence == (
        "Streaming was measured without unary gRPC on the same records: it is compared with nothing "
        "(a stream of N messages is not one response of N records)."
    )
    with_unary = _find(_run({"grpc-stream": [60, 62, 61], "grpc": [600, 610, 590]}) + _loaded(LATENCY, 50))
    assert [f.sentence for f in with_unary if f.question == "run"] == []  # streams had unary; latency ran
    assert not [f for f in with_unary if "without unary gRPC" in f.sentence]


def test_findings_rank_by_question_then_answers_then_effect() -> None:
    found = [
        Finding("somewhere else", "unknown question"),
        Finding("payload", "evidence", effect=0.9),
        Finding("payload", "the answer", answer=True),
        Finding("gRPC vs REST", "small", effect=0.1),
        Finding("HTTP/2 vs HTTP/1.1", "h2"),
        Finding("gRPC vs REST", "large", effect=0.7),
    ]
    assert [f.sentence for f in findings.ranked(found)] == [
        "h2",
        "large",
        "small",
        "the answer",
        "evidence",
        "unknown question",
    ]


def test_what_each_finding_held_fixed_heads_it_and_its_caveat_is_a_numbered_note() -> None:
    found = [
        Finding("gRPC vs REST", "first", effect=0.2, held_fixed="quarter profile", caveat="one suspect"),
        Finding("gRPC vs REST", "second", effect=0.1, held_fixed="small profile"),
    ]
    assert findings_text.markdown(found) == [
        "- **gRPC vs REST**, quarter profile",  # nothing held fixed by both: nothing said at the top
        "  - first [1]",
        "- **gRPC vs REST**, small profile",
        "  - second",
        "",
        "Notes:",
        "",
        "- [1] one suspect",
    ]


def test_exactly_the_terminals_limit_needs_no_pointer_to_the_rest() -> None:
    three = [Finding("server vs server", f"pair {i}", effect=i / 10) for i in range(3)]
    assert findings_text.plain(three)[2:] == ["  server vs server", "    pair 2", "    pair 1", "    pair 0"]


def test_the_terminal_keeps_dashes_inside_a_sentence() -> None:
    [_, _, question, sentence] = findings_text.plain([Finding("payload", "raw - gzip: 0.41x - 0.95x")])
    assert (question, sentence) == ("  payload", "    raw - gzip: 0.41x - 0.95x")


@pytest.mark.parametrize("found", [[], [Finding("payload", "the answer", answer=True)]])
def test_the_summary_section_frames_the_findings(found: list[Finding]) -> None:
    body = findings_text.markdown(found) or [findings_text.NONE_YET]
    method = f"{findings_text.CONFIDENCE_LINE} {findings_text.LEGEND}"
    assert findings_text.markdown_section(found) == ["## Findings", "", *body, "", method, ""]
    assert body[0] in ("- No finding: the run has no successful throughput group yet.", "- **payload**")
