"""The run report: results/<run>/report.md and report.html, built from the run's saved JSON."""

import json
import traceback
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labrunner.report import charts, host_conditions, payload, payload_charts, payload_sweep, serialization
from labrunner.report import network as network_figures
from labrunner.report.compare import (
    CAPACITY,
    COMPARED,
    IMPROVEMENT,
    LARGE_CHANGE,
    LARGE_NOT_SIGNIFICANT,
    LARGE_UNJUDGED,
    METRICS,
    NOT_COMPARED,
    REGRESSION,
    SEQUENTIAL,
    THROUGHPUT,
    UNJUDGED,
    VERDICTS,
    WITHIN_NOISE,
    BaselineChange,
    Comparison,
    Group,
    against_baseline,
    baseline_changes,
    budget_pairs,
    compare_groups,
    group_results,
    is_regression,
)
from labrunner.report.document import Block, Bullets, Heading, Image, Paragraph, table, to_html, to_markdown
from labrunner.report.stats import CONFIDENCE, ERROR_CONFIDENCE, ONE_REPEAT, Ratio, Summary
from labrunner.results.store import load_results, write_json_atomic, write_text_atomic

PAYLOAD_FILE = "payload.json"
SERIALIZATION_FILE = "serialization.json"
CHARTS_DIR = "charts"
LATENCY_STATS = ("avg", "p50", "p90", "p95", "p99")
_FORMATS = {
    "rps": "{:.1f}",
    "cpu_per_1k": "{:.3f}",
    "bytes": "{:.0f}",
    "service_cpu": "{:.0%}",
    "k6_cpu": "{:.0%}",
    "seconds": "{:.2f}",
    "sustainable": "{:.0f}",
}
_LATENCY_FORMAT = "{:.2f}"

Say = Callable[[str], None]


@dataclass(frozen=True)
class Run:
    """A run directory as the report reads it."""

    path: Path
    run_id: str
    manifest: Mapping[str, Any]  # empty when manifest.json is missing or unreadable
    results: tuple[Mapping[str, Any], ...]
    groups: tuple[Group, ...]


def load_run(path: Path) -> Run:
    """Manifest and results of a run directory, results in the run's scenario order."""
    manifest = _read_json(path / "manifest.json") or {}
    order = [s["id"] for s in manifest.get("matrix", {}).get("scenarios", [])]
    results = tuple(load_results(path, order))
    return Run(path, manifest.get("run_id", path.name), manifest, results, tuple(group_results(results)))


def write_report(run_dir: Path, baseline_dir: Path | None = None) -> tuple[Path, Path]:
    """Regenerate report.md, report.html and charts/ from the run's JSON files."""
    run = load_run(run_dir)
    baseline = load_run(baseline_dir) if baseline_dir is not None else None
    payload_rows = payload.rows_from_document(_read_json(run_dir / PAYLOAD_FILE))
    payload_note = ""
    if not payload_rows:
        payload_rows = payload.measure()
        payload_note = f"{PAYLOAD_FILE} was missing: computed now from the current code's record pool."
    bench = _read_json(run_dir / SERIALIZATION_FILE)
    for stale in (run_dir / CHARTS_DIR).glob("*.png"):  # a chart without data this time must not linger
        stale.unlink()
    blocks = build(run, baseline, payload_rows, payload_note, bench)
    title = f"protolab report: run {run.run_id}"
    md, page = run_dir / "report.md", run_dir / "report.html"
    write_text_atomic(md, to_markdown(blocks, run_dir))
    write_text_atomic(page, to_html(blocks, title))
    return md, page


def finish_run(run_dir: Path, benchmark: bool, say: Say) -> None:
    """What run_matrix.py does after the last scenario: payload table, benchmark, report.

    The serialization benchmark runs only after a run that was not interrupted, on the
    now idle host. Failures are reported, never raised: the results are already safe.
    """
    try:
        if not (run_dir / PAYLOAD_FILE).exists():
            write_json_atomic(run_dir / PAYLOAD_FILE, payload.as_document(payload.measure()))
        if benchmark and not (run_dir / SERIALIZATION_FILE).exists():
            say("serialization benchmark (about 10 s)")
            budget = serialization.FULL
            write_json_atomic(
                run_dir / SERIALIZATION_FILE, serialization.as_document(serialization.run(budget), budget)
            )
        md, _ = write_report(run_dir)
        say(f"report: {md} (and report.html)")
    except Exception:  # a report bug must not turn a finished run into a failed one
        say(f"report: not written:\n{traceback.format_exc()}\nregenerate with: scripts/report.py {run_dir}")


def build(
    run: Run,
    baseline: Run | None,
    payload_rows: Sequence[payload.PayloadRow],
    payload_note: str,
    bench: Any,
) -> list[Block]:
    """Every section of the report, in reading order."""
    charts_dir = run.path / CHARTS_DIR
    changes = against_baseline(run.groups, baseline.groups) if baseline else {}
    blocks: list[Block] = [Heading(1, f"protolab report: run {run.run_id}")]
    blocks += _provenance(run)
    blocks += host_conditions.calibration_warnings(run.manifest)
    blocks += _summary(run, changes, baseline)
    blocks += _latency(run)
    blocks += _sequential(run)
    blocks += _capacity(run)
    blocks += _comparisons(run)
    blocks += network_figures.section(run.groups)  # only with more than one network profile
    blocks += payload_sweep.section(run.groups, payload_rows)  # only with two or more counts
    blocks += host_conditions.section(run.manifest, run.results)
    if baseline is not None:
        blocks += _baseline(run, baseline)
    blocks += _charts(run, payload_rows, serialization.cases_from_document(bench), charts_dir)
    blocks += _payload(payload_rows, payload_note)
    blocks += _serialization(bench)
    blocks += _problems(run)
    return blocks


def _provenance(run: Run) -> list[Block]:
    m = run.manifest
    if not m:
        return [Heading(2, "Provenance"), Paragraph("manifest.json is missing: no provenance for this run.")]
    host, versions, git = m.get("host", {}), m.get("versions", {}), m.get("git", {})
    planned = len(m.get("matrix", {}).get("scenarios", []))
    ok = sum(1 for r in run.results if r.get("status") == "ok")
    state = "complete" if m.get("complete") else "partial (interrupted or still running)"
    memory = host.get("memory_bytes")
    rows = [
        ("run", f"{run.run_id}, preset `{m.get('matrix', {}).get('preset')}`"),
        ("state", f"{state}; {ok} of {len(run.results)} results ok, {planned} scenarios planned"),
        ("started / finished", f"{m.get('started_at')} / {m.get('finished_at') or '-'}"),
        ("backend", f"{m.get('backend', {}).get('name')} ({m.get('backend', {}).get('reason')})"),
        ("git", f"`{git.get('sha')}`" + (" with uncommitted changes" if git.get("dirty") else "")),
        (
            "host",
            f"{host.get('cpu_model')}, "
            f"{host.get('cpus_available')} of {host.get('cpu_count')} CPUs available, "
            + (f"{memory / 2**30:.1f} GiB, " if memory else "")
            + f"kernel {host.get('kernel')}",
        ),
        *((name, str(version)) for name, version in versions.items()),
        *_service_paths(run.results),
        ("command", f"`{' '.join(m.get('argv', []))}`"),
    ]
    notes = sorted({note for r in run.results for note in r.get("notes", [])})
    blocks: list[Block] = [Heading(2, "Provenance"), table(("", "value"), rows, (False, False))]
    if notes:
        blocks += [Paragraph("Conditions noted by the runner:"), Bullets(tuple(notes))]
    blocks.append(
        Paragraph(
            f"Statistics over repeats: intervals are {CONFIDENCE:.0%} Student t intervals of the mean; "
            f"Error is half the {ERROR_CONFIDENCE:.1%} interval (BenchmarkDotNet's column); comparisons "
            f"are ratios of geometric means with Welch {CONFIDENCE:.0%} intervals on log values, "
            "**significant** when the interval excludes 1. Latency is of successful requests, in ms."
        )
    )
    return blocks


def _service_paths(results: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """The services' Python builds and k6's network paths, as the results recorded them."""
    interpreters: set[str] = set()
    paths: set[str] = set()
    for r in results:
        service = r.get("service") or {}
        if build := service.get("interpreter"):
            interpreters.add(
                f"{build['implementation']} {build['version']} `{build['executable']}`, optimized: "
                f"{build['optimized']}, libpython {build['libpython']}"
            )
        if service.get("network_path"):
            paths.add(service["network_path"])
    rows = [("service interpreter", interpreters), ("k6 to service", paths)]
    return [(name, "; ".join(sorted(values))) for name, values in rows if values]


def _summary(run: Run, changes: Mapping[str, Comparison], baseline: Run | None) -> list[Block]:
    groups = [g for g in run.groups if g.kind == THROUGHPUT]
    if not groups:
        return []
    headers = [
        "group",
        "ok",
        "req/s median",
        f"req/s {CONFIDENCE:.0%} CI",
        "p50 median",
        "p99 median",
        f"p99 {CONFIDENCE:.0%} CI",
        "errors",
        "CPU s / 1k req",
        "bytes / resp",
        "service CPU",
        "k6 CPU",
        "others max",
        "CPU / req (cal)",
    ]
    unit = host_conditions.calibration_unit(run.manifest)
    if baseline is not None:
        headers += [f"req/s vs {baseline.run_id}", f"p99 vs {baseline.run_id}"]
    rows = []
    for g in groups:
        rps, p99 = g.summary("rps"), g.summary("p99")
        errors = sum((r["k6"]["metrics"] or {}).get("errors") or 0 for r in g.results)
        row = [
            f"`{g.id}`" + (" (lower bound)" if g.lower_bound else ""),
            f"{len(g.results)}/{g.attempted}",
            _median(rps, "rps"),
            _interval(rps, "rps"),
            _median(g.summary("p50"), "p50"),
            _median(p99, "p99"),
            _interval(p99, "p99"),
            str(errors) if g.results else "-",
            _median(g.summary("cpu_per_1k"), "cpu_per_1k"),
            _median(g.summary("bytes"), "bytes"),
            _median(g.summary("service_cpu"), "service_cpu"),
            _median(g.summary("k6_cpu"), "k6_cpu"),
            _fmt(host_conditions.others_max(g.results), "{:.1%}"),
            _fmt(host_conditions.cpu_per_request_cal(g, unit), "{:.3f}"),
        ]
        if baseline is not None:
            change = changes.get(g.id)
            row += [_change(change, "rps"), _change(change, "p99")] if change else ["not in baseline"] * 2
        rows.append(row)
    return [
        Heading(2, "Summary"),
        Paragraph(
            "Closed and open load models, one row per scenario group (target.profile.count.load model) "
            "across its repeats. CPU is the share of the profile's quota (service) or of k6's own CPUs; "
            "bytes are what k6 received per response, headers and framing included. Others max: the "
            "largest share of the service's or k6's CPUs that processes outside the scenario took in "
            "any repeat; CPU / req (cal): the median service CPU per request in calibration units "
            "(see Host interference and calibration). A lower bound is a closed-model group that k6 or "
            "something else, not the service, limited: the service does at least this much, and the "
            "group enters no comparison."
        ),
        table(headers, rows),
        *(
            [Bullets(tuple(f"`{g.id}`: {g.lower_bound}" for g in groups if g.lower_bound))]
            if any(g.lower_bound for g in groups)
            else []
        ),
    ]


def _latency(run: Run) -> list[Block]:
    groups = [g for g in run.groups if g.kind == THROUGHPUT and g.results]
    if not groups:
        return []
    rows = []
    for g in groups:
        for stat in LATENCY_STATS:
            s = g.summary(stat)
            if s is not None:
                rows.append([f"`{g.id}`", stat, *_bdn(s, _LATENCY_FORMAT), _interval(s, stat)])
    return [
        Heading(2, "Latency across repeats"),
        Paragraph(
            "Each k6 statistic (avg and percentiles of one repeat) summarised over the repeats in "
            "BenchmarkDotNet's columns, in ms."
        ),
        table(("group", "statistic", "n", "Mean", "Error", "StdDev", "Median", f"{CONFIDENCE:.0%} CI"), rows),
    ]


def _sequential(run: Run) -> list[Block]:
    groups = [g for g in run.groups if g.kind == SEQUENTIAL]
    if not groups:
        return []
    rows = []
    for g in groups:
        s = g.summary("avg")
        rows.append(
            [
                g.target,
                g.protocol + (" TLS" if g.tls else ""),
                g.profile,
                str(g.count),
                str(g.iterations),
                *(_bdn(s, _LATENCY_FORMAT) if s else ["0", "-", "-", "-", "-"]),
                _median(g.summary("p50"), "p50"),
                _median(g.summary("p99"), "p99"),
                _median(g.summary("seconds"), "seconds"),
            ]
        )
    return [
        Heading(2, "Sequential latency"),
        Paragraph(
            "One client (1 VU) sends N requests one after another on one connection; each repeat is a "
            "fresh service and k6 run. Mean/Error/StdDev/Median are of the repeats' mean latency in ms; "
            "p50 and p99 are medians over repeats; time is the k6 run for all N requests."
        ),
        table(
            (
                "target",
                "protocol",
                "profile",
                "count",
                "N",
                "n",
                "Mean",
                "Error",
                "StdDev",
                "Median",
                "p50",
                "p99",
                "time s",
            ),
            rows,
            (False, False, False, True, True, True, True, True, True, True, True, True, True),
        ),
    ]


def _capacity(run: Run) -> list[Block]:
    groups = [g for g in run.groups if g.kind == CAPACITY]
    if not groups:
        return []
    rows = []
    for g in groups:
        for result in g.results:
            search = result["capacity"]
            best = next((s for s in search["steps"] if s["rate"] == search["sustainable_rate"]), None)
            rows.append(
                [
                    f"`{g.id}`",
                    str(result["scenario"]["repeat"]),
                    f"{search['slo_p99_ms']:g} ms",
                    _fmt(search["sustainable_rate"], "{:.0f}") if search["sustainable_rate"] else "none",
                    search["limit"],
                    _fmt(best["p99_ms"] if best else None, _LATENCY_FORMAT),
                    _fmt(best["service_cpu_utilisation"] if best else None, "{:.0%}"),
                    str(len(search["steps"])),
                ]
            )
    medians = [
        f"`{g.id}`: median {s.median:.0f} req/s over {s.n} repeat(s)"
        for g in groups
        if (s := g.summary("sustainable")) is not None
    ]
    blocks: list[Block] = [
        Heading(2, "Capacity"),
        Paragraph(
            "Open model (constant arrival rate): each step is one k6 run at a fixed rate; the rate grows "
            "while p99, errors and dropped iterations stay within the SLO, then bisects. Sustainable = "
            "the highest passing rate below the lowest failing one."
        ),
        table(
            (
                "group",
                "repeat",
                "SLO p99",
                "sustainable req/s",
                "limited by",
                "p99 there",
                "service CPU",
                "steps",
            ),
            rows,
            (False, True, True, True, False, True, True, True),
        ),
    ]
    if medians:
        blocks.append(Bullets(tuple(medians)))
    return blocks


def _comparisons(run: Run) -> list[Block]:
    comparisons = compare_groups(run.groups)
    budgets = budget_pairs(run.groups)
    if not comparisons and not budgets:
        return []
    blocks: list[Block] = [
        Heading(2, "Comparisons"),
        Paragraph(
            "Ratios are candidate / baseline (> 1 means more requests/s, or more latency, CPU or bytes). "
            "Pairs come from target attributes: the same server and TLS for HTTP/2 vs HTTP/1.1, the same "
            "TLS for gRPC vs REST, the same protocol and TLS for server vs server, always the same "
            "profile, payload and load model."
        ),
    ]
    for kind in (THROUGHPUT, SEQUENTIAL, CAPACITY):
        members = [c for c in comparisons if c.candidate.kind == kind]
        if not members:
            continue
        metrics = COMPARED[kind]
        rows = [
            [c.kind, c.candidate.target, c.baseline.target, c.candidate.context, *_ratio_cells(c, metrics)]
            for c in members
        ]
        headers = ("comparison", "candidate", "baseline", "held fixed", *(METRICS[m].label for m in metrics))
        blocks += [
            Heading(3, f"{kind.capitalize()} comparisons"),
            table(headers, rows, _left(4, len(headers))),
        ]
    if budgets:
        rows = []
        for c in budgets:
            ideal = c.candidate.cpus / c.baseline.cpus
            metric = COMPARED[c.candidate.kind][0]
            r = c.ratios.get(metric)
            rows.append(
                [
                    c.candidate.target,
                    f"c{c.candidate.count}, {c.candidate.load_model}",
                    c.kind,
                    _ratio_cell(r) if r else "-",
                    f"{r.estimate / ideal:.0%}" if r else "-",
                ]
            )
        blocks += [
            Heading(3, "Budget scaling"),
            Paragraph(
                "Does a bigger CPU budget buy proportionally more? Scaling is the throughput ratio over "
                "the CPU ratio: 100% means doubling the budget doubled the throughput."
            ),
            table(
                ("target", "held fixed", "budgets", "throughput ratio", "scaling"),
                rows,
                (False, False, False, True, True),
            ),
        ]
    return blocks


def _baseline(run: Run, baseline: Run) -> list[Block]:
    changes = baseline_changes(run.groups, baseline.groups)
    blocks: list[Block] = [
        Heading(2, f"Against baseline run {baseline.run_id}"),
        Paragraph(
            f"Each group of this run against the same group of {baseline.path}; ratio = this run / "
            f"baseline, with its Welch {CONFIDENCE:.0%} interval where both runs have repeats. A "
            "regression is a significant change for the worse: fewer requests/s or more latency or CPU "
            "per request. With one repeat in either run no test can tell a change from noise, so such a "
            f"group is not judged; a change beyond ±{LARGE_CHANGE:.0%} is flagged, tested or not."
        ),
    ]
    sha_now, sha_then = run.manifest.get("git", {}).get("sha"), baseline.manifest.get("git", {}).get("sha")
    host_now, host_then = run.manifest.get("host", {}), baseline.manifest.get("host", {})
    if host_now.get("cpu_model") != host_then.get("cpu_model"):
        blocks.append(Paragraph("**Different hosts**: the change mixes code and machine."))
    blocks.append(Paragraph(f"Code: `{sha_then}` then, `{sha_now}` now."))
    blocks += host_conditions.baseline_warnings(run.manifest, baseline.manifest, baseline.run_id)
    blocks.append(Paragraph(_baseline_findings(changes)))
    for kind in (THROUGHPUT, SEQUENTIAL, CAPACITY):
        members = [c for c in changes if c.current.kind == kind]
        if not members:
            continue
        metrics = COMPARED[kind]
        first = metrics[0]
        headers = (
            "group",
            "repeats (baseline / now)",
            f"baseline → now ({METRICS[first].label}, mean)",
            *(METRICS[m].label for m in metrics),
            "verdict",
        )
        rows = [
            [
                f"`{c.id}`",
                f"{len(c.baseline.results)} / {len(c.current.results)}",
                f"{_mean(c.baseline, first)} → {_mean(c.current, first)}",
                *(_baseline_cell(c.ratios.get(m)) for m in metrics),
                _verdict_cell(c),
            ]
            for c in members
        ]
        blocks += [
            Heading(3, f"{kind.capitalize()} groups against the baseline"),
            table(headers, rows, (False, *(True,) * (len(headers) - 2), False)),
        ]
    ids_now, ids_then = {g.id for g in run.groups}, {g.id for g in baseline.groups}
    for ids, where in ((ids_now - ids_then, "this run"), (ids_then - ids_now, "the baseline")):
        if ids:
            blocks.append(Paragraph(f"Only in {where}: " + ", ".join(f"`{m}`" for m in sorted(ids)) + "."))
    return blocks


# How the findings sentence counts each verdict: (one, several).
_FINDINGS = {
    REGRESSION: ("significant regression", "significant regressions"),
    IMPROVEMENT: ("significant improvement", "significant improvements"),
    LARGE_UNJUDGED: ("large unjudged change", "large unjudged changes"),
    LARGE_NOT_SIGNIFICANT: ("large non-significant change", "large non-significant changes"),
    UNJUDGED: (
        f"unjudged group with changes within ±{LARGE_CHANGE:.0%}",
        f"unjudged groups with changes within ±{LARGE_CHANGE:.0%}",
    ),
    WITHIN_NOISE: ("group within noise", "groups within noise"),
    NOT_COMPARED: (
        "group without a successful repeat in one run",
        "groups without a successful repeat in one run",
    ),
}


def _baseline_findings(changes: Sequence[BaselineChange]) -> str:
    """What the comparison found; "no regression" only when every group was judged and none changed."""
    if not changes:
        return "No group is present in both runs: nothing to compare."
    counts = Counter(c.verdict for c in changes)
    if counts[WITHIN_NOISE] == len(changes):
        return (
            f"No regression among {len(changes)} group{'s' if len(changes) > 1 else ''} present in both "
            "runs: every group has repeats in both runs and none changed significantly."
        )
    parts = []
    for verdict in VERDICTS:
        n = counts[verdict]
        if n:
            one, several = _FINDINGS[verdict]
            part = f"{n} {one if n == 1 else several}"
            parts.append(f"**{part}**" if verdict == REGRESSION else part)
    present = f"{len(changes)} group{'s' if len(changes) > 1 else ''} present in both runs"
    text = f"{present}: " + ", ".join(parts) + "."
    if any(c.ratios[m].note == ONE_REPEAT for c in changes for m in c.untested):
        text += (
            " With one repeat in either run no test can judge a change: rerun both with `--repeats 3` "
            "or more to judge them."
        )
    return text


def _baseline_cell(r: Ratio | None) -> str:
    """A ratio against the baseline with its change in percent, and its interval where tested."""
    if r is None:
        return "-"
    text = f"{r.estimate:.2f}x ({_percent(r.estimate)})"
    if r.significant is None:
        return text
    interval = f"[{r.low:.2f}, {r.high:.2f}]"
    return f"**{text}** {interval} significant" if r.significant else f"{text} {interval} not significant"


def _verdict_cell(c: BaselineChange) -> str:
    if c.comparison is None:
        return (
            f"not compared: no successful repeat in {'this run' if not c.current.results else 'the baseline'}"
        )
    if not c.ratios:
        return "not compared: no metric has values in both runs"
    parts = []
    if c.worse:
        parts.append(f"**{REGRESSION}** ({_labels(c.worse)})")
    if c.better:
        parts.append(f"{IMPROVEMENT} ({_labels(c.better)})")
    untested = c.untested
    for note in sorted({c.ratios[m].note for m in untested}):
        if note == ONE_REPEAT:
            parts.append("one repeat: cannot judge")
        else:
            parts.append(
                f"cannot judge {_labels([m for m in untested if c.ratios[m].note == note])} ({note})"
            )
    if not parts:
        parts.append(WITHIN_NOISE)
    for large, how in (
        ([m for m in c.large if m in untested], "not tested"),
        ([m for m in c.large if m not in untested], "not significant"),
    ):
        if large:
            moves = ", ".join(f"{_percent(c.ratios[m].estimate)} {METRICS[m].label}" for m in large)
            parts.append(f"**large change ({moves}), {how}**")
    return "; ".join(parts)


def _labels(metrics: Sequence[str]) -> str:
    return ", ".join(METRICS[m].label for m in metrics)


def _percent(estimate: float) -> str:
    """The change a ratio stands for: 0.6 -> -40%, 1.09 -> +9%."""
    return f"{estimate - 1:+.0%}"


def _mean(g: Group, metric: str) -> str:
    s = g.summary(metric)
    return _fmt(s.mean if s else None, _format(metric))


def _charts(
    run: Run, rows: Sequence[payload.PayloadRow], cases: Sequence[serialization.Case], out: Path
) -> list[Block]:
    whiskers = f"bars: mean; whiskers: {CONFIDENCE:.0%} interval of the mean; dots: repeats"
    drawn = [
        (charts.throughput(run.groups, out / "throughput.png"), "Requests/s by target and profile", whiskers),
        (charts.latency(run.groups, out / "latency.png"), "Latency percentiles by target", whiskers),
        (
            charts.efficiency(run.groups, out / "cpu_per_1k_requests.png"),
            "Service CPU seconds per 1,000 requests (lower is more efficient)",
            whiskers,
        ),
        (
            charts.payload_bytes(run.groups, rows, out / "bytes_per_response.png"),
            "Bytes per response: on the wire and by encoding",
            "left: median over repeats; right: the payload table below",
        ),
        *payload_charts.drawn(run.groups, rows, out),
        (charts.sequential(run.groups, out / "sequential.png"), "Sequential mean latency by N", whiskers),
        (
            charts.capacity(run.groups, out / "capacity.png"),
            "Capacity search: p99 by offered rate",
            "x: failed steps; dashed: the SLO",
        ),
        (
            charts.serialization(cases, out / "serialization.png"),
            "Serialization: microseconds per operation",
            f"whiskers: Error (half the {ERROR_CONFIDENCE:.1%} interval)",
        ),
    ]
    images = [Image(path, alt, f"{alt}. {caption}.") for path, alt, caption in drawn if path is not None]
    return [Heading(2, "Charts"), *images] if images else []


def _payload(rows: Sequence[payload.PayloadRow], note: str) -> list[Block]:
    blocks: list[Block] = [
        Heading(2, "Payload size"),
        Paragraph(
            f"Body bytes of one response of N records (the same records, pool offset 0) as REST JSON and "
            f"as the gRPC protobuf message, raw and gzip level {payload.GZIP_LEVEL}. Wire bytes add HTTP "
            "headers or gRPC framing, and TLS."
        ),
    ]
    if note:
        blocks.append(Paragraph(note))
    blocks.append(
        table(
            ("records", "JSON", "JSON gzip", "protobuf", "protobuf gzip", "protobuf / JSON"),
            [
                [
                    str(r.count),
                    str(r.json_bytes),
                    str(r.json_gzip_bytes),
                    str(r.protobuf_bytes),
                    str(r.protobuf_gzip_bytes),
                    f"{r.protobuf_bytes / r.json_bytes:.2f}",
                ]
                for r in rows
            ],
        )
    )
    return blocks


def _serialization(bench: Any) -> list[Block]:
    cases = serialization.cases_from_document(bench)
    heading = Heading(2, "Serialization micro-benchmark")
    if not cases:
        return [
            heading,
            Paragraph(
                "Not measured for this run. Measure it on the run's host with "
                "`python scripts/bench_serialization.py --out RUN_DIR/serialization.json`, then rerun "
                "`scripts/report.py RUN_DIR`."
            ),
        ]
    budget = bench["budget"]
    rows = [
        [
            c.codec,
            c.operation,
            str(c.count),
            str(c.bytes),
            *_bdn_values(c.n, c.mean_us, c.error_us, c.stddev_us, c.median_us, spec="{:.2f}"),
        ]
        for c in cases
    ]
    return [
        heading,
        Paragraph(
            f"One Python thread, {bench['python']}, protobuf backend {bench['protobuf_backend']}, "
            + ", ".join(f"{k} {v}" for k, v in bench["versions"].items())
            + f"; {budget['iterations']} iterations of at least {budget['iteration_s'] * 1000:g} ms per case"
            + (" (quick)" if bench.get("quick") else "")
            + ". Encode: the pool's dicts (JSON) or a prebuilt message (protobuf) to bytes; decode: bytes "
            "to dicts or a message. Microseconds per operation."
        ),
        table(
            ("codec", "operation", "records", "bytes", "n", "Mean", "Error", "StdDev", "Median"),
            rows,
            (False, False, True, True, True, True, True, True, True),
        ),
    ]


def _problems(run: Run) -> list[Block]:
    items = []
    for r in run.results:
        failure = r.get("failure")
        if failure:
            items.append(f"`{r['scenario_id']}` failed in {failure['phase']}: {failure['message']}")
        items += [f"`{r['scenario_id']}` suspect: {reason}" for reason in r.get("suspect") or []]
    if not items:
        return [Heading(2, "Failed and suspect results"), Paragraph("None.")]
    return [Heading(2, "Failed and suspect results"), Bullets(tuple(items))]


def _ratio_cells(c: Comparison, metrics: Sequence[str]) -> list[str]:
    return [_ratio_cell(c.ratios[m]) if m in c.ratios else "-" for m in metrics]


def _ratio_cell(r: Ratio) -> str:
    if r.significant is None:
        return f"{r.estimate:.2f}x ({r.note})"
    interval = f"[{r.low:.2f}, {r.high:.2f}]"
    return (
        f"**{r.estimate:.2f}x** {interval} significant"
        if r.significant
        else f"{r.estimate:.2f}x {interval} not significant"
    )


def _change(c: Comparison, metric: str) -> str:
    r = c.ratios.get(metric)
    if r is None:
        return "-"
    cell = _ratio_cell(r)
    return cell + (" **REGRESSION**" if metric in is_regression(c) else "")


def _median(s: Summary | None, metric: str) -> str:
    return _fmt(s.median if s else None, _format(metric))


def _interval(s: Summary | None, metric: str) -> str:
    if s is None:
        return "-"
    if s.ci_low is None or s.ci_high is None:
        return "n/a: one repeat"
    spec = _format(metric)
    return f"[{spec.format(s.ci_low)}, {spec.format(s.ci_high)}]"


def _bdn(s: Summary, spec: str) -> list[str]:
    return _bdn_values(s.n, s.mean, s.error, s.stddev, s.median, spec=spec)


def _bdn_values(
    n: int, mean: float, error: float | None, stddev: float | None, median: float, *, spec: str
) -> list[str]:
    return [str(n), spec.format(mean), _fmt(error, spec), _fmt(stddev, spec), spec.format(median)]


def _format(metric: str) -> str:
    return _FORMATS.get(metric, _LATENCY_FORMAT)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else spec.format(value)


def _left(count: int, total: int) -> tuple[bool, ...]:
    return tuple(i >= count for i in range(total))


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
