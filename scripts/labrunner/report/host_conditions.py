"""The report's host figures: interference on each scenario's CPUs and the run's calibration."""

from collections.abc import Mapping, Sequence
from typing import Any

from labrunner.observe import fingerprint
from labrunner.report.compare import Group
from labrunner.report.document import Block, Paragraph
from labrunner.results.result import Result, Usage
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


def user_share(usage: Usage) -> float | None:
    """The user part of the service's CPU time (user / (user + system)); None where not split."""
    user, system = usage.user_cpu_seconds, usage.system_cpu_seconds
    if user is None or system is None or user + system <= 0:
        return None
    return float(user / (user + system))


def _known(value: object) -> str:
    return "unknown" if value is None else str(value)
