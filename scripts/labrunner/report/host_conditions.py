"""The report's host figures: interference on each scenario's CPUs and the run's calibration."""

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from labrunner.observe import fingerprint
from labrunner.report.cells import fmt
from labrunner.report.compare import Group, group_results
from labrunner.report.document import Block, Heading, Paragraph, table
from labrunner.results.result import Others, Result, Usage
from labrunner.results.trust import SUSPECT_SHARE
from labrunner.run import calibration


def calibration_unit(manifest: Mapping[str, Any]) -> float | None:
    """The run's calibration unit in CPU seconds (mean of before and after), None without one."""
    return calibration.unit_seconds(manifest.get("calibration"))


def others_max(results: Sequence[Result]) -> float | None:
    """The largest share of the service's or k6's CPUs that others took in any of the results."""
    shares = [
        figure.share
        for r in results
        if r.host
        for figure in (r.host.service_cpus, r.host.k6_cpus)
        if figure and figure.share is not None
    ]
    return max(shares) if shares else None


def cpu_per_request_cal(group: Group, unit: float | None) -> float | None:
    """The group's service CPU per request (geometric mean), in calibration units."""
    summary = group.summary("cpu_per_1k")
    return None if summary is None or not unit else summary.centre / 1000 / unit


def fingerprint_rows(found: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """The provenance rows of a manifest's host fingerprint (observe.fingerprint); none without one."""
    if not found:
        return []
    virtualisation = found.get("virtualisation") or {}
    if virtualisation.get("hypervisor"):
        virtual = f"hypervisor {virtualisation.get('vendor') or '(vendor unknown)'}"
    else:
        virtual = "no hypervisor flag"
    cells = (
        ("CPU model", found.get("cpu_model")),
        ("CPU family/model/stepping", found.get("cpu_family_model_stepping")),
        ("microcode", found.get("microcode")),
        ("cores / threads", f"{_known(found.get('cores'))} / {_known(found.get('threads'))}"),
        ("frequency governor", found.get("governor")),
        ("kernel release", found.get("kernel")),
        ("virtualisation", virtual),
        ("CPU vulnerabilities", mitigations_summary(found.get("mitigations"))),
        ("cgroup", found.get("cgroup")),
        ("interpreter", found.get("interpreter")),
    )
    return [(f"fingerprint: {name}", _known(value)) for name, value in cells]


def host_differences(manifest: Mapping[str, Any], baseline: Mapping[str, Any]) -> list[str] | None:
    """What differs between two runs' host fingerprints (empty: the same host); None when either
    run has no fingerprint (runs recorded before fingerprints were)."""
    now, then = manifest.get("fingerprint"), baseline.get("fingerprint")
    if not now or not then:
        return None
    return fingerprint.differences(now, then)


def steal_clock_row(found: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """Whether the task clock counted steal (observe.steal_clock), as interference assumed it."""
    if not found:
        return []
    counts = {True: "includes steal", False: "excludes steal", None: "unknown"}[found.get("includes_steal")]
    return [("task clock", f"{counts} ({found.get('source')})")]


def mitigations_summary(mitigations: Mapping[str, str] | None) -> str:
    """The CPU vulnerabilities by state, the vulnerable ones named: "12 not affected, 3 mitigated,
    2 vulnerable: spec_store_bypass, tsx_async_abort"."""
    if mitigations is None:
        return "unknown"
    kinds: dict[str, list[str]] = {
        "not affected": [],
        "mitigated": [],
        "vulnerable": [],
        "in another state": [],
    }
    for name, state in sorted(mitigations.items()):
        lowered = state.lower()
        if lowered.startswith("not affected"):
            kinds["not affected"].append(name)
        elif lowered.startswith("mitigation"):
            kinds["mitigated"].append(name)
        elif lowered.startswith("vulnerable"):
            kinds["vulnerable"].append(name)
        else:
            kinds["in another state"].append(name)
    parts = [f"{len(names)} {kind}" for kind, names in kinds.items() if names and kind != "vulnerable"]
    if kinds["vulnerable"]:
        parts.append(f"{len(kinds['vulnerable'])} vulnerable: {', '.join(kinds['vulnerable'])}")
    return ", ".join(parts) or "none listed"


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
            "and is shown apart (of which relay); so is the CPU time of the Prometheus and InfluxDB the run "
            "started, pinned to k6's CPUs (of which lab), which is not held against the host."
        ),
    ]
    rows = [_interference_row(r) for r in results if r.host is not None or r.unmeasured is not None]
    if rows:
        blocks.append(
            table(
                ("scenario", "service CPUs", "others there", "k6 CPUs", "others there", "steal"),
                rows,
                (False, False, True, False, True, True),
            )
        )
    blocks += _calibration(manifest.get("calibration") or {})
    blocks += _cpu_per_request_in_units(manifest.get("calibration"), results)
    return blocks


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


def user_share(usage: Usage) -> float | None:
    """The user part of the service's CPU time (user / (user + system)); None where not split."""
    user, system = usage.user_cpu_seconds, usage.system_cpu_seconds
    if user is None or system is None or user + system <= 0:
        return None
    return float(user / (user + system))


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


def _known(value: object) -> str:
    return "unknown" if value is None else str(value)


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"
