"""Latency across repeats: each k6 statistic of each throughput group, where its samples support it."""

from collections.abc import Sequence

from labrunner.report import charts as drawing
from labrunner.report.cells import LATENCY_FORMAT, centre_interval_cells
from labrunner.report.compare import THROUGHPUT, Group
from labrunner.report.document import Block, Heading, Paragraph, table
from labrunner.report.findings.finding import OPEN_EXECUTORS, executor
from labrunner.report.sections.section import Report, Section, figures, groups_of
from labrunner.report.stats import CENTRE, CONFIDENCE, METHOD_LINE, MIN_SAMPLES_BEYOND, samples_needed
from labrunner.run.k6_stats import PERCENTILES

LATENCY_STATS = ("avg", "p50", "p90", "p95", "p99", "p99.9")


TITLE = "Latency across repeats"
NO_LATENCY_CHART = (
    "No latency chart: this run held no open-model runs (a ladder's rungs, or equal-load). Latency at "
    "saturation is set by the CPU quota more than by the protocol, so it is compared only at an offered "
    "load every target carried: add `--load-model loaded,loaded-stream` after the closed model."
)


def applies(report: Report) -> bool:
    return any(g.results for g in groups_of(report, THROUGHPUT))


def blocks(report: Report) -> list[Block]:
    groups = [g for g in groups_of(report, THROUGHPUT) if g.results]
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
        Heading(2, TITLE),
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
    models = sorted({g.load_model for g in groups if executor(g) in OPEN_EXECUTORS})
    if not models:
        return "this run has no open-model group, so no latency here compares protocols."
    names = ", ".join(f"`{m}`" for m in models)
    return (
        f"compare latency in the rows of the {names} load model (open: the same offered rate for every "
        "target), which the findings use."
    )


def charts(report: Report) -> list[Block]:
    """The latency percentiles under an equal offered load; without one, why there is no chart."""
    drawn = drawing.latency(report.run.groups, report.charts_dir / "latency.png")
    if drawn is None:
        return [Paragraph(NO_LATENCY_CHART)]
    return figures(
        [
            (
                drawn,
                "Latency percentiles p50 to p99.9 under an equal offered load (open model), by target",
                "lines: each percentile over every repeat's samples (shown where 10 lie beyond it); blue "
                "REST, orange gRPC, dashed TLS",
            )
        ]
    )


SECTION = Section(TITLE, applies, blocks, charts)
