"""What the Python driver writes, in k6's forms so that the runner reads it as it reads k6's: the summary
JSON k6/lib/common.js's handleSummary writes (run/k6/output.py parses it), and the raw CSV of --out csv
(every sample of the clock, for percentiles merged over instances and an open model's batches)."""

import csv
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from labrunner.run.drive.load import Tally
from labrunner.run.k6_stats import percentile

# The driver's clock: each request from just before it is sent to its whole reply in (load.py).
CLOCK = "drive_req_duration"
FAILED_RATE_BOUND = 0.01  # k6/lib/common.js's threshold on protolab_req_failed: rate<0.01


def trend(samples: Sequence[float], stats: Sequence[str]) -> dict[str, float]:
    """k6's trend values of the samples for each of its summary's stats ("avg", "med", "p(99)", ...)."""
    if not samples:
        return {stat: 0.0 for stat in stats}
    ordered = sorted(samples)
    named = {"avg": math.fsum(ordered) / len(ordered), "min": ordered[0], "max": ordered[-1],
             "med": percentile(ordered, 0.5), "count": float(len(ordered))}  # fmt: skip
    return {
        stat: named[stat] if stat in named else percentile(ordered, float(stat[2:-1]) / 100) for stat in stats
    }


def document(tally: Tally, ran_s: float, stats: Sequence[str]) -> dict[str, Any]:
    """The summary of a run: k6's metric names and value keys, its thresholds judged as k6 judges them."""
    succeeded = len(tally.latency_ms)
    attempts = succeeded + tally.failed
    failed_rate = tally.failed / attempts if attempts else 0.0
    checks = tally.checks_passed + tally.checks_failed
    checks_rate = tally.checks_passed / checks if checks else 1.0
    seconds = max(ran_s, 1e-9)
    vus = tally.vus  # a VU is a connection
    return {
        "protolab": {"latency_metric": CLOCK, "driver": "python"},
        "state": {"testRunDurationMs": ran_s * 1000},
        "metrics": {
            "protolab_reqs": {"type": "counter", "values": {"count": succeeded, "rate": succeeded / seconds}},
            "protolab_req_failed": {
                "type": "rate",
                "values": {"passes": tally.failed, "fails": succeeded, "rate": failed_rate},
                "thresholds": {"rate<0.01": {"ok": failed_rate < FAILED_RATE_BOUND}},
            },
            CLOCK: {"type": "trend", "values": trend(tally.latency_ms, stats)},
            "data_received": {
                "type": "counter",
                "values": {"count": tally.received_bytes, "rate": tally.received_bytes / seconds},
            },
            "iterations": {
                "type": "counter",
                "values": {"count": tally.iterations, "rate": tally.iterations / seconds},
            },
            "dropped_iterations": {
                "type": "counter",
                "values": {"count": tally.dropped, "rate": tally.dropped / seconds},
            },
            "checks": {
                "type": "rate",
                "values": {"passes": tally.checks_passed, "fails": tally.checks_failed, "rate": checks_rate},
                "thresholds": {"rate==1.0": {"ok": tally.checks_failed == 0}},
            },
            "protolab_vus": {"type": "gauge", "values": {"value": vus, "min": vus, "max": vus}},
            "protolab_connections": {
                "type": "counter",
                "values": {"count": tally.connections, "rate": tally.connections / seconds},
            },
        },
    }


def thresholds_ok(summary: dict[str, Any]) -> bool:
    return all(
        state["ok"]
        for metric in summary["metrics"].values()
        for state in metric.get("thresholds", {}).values()
    )


def line(summary: dict[str, Any]) -> str:
    """The one line k6's handleSummary prints (k6/lib/common.js), for the log."""
    metrics = summary["metrics"]
    clock = metrics[CLOCK]["values"]
    return (
        f"protolab: ok_reqs={metrics['protolab_reqs']['values']['count']} "
        f"({metrics['protolab_reqs']['values']['rate']:.1f}/s) "
        f"failed={100 * metrics['protolab_req_failed']['values']['rate']:.2f}% "
        f"p50={clock.get('p(50)', 0.0):.3f}ms p99={clock.get('p(99)', 0.0):.3f}ms "
        f"checks={100 * metrics['checks']['values']['rate']:.2f}% "
        f"dropped={metrics['dropped_iterations']['values']['count']} "
        f"thresholds={'ok' if thresholds_ok(summary) else 'FAILED'}"
    )


def write_csv(path: Path, samples: Sequence[float]) -> None:
    """--out csv: the clock's samples in k6's CSV columns, in the order they were taken."""
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["metric_name", "timestamp", "metric_value", "extra_tags"])
        writer.writerows([CLOCK, 0, repr(value), ""] for value in samples)


def write_summary(path: Path, summary: dict[str, Any]) -> None:
    path.write_text(json.dumps(summary, indent=2))
