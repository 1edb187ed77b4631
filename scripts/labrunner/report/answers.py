"""All of a run's findings, ranked: its comparisons', the payload sweep's and the network profiles'."""

from collections.abc import Sequence

from labrunner.report import network_findings, payload, payload_sweep
from labrunner.report.compare import Group
from labrunner.report.findings import Finding, cannot_compare, comparisons_findings, ranked, unasked
from labrunner.report.floor import lab_groups


def for_run(
    groups: Sequence[Group], preset: str | None, payload_rows: Sequence[payload.PayloadRow] | None = None
) -> list[Finding]:
    """Floor targets have their own section and enter no finding. payload_rows: the run's body sizes
    (payload.json); measured from the record pool when the run swept counts and none are given."""
    lab = lab_groups(groups)
    if payload_rows is None and len({g.count for g in lab}) > 1:
        payload_rows = payload.measure()
    found = comparisons_findings(lab) + cannot_compare(lab)
    found += payload_sweep.findings(lab, payload_rows or ())
    found += network_findings.findings(lab)
    return ranked(found + unasked(found, preset))
