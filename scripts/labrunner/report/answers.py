"""All of a run's findings, ranked: its comparisons', the payload sweep's and the network profiles'."""

from collections.abc import Sequence

from labrunner.report import aa_control, network_findings, payload, payload_sweep
from labrunner.report.compare import Group
from labrunner.report.findings import Finding, cannot_compare, comparisons_findings, ranked, unasked
from labrunner.report.floor import lab_groups
from labrunner.report.serialization import Case


def for_run(
    groups: Sequence[Group],
    preset: str | None,
    payload_rows: Sequence[payload.PayloadRow] | None = None,
    cases: Sequence[Case] = (),
) -> list[Finding]:
    """Floor targets have their own section and enter no finding. payload_rows: the run's body sizes
    (payload.json); measured from the record pool when the run swept counts and none are given.
    cases: the serialization benchmark's, so the payload answer can say what the format costs alone
    (none at the end of a run: the benchmark runs after the findings are printed)."""
    lab = lab_groups(groups)
    if payload_rows is None and len({g.count for g in lab}) > 1:
        payload_rows = payload.measure()
    found = aa_control.findings(lab) + comparisons_findings(lab) + cannot_compare(lab)
    found += payload_sweep.findings(lab, payload_rows or (), cases)
    found += network_findings.findings(lab)
    return ranked(found + unasked(found, preset))
