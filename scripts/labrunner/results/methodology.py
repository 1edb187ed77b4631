"""Which method measured a run's numbers: a version in every manifest, raised when a change alters
what a figure means, and what each raise changed, so a baseline comparison says which figures of
two runs still compare."""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Runs written before the manifest carried a methodology are version 1.
UNVERSIONED = 1


@dataclass(frozen=True)
class Change:
    """What a methodology version changed, and the figures it left comparable with the one before."""

    version: int
    changed: str
    still_compare: frozenset[str]  # report/compare.py metric names


HISTORY = (
    Change(
        2,
        "latency on k6's own timer for gRPC (grpc_req_duration, no JavaScript or decode in the window), "
        "percentiles pooled over repeats and shown only where 10 samples lie beyond them, latency "
        "compared at loaded offered rates instead of 15 req/s, ratios within a run paired by round, "
        "significance after Holm's correction",
        frozenset({"rps", "cpu_per_1k", "bytes", "service_cpu", "k6_cpu", "seconds", "sustainable"}),
    ),
    Change(
        3,
        "closed-model pairs measured as duet blocks where two quotas fit (both sides at once, slots "
        "swapped, an A/A control; a side's k6 CPU counts its partner's k6), ladder rungs at shares of "
        "each target's capacity in the run, an open model's percentiles over 5 batches of its window "
        "(Welch), a percentile's centre the geometric mean of its repeats' or batches' own, not pooled",
        frozenset({"rps", "cpu_per_1k", "bytes", "service_cpu", "seconds", "sustainable"}),
    ),
)
VERSION = HISTORY[-1].version


def version_of(manifest: Mapping[str, Any]) -> int:
    return int(manifest.get("methodology") or UNVERSIONED)


def between(older: int, newer: int) -> list[Change]:
    """The changes from methodology `older` to `newer` (either order), oldest first."""
    low, high = sorted((older, newer))
    return [c for c in HISTORY if low < c.version <= high]


def still_compare(older: int, newer: int, metrics: frozenset[str]) -> frozenset[str]:
    """Which of `metrics` mean the same under both methodologies."""
    kept = metrics
    for change in between(older, newer):
        kept &= change.still_compare
    return kept
