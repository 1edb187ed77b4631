"""The report's sections on one run: findings, summary, latency, sequential, capacity, comparisons,
the failed and suspect results, and provenance."""

from collections.abc import Mapping, Sequence

from labrunner.report import aa_control, answers, charts, floor, host_conditions, serialization
from labrunner.report import findings as run_findings
from labrunner.report.cells import (
    LATENCY_FORMAT,
    centre_cell,
    centre_interval_cells,
    fmt,
    interval_cell,
    left_first,
    ratio_cell,
)
from labrunner.report.compare import (
    AA_CONTROL,
    CAPACITY,
    COMPARED,
    METRICS,
    SEQUENTIAL,
    THROUGHPUT,
    Comparison,
    Group,
    budget_pairs,
    compare_groups,
    is_regression,
)
from labrunner.report.document import Block, Bullets, Heading, Image, Paragraph, table
from labrunner.report.floor import lab_groups
from labrunner.report.runs import Run, read_json
from labrunner.report.stats import (
    CENTRE,
    CONFIDENCE,
    METHOD_LINE,
    MIN_SAMPLES_BEYOND,
    RATIO_METHOD_LINE,
    Ratio,
    samples_needed,
)
from labrunner.results.result import Result
from labrunner.results.trust import verdict_of
from labrunner.run.k6_stats import PERCENTILES

LATENCY_STATS = ("avg", "p50", "p90", "p95", "p99", "p99.9")
K6_CPU_PER_REQUEST = "{:.3f}"  # ms: k6's CPU per request is tens to hundreds of µs


def findings(run: Run) -> list[Block]:
    """The answers first: the findings' chart, each question's lines and their notes, then the method and
    the run's host and date."""
    m = run.manifest
    host, preset = m.get("host", {}), m.get("matrix", {}).get("preset")
    on = (
        f"Run {run.run_id} on {host.get('cpu_model') or 'an unrecorded host'} "
        f"({host.get('cpus_available', '?')} of {host.get('cpu_count', '?')} CPUs available), "
        f"started {m.get('started_at') or 'at an unrecorded time'}, preset `{preset}`; provenance at the end."
    )
    bench = read_json(run.path / serialization.FILE)
    found = answers.for_run(run.groups, preset, cases=serialization.cases_from_document(bench))
    blocks: list[Block] = [Heading(2, "Findings")]
    if chart := charts.forest(forest_rows(run.groups), run.path / "charts" / "findings.png"):
        blocks.append(
            Image(chart, "the findings' ratios", "req/s ratios of the compared pairs, A/A control first")
        )
    blocks += run_findings.blocks(found)
    if not found:
        blocks.append(Paragraph(run_findings.NONE_YET.removeprefix("- ")))
    return [*blocks, Paragraph(f"{run_findings.CONFIDENCE_LINE} {run_findings.LEGEND}"), Paragraph(on)]


def forest_rows(groups: Sequence[Group]) -> list[tuple[str, Ratio]]:
    """The req/s ratio of each duet's A/A control and of each pair the findings compare, labelled."""
    lab = lab_groups(groups)
    comparisons = [*aa_control.controls(lab), *(c for _, c in run_findings.saturation_comparisons(lab))]
    return [
        (
            f"{c.candidate.target} / {c.baseline.target}"
            if c.kind != AA_CONTROL
            else f"A/A {c.candidate.target}",
            r,
        )
        for c in comparisons
        if (r := c.ratios.get("rps")) is not None
    ]


def provenance(run: Run) -> list[Block]:
    m = run.manifest
    if not m:
        return [Heading(2, "Provenance"), Paragraph("manifest.json is missing: no provenance for this run.")]
    host, versions, git = m.get("host", {}), m.get("versions", {}), m.get("git", {})
    planned = len(m.get("matrix", {}).get("scenarios", []))
    ok = sum(1 for r in run.results if r.status == "ok")
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
        *host_conditions.fingerprint_rows(m.get("fingerprint")),
        *host_conditions.steal_clock_row(m.get("steal_clock")),
        *((name, str(version)) for name, version in versions.items()),
        *_service_paths(run.results),
        ("command", f"`{' '.join(m.get('argv', []))}`"),
    ]
    notes = sorted({note for r in run.results for note in r.notes})
    blocks: list[Block] = [Heading(2, "Provenance"), table(("", "value"), rows, (False, False))]
    if notes:
        blocks += [Paragraph("Conditions noted by the runner:"), Bullets(tuple(notes))]
    blocks.append(
        Paragraph(
            f"Statistics over repeats: {METHOD_LINE} {RATIO_METHOD_LINE} Latency is of successful "
            "requests, in ms."
        )
    )
    return blocks


def _service_paths(results: Sequence[Result]) -> list[tuple[str, str]]:
    """The services' Python builds and k6's network paths, as the results recorded them."""
    interpreters: set[str] = set()
    paths: set[str] = set()
    for r in results:
        if build := r.interpreter:
            interpreters.add(
                f"{build['implementation']} {build['version']} `{build['executable']}`, optimized: "
                f"{build['optimized']}, libpython {build['libpython']}"
            )
        if r.network_path:
            paths.add(r.network_path)
    rows = [("service interpreter", interpreters), ("k6 to service", paths)]
    return [(name, "; ".join(sorted(values))) for name, values in rows if values]


def summary(run: Run, changes: Mapping[str, Comparison], baseline: Run | None) -> list[Block]:
    groups = [g for g in run.groups if g.kind == THROUGHPUT]
    if not groups:
        return []
    headers = [
        "group",
        "ok",
        "req/s",
        f"req/s {CONFIDENCE:.0%} CI",
        "p50",
        "p99",
        f"p99 {CONFIDENCE:.0%} CI",
        "errors",
        "CPU s / 1k req",
        "bytes / resp",
        "service CPU",
        "k6 CPU",
        "k6 CPU / req (ms)",
        "others max",
        "CPU / req (cal)",
    ]
    unit = host_conditions.calibration_unit(run.manifest)
    # Two hosts' absolute figures differ by machine as much as by code: no change is a regression.
    other_host = baseline is not None and bool(
        host_conditions.host_differences(run.manifest, baseline.manifest)
    )
    if baseline is not None:
        headers += [f"req/s vs {baseline.run_id}", f"p99 vs {baseline.run_id}"]
    rows = []
    for g in groups:
        rps, p99 = g.summary("rps"), g.summary("p99")
        errors = sum(r.metrics.errors or 0 for r in g.results if r.metrics)
        row = [
            f"`{g.id}`" + (" (lower bound)" if g.lower_bound else ""),
            f"{len(g.results)}/{g.attempted}",
            centre_cell(rps, "rps"),
            interval_cell(rps, "rps"),
            centre_cell(g.summary("p50"), "p50"),
            centre_cell(p99, "p99"),
            interval_cell(p99, "p99"),
            str(errors) if g.results else "-",
            centre_cell(g.summary("cpu_per_1k"), "cpu_per_1k"),
            centre_cell(g.summary("bytes"), "bytes"),
            centre_cell(g.summary("service_cpu"), "service_cpu"),
            centre_cell(g.summary("k6_cpu"), "k6_cpu"),
            fmt(k6_cpu.centre if (k6_cpu := g.summary("k6_cpu_per_1k")) else None, K6_CPU_PER_REQUEST),
            fmt(host_conditions.others_max(g.results), "{:.1%}"),
            fmt(host_conditions.cpu_per_request_cal(g, unit), "{:.3f}"),
        ]
        if baseline is not None:
            change = changes.get(g.id)
            row += (
                [_change(change, "rps", other_host), _change(change, "p99", other_host)]
                if change
                else ["not in baseline"] * 2
            )
        rows.append(row)
    return [
        Heading(2, "Summary"),
        Paragraph(
            "Closed and open load models, one row per scenario group (target.profile.count.load model) "
            f"across its repeats: every number is the {CENTRE} of the repeats. CPU is the share of the "
            "profile's quota (service) or of k6's own CPUs; bytes are what k6 received per response, "
            "headers and framing included. k6 CPU / req: k6's CPU time per successful request in ms "
            "(its process, start-up included), what the load generator pays for a request of the "
            "group's protocol. Others max: the largest share of the service's or k6's CPUs "
            "that processes outside the scenario took in any repeat; CPU / req (cal): the service CPU "
            "per request in calibration units (see Host interference and calibration). A lower bound "
            "is a closed-model group that k6 or something else, not the service, limited: the service "
            "does at least this much, and the group enters no comparison."
        ),
        table(headers, rows),
        *(
            [Bullets(tuple(f"`{g.id}`: {g.lower_bound}" for g in groups if g.lower_bound))]
            if any(g.lower_bound for g in groups)
            else []
        ),
    ]


def latency(run: Run) -> list[Block]:
    groups = [g for g in run.groups if g.kind == THROUGHPUT and g.results]
    if not groups:
        return []
    rows = []
    for g in groups:
        for stat in LATENCY_STATS:
            s = g.summary(stat)
            if s is not None and g.supports(stat):
                rows.append([f"`{g.id}`", stat, *centre_interval_cells(s, LATENCY_FORMAT)])
            elif s is not None:
                rows.append(
                    [
                        f"`{g.id}`",
                        stat,
                        str(s.n),
                        f"— ({g.fewest_samples:,} samples in a repeat: needs "
                        f"{samples_needed(PERCENTILES[stat]):,})",
                        "",
                        "",
                        "",
                    ]
                )
    return [
        Heading(2, "Latency across repeats"),
        Paragraph(
            "Each k6 statistic over the repeats, in ms, on each script's clock (k6's own timer of a "
            "request: http_req_duration for REST, grpc_req_duration for gRPC). A percentile's centre "
            f"is the {CENTRE} of the repeats' own percentiles, the centre its ratios pair round by round; "
            f"a percentile with fewer than {MIN_SAMPLES_BEYOND} samples beyond it in any repeat is not "
            f"shown. {METHOD_LINE} Under a closed "
            "model (constant VUs) every target runs at saturation, where "
            "latency is set by the CPU quota (the CFS period) more than by the protocol: "
            + _equal_load_pointer(groups)
        ),
        table(
            ("group", "statistic", "n", CENTRE, f"{CONFIDENCE:.0%} CI", "min", "max"),
            rows,
            (False, False, True, True, True, True, True),
        ),
    ]


def _equal_load_pointer(groups: Sequence[Group]) -> str:
    """Where to read latency that compares protocols: the open-model (equal offered load) rows."""
    models = sorted({g.load_model for g in groups if run_findings.executor(g) in run_findings.OPEN_EXECUTORS})
    if not models:
        return "this run has no open-model group, so no latency here compares protocols."
    names = ", ".join(f"`{m}`" for m in models)
    return (
        f"compare latency in the rows of the {names} load model (open: the same offered rate for every "
        "target), which the findings use."
    )


def sequential(run: Run) -> list[Block]:
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
                *(centre_interval_cells(s, LATENCY_FORMAT) if s else ["0", "-", "-", "-", "-"]),
                centre_cell(g.summary("p50"), "p50"),
                centre_cell(g.summary("p99"), "p99"),
                centre_cell(g.summary("seconds"), "seconds"),
            ]
        )
    return [
        Heading(2, "Sequential latency"),
        Paragraph(
            "One client (1 VU) sends N requests one after another on one connection; each repeat is a "
            "fresh service and k6 run. The columns n to max are of the repeats' mean latency in ms; "
            f"p50, p99 and time (the k6 run for all N requests) are {CENTRE}s over repeats. {METHOD_LINE}"
        ),
        table(
            (
                "target",
                "protocol",
                "profile",
                "count",
                "N",
                "n",
                CENTRE,
                f"{CONFIDENCE:.0%} CI",
                "min",
                "max",
                "p50",
                "p99",
                "time s",
            ),
            rows,
            (False, False, False, True, True, True, True, True, True, True, True, True, True),
        ),
    ]


def capacity(run: Run) -> list[Block]:
    groups = [g for g in run.groups if g.kind == CAPACITY]
    if not groups:
        return []
    rows = []
    for g in groups:
        for result in g.results:
            if (search := result.capacity) is None:
                continue
            best = next((s for s in search.steps if s.rate == search.sustainable_rate), None)
            rows.append(
                [
                    f"`{g.id}`",
                    str(result.scenario.repeat),
                    f"{search.slo_p99_ms:g} ms",
                    fmt(search.sustainable_rate, "{:.0f}") if search.sustainable_rate else "none",
                    search.limit,
                    fmt(best.p99_ms if best else None, LATENCY_FORMAT),
                    fmt(best.service_cpu_utilisation if best else None, "{:.0%}"),
                    str(len(search.steps)),
                ]
            )
    centres = [
        f"`{g.id}`: {CENTRE} {s.centre:.0f} req/s over {s.n} repeat(s)"
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
    if centres:
        blocks.append(Bullets(tuple(centres)))
    return blocks


def comparisons(run: Run) -> list[Block]:
    comparisons = compare_groups(floor.lab_groups(run.groups))
    budgets = budget_pairs(run.groups)
    if not comparisons and not budgets:
        return []
    blocks: list[Block] = [
        Heading(2, "Comparisons"),
        Paragraph(
            "Ratios are candidate / baseline (> 1 means more requests/s, or more latency, CPU or bytes). "
            "Pairs come from target attributes: the same server and TLS for HTTP/2 vs HTTP/1.1, the same "
            "TLS for gRPC vs REST, the same protocol and TLS for server vs server, always the same "
            f"profile, payload and load model. {RATIO_METHOD_LINE}"
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
            table(headers, rows, left_first(4, len(headers))),
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
                    ratio_cell(r) if r else "-",
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


def problems(run: Run) -> list[Block]:
    items = []
    for r in run.results:
        if r.failure:
            items.append(f"`{r.scenario_id}` failed in {r.failure.phase}: {r.failure.message}")
        items += [f"`{r.scenario_id}` suspect: {reason}" for reason in verdict_of(r).suspect]
    if not items:
        return [Heading(2, "Failed and suspect results"), Paragraph("None.")]
    return [Heading(2, "Failed and suspect results"), Bullets(tuple(items))]


def _ratio_cells(c: Comparison, metrics: Sequence[str]) -> list[str]:
    return [ratio_cell(c.ratios[m]) if m in c.ratios else "-" for m in metrics]


def _change(c: Comparison, metric: str, other_host: bool = False) -> str:
    r = c.ratios.get(metric)
    if r is None:
        return "-"
    cell = ratio_cell(r)
    if other_host:
        return f"{cell} (different host)"
    return cell + (" **REGRESSION**" if metric in is_regression(c) else "")
