"""benchmarks/side_by_side.py's statistics and report, without running anything: the paired ratio of
interleaved repeats with its t interval on the logarithms, the quota share, the groups --stack makes,
the git state and the JSON file's content."""

import argparse
import json
import math
import subprocess
from pathlib import Path

import pytest
from scipy import stats as scipy_stats

from benchmarks.side_by_side import (
    MEMORY_BYTES,
    ROOT,
    Measured,
    compare,
    git_state,
    quota_share,
    report,
    stack_groups,
    write_report,
)

# Three rounds whose level swung widely (the host), the lab's log ratio to its floor each round
# -0.02, -0.04 and -0.06 in req/s and +0.03, +0.05, +0.07 in CPU per request.
FLOOR_RPS = [4000.0, 2000.0, 3000.0]
RPS_LOGS = [-0.02, -0.04, -0.06]
FLOOR_CPU = [0.12, 0.20, 0.15]
CPU_LOGS = [0.03, 0.05, 0.07]


def _measured(rps: list[float], cpu: list[float], quota: list[float]) -> list[Measured]:
    return [
        Measured(r, c, q, 0, int(r * 10), c * r * 10 / 1000, 10.0)
        for r, c, q in zip(rps, cpu, quota, strict=True)
    ]


FLOOR = _measured(FLOOR_RPS, FLOOR_CPU, [1.0, 0.98, 0.99])
LAB = _measured(
    [r * math.exp(d) for r, d in zip(FLOOR_RPS, RPS_LOGS, strict=True)],
    [c * math.exp(d) for c, d in zip(FLOOR_CPU, CPU_LOGS, strict=True)],
    [0.97, 1.0, 0.99],
)


def _expected(logs: list[float]) -> tuple[float, float, float]:
    """The geometric mean of the paired ratios and its 95% t interval, from the logarithms by hand."""
    mean = sum(logs) / len(logs)
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1))
    margin = float(scipy_stats.t.ppf(0.975, len(logs) - 1)) * sd / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - margin), math.exp(mean + margin)


@pytest.mark.parametrize(
    ("key", "logs"), [("requests_per_second", RPS_LOGS), ("cpu_ms_per_request", CPU_LOGS)]
)
def test_the_ratio_is_the_geometric_mean_of_paired_ratios_with_a_log_t_interval(
    key: str, logs: list[float]
) -> None:
    ratio = compare(LAB, FLOOR)[key]
    estimate, low, high = _expected(logs)
    assert ratio.estimate == pytest.approx(estimate, rel=1e-12)
    assert (ratio.low, ratio.high) == (pytest.approx(low, rel=1e-9), pytest.approx(high, rel=1e-9))
    assert ratio.low is not None and ratio.high is not None and ratio.low < ratio.estimate < ratio.high


def test_the_rounds_swing_cancels_in_the_paired_ratio() -> None:
    # Each round's level differs by up to 2x, but each round's ratio by 4% at most: the interval is
    # as narrow as the ratios' spread, not the levels'.
    ratio = compare(LAB, FLOOR)["requests_per_second"]
    assert ratio.low is not None and ratio.high is not None
    assert ratio.high / ratio.low < 1.2


def test_one_repeat_has_no_interval() -> None:
    ratio = compare(LAB[:1], FLOOR[:1])["requests_per_second"]
    assert ratio.estimate == pytest.approx(math.exp(RPS_LOGS[0]))
    assert (ratio.low, ratio.high) == (None, None) and ratio.note


def test_the_quota_share_is_the_geometric_mean_and_range() -> None:
    share = quota_share(LAB)
    assert share["geometric_mean"] == pytest.approx((0.97 * 1.0 * 0.99) ** (1 / 3))
    assert (share["min"], share["max"]) == (0.97, 1.0)


def test_stack_groups_put_each_floor_first_in_every_response_model() -> None:
    groups = stack_groups(["rest_quart", "grpc_grpclib"], ["build", "prebuilt"])
    assert [g.name for g in groups] == [
        "rest_quart build",
        "rest_quart prebuilt",
        "grpc_grpclib build",
        "grpc_grpclib prebuilt",
    ]
    quart, grpclib = groups[1], groups[2]
    assert (quart.module, quart.script) == ("services.rest_quart", "k6/rest.js")
    assert (grpclib.module, grpclib.script) == ("services.grpc_grpclib", "k6/grpc_unary.js")
    assert [(v.name, v.module, v.env) for v in quart.variants] == [
        ("floor", "benchmarks.floor.rest_quart", {"RESPONSE_MODEL": "prebuilt"}),
        ("lab", None, {"RESPONSE_MODEL": "prebuilt"}),
    ]
    assert [g.variants[0].env for g in stack_groups(["grpc_aio"], [None])] == [{}]  # the servers' default


def _git(tree: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(tree), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True)


def test_git_state_names_the_commit_and_whether_the_tree_differs(tmp_path: Path) -> None:
    assert git_state(tmp_path) == {"tree": str(tmp_path), "commit": None, "dirty": None}  # not a checkout
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.txt").write_text("a")
    _git(tmp_path, "add", "a.txt")
    _git(tmp_path, "commit", "-q", "-m", "a")
    state = git_state(tmp_path)
    assert state["dirty"] is False and len(state["commit"]) == 40
    (tmp_path / "a.txt").write_text("b")
    assert git_state(tmp_path) == {**state, "dirty": True}


def test_the_json_report_holds_conditions_provenance_raw_repeats_and_ratios(tmp_path: Path) -> None:
    args = argparse.Namespace(
        cpus=0.5, service_cpu=1, k6_cpu=0, vus=10, count=100, warmup=3.0, duration=10.0, repeats=3
    )
    groups = stack_groups(["rest_aiohttp"], ["build"])
    runs = {"rest_aiohttp build": {"floor": FLOOR, "lab": LAB}}
    provenance = {
        "started": "2026-12-04T20:15:00+00:00",
        "git": git_state(ROOT),
        "host": {"cpu_model": "Intel Xeon", "cpus": 2},
    }
    path = tmp_path / "results" / "side-by-side.json"
    write_report(path, report(args, groups, runs, provenance))
    loaded = json.loads(path.read_text())

    assert loaded["git"]["commit"] is None or len(loaded["git"]["commit"]) == 40
    assert loaded["host"]["cpu_model"] == "Intel Xeon"
    assert loaded["conditions"] == {
        "cpus": 0.5,
        "service_cpu": 1,
        "k6_cpu": 0,
        "vus": 10,
        "count": 100,
        "warmup_seconds": 3.0,
        "measured_seconds": 10.0,
        "repeats": 3,
        "repeats_done": 3,
        "memory_bytes": MEMORY_BYTES,
    }
    (group,) = loaded["groups"]
    assert group["reference"] == "floor"
    assert [v["module"] for v in group["variants"]] == [
        "benchmarks.floor.rest_aiohttp",
        "services.rest_aiohttp",
    ]
    assert [r["requests_per_second"] for r in group["repeats"]["lab"]] == [m.requests_per_second for m in LAB]
    assert [r["cpu_seconds"] for r in group["repeats"]["floor"]] == [m.cpu_seconds for m in FLOOR]
    estimate, low, high = _expected(RPS_LOGS)
    rps = group["ratios"]["lab"]["requests_per_second"]
    assert (rps["estimate"], rps["low"], rps["high"]) == pytest.approx((estimate, low, high))
    assert group["ratios"]["lab"]["cpu_ms_per_request"]["estimate"] == pytest.approx(_expected(CPU_LOGS)[0])
    assert group["quota_used"]["lab"]["min"] == 0.97
    assert not list(path.parent.glob("*.tmp"))  # written whole, then renamed
