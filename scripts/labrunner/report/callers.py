"""The caller's cost (preset caller, docs/caller.md): per caller, direction and count, the caller's CPU per
call and per record, calls/s and user share, and the server's CPU over the same window; findings in
the caller's words, from ratios that pair each round's repeats (a round the host slowed for every
caller cancels) with Holm's correction over each question's tests; and the report of a caller run.
"""

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labrunner.files import write_text_atomic
from labrunner.report.compare import THROUGHPUT, Group
from labrunner.report.document import Block, Bullets, Heading, Paragraph, table, to_html, to_markdown
from labrunner.report.findings import run
from labrunner.report.findings.finding import CLOSED_EXECUTORS, CORRECTED_AWAY, Finding, corrected, executor
from labrunner.report.findings.text import blocks as findings_blocks
from labrunner.report.findings.text import plain
from labrunner.report.runs import Run, load_run
from labrunner.report.stats import (
    CENTRE,
    CONFIDENCE,
    EQUIVALENCE_MARGIN,
    Ratio,
    Summary,
    paired_ratio,
    summarize,
)
from labrunner.results.callers import load_results, read_manifest
from labrunner.run.callers import FLOOR, LAB

CALLERS_QUESTION = "the caller's cost"
HARNESS_QUESTION = "the caller's harness"
METRIC = "cpu_per_call_us"  # what the findings compare: the caller's CPU per call
CONFIDENCE_LINE = (
    f"Ratios of the caller's CPU per call pair the repeats of each round (a paired t-test on the logarithms, "
    f"{CONFIDENCE:.0%} interval); significant after Holm's correction over each question's tests, "
    f"equivalent within ±{EQUIVALENCE_MARGIN:.0%} by two one-sided tests, else inconclusive."
)


@dataclass(frozen=True)
class CallerGroup:
    """The repeats of one measurement (a caller, its variant, profile, count and direction): its
    successful results, and how many were attempted."""

    id: str
    target: str
    client: str  # the library's module: aiohttp_h1, httpx_h2, grpc_aio
    variant: str
    profile: str
    profile_cpus: float
    concurrency: int
    count: int
    direction: str
    results: tuple[Mapping[str, Any], ...]
    attempted: int

    def by_repeat(self, metric: str) -> dict[int, float]:
        """The metric of each successful repeat, by round."""
        return {
            r["repeat"]: float(value)
            for r in self.results
            if (value := (r.get("figures") or {}).get(metric)) is not None
        }

    def summary(self, metric: str) -> Summary | None:
        values = list(self.by_repeat(metric).values())
        return summarize(values) if values else None

    @property
    def lower_bound(self) -> str | None:
        """Why this group's calls/s is only a lower bound (its first repeat that is one), or None."""
        return next((r["lower_bound"] for r in self.results if r.get("lower_bound")), None)

    @property
    def suspect(self) -> int:
        return sum(1 for r in self.results if r.get("suspect"))

    def same_call(self, other: "CallerGroup") -> bool:
        """Whether both groups measured the same call at the same budget and load (targets apart)."""
        return (self.profile, self.count, self.direction, self.concurrency) == (
            other.profile,
            other.count,
            other.direction,
            other.concurrency,
        )


def groups_of(results: Sequence[Mapping[str, Any]]) -> list[CallerGroup]:
    """The results' groups in the order their first result comes."""
    members: dict[str, list[Mapping[str, Any]]] = {}
    for result in results:
        members.setdefault(result["group"], []).append(result)
    groups = []
    for group_id, found in members.items():
        first, caller = found[0], found[0]["caller"]
        groups.append(
            CallerGroup(
                id=group_id,
                target=first["target"]["name"],
                client=caller["client"],
                variant=caller["variant"],
                profile=caller["profile"]["name"],
                profile_cpus=caller["profile"]["cpus"],
                concurrency=caller["concurrency"],
                count=first["count"],
                direction=first["direction"],
                results=tuple(r for r in found if r.get("status") == "ok"),
                attempted=len(found),
            )
        )
    return groups


@dataclass(frozen=True)
class Comparison:
    """candidate / baseline of the caller's CPU per call, paired by round."""

    question: str
    candidate: CallerGroup
    baseline: CallerGroup
    ratio: Ratio


def paired(candidate: CallerGroup, baseline: CallerGroup, metric: str = METRIC) -> Ratio | None:
    """The paired ratio over the rounds both groups have a value in; None without one."""
    ours, theirs = candidate.by_repeat(metric), baseline.by_repeat(metric)
    rounds = sorted(set(ours) & set(theirs))
    if not rounds:
        return None
    return paired_ratio([ours[r] for r in rounds], [theirs[r] for r in rounds])


def comparisons(groups: Sequence[CallerGroup]) -> list[Comparison]:
    """Every pair of lab callers on the same call (each against every one listed before it), and each lab
    caller against its floor; each question's ratios corrected together (Holm)."""
    lab = [g for g in groups if g.variant == LAB]
    floors = {(g.target, g.profile, g.count, g.direction): g for g in groups if g.variant == FLOOR}
    found: dict[str, list[tuple[CallerGroup, CallerGroup]]] = {CALLERS_QUESTION: [], HARNESS_QUESTION: []}
    for i, candidate in enumerate(lab):
        found[CALLERS_QUESTION] += [(candidate, b) for b in lab[:i] if b.same_call(candidate)]
        floor = floors.get((candidate.target, candidate.profile, candidate.count, candidate.direction))
        if floor is not None:
            found[HARNESS_QUESTION].append((candidate, floor))
    compared = []
    for question, pairs in found.items():
        ratios = [(c, b, r) for c, b in pairs if (r := paired(c, b)) is not None]
        judged = corrected([r for _, _, r in ratios if r.p_value is not None])
        compared += [Comparison(question, c, b, judged.get(id(r), r)) for c, b, r in ratios]
    return compared


def describe_cost(r: Ratio) -> str:
    """'0.60x [0.55, 0.66]' when significant; with '(equivalent within ±10%)' or '(inconclusive)' (after
    Holm's correction, when only it took the significance away) otherwise."""
    if r.low is None or r.high is None:
        return f"{r.estimate:.2f}x ({r.note or 'no interval'})"
    figure = f"{r.estimate:.2f}x [{r.low:.2f}, {r.high:.2f}]"
    if r.significant:
        return figure
    if r.equivalent:
        return f"{figure} (equivalent within ±{EQUIVALENCE_MARGIN:.0%})"
    after = " after correction" if r.note == CORRECTED_AWAY else ""
    return f"{figure} (inconclusive{after})"


def findings(groups: Sequence[CallerGroup]) -> list[Finding]:
    """One sentence per comparison, in the caller's words, with what was held fixed and its caveats."""
    found = []
    for c in comparisons(groups):
        a, b = c.candidate, c.baseline
        call = f"{a.count} records, {a.direction}"
        if c.question == CALLERS_QUESTION:
            sentence = (
                f"calling {a.target} from Python cost the caller {describe_cost(c.ratio)} the CPU of calling "
                f"{b.target}, {call}."
            )
        else:
            sentence = (
                f"the lab's {a.target} caller cost {describe_cost(c.ratio)} the CPU per call of its floor "
                f"(the client library alone), {call}."
            )
        budget = f"on the {a.profile} profile ({a.profile_cpus:g} CPU), {a.concurrency} calls in flight"
        held = f"the lab's callers, {budget}" if c.question == CALLERS_QUESTION else f"each caller {budget}"
        effect = abs(math.log(c.ratio.estimate)) if c.ratio.significant else 0.0
        found.append(Finding(c.question, sentence, effect, _caveat(a, b), held))
    return found + _not_compared(groups)


def _caveat(*groups: CallerGroup) -> str:
    notes = []
    for g in groups:
        if g.lower_bound:
            notes.append(f"{g.target} ({g.variant}): calls/s only a lower bound, {g.lower_bound}")
        if g.suspect:
            notes.append(f"{g.target} ({g.variant}): {g.suspect} of {len(g.results)} repeats suspect")
    return "; ".join(notes)


def _not_compared(groups: Sequence[CallerGroup]) -> list[Finding]:
    return [
        Finding(
            run.QUESTION,
            f"{g.target} ({g.variant}, {g.count} records, {g.direction}): no successful repeat of "
            f"{g.attempted}, in no ratio.",
        )
        for g in groups
        if not g.results
    ]


# The per-group table: (header, figure, format); the figures are results.callers' names.
COLUMNS = (
    ("calls/s", "calls_per_s", "{:,.0f}"),
    ("caller CPU µs / call", "cpu_per_call_us", "{:,.0f}"),
    ("caller CPU µs / record", "cpu_per_record_us", "{:.2f}"),
    ("user share", "user_share", "{:.0%}"),
    ("caller quota used", "quota_share", "{:.0%}"),
    ("server CPU µs / call", "server_cpu_per_call_us", "{:,.0f}"),
    ("server CPU used", "server_cpu_share", "{:.0%}"),
)


def section(groups: Sequence[CallerGroup]) -> list[Block]:
    """The report's section on the callers: each group's figures, the comparisons, what was not."""
    if not groups:
        return []
    headers = ["target called", "client", "variant", "direction", "records", "ok"]
    headers += [name for name, _, _ in COLUMNS]
    headers.append("caller + server CPU µs / call")
    rows = []
    for g in groups:
        row = [g.target + (" (lower bound)" if g.lower_bound else ""), g.client, g.variant, g.direction]
        row.append(str(g.count))
        row.append(f"{len(g.results)}/{g.attempted}")
        row += [_centre(g.summary(metric), spec, interval=metric == METRIC) for _, metric, spec in COLUMNS]
        caller, server = g.summary(METRIC), g.summary("server_cpu_per_call_us")
        row.append(f"{caller.centre + server.centre:,.0f}" if caller and server else "-")
        rows.append(row)
    ratio_rows = [
        [
            c.question,
            f"{c.candidate.target} ({c.candidate.variant})",
            f"{c.baseline.target} ({c.baseline.variant})",
            f"{c.candidate.count}, {c.candidate.direction}",
            describe_cost(c.ratio),
        ]
        for c in comparisons(groups)
    ]
    blocks: list[Block] = [
        Heading(2, "The caller's cost"),
        Paragraph(
            "A Python client is what is measured: each caller in a cgroup of its own at its profile's quota "
            "on one CPU, a closed loop of calls in flight, against a lab server with a whole CPU of its own. "
            "Download: the caller decodes every reply into the neutral records; upload: it builds every "
            "request from them. CPU is the caller's cgroup's over the measured window, per call completed "
            f"in it. Each figure is the {CENTRE} of the repeats (CPU per call with its {CONFIDENCE:.0%} "
            "interval); the server's CPU is its cgroup's over the same window, so caller + server is one "
            "call's CPU on both sides. A caller's calls/s is only a lower bound when the server used more "
            "than half its CPU (it may have held the caller back) or the caller left half its quota unused."
        ),
        table(headers, rows, (False, False, False, False, *(True,) * (len(headers) - 4))),
    ]
    if ratio_rows:
        blocks += [
            Paragraph("Ratios of the caller's CPU per call, paired by round:"),
            table(("question", "candidate", "baseline", "call", "CPU per call"), ratio_rows),
        ]
    return blocks


def _centre(s: Summary | None, spec: str, *, interval: bool) -> str:
    if s is None:
        return "-"
    if interval and s.low is not None and s.high is not None:
        return f"{spec.format(s.centre)} [{spec.format(s.low)}, {spec.format(s.high)}]"
    return spec.format(s.centre)


def server_side(groups: Sequence[CallerGroup], main: Run) -> list[Block]:
    """The same calls' server side from a main run (scripts/report.py --server-run): each lab caller's CPU
    per call beside the server's CPU per request there, closed model on loopback (its first such group
    of the same target, count and direction), and the two together."""
    servers: dict[tuple[str, int, str], Group] = {}
    for group in main.groups:
        if (
            group.kind == THROUGHPUT
            and group.results
            and group.network == "loopback"
            and executor(group) in CLOSED_EXECUTORS
        ):
            servers.setdefault((group.target, group.count, group.direction), group)
    rows = []
    for g in groups:
        server = servers.get((g.target, g.count, g.direction))
        caller, per_1k = g.summary(METRIC), server.summary("cpu_per_1k") if server else None
        if g.variant != LAB or server is None or caller is None or per_1k is None:
            continue
        per_request_us = per_1k.centre * 1000  # CPU s per 1,000 requests = ms per request
        rows.append(
            [
                g.target,
                g.direction,
                str(g.count),
                f"{caller.centre:,.0f}",
                f"{per_request_us:,.0f}",
                f"`{server.id}`" + (" (lower bound)" if server.lower_bound else ""),
                f"{caller.centre + per_request_us:,.0f}",
                f"{caller.centre / (caller.centre + per_request_us):.0%}",
            ]
        )
    if not rows:
        return [Paragraph(f"Run {main.run_id} has no closed-model group of the calls measured here.")]
    headers = (
        "target called",
        "direction",
        "records",
        "caller CPU µs / call",
        f"server CPU µs / request ({main.run_id})",
        "server group",
        "together µs",
        "caller's share",
    )
    return [
        Heading(2, f"The same calls' server side, from run {main.run_id}"),
        Paragraph(
            "Each lab caller's CPU per call (this run) beside the server's CPU per request under k6 in a "
            "main run, at that run's profile: what one call costs the caller, the server, and both."
        ),
        table(headers, rows, (False, False, True, True, True, False, True, True)),
    ]


def terminal_findings(run_dir: Path) -> list[str]:
    """The run's findings for a terminal: each question, then its findings, strongest first."""
    return plain(findings(groups_of(_results(run_dir))), limit=None)


def write_report(run_dir: Path, server_run: Path | None = None) -> tuple[Path, Path]:
    """report.md and report.html of a caller run, from its JSON files; with a main run's directory, the
    same calls' server side from it (server_side)."""
    manifest = read_manifest(run_dir)
    results = _results(run_dir)
    groups = groups_of(results)
    run_id = manifest.get("run_id", run_dir.name)
    blocks: list[Block] = [Heading(1, f"protolab report: caller run {run_id}"), *_findings(manifest, groups)]
    blocks += section(groups)
    if server_run is not None:
        blocks += server_side(groups, load_run(server_run))
    failed = [f"`{r['id']}`: {r.get('error')}" for r in results if r.get("status") != "ok"]
    if failed:
        blocks += [Heading(2, "Failed measurements"), Bullets(tuple(failed))]
    blocks += _provenance(manifest)
    md, page = run_dir / "report.md", run_dir / "report.html"
    write_text_atomic(md, to_markdown(blocks, run_dir))
    write_text_atomic(page, to_html(blocks, f"protolab report: caller run {run_id}"))
    return md, page


def _results(run_dir: Path) -> list[dict[str, Any]]:
    return load_results(run_dir, read_manifest(run_dir).get("measurements", []))


def _findings(manifest: Mapping[str, Any], groups: Sequence[CallerGroup]) -> list[Block]:
    host = manifest.get("host", {})
    on = (
        f"Run {manifest.get('run_id')} on {host.get('cpu_model') or 'an unrecorded host'} "
        f"({host.get('cpus_available', '?')} of {host.get('cpu_count', '?')} CPUs available), started "
        f"{manifest.get('started_at') or 'at an unrecorded time'}, preset `{manifest.get('preset')}`, "
        f"rounds shuffled by seed {manifest.get('seed')}; provenance at the end."
    )
    blocks: list[Block] = [Heading(2, "Findings"), Paragraph(CONFIDENCE_LINE), Paragraph(on)]
    found = findings(groups)
    blocks += findings_blocks(found)
    if not found:
        blocks.append(Paragraph("No finding: the run has no successful caller group yet."))
    return blocks


def _provenance(manifest: Mapping[str, Any]) -> list[Block]:
    host, versions, git = manifest.get("host", {}), manifest.get("versions", {}), manifest.get("git", {})
    rows = [
        ("run", f"{manifest.get('run_id')}, preset `{manifest.get('preset')}`"),
        ("started / finished", f"{manifest.get('started_at')} / {manifest.get('finished_at') or '-'}"),
        ("git", f"`{git.get('sha')}`" + (" with uncommitted changes" if git.get("dirty") else "")),
        ("host", f"{host.get('cpu_model')}, {host.get('cpus_available')} of {host.get('cpu_count')} CPUs, "
         f"kernel {host.get('kernel')}"),
        ("server CPUs", ", ".join(map(str, manifest.get("server_cpus", [])))),
        *((name, str(version)) for name, version in versions.items() if name != "k6"),
        ("command", f"`{' '.join(manifest.get('argv', []))}`"),
    ]  # fmt: skip
    return [Heading(2, "Provenance"), table(("", "value"), rows, (False, False))]
