"""The findings' text at its edges: the terminal's answer when nothing was found, where a long line
wraps and how, how many notes it says it left out, what the report's blocks hold, and how a pair's two
sides are named when they run the same target."""

import dataclasses
from typing import Any

import pytest
from labrunner.report.compare import Comparison, Group
from labrunner.report.document import Bullets, Paragraph
from labrunner.report.findings import finding, pairs, run
from labrunner.report.findings import text as findings_text
from labrunner.report.findings.finding import VERDICT, Finding, Note
from labrunner.report.stats import CONFIDENCE, Ratio

GRPC_VS_REST = pairs.GRPC_VS_REST
HTTP2 = pairs.HTTP2


def test_the_terminal_says_in_one_line_that_nothing_was_found() -> None:
    assert findings_text.plain([]) == [
        "findings: No finding: the run has no successful throughput group yet."
    ]


def test_a_line_at_the_longest_stays_whole_and_a_longer_one_wraps_without_breaking_words() -> None:
    longest = "  " + "x" * (findings_text.LONGEST_LINE - 2)
    assert findings_text._wrapped([longest]) == [longest]
    words = "grpc-tls vs aiohttp-h1-tls at a quarter-CPU " * 4
    longer = "    " + words.strip()
    assert len(longer) > findings_text.LONGEST_LINE
    wrapped = findings_text._wrapped([longer])
    assert len(wrapped) == 2 and " ".join(line.strip() for line in wrapped) == longer.strip()
    assert all(len(line) <= findings_text.WRAP_AT for line in wrapped)
    # The continuation two columns further in than the line's start; hyphenated names kept whole.
    assert wrapped[1].startswith(" " * 6) and not wrapped[1].startswith(" " * 7)
    assert wrapped[0].endswith(("grpc-tls", "aiohttp-h1-tls", "quarter-CPU", "at", "vs", "a"))
    assert wrapped[0] == longer[: len(wrapped[0])]


@pytest.mark.parametrize(
    ("hidden", "said"),
    [(0, []), (1, ["  1 more note in summary.md"]), (2, ["  2 more notes in summary.md"])],
)
def test_the_terminal_counts_the_notes_it_leaves_out(hidden: int, said: list[str]) -> None:
    assert findings_text._more(hidden) == said


def _finding(question: str, sentence: str, held: str, *notes: Note) -> Finding:
    return Finding(question, sentence, effect=0.1, held_fixed=held, notes=notes)


def test_the_blocks_say_what_all_held_fixed_then_each_heading_then_the_notes() -> None:
    found = [
        _finding(HTTP2, "quart-h2-tls vs quart-h1-tls: 0.80x", "small, c100", Note("a note", "quart-h2-tls")),
        _finding(GRPC_VS_REST, "grpc vs aiohttp-h1: 1.10x", "small, c10"),
    ]
    blocks = findings_text.blocks(found)
    assert blocks[0] == Paragraph("All held fixed: small.")
    headings = [b.text for b in blocks if isinstance(b, Paragraph)]
    assert headings == [
        "All held fixed: small.",
        f"**{HTTP2}**, c100",
        f"**{GRPC_VS_REST}**, c10",
        "**Notes**",
    ]
    assert blocks[-1] == Bullets(("[1] quart-h2-tls: a note",))
    # Nothing held fixed by all: no such paragraph; a question without a heading of its own (what
    # the run did not compare): no heading; no note: no notes heading.
    alone = findings_text.blocks([_finding(run.QUESTION, "not compared: latency", "")])
    assert alone == [Bullets(("not compared: latency",))]


def test_the_terminal_heads_the_findings_with_what_all_held_fixed_or_with_nothing() -> None:
    held = findings_text.plain([_finding(GRPC_VS_REST, "grpc vs aiohttp-h1: 1.10x", "small, c100")])
    assert held[:2] == ["findings: small, c100", f"  {findings_text.SHORT_METHOD}"]
    none = findings_text.plain([_finding(GRPC_VS_REST, "grpc vs aiohttp-h1: 1.10x", "")])
    assert none == [
        "findings:",
        f"  {findings_text.SHORT_METHOD}",
        f"  {GRPC_VS_REST}",
        "    grpc vs aiohttp-h1: 1.10x",
    ]


def _group(**differs: Any) -> Group:
    same = {
        "id": "g", "target": "aiohttp-h1", "service": "rest_aiohttp", "protocol": "http1.1",
        "script": "rest.js", "tls": False, "instrumented": True, "profile": "small", "cpus": 0.5,
        "count": 100, "load_model": "closed", "response_model": "build", "direction": "download",
        "shape": "cars", "network": "loopback", "kind": "throughput", "iterations": None, "order": 0,
        "results": (), "attempted": 0,
    }  # fmt: skip
    return Group(**{**same, **differs})


@pytest.mark.parametrize(
    ("side", "ours", "theirs"),
    [
        ("response_model", "prebuilt", "build"),
        ("direction", "upload", "download"),
        ("shape", "nested", "cars"),
        ("profile", "eighth", "small"),
        ("network", "wan", "loopback"),
    ],
)
def test_a_pair_of_one_target_is_named_by_what_differs(side: str, ours: str, theirs: str) -> None:
    candidate, baseline = _group(**{side: ours}), _group(**{side: theirs})
    assert pairs.side_names(candidate, baseline) == (f"aiohttp-h1 ({ours})", f"aiohttp-h1 ({theirs})")


def test_a_pair_of_two_targets_is_named_by_them_and_of_one_alike_by_it() -> None:
    assert pairs.side_names(_group(target="grpc"), _group()) == ("grpc", "aiohttp-h1")
    assert pairs.side_names(_group(), dataclasses.replace(_group(), id="other")) == (
        "aiohttp-h1",
        "aiohttp-h1",
    )


def test_a_ratio_without_a_figure_or_interval_or_lost_to_holm_is_a_verdict_note() -> None:
    # The verdict rank is what keeps these notes on a crowded terminal (text.plain cuts by rank).
    assert finding.glance(None, "req/s", "a vs b") == (
        "req/s —",
        [Note("a vs b: no figure", "req/s —", VERDICT)],
    )
    alone = Ratio(1.5, None, None, None, None, note="n/a: one repeat")
    assert finding.glance(alone, "req/s", "a vs b") == (
        "req/s 1.50x",
        [Note("a vs b req/s (n/a: one repeat)", "no interval", VERDICT)],
    )
    lost = Ratio(1.2, 1.05, 1.4, 0.01, False, note=finding.CORRECTED_AWAY, equivalent=False, rounds=3)
    assert finding.glance(lost, "p50", "a vs b") == (
        "p50 ?",
        [Note("a vs b", "p50 ? (significant alone, not after Holm's correction)", VERDICT)],
    )


def test_holm_keeps_a_ratio_significant_only_strictly_under_the_level() -> None:
    level = 1 - CONFIDENCE
    under, at = Ratio(1.2, 1.1, 1.3, level / 2, True), Ratio(1.2, 1.1, 1.3, level, True)
    judged = finding.corrected([under])
    assert judged[id(under)].significant is True
    judged = finding.corrected([at])
    assert judged[id(at)].significant is False and judged[id(at)].note == finding.CORRECTED_AWAY


def test_a_group_without_results_has_no_executor() -> None:
    assert finding.executor(_group()) == ""


def test_what_a_comparison_held_fixed_names_the_shape_and_the_network_when_not_the_defaults() -> None:
    other = _group(shape="nested", network="wan", direction="upload", tls=True)
    held = finding.held_fixed(Comparison("k", other, dataclasses.replace(other, target="grpc"), {}))
    assert (
        held == "small profile (0.5 CPU), 100 records, build, uploads, nested records, closed model, TLS, wan"
    )
    plain = finding.held_fixed(Comparison("k", _group(), _group(target="grpc", tls=True), {}))
    assert plain == "small profile (0.5 CPU), 100 records, build, closed model"


def test_the_rounds_a_pair_needs_are_said_from_two_rounds_on_and_only_with_an_interval() -> None:
    settled = pairs.SETTLED_HALF_WIDTH
    wide = Ratio(1.0, 1 / (1 + 2 * settled), 1 + 2 * settled, 0.5, False, rounds=2)
    said = pairs._rounds_needed(wide, None)
    assert said.startswith(f"req/s ±{2 * settled:.0%}: about ") and said.endswith(" (--precision)"), said
    # CPU per request wider than req/s: the note is its (--precision asks both within the target).
    wider = dataclasses.replace(wide, low=1 / (1 + 3 * settled), high=1 + 3 * settled)
    assert pairs._rounds_needed(wide, wider).startswith(f"CPU/req ±{3 * settled:.0%}: about ")
    assert pairs._rounds_needed(wider, wide).startswith(f"req/s ±{3 * settled:.0%}: about ")
    for unsaid in (
        None,
        dataclasses.replace(wide, low=None),
        dataclasses.replace(wide, high=None),
        dataclasses.replace(wide, rounds=None),
        dataclasses.replace(wide, rounds=1),
        dataclasses.replace(wide, low=1 / (1 + settled / 2), high=1 + settled / 2),  # settled already
    ):
        assert pairs._rounds_needed(unsaid, None) == "", unsaid
        assert pairs._rounds_needed(None, unsaid) == "", unsaid


def test_a_long_line_breaks_between_words_never_at_a_hyphen() -> None:
    # With hyphens allowed, "quarter-of-" would still fit the first line's 100 columns.
    line = "    " + "word " * 17 + "quarter-of-a-cpu-here-now and then some more words to pass the longest"
    assert len(line) > findings_text.LONGEST_LINE
    first, second = findings_text._wrapped([line])
    assert first.endswith("word") and second.strip().startswith("quarter-of-a-cpu-here-now")


def test_a_terminal_row_holds_its_columns_and_a_longer_line_takes_two() -> None:
    assert findings_text.rows(["x" * 80, "x" * 81, ""]) == 1 + 2 + 1


def test_markdown_cuts_a_question_at_its_limit_and_says_how_many_more() -> None:
    found = [
        _finding(GRPC_VS_REST, "grpc vs aiohttp-h1: 1.10x", "small, c100, closed"),
        _finding(GRPC_VS_REST, "grpc-tls vs aiohttp-h1-tls: 1.05x", "small, c100, closed"),
        _finding(HTTP2, "quart-h2-tls vs quart-h1-tls: 0.80x", "small, c10, open"),
    ]
    lines = findings_text.markdown(found, limit=1)
    assert lines[0] == "All held fixed: small."
    assert f"- **{GRPC_VS_REST}**, c100, closed" in lines and f"- **{HTTP2}**, c10, open" in lines
    assert "  - ... and 1 more in summary.md" in lines
    assert "  - grpc-tls vs aiohttp-h1-tls: 1.05x" not in findings_text.markdown(found, limit=1)
    assert "  - grpc-tls vs aiohttp-h1-tls: 1.05x" in findings_text.markdown(found)
