"""The Summary: one row per throughput group across its repeats, and against a baseline its change."""

from labrunner.report import charts as drawing
from labrunner.report import host_conditions
from labrunner.report.cells import centre_cell, fmt, interval_cell, ratio_cell
from labrunner.report.compare import THROUGHPUT, Comparison, is_regression
from labrunner.report.document import Block, Bullets, Heading, Paragraph, table
from labrunner.report.sections.section import Report, Section, figures, groups_of
from labrunner.report.stats import CENTRE, CONFIDENCE

K6_CPU_PER_REQUEST = "{:.3f}"  # ms: k6's CPU per request is tens to hundreds of µs


TITLE = "Summary"


def applies(report: Report) -> bool:
    return bool(groups_of(report, THROUGHPUT))


def blocks(report: Report) -> list[Block]:
    run, changes, baseline = report.run, report.changes, report.baseline
    groups = groups_of(report, THROUGHPUT)
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
        Heading(2, TITLE),
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


def _change(c: Comparison, metric: str, other_host: bool = False) -> str:
    r = c.ratios.get(metric)
    if r is None:
        return "-"
    cell = ratio_cell(r)
    if other_host:
        return f"{cell} (different host)"
    return cell + (" **REGRESSION**" if metric in is_regression(c) else "")


def charts(report: Report) -> list[Block]:
    groups, out = report.run.groups, report.charts_dir
    return figures(
        [
            (
                drawing.throughput(groups, out / "throughput.png"),
                "Requests/s at saturation (closed model), by target",
                f"{drawing.WHISKERS}; blue REST, orange gRPC",
            ),
            (
                drawing.efficiency(groups, out / "cpu_per_1k_requests.png"),
                "Service CPU seconds per 1,000 requests at saturation (lower is more efficient); streaming "
                "in its own panel",
                f"{drawing.WHISKERS}; blue REST, orange gRPC",
            ),
        ]
    )


SECTION = Section(TITLE, applies, blocks, charts)
