"""The trend statistics of k6's latency: the ones its summary holds, and the same ones computed
over raw samples as k6 computes them (a split run's instances, merged over all their samples)."""

import functools
import json
import math
from collections.abc import Mapping, Sequence

from labrunner.paths import REPO

# The percentiles a result shows, by their key in latency_ms ("p99.9") and their fraction.
PERCENTILES = {"p50": 0.50, "p90": 0.90, "p95": 0.95, "p99": 0.99, "p99.9": 0.999}
LATENCY_STATS = {"avg": "avg", **{key: f"p({key[1:]})" for key in PERCENTILES}, "max": "max"}

Quantiles = tuple[tuple[float, float], ...]  # (fraction, value): the minimum, quantile_grid(), the maximum


@functools.cache
def trend_stats() -> tuple[str, ...]:
    """The checkout's k6/lib/trend_stats.json, which k6/lib/common.js reads too; passing it makes the
    summary independent of the script's options. Read at first use, not at import, so that
    `protolab --help` and `--version` answer without a checkout."""
    return tuple(json.loads((REPO / "k6" / "lib" / "trend_stats.json").read_text()))


@functools.cache
def quantile_grid() -> Mapping[str, float]:
    """Every percentile the summary holds ("p(99.9)": 0.999): the grid a group's repeats are pooled on
    (report/compare.py)."""
    return {stat: round(float(stat[2:-1]) / 100, 6) for stat in trend_stats() if stat.startswith("p(")}


def percentile(ordered: Sequence[float], fraction: float) -> float:
    """k6's percentile of sorted values: linear interpolation between the closest ranks."""
    rank = fraction * (len(ordered) - 1)
    low, high = ordered[math.floor(rank)], ordered[math.ceil(rank)]
    return low + (high - low) * (rank - math.floor(rank))


def latency_stats(samples: Sequence[float]) -> dict[str, float | None]:
    """LATENCY_STATS (avg, the percentiles, max) over every sample, as k6 computes them for one instance."""
    if not samples:
        return dict.fromkeys(LATENCY_STATS)
    ordered = sorted(samples)
    stats: dict[str, float | None] = {"avg": math.fsum(ordered) / len(ordered)}
    stats |= {key: percentile(ordered, fraction) for key, fraction in PERCENTILES.items()}
    stats["max"] = ordered[-1]
    return stats


# An open-model window's samples in this many consecutive batches of equal count: each batch's
# percentiles are one value, so a latency ratio has batches - 1 degrees of freedom a side from one
# window (batch means; docs/measurement.md) where repeats alone would give one or none.
LATENCY_BATCHES = 5


def batch_percentiles(
    samples: Sequence[float], batches: int = LATENCY_BATCHES
) -> tuple[dict[str, float], ...]:
    """The samples, in the order k6 took them, cut into `batches` consecutive runs of equal count:
    each one's count ("n") and PERCENTILES. None when there are fewer samples than batches."""
    size = len(samples) // batches
    if size == 0:
        return ()
    found = []
    for index in range(batches):
        ordered = sorted(samples[index * size : (index + 1) * size])
        found.append({"n": float(size), **{key: percentile(ordered, f) for key, f in PERCENTILES.items()}})
    return tuple(found)


def quantiles(samples: Sequence[float]) -> Quantiles:
    """(fraction, value) at 0 (the minimum), on quantile_grid(), at 1 (the maximum), as k6 computes them."""
    if not samples:
        return ()
    ordered = sorted(samples)
    grid = (0.0, *quantile_grid().values(), 1.0)
    return tuple((fraction, percentile(ordered, fraction)) for fraction in grid)


def merged_latency(
    instances: Sequence[tuple[Mapping[str, float | None], int]], samples: Sequence[float] | None
) -> tuple[dict[str, float | None], Quantiles]:
    """Instances' latency as one run's, from each one's (latency_ms, requests), and its quantile grid.

    From every instance's samples, never from averaging percentiles; without samples (a warm-up)
    only avg (weighted by requests) and max are exact, the percentiles are None and there is no grid.
    """
    if samples is not None:
        return latency_stats(samples), quantiles(samples)
    latency: dict[str, float | None] = dict.fromkeys(LATENCY_STATS)
    requests = sum(n for _, n in instances)
    timed = [(stats.get("avg"), n) for stats, n in instances if n]
    if requests and all(avg is not None for avg, _ in timed):
        latency["avg"] = sum(avg * n for avg, n in timed if avg is not None) / requests
    maxima = [stats.get("max") for stats, n in instances if n]
    latency["max"] = max((v for v in maxima if v is not None), default=None)
    return latency, ()
