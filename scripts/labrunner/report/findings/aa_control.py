"""The duet's A/A control as a finding: its req/s ratio, and whether the run's ratios carry a bias."""

from labrunner.report.aa_control import controls, verdict
from labrunner.report.findings.finding import Evidence, Finding, glance, held_fixed

QUESTION = "duet"  # the control's line comes first, under no heading


def findings(evidence: Evidence) -> list[Finding]:
    """One line per control: its req/s ratio and interval, and whether the run's ratios carry a bias."""
    found = []
    for control in controls(evidence.groups):
        target = control.candidate.target
        rps = control.ratios.get("rps")
        cell, notes = glance(rps, "req/s", f"{target} beside itself", digits=3)
        line = f"A/A control {target}: {cell}"
        said = verdict(rps) if rps else "no req/s ratio"
        found.append(Finding(QUESTION, f"{line}; {said}", held_fixed=held_fixed(control), notes=tuple(notes)))
    return found
