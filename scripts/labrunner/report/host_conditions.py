"""The report's host figures: interference on each scenario's CPUs and the run's calibration."""

from collections.abc import Mapping, Sequence
from typing import Any

from labrunner.observe import interference
from labrunner.report.compare import Group
from labrunner.report.document import Block, Heading, Paragraph, table
from labrunner.results.trust import SUSPECT_SHARE
from labrunner.run import calibration

Result = Mapping[str, Any]


def calibration_unit(manifest: Mapping[str, Any]) -> float | None:
    """The run's calibration unit in CPU seconds (mean of before and after), None without one."""
    return calibration.unit_seconds(manifest.get("calibration"))


def others_max(results: Sequence[Result]) -> float | None:
    """The largest share of the service's or k6's CPUs that others took in any of the results."""
    shares = [
        share
        for r in results
        for key in ("service_cpus", "k6_cpus")
        if (share := interference.share(r.get("host"), key)) is not None
    ]
    return max(shares) if shares else None


def cpu_per_request_cal(group: Group, unit: float | None) -> float | None:
    """The group's service CPU per request (geometric mean), in calibration units."""
    summary = group.summary("cpu_per_1k")
    return None if summary is None or not unit else summary.centre / 1000 / unit


def calibration_warnings(manifest: Mapping[str, Any]) -> list[Block]:
    """A warning when the run's calibration moved by more than RUN_SPREAD between before and after."""
    change = calibration.drift(manifest.get("calibration"))
    if change is None or abs(change) <= calibration.RUN_SPREAD:
        return []
    return [
        Paragraph(
            f"**Warning: the calibration changed by {change:+.1%} between the start and the end of the "
            f"run** (more than ±{calibration.RUN_SPREAD:.0%}): the CPU ran at a different speed, "
            "so scenarios early and late in the run are not measured alike."
        )
    ]


def baseline_warnings(manifest: Mapping[str, Any], baseline: Mapping[str, Any], name: str) -> list[Block]:
    """A warning when the two runs' calibrations differ by more than BASELINE_SPREAD."""
    now, then = calibration_unit(manifest), calibration_unit(baseline)
    if now is None or then is None:
        missing = "this run" if now is None else "the baseline"
        return [Paragraph(f"Calibration: none in {missing}, so the hosts' CPU speeds cannot be compared.")]
    change = now / then - 1
    text = f"Calibration: {then * 1e6:.0f} us per unit in {name}, {now * 1e6:.0f} us now ({change:+.1%})."
    if abs(change) > calibration.BASELINE_SPREAD:
        text = (
            f"**Warning: the calibrations differ by {change:+.1%}** (more than "
            f"±{calibration.BASELINE_SPREAD:.0%}): the CPUs ran at different speeds, so the change mixes "
            f"code and machine; compare CPU per request in calibration units. {text}"
        )
    return [Paragraph(text)]


def section(manifest: Mapping[str, Any], results: Sequence[Result]) -> list[Block]:
    """The "Host interference and calibration" section."""
    blocks: list[Block] = [
        Heading(2, "Host interference and calibration"),
        Paragraph(
            "Others: the CPU time that processes outside the scenario used on the service's and on k6's "
            "CPUs during the measured window (their time neither idle nor stolen, from per-CPU "
            "/proc/stat, minus the scenario's own CPU time), as a share of those CPUs' capacity (wall "
            "time x CPUs); steal: what the hypervisor took from them. "
            f"Above {SUSPECT_SHARE:.0%} the result is suspect. On network scenarios with the "
            "userspace link emulator, the relay runs on k6's CPUs: its CPU time counts as others there "
            "and is shown apart (of which relay)."
        ),
    ]
    rows = [_interference_row(r) for r in results if r.get("host") is not None]
    if rows:
        blocks.append(
            table(
                ("scenario", "service CPUs", "others there", "k6 CPUs", "others there", "steal"),
                rows,
                (False, False, True, False, True, True),
            )
        )
    blocks += _calibration(manifest.get("calibration") or {})
    return blocks


def _interference_row(result: Result) -> list[str]:
    section = result["host"]
    if not section.get("measured"):
        return [f"`{result['scenario_id']}`", "-", f"unknown: {section.get('reason')}", "-", "-", "-"]
    figures = section.get("interference") or {}
    return [
        f"`{result['scenario_id']}`",
        *_figure(figures.get("service_cpus")),
        *_figure(figures.get("k6_cpus")),
        _share(section.get("steal_share")),
    ]


def _figure(figure: Mapping[str, Any] | None) -> list[str]:
    if not figure:
        return ["-", "-"]
    cpus = ",".join(map(str, figure["cpus"]))
    seconds = figure.get("others_cpu_seconds")
    cell = _share(figure.get("share")) + (f" ({seconds:.2f} CPU s)" if seconds is not None else "")
    relay = figure.get("relay_cpu_seconds")
    if relay is not None:  # the userspace link emulator runs on k6's CPUs: part of others there
        cell += f", of which relay {_share(figure.get('relay_share'))} ({relay:.2f} CPU s)"
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
