"""The findings at a glance: a default run's answer, from the real default plan (duet blocks, the A/A
control, the ladder's rungs at their shares of capacity) with synthetic results shaped like the
2026-12-05 run on the lab's VM, fits one 80x40 terminal, one line of at most 120 characters a pair,
its caveats numbered notes that combine what is said of one target at one load."""

import math
from typing import Any

import pytest
from labrunner.model import duet
from labrunner.model.matrix import expand, load_matrix
from labrunner.model.scenario import Scenario
from labrunner.report import findings
from labrunner.report.compare import group_results
from labrunner.report.document import Bullets
from labrunner.report.findings import finding as finding_model
from labrunner.report.findings import text as findings_text
from labrunner.results import ladder
from labrunner.results.result import parse_results
from labrunner.results.store import scenario_dict

from tests.support import ROOT

# req/s at saturation at 0.25 CPU and CPU seconds a request, as the default run of 2026-12-05 read them.
SERVED = {
    "aiohttp-h1": 900.0,
    "aiohttp-h1-tls": 700.0,
    "quart-h1": 230.0,
    "quart-h1-tls": 210.0,
    "quart-h2-tls": 150.0,
    "grpc": 260.0,
    "grpc-tls": 240.0,
    "grpc-stream": 21.0,
}
HOST = {1: 1.0, 2: 0.85, 3: 1.1}  # the host's speed block by block: both sides of a block move together


def _wobble(key: str, spread: float) -> float:
    """A fixed factor within ±spread for a name: each side's own noise, the same on every run."""
    return 1.0 + spread * math.sin(sum(map(ord, key)))


def _result(scenario: Scenario, rps: float, suspect: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "scenario_id": scenario.id,
        "status": "ok",
        "scenario": scenario_dict(scenario),
        "k6": {
            "cpu_utilisation": 0.4,
            "metrics": {
                "requests": int(rps * 5),
                "requests_per_second": rps,
                "errors": 0,
                "latency_count": int(rps * 5),
                "latency_ms": {"p50": 5.0, "p99": 20.0},
            },
        },
        "service": {"usage": {"cpu_seconds": 1.25, "cpu_utilisation": 1.0}},
        "suspect": list(suspect),
    }


def _rung(scenario: Scenario, closed: list[dict[str, Any]]) -> dict[str, Any]:
    """A rung at its share of its target's capacity: it carries the rate, with latency batches too
    small for p99 (a 5 s window), p50 a little noisy from batch to batch; quart-h1-tls queues."""
    resolved = ladder.resolve(scenario, parse_results(closed))
    assert not isinstance(resolved, str), resolved
    rate = resolved.load_model.rate
    assert rate is not None
    result = _result(resolved, float(rate))
    target = scenario.target.name
    base = 2.0 * _wobble(target, 0.5)
    queue = target == "quart-h1-tls" and resolved.load_model.rung is not None and rate > 60
    p50s = [base * (3.0**i if queue else _wobble(f"{target}{i}", 0.05)) for i in range(5)]
    result["k6"]["latency_batches"] = [{"n": rate, "p50": v, "p99": 4 * v} for v in p50s]
    result["service"]["usage"] = {
        "cpu_seconds": 1.0,
        "cpu_utilisation": 0.6 + 0.3 * abs(_wobble(target, 1.0) - 1),
        "throttled_seconds": 0.3 if target.startswith("aiohttp") else 0.0,
    }
    return result


def _default_run() -> list[dict[str, Any]]:
    plan = duet.plan_duets(expand(load_matrix(ROOT / "matrix.toml"), "local", "default"), duet.AUTO)
    closed = []
    for s in plan.scenarios:
        if s.load_model.rung is not None:
            continue
        name, repeat = s.target.name, s.repeat
        spread = 0.2 if name in ("grpc-stream", "quart-h1-tls") else 0.02  # two pairs too wide for ±5%
        rps = SERVED[name] * HOST[repeat] * _wobble(f"{s.id}", spread)
        suspect = ("others used 7.1% of the service's CPUs",) if name == "grpc-tls" and repeat == 2 else ()
        closed.append(_result(s, rps, suspect))
    rungs = [_rung(s, closed) for s in plan.scenarios if s.load_model.rung is not None]
    rungs[0]["suspect"] = ["5 iterations dropped"]
    return closed + rungs


@pytest.fixture(scope="module")
def found() -> list[finding_model.Finding]:
    return findings.for_run(group_results(parse_results(_default_run())), "default")


def test_a_default_runs_answer_fits_one_screen(found: list[finding_model.Finding]) -> None:
    lines = findings_text.plain(found)
    assert lines[0].startswith("findings: quarter profile (0.25 CPU), 100 records, build, closed model")
    assert lines[1] == f"  {findings_text.SHORT_METHOD}"
    assert lines[2].startswith("  A/A control quart-h1: req/s ")  # the control first
    pairs = [line for line in lines if line.startswith("    ") and " vs " in line]
    assert len(pairs) == 9  # the default run's compared pairs, one line each
    assert all(", CPU/req " in line and ", p50 " in line for line in pairs if "grpc-stream" not in line)
    assert max(len(line) for line in lines) <= 120
    assert max(len(line) for line in pairs) <= 115
    assert findings_text.rows(lines) <= findings_text.SCREEN_ROWS
    # Its notes did not all fit: the most important are shown and the rest counted.
    summary = findings_text.markdown(found)
    noted = [line for line in summary if line.startswith("- [")]
    shown = [line for line in lines if line.startswith("  [")]
    assert 0 < len(shown) < len(noted)
    assert lines[-1] == f"  {len(noted) - len(shown)} more notes in summary.md"
    assert all(any(note.startswith(f"- {line.strip()}") for note in noted) for line in shown)
    # Suspect repeats are the first notes a screen keeps.
    suspects = {line.split("]")[0] for line in noted if "suspect" in line}  # "- [12"
    assert suspects and suspects <= {f"- {line.strip().split(']')[0]}" for line in shown}


def test_notes_about_one_target_at_one_load_are_one_note(found: list[finding_model.Finding]) -> None:
    notes = [text for text, _ in findings_text.by_question(found).notes]
    subjects = [text.split(": ", 1)[0] for text in notes]
    assert len(subjects) == len(set(subjects))
    # aiohttp-h1 at its 40% rung is compared with grpc and with quart-h1: one note, referred to twice.
    [aiohttp] = [n for n in notes if n.startswith("aiohttp-h1 at ") and " req/s: " in n]
    number = notes.index(aiohttp) + 1
    lines = findings_text.markdown(found)
    marks = [(line.split(":")[0], line.rsplit("[", 1)[-1]) for line in lines if line.startswith("  - ")]
    referring = [pair for pair, mark in marks if f",{number}," in f",{mark.rstrip(']')},"]
    assert referring == ["  - grpc vs aiohttp-h1", "  - aiohttp-h1 vs quart-h1"]
    # Every pair whose p99 has no interval refers to the one note saying why.
    [p99] = [i + 1 for i, n in enumerate(notes) if n.startswith("p99 —: ")]
    assert all(f"{p99}" in line.rsplit("[", 1)[1] for line in lines if line.endswith("]") and "p99 —" in line)


def test_the_summary_and_the_report_open_with_the_same_lines(found: list[finding_model.Finding]) -> None:
    section = findings_text.markdown_section(found)
    assert section[2].startswith("All held fixed: quarter profile (0.25 CPU), 100 records")
    assert section[4].startswith("- A/A control quart-h1: req/s ")
    assert (
        max(len(line) for line in section if not line.startswith(("- [", findings_text.CONFIDENCE_LINE)))
        <= 120
    )
    bullets = [b for b in findings_text.blocks(found) if isinstance(b, Bullets)]
    said = {item for b in bullets for item in b.items}
    assert {line.strip().removeprefix("- ") for line in section if line.startswith(("- ", "  - "))} <= (
        said | {line.strip().removeprefix("- ") for line in section if line.startswith("- **")}
    )


def test_a_sentence_longer_than_the_longest_line_is_wrapped_under_itself() -> None:
    # Other presets' findings are sentences (the payload answer runs to about 200 characters).
    sentence = "grpc vs aiohttp-h1, CPU per request: " + "crosses at 165 records [120, 230], " * 6 + "end"
    lines = findings_text.plain([finding_model.Finding("payload", sentence)])
    body = lines[3:]
    assert len(body) > 1 and max(len(line) for line in lines) <= findings_text.LONGEST_LINE
    assert body[0].startswith("    grpc vs aiohttp-h1") and all(
        line.startswith("      ") for line in body[1:]
    )
    assert " ".join(line.strip() for line in body) == sentence


def test_the_terminal_numbers_notes_as_summary_md_does_when_it_shows_fewer_findings() -> None:
    # Five pairs of one question: the terminal shows the three largest; a note keeps its number.
    found = [
        finding_model.Finding("server vs server", f"pair {i}", effect=i / 10, caveat=f"note of pair {i}")
        for i in range(5)
    ]
    summary = findings_text.markdown(found)
    lines = findings_text.plain(found)
    assert [line for line in lines if line.startswith("    pair")] == [
        "    pair 4 [1]",
        "    pair 3 [2]",
        "    pair 2 [3]",
    ]
    shown = [line.strip() for line in lines if line.startswith("  [")]
    assert shown == ["[1] note of pair 4", "[2] note of pair 3", "[3] note of pair 2"]
    assert all(f"- {note}" in summary for note in shown)
    assert "- [5] note of pair 0" in summary and lines[-1] == "  2 more notes in summary.md"


def test_latency_compared_at_one_load_is_said_once_and_at_several_on_each_line() -> None:
    def pair(question: str, held: str, load: str) -> finding_model.Finding:
        sentence = f"{question} pair: req/s 1.20x [1.10, 1.30], CPU/req 0.80x, p50 ≈, p99 —"
        return finding_model.Finding(question, sentence, effect=0.2, held_fixed=held, load=load)

    one = findings_text.by_question(
        [
            pair("gRPC vs REST", "quarter profile, no TLS", "40% load"),
            pair("HTTP/2", "quarter profile, TLS", "40% load"),
        ]
    )
    assert one.shared == "quarter profile; latency at 40% load"
    assert [rest for _, rest, _ in one.questions] == ["no TLS", "TLS"]
    assert all(
        ", p50 ≈" in line and "at 40% load" not in line for _, _, lines in one.questions for line in lines
    )
    two = findings_text.by_question(
        [
            pair("gRPC vs REST", "quarter profile, no TLS", "25% load"),
            pair("HTTP/2", "quarter profile, TLS", "40% load"),
        ]
    )
    assert two.shared == "quarter profile"  # two loads: each line says its own
    lines = [line for _, _, found in two.questions for line in found]
    assert lines == [
        "gRPC vs REST pair: req/s 1.20x [1.10, 1.30], CPU/req 0.80x, at 25% load: p50 ≈, p99 —",
        "HTTP/2 pair: req/s 1.20x [1.10, 1.30], CPU/req 0.80x, at 40% load: p50 ≈, p99 —",
    ]
