"""benchmarks/side_by_side.py's statistics and report, without running anything: the ratio per duet
block with its t interval over blocks on the logarithms, the quota share, the stacks it reads from the
one declaration and the groups --stack makes, the A/A control, the git state and the JSON file's
content. tests/integration/test_side_by_side_duet.py runs it."""

import argparse
import json
import math
import subprocess
from pathlib import Path

import pytest
from labrunner.model.duet import slot_of
from labrunner.model.matrix import load_matrix
from labrunner.model.scenario import Target
from labrunner.report import aa_control
from labrunner.report.stats import Ratio
from scipy import stats as scipy_stats

from benchmarks.side_by_side import (
    MEMORY_BYTES,
    ROOT,
    Measured,
    compare,
    control_group,
    git_state,
    main,
    quota_share,
    report,
    stack_groups,
    stack_targets,
    write_report,
)
from services.common.stacks import STACKS

TARGETS = load_matrix(ROOT / "matrix.toml").targets

# Three rounds whose level swung widely (the host), the lab's log ratio to its floor each round
# -0.02, -0.04 and -0.06 in req/s and +0.03, +0.05, +0.07 in CPU per request.
FLOOR_RPS = [4000.0, 2000.0, 3000.0]
RPS_LOGS = [-0.02, -0.04, -0.06]
FLOOR_CPU = [0.12, 0.20, 0.15]
CPU_LOGS = [0.03, 0.05, 0.07]


def _measured(rps: list[float], cpu: list[float], quota: list[float], side: int) -> list[Measured]:
    return [
        Measured(
            r,
            c,
            q,
            0,
            int(r * 10),
            c * r * 10 / 1000,
            10.4,
            slot_of(side, block + 1),
            2.0,
            10.0,
            0,
            10,
            100 * block + side,
        )
        for block, (r, c, q) in enumerate(zip(rps, cpu, quota, strict=True))
    ]


FLOOR = _measured(FLOOR_RPS, FLOOR_CPU, [1.0, 0.98, 0.99], 2)
LAB = _measured(
    [r * math.exp(d) for r, d in zip(FLOOR_RPS, RPS_LOGS, strict=True)],
    [c * math.exp(d) for c, d in zip(FLOOR_CPU, CPU_LOGS, strict=True)],
    [0.97, 1.0, 0.99],
    1,
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


def test_the_stacks_are_the_declared_ones_each_with_its_floor_targets_script() -> None:
    declared = stack_targets(TARGETS)
    assert list(declared) == [stack.package for stack in STACKS]
    for stack in STACKS:
        lab, floor = declared[stack.package]
        assert floor.module == stack.floor_module and lab.service == stack.package
        assert floor.name == "floor-" + lab.name and lab.module is None
        assert (lab.script, lab.protocol, lab.expect_proto) == (
            floor.script,
            floor.protocol,
            floor.expect_proto,
        )
    groups = stack_groups([stack.package for stack in STACKS], [None], TARGETS)
    assert [(g.name, g.module, g.variants[1].module) for g in groups] == [
        (stack.package, f"services.{stack.package}", stack.floor_module) for stack in STACKS
    ]


def test_the_command_line_offers_exactly_the_declared_stacks(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    usage = capsys.readouterr().out
    choices = usage.split("--stack {", 1)[1].split("}", 1)[0].split(",")
    assert set(choices) == {stack.package for stack in STACKS} | {"all"}
    with pytest.raises(SystemExit) as refused:
        main(["--stack", "rest_undeclared"])
    assert refused.value.code == 2 and "rest_undeclared" in capsys.readouterr().err


def test_a_stack_without_its_floor_target_is_named() -> None:
    without = {name: t for name, t in TARGETS.items() if t.module != "benchmarks.floor.grpc_grpclib"}
    with pytest.raises(ValueError, match=r"benchmarks\.floor\.grpc_grpclib"):
        stack_targets(without)


def test_the_script_is_the_matrix_targets_not_a_name_prefix() -> None:
    # A gRPC stack whose floor target drives it with another script: the group takes that script.
    floor = TARGETS["floor-grpclib"]
    streaming = {**TARGETS, floor.name: Target(**{**floor.__dict__, "script": "k6/grpc_stream.js"})}
    lab = TARGETS["grpclib"]
    streaming["grpclib"] = Target(**{**lab.__dict__, "script": "k6/grpc_stream.js"})
    (group,) = stack_groups(["grpc_grpclib"], [None], streaming)
    assert group.script == "k6/grpc_stream.js"


def test_stack_groups_put_the_lab_first_and_its_floor_second_in_every_response_model() -> None:
    groups = stack_groups(["rest_quart", "grpc_grpclib"], ["build", "prebuilt"], TARGETS)
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
        ("lab", None, {"RESPONSE_MODEL": "prebuilt"}),
        ("floor", "benchmarks.floor.rest_quart", {"RESPONSE_MODEL": "prebuilt"}),
    ]
    assert [g.variants[0].env for g in stack_groups(["grpc_aio"], [None], TARGETS)] == [{}]  # the default


def test_the_aa_control_is_the_lab_server_beside_itself() -> None:
    (group,) = stack_groups(["rest_aiohttp"], ["build"], TARGETS)
    control = control_group(group)
    assert control.control and not group.control
    assert [v.name for v in control.variants] == ["aa1", "aa2"]
    assert {(v.tree, v.module, tuple(v.env.items())) for v in control.variants} == {
        (group.variants[0].tree, None, (("RESPONSE_MODEL", "build"),))
    }


@pytest.mark.parametrize(
    ("low", "estimate", "high", "said"),
    [
        (0.99, 1.005, 1.02, "no slot bias beyond ±2%"),
        (1.02, 1.035, 1.05, "the run's duet ratios carry a bias of about 3.5%"),
        (0.95, 1.03, 1.11, "the run's duet ratios may carry a bias of about 3.0% (its interval holds 1)"),
        (0.90, 0.985, 1.06, "no slot bias beyond ±10.0% (±2% needs more blocks)"),
        # ±1.5% around 0.988: narrower than ±2%, but its centre takes it beyond; no bias shown either.
        (0.973, 0.988, 1.003, "no slot bias beyond ±2.7% (±2% needs more blocks)"),
    ],
)
def test_the_aa_verdict_says_what_its_interval_can_tell(
    low: float, estimate: float, high: float, said: str
) -> None:
    # side_by_side's A/A verdict is the runner's (report.aa_control), which its findings print too.
    assert aa_control.verdict(Ratio(estimate, low, high, None, None)) == said
    assert (aa_control.ratio_bias(Ratio(estimate, low, high, None, None)) is not None) == ("bias of" in said)


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


def test_the_json_report_holds_conditions_provenance_raw_blocks_and_ratios(tmp_path: Path) -> None:
    args = argparse.Namespace(
        cpus=0.25, service_cpu=1, k6_cpu=0, vus=10, count=100, warmup=1.0, duration=10.0, blocks=3
    )
    (group,) = stack_groups(["rest_aiohttp"], ["build"], TARGETS)
    control = control_group(group)
    runs = {group.name: (LAB, FLOOR), control.name: (LAB, LAB)}
    provenance = {
        "started": "2026-12-04T20:15:00+00:00",
        "git": git_state(ROOT),
        "host": {"cpu_model": "Intel Xeon", "cpus": 2},
    }
    path = tmp_path / "results" / "side-by-side.json"
    write_report(path, report(args, [control, group], runs, provenance))
    loaded = json.loads(path.read_text())

    assert loaded["git"]["commit"] is None or len(loaded["git"]["commit"]) == 40
    assert loaded["host"]["cpu_model"] == "Intel Xeon"
    assert loaded["conditions"] == {
        "design": "duet",
        "cpus": 0.25,
        "fits": True,
        "service_cpu": 1,
        "k6_cpu": 0,
        "vus": 10,
        "count": 100,
        "warmup_seconds": 1.0,
        "measured_seconds": 10.0,
        "blocks": 3,
        "blocks_done": 3,
        "memory_bytes": MEMORY_BYTES,
    }
    aa, pair = loaded["groups"]
    assert (aa["control"], pair["control"]) == (True, False)
    assert aa["verdict"] == "no slot bias beyond ±2%" and aa["bias"] is None
    assert pair["ratio"] == "lab / floor"
    assert [s["module"] for s in pair["sides"]] == ["services.rest_aiohttp", "benchmarks.floor.rest_aiohttp"]
    assert [b["sides"]["lab"]["requests_per_second"] for b in pair["blocks"]] == [
        m.requests_per_second for m in LAB
    ]
    assert [b["sides"]["floor"]["cpu_seconds"] for b in pair["blocks"]] == [m.cpu_seconds for m in FLOOR]
    assert [(b["sides"]["lab"]["slot"], b["sides"]["floor"]["slot"]) for b in pair["blocks"]] == [
        (1, 2),
        (2, 1),
        (1, 2),
    ]
    assert [b["requests_per_second_ratio"] for b in pair["blocks"]] == pytest.approx(
        [math.exp(d) for d in RPS_LOGS]
    )
    estimate, low, high = _expected(RPS_LOGS)
    rps = pair["ratios"]["requests_per_second"]
    assert (rps["estimate"], rps["low"], rps["high"]) == pytest.approx((estimate, low, high))
    assert pair["ratios"]["cpu_ms_per_request"]["estimate"] == pytest.approx(_expected(CPU_LOGS)[0])
    assert pair["quota_used"]["lab"]["min"] == 0.97
    assert not list(path.parent.glob("*.tmp"))  # written whole, then renamed
