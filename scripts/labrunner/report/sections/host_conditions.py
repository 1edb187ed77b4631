"""Host interference and calibration: others' CPU time and steal on each scenario's CPUs, the run's
calibration, and each group's CPU per request in its units."""

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from labrunner.report.cells import fmt
from labrunner.report.compare import group_results
from labrunner.report.document import Block, Heading, Paragraph, table
from labrunner.report.host_conditions import user_share
from labrunner.report.sections.section import Report, Section, always
from labrunner.results.result import Others, Result
from labrunner.results.trust import SUSPECT_SHARE
from labrunner.run import calibration

TITLE = "Host interference and calibration"


def blocks(report: Report) -> list[Block]:
    manifest, results = report.run.manifest, report.run.results
    shown: list[Block] = [
        Heading(2, TITLE),
        Paragraph(
            "Others: the CPU time that processes outside the scenario used on the service's and on k6's "
            "CPUs during the measured window (their time neither idle nor stolen, from per-CPU "
            "/proc/stat, minus the scenario's own CPU time), as a share of those CPUs' capacity (wall "
            "time x CPUs); steal: what the hypervisor took from them. "
            f"Above {SUSPECT_SHARE:.0%} the result is suspect. On network scenarios with the "
            "userspace link emulator, the relay runs on k6's CPUs: its CPU time counts as others there "
            "and is shown apart (of which relay); so is the CPU time of the Prometheus and InfluxDB the run "
            "started, pinned to k6's CPUs (of which lab), which is not held against the host."
        ),
    ]
    rows = [_interference_row(r) for r in results if r.host is not None or r.unmeasured is not None]
    if rows:
        shown.append(
            table(
                ("scenario", "service CPUs", "others there", "k6 CPUs", "others there", "steal"),
                rows,
                (False, False, True, False, True, True),
            )
        )
    shown += _calibration(manifest.get("calibration") or {})
    shown += _cpu_per_request_in_units(manifest.get("calibration"), results)
    return shown


def _cpu_per_request_in_units(found: Mapping[str, Any] | None, results: Sequence[Result]) -> list[Block]:
    """Each group's service CPU per request in both calibration units, and its user/system split."""
    units = calibration.unit_seconds(found), calibration.unit_seconds(found, "kernel")
    rows = []
    for g in group_results(results):
        per_request = _geometric_mean([_cpu_per_request(r) for r in g.results])
        user = _geometric_mean([user_share(r.usage) if r.usage else None for r in g.results])
        if per_request is None:
            continue
        rows.append(
            [
                f"`{g.id}`",
                f"{per_request * 1e6:.0f}",
                *(fmt(per_request / unit if unit else None, "{:.3f}") for unit in units),
                "-" if user is None else f"{user:.0%} / {1 - user:.0%}",
            ]
        )
    if not rows:
        return []
    return [
        Paragraph(
            "Service CPU per request in both units, geometric means over each group's repeats: cal is "
            "the CPU unit above, kcal the kernel unit (loopback round trips, mostly system time); "
            "user / system: how the service's CPU time split between user space and the kernel."
        ),
        table(
            ("group", "us CPU / req", "CPU / req (cal)", "CPU / req (kcal)", "user / system"),
            rows,
            (False, True, True, True, True),
        ),
    ]


def _cpu_per_request(result: Result) -> float | None:
    requests = result.metrics.requests if result.metrics else None
    cpu = result.usage.cpu_seconds if result.usage else None
    return cpu / requests if cpu and requests else None


def _geometric_mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None and v > 0]
    return statistics.geometric_mean(known) if known and len(known) == len(values) else None


def _interference_row(result: Result) -> list[str]:
    host = result.host
    if host is None:
        return [f"`{result.scenario_id}`", "-", f"unknown: {result.unmeasured}", "-", "-", "-"]
    return [
        f"`{result.scenario_id}`",
        *_figure(host.service_cpus),
        *_figure(host.k6_cpus),
        _share(host.steal_share),
    ]


def _figure(figure: Others | None) -> list[str]:
    if figure is None:
        return ["-", "-"]
    cpus = ",".join(map(str, figure.cpus))
    seconds = figure.others_cpu_seconds
    cell = _share(figure.share) + (f" ({seconds:.2f} CPU s)" if seconds is not None else "")
    relay = figure.relay_cpu_seconds
    if relay is not None:  # the userspace link emulator runs on k6's CPUs: part of others there
        cell += f", of which relay {_share(figure.relay_share)} ({relay:.2f} CPU s)"
    lab = figure.lab_cpu_seconds
    if lab is not None:  # the run's own Prometheus and InfluxDB, pinned to k6's side
        cell += f", of which lab {_share(figure.lab_share)} ({lab:.2f} CPU s)"
    return [cpus, cell]


def _calibration(found: Mapping[str, Any]) -> list[Block]:
    if not found:
        return [Paragraph("Calibration: not measured in this run.")]
    rows = []
    for when in ("before", "after"):
        c = found.get(when)
        if not isinstance(c, Mapping):
            rows.append([when, "not measured", "-", "-", "-"])
        elif "error" in c:
            rows.append([when, f"failed: {c['error']}", "-", "-", "-"])
        else:
            rows.append(
                [
                    when,
                    f"{c['cpu_seconds_per_unit'] * 1e6:.1f}",
                    f"{c['median_over_fastest']:.2f}x",
                    ",".join(map(str, c["cpus"])),
                    _share(c.get("others_share")),  # absent in runs before it was recorded
                ]
            )
    change = calibration.drift(found)
    summary = (
        f"The calibration moved by {change:+.1%} from before to after (warning above "
        f"±{calibration.RUN_SPREAD:.0%})."
        if change is not None
        else ""
    )
    return [
        Paragraph(
            "Calibration: a fixed single-threaded workload (one unit = 100 fixed records mapped and "
            "serialized to JSON with orjson and to protobuf) run before the first scenario and after the "
            "last, pinned to the first scenario's service CPUs; its CPU time per unit is that of the "
            "fastest of its rounds; one taken while other processes used more than "
            f"{calibration.QUIET_SHARE:.0%} of the host is taken again after a pause. "
            "CPU per request in calibration units = the service's CPU time per "
            f"request / the mean of the two. {summary}"
        ),
        table(
            ("calibration", "us CPU per unit", "median round", "CPUs", "others on the host"),
            rows,
            (False, True, True, False, True),
        ),
    ]


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


SECTION = Section(TITLE, always, blocks)
