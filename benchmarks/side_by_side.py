"""Two service variants measured at the same time (duet) under the lab's limits: req/s and CPU per request.

A tool for changing the servers, not a test and not a lab result. Its design is the runner's duet
(docs/measurement.md, "Duet rounds"): a block starts both variants fresh, each in its own cgroup at
the same CPU quota on the same service CPU, one after the other in slot order; loads each with its
own k6 (the lab's script, on the k6 CPU), warm-ups at once, then measured windows at once; then stops
both. Whatever else the host runs falls on both alike. The next block swaps the slots
(labrunner.model.duet.slot_of), since a fresh process's layout and start order bias a side by a few
percent. The ratio is per block, the interval over blocks: the geometric mean of the blocks' ratios
with the 95% t interval of their logarithms (labrunner.report.stats.paired_ratio). Blocks go round
every group in turn, so the groups' blocks interleave. Run as root (it creates cgroups) with the
lab's venv, from the repository root.

--stack runs each lab server (services.<stack>) beside its floor (benchmarks.floor.<stack>), this
checkout; the stacks are services.common.stacks.STACKS, and each one's k6 script, protocol and lab
target are its floor target's in matrix.toml (the target whose `module` is the floor). --aa adds the
A/A control: the first group's lab server beside itself, whose ratio shows the slot bias left.

    .venv/bin/python benchmarks/side_by_side.py --stack rest_aiohttp --response-model build \\
        --response-model prebuilt --aa --blocks 8 --warmup 1 --duration 5 --cpus 0.25

--target runs two variants of a matrix.toml target (its module, script and env; plaintext targets):

    .venv/bin/python benchmarks/side_by_side.py --target grpc --variant on=. \\
        --variant off=.:METRICS_ENABLED=0
    .venv/bin/python benchmarks/side_by_side.py --target aiohttp-h1 --variant old=/tmp/old-tree \\
        --variant new=.

A variant is name=TREE[:KEY=VALUE,...][@MODULE]: a checkout whose services/ it runs (with the
generated services/common/pb), env for the service, and another module to run. The ratio is the
second variant over the first (--stack: lab over floor).

Two quotas fit beside each other on the one service CPU when they take at most 80% of it, the
runner's rule (labrunner.model.duet.fits): 0.25 CPU does, 0.5 does not. Beyond it the tool says so
and runs anyway; each side's share of its quota shows what it got. Both k6 share the k6 CPU: a block
where they used more than 80% of it is flagged k6-bound, a side below half its quota svc-idle (the
runner's thresholds, labrunner.results.trust); such a ratio measures k6 or the host, not the servers.

It prints each block, then per group each side's medians and quota share and the ratio with its
interval and the per-block ratios. The same, with every block's raw figures and windows, the git
commit (and whether the tree was dirty), the host's CPU and the conditions, goes to a JSON file
(--json; by default results/side-by-side-<UTC time>.json), rewritten after every block.
"""

import argparse
import contextlib
import functools
import json
import os
import platform
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from labrunner.backends.base import SERVICE_STOP_ENV
from labrunner.backends.cgroups import Cgroup, create_cgroup, join_cgroup, remove_cgroup
from labrunner.model.duet import FITS_SHARE, fits, slot_of
from labrunner.model.matrix import load_matrix
from labrunner.model.questions import FLOOR_PREFIX
from labrunner.model.scenario import Profile, Target
from labrunner.report import aa_control
from labrunner.report.stats import CONFIDENCE, Ratio, paired_ratio, summarize
from labrunner.results.trust import (
    FLAG_K6_SATURATED,
    FLAG_NOT_CPU_BOUND,
    K6_SATURATED,
    SERVICE_CPU_BOUND,
)
from labrunner.run.k6.binary import find_k6, k6_version
from labrunner.run.k6.output import parse_summary

from services.common.cgroup import read_stats
from services.common.stacks import STACKS

ROOT = Path(__file__).resolve().parents[1]
MEMORY_BYTES = 1 << 30
AA_NAMES = ("aa1", "aa2")  # the A/A control's two sides: the same variant, side 1 over side 2


@dataclass(frozen=True)
class Variant:
    name: str
    tree: Path
    env: dict[str, str]
    module: str | None  # None: its group's module


@dataclass(frozen=True)
class Group:
    """Two variants measured together in each block: side 1 (the candidate) over side 2 (the reference)."""

    name: str
    module: str
    target: Target  # the script, protocol and expected response protocol k6 drives both with
    variants: tuple[Variant, Variant]  # sides 1 and 2
    control: bool = False  # an A/A control: both sides the same variant

    @property
    def script(self) -> str:
        return self.target.script


@dataclass(frozen=True)
class Measured:
    """One side of one block."""

    requests_per_second: float
    cpu_ms_per_request: float
    quota_used: float  # CPU used over the quota's CPU time in its k6 test run: 1.0 = all its quota
    errors: int
    requests: int
    cpu_seconds: float  # the service's cgroup, over the measured stage
    wall_seconds: float  # the measured stage, from the first k6's start to the last one's end
    slot: int  # 1: started first in its block
    k6_cpu_seconds: float  # its measured k6 process's user and system time (its start-up included)
    run_seconds: float  # its k6 test run (the summary's duration; the stage's wall time without one)
    window_start: float  # its k6 test run in Unix time: its process's end less run_seconds
    window_end: float  # its k6 process's end
    pid: int  # its service's main process: a fresh one every block
    flags: tuple[str, ...] = ()  # FLAG_K6_SATURATED (the block's), FLAG_NOT_CPU_BOUND


@dataclass(frozen=True)
class _Window:
    summary: dict[str, Any]
    k6_cpu_seconds: float
    end: float


def parse_variant(spec: str) -> Variant:
    name, _, rest = spec.partition("=")
    rest, _, module = rest.partition("@")
    tree, _, env_spec = rest.partition(":")
    env = dict(item.split("=", 1) for item in env_spec.split(",") if item)
    return Variant(name, Path(tree).resolve(), env, module or None)


def stack_targets(targets: Mapping[str, Target]) -> dict[str, tuple[Target, Target]]:
    """Each declared stack's (lab target, floor target) from the matrix: the floor target is the one whose
    module is the stack's floor, its lab target the one it is named after (floor-<target>)."""
    found = {}
    for stack in STACKS:
        floors = [t for t in targets.values() if t.module == stack.floor_module]
        if len(floors) != 1:
            raise ValueError(
                f"matrix.toml: {len(floors)} targets with module = {stack.floor_module!r}, not 1"
            )
        (floor,) = floors
        lab = targets.get(floor.name.removeprefix(FLOOR_PREFIX))
        if lab is None or lab.service != stack.package or lab.module is not None:
            raise ValueError(f"matrix.toml: {floor.name} names no lab target of {stack.package}")
        found[stack.package] = (lab, floor)
    return found


def stack_groups(
    stacks: Sequence[str], models: Sequence[str | None], targets: Mapping[str, Target], tree: Path = ROOT
) -> list[Group]:
    """Per stack and response model, its lab server (side 1) beside its floor (side 2), from tree."""
    declared = stack_targets(targets)
    groups = []
    for stack in stacks:
        lab, floor = declared[stack]
        for model in models:
            env = dict(lab.env) | ({"RESPONSE_MODEL": model} if model else {})
            variants = (
                Variant("lab", tree, env, None),
                Variant("floor", tree, dict(floor.env) | env, floor.main_module),
            )
            groups.append(Group(" ".join(filter(None, (stack, model))), lab.main_module, lab, variants))
    return groups


def variant_groups(target: Target, variants: Sequence[Variant], models: Sequence[str | None]) -> list[Group]:
    """--variant's two variants, a group per response model: the second over the first."""
    if len(variants) != 2:
        raise ValueError(f"a duet takes two variants, not {len(variants)}")
    groups = []
    for model in models:
        env = dict(target.env) | ({"RESPONSE_MODEL": model} if model else {})
        first, second = (Variant(v.name, v.tree, env | v.env, v.module) for v in variants)
        groups.append(Group(model or target.name, target.main_module, target, (second, first)))
    return groups


def control_group(group: Group) -> Group:
    """The A/A control: the group's side 1 beside itself, as the runner's (model.duet)."""
    variant = group.variants[0]
    aa1, aa2 = (Variant(name, variant.tree, variant.env, variant.module) for name in AA_NAMES)
    return Group(f"A/A {group.name}", group.module, group.target, (aa1, aa2), control=True)


def _enter(cgroup: Cgroup, cpu: int) -> None:
    join_cgroup(cgroup)
    os.sched_setaffinity(0, {cpu})


def _start(variant: Variant, module: str, cgroup: Cgroup, cpu: int) -> tuple[subprocess.Popen[str], int]:
    """The variant's service, listening; its port."""
    env = {
        **os.environ,
        "PORT": "0",
        "METRICS_PORT": "0",
        **SERVICE_STOP_ENV,  # stopped after its k6, as the lab's runner stops its services
        "PYTHONPATH": str(variant.tree),
        **variant.env,
    }
    process = subprocess.Popen(
        [sys.executable, "-m", variant.module or module],
        cwd=variant.tree,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=functools.partial(_enter, cgroup, cpu),  # noqa: PLW1509
        start_new_session=True,
    )
    assert process.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        if select.select([process.stdout], [], [], 0.2)[0]:
            event = json.loads(process.stdout.readline() or "{}")
            if event.get("event") == "listening":
                return process, int(event["port"])
    _stop(process)
    raise RuntimeError(f"{variant.name}: no listening line")


def _stop(process: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def k6_env(
    args: argparse.Namespace, target: Target, port: int, seconds: float, summary: Path
) -> dict[str, str]:
    """One closed-model k6 run of the target's script against the port, as the runner sets it
    (labrunner.run.k6.invocation.K6Setup) for a plaintext target."""
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/tmp"),
        "K6_NO_USAGE_REPORT": "true",
        "LOAD_MODEL": "constant-vus",
        "VUS": str(args.vus),
        "DURATION": f"{seconds:g}s",
        "COUNT": str(args.count),
        "TLS": "0",
        "SUMMARY_FILE": str(summary),
    }
    if target.is_grpc:
        env |= {"GRPC_ADDR": f"127.0.0.1:{port}", "PROTO_DIR": str(ROOT / "proto")}
    else:
        env |= {"BASE_URL": f"http://127.0.0.1:{port}", "EXPECT_PROTO": target.expect_proto or ""}
    if target.protocol == "http1.1":
        env["GODEBUG"] = "http2client=0"  # Go offers h2 via ALPN unless told not to
    return env


def _k6(args: argparse.Namespace, target: Target, port: int, seconds: float, summary: Path) -> _Window:
    """One k6 run on the k6 CPU: its summary, its CPU time (wait4) and its wall-clock window."""
    k6 = [str(find_k6(None)), "run", "--quiet", "--no-color", "--address", "", str(ROOT / target.script)]
    process = subprocess.Popen(
        ["taskset", "-c", str(args.k6_cpu), *k6],  # taskset execs k6: wait4's usage is k6's
        env=k6_env(args, target, port, seconds, summary),
        stdout=subprocess.DEVNULL,
    )
    _, status, usage = os.wait4(process.pid, 0)
    end = time.time()
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise RuntimeError(f"k6 on port {port} exited {process.returncode}")
    loaded: dict[str, Any] = json.loads(summary.read_text())
    return _Window(loaded, usage.ru_utime + usage.ru_stime, end)


def _cpu_seconds(cgroup: Cgroup) -> float:
    return read_stats(cgroup.paths).cpu_usage_seconds or 0.0


def measure(args: argparse.Namespace, group: Group, block: int) -> tuple[Measured, Measured]:
    """One block: both sides started fresh in slot order (side 1 first in odd blocks), warmed up and
    measured at the same time, then stopped; each side's figures, sides 1 and 2."""
    slots = (slot_of(1, block), slot_of(2, block))
    order = sorted((0, 1), key=lambda side: slots[side])
    stamp = f"{os.getpid()}-{time.monotonic_ns()}"
    cgroups = [create_cgroup(f"side-{stamp}-{i}", args.cpus, MEMORY_BYTES) for i in (0, 1)]
    processes: list[subprocess.Popen[str]] = []
    try:
        ports, pids = [0, 0], [0, 0]
        for side in order:
            process, ports[side] = _start(group.variants[side], group.module, cgroups[side], args.service_cpu)
            processes.append(process)
            pids[side] = process.pid
        with tempfile.TemporaryDirectory() as scratch, ThreadPoolExecutor(2) as pool:

            def load(seconds: float, stage: str) -> list[_Window]:
                files = [Path(scratch) / f"{stage}-{side}.json" for side in (0, 1)]
                return list(pool.map(lambda p, f: _k6(args, group.target, p, seconds, f), ports, files))

            load(args.warmup, "warmup")
            before = [_cpu_seconds(cgroup) for cgroup in cgroups]
            started = time.monotonic()
            windows = load(args.duration, "measured")
            wall = time.monotonic() - started
            used = [_cpu_seconds(cgroup) - b for cgroup, b in zip(cgroups, before, strict=True)]
    finally:
        for process in reversed(processes):
            _stop(process)
        for cgroup in cgroups:
            remove_cgroup(cgroup)
    metrics = [parse_summary(window.summary) for window in windows]
    runs = [m.test_run_seconds or wall for m in metrics]
    # Both k6 ran on the one k6 CPU at once: a block is k6-bound when together they used most of it.
    k6_bound = sum(w.k6_cpu_seconds for w in windows) / max(runs) > K6_SATURATED
    results = []
    for side, (window, cpu, run) in enumerate(zip(windows, used, runs, strict=True)):
        quota_used = cpu / (run * args.cpus)
        flags = (FLAG_K6_SATURATED,) * k6_bound + (FLAG_NOT_CPU_BOUND,) * (quota_used < SERVICE_CPU_BOUND)
        results.append(
            Measured(
                metrics[side].requests_per_second,
                1000 * cpu / max(metrics[side].requests, 1),
                quota_used,
                metrics[side].errors,
                metrics[side].requests,
                cpu,
                wall,
                slots[side],
                window.k6_cpu_seconds,
                run,
                window.end - run,
                window.end,
                pids[side],
                flags,
            )
        )
    return results[0], results[1]


def compare(own: Sequence[Measured], reference: Sequence[Measured]) -> dict[str, Ratio]:
    """own against reference, whose i-th blocks ran together: the geometric mean of the blocks' ratios
    with the CONFIDENCE t interval of their logarithms, in req/s and in CPU per request."""
    return {
        "requests_per_second": paired_ratio(
            [m.requests_per_second for m in own], [m.requests_per_second for m in reference]
        ),
        "cpu_ms_per_request": paired_ratio(
            [m.cpu_ms_per_request for m in own], [m.cpu_ms_per_request for m in reference]
        ),
    }


def quota_share(own: Sequence[Measured]) -> dict[str, float]:
    """The share of its CPU quota a side used: the blocks' geometric mean and range."""
    summary = summarize([m.quota_used for m in own])
    return {"geometric_mean": summary.centre, "min": summary.minimum, "max": summary.maximum}


def _interval(ratio: Ratio) -> str:
    if ratio.low is None or ratio.high is None:
        return f"{ratio.estimate:.3f} ({ratio.note})"
    return f"{ratio.estimate:.3f} [{ratio.low:.3f}, {ratio.high:.3f}]"


def _ratios(own: Sequence[float], reference: Sequence[float]) -> str:
    return " ".join(f"{mine / theirs:.3f}" for mine, theirs in zip(own, reference, strict=True))


def git_state(tree: Path) -> dict[str, Any]:
    """The tree's commit and whether it differs from it (untracked files count, ignored ones not)."""

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        # safe.directory: run as root, the checkout is often another user's.
        command = ["git", "-c", f"safe.directory={tree}", "-C", str(tree), *args]
        return subprocess.run(command, capture_output=True, text=True, check=False)

    head = git("rev-parse", "HEAD")
    if head.returncode != 0:
        return {"tree": str(tree), "commit": None, "dirty": None}
    status = git("status", "--porcelain")
    return {"tree": str(tree), "commit": head.stdout.strip(), "dirty": bool(status.stdout.strip())}


def host() -> dict[str, Any]:
    model = platform.processor() or "unknown"
    with contextlib.suppress(OSError):
        names = [
            line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")
        ]
        model = names[0].split(":", 1)[1].strip() if names else model
    return {
        "cpu_model": model,
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "k6": k6_version(find_k6(None)),
    }


def conditions(args: argparse.Namespace, done: int) -> dict[str, Any]:
    return {
        "design": "duet",
        "cpus": args.cpus,
        "fits": fits(Profile("--cpus", args.cpus, MEMORY_BYTES)),
        "service_cpu": args.service_cpu,
        "k6_cpu": args.k6_cpu,
        "vus": args.vus,
        "count": args.count,
        "warmup_seconds": args.warmup,
        "measured_seconds": args.duration,
        "blocks": args.blocks,
        "blocks_done": done,
        "memory_bytes": MEMORY_BYTES,
    }


def report(
    args: argparse.Namespace,
    groups: Sequence[Group],
    runs: dict[str, tuple[list[Measured], list[Measured]]],
    provenance: dict[str, Any],
) -> dict[str, Any]:
    """What the JSON file holds: provenance, conditions, each block's raw figures and the ratios."""
    done = min((len(runs[group.name][0]) for group in groups), default=0)
    entries = []
    for group in groups:
        first, second = runs[group.name]
        entry: dict[str, Any] = {
            "name": group.name,
            "control": group.control,
            "module": group.module,
            "target": group.target.name,
            "script": group.script,
            "sides": [
                {
                    "side": side,
                    "name": v.name,
                    "tree": str(v.tree),
                    "env": v.env,
                    "module": v.module or group.module,
                }
                for side, v in enumerate(group.variants, start=1)
            ],
            "blocks": [
                {
                    "block": block,
                    "sides": {v.name: asdict(m) for v, m in zip(group.variants, pair, strict=True)},
                    "requests_per_second_ratio": pair[0].requests_per_second / pair[1].requests_per_second,
                    "cpu_ms_per_request_ratio": pair[0].cpu_ms_per_request / pair[1].cpu_ms_per_request,
                }
                for block, pair in enumerate(zip(first, second, strict=True), start=1)
            ],
            "quota_used": {
                v.name: quota_share(own)
                for v, own in zip(group.variants, runs[group.name], strict=True)
                if own
            },
            "ratio": f"{group.variants[0].name} / {group.variants[1].name}",
        }
        if first:
            ratios = compare(first, second)
            entry["ratios"] = {key: asdict(r) for key, r in ratios.items()}
            if group.control:
                entry["bias"] = aa_control.ratio_bias(ratios["requests_per_second"])
                entry["verdict"] = aa_control.verdict(ratios["requests_per_second"])
        entries.append(entry)
    return {
        "tool": "benchmarks/side_by_side.py",
        "argv": sys.argv[1:],
        **provenance,
        "written": datetime.now(UTC).isoformat(timespec="seconds"),
        "load_average": os.getloadavg(),
        "conditions": conditions(args, done),
        "confidence": CONFIDENCE,
        "ratio_method": "geometric mean of the blocks' ratios (side 1 / side 2), t interval of their logs",
        "groups": entries,
    }


def write_report(path: Path, content: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps(content, indent=1) + "\n")
    partial.replace(path)


def _print_group(group: Group, runs: tuple[list[Measured], list[Measured]]) -> None:
    candidate, reference = group.variants
    print(f"\n{group.name}  ({candidate.name} / {reference.name}, {CONFIDENCE:.0%} interval over blocks)")
    print(f"{'side':<8} {'req/s':>8} {'CPU ms/req':>10} {'quota used':>17}")
    for variant, own in zip(group.variants, runs, strict=True):
        share = quota_share(own)
        print(
            f"{variant.name:<8} {statistics.median(m.requests_per_second for m in own):>8,.0f} "
            f"{statistics.median(m.cpu_ms_per_request for m in own):>10.3f} "
            f"{share['geometric_mean']:>5.2f} ({share['min']:.2f}-{share['max']:.2f})"
        )
    first, second = runs
    ratios = compare(first, second)
    rps = [m.requests_per_second for m in first], [m.requests_per_second for m in second]
    cpu = [m.cpu_ms_per_request for m in first], [m.cpu_ms_per_request for m in second]
    print(f"req/s   {_interval(ratios['requests_per_second'])}  (each block: {_ratios(*rps)})")
    print(f"CPU/req {_interval(ratios['cpu_ms_per_request'])}  (each block: {_ratios(*cpu)})")
    if group.control:
        print(f"A/A control: {aa_control.verdict(ratios['requests_per_second'])}")


def _print_pairs(groups: Sequence[Group], runs: dict[str, tuple[list[Measured], list[Measured]]]) -> None:
    """One line per group: the table to quote."""
    print(
        f"\n| group | ratio | req/s ratio [{CONFIDENCE:.0%}] | CPU/req ratio [{CONFIDENCE:.0%}] "
        "| quota used |"
    )
    print("|---|---|--:|--:|--:|")
    for group in groups:
        first, second = runs[group.name]
        ratios = compare(first, second)
        shares = " / ".join(f"{quota_share(own)['geometric_mean']:.2f}" for own in (first, second))
        print(
            f"| {group.name} | {group.variants[0].name} / {group.variants[1].name} "
            f"| {_interval(ratios['requests_per_second'])} | {_interval(ratios['cpu_ms_per_request'])} "
            f"| {shares} |"
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    targets = load_matrix(ROOT / "matrix.toml").targets
    stacks = [stack.package for stack in STACKS]
    parser.add_argument(
        "--stack", action="append", default=[], choices=[*stacks, "all"], help="lab beside floor"
    )
    parser.add_argument("--target", choices=sorted(targets), help="with two --variant: a matrix.toml target")
    parser.add_argument("--variant", action="append", default=[], type=parse_variant, help="see above")
    parser.add_argument(
        "--aa", action="store_true", help="add the A/A control: the first side 1 beside itself"
    )
    parser.add_argument(
        "--response-model", action="append", default=[], choices=["build", "prebuilt"], help="repeatable"
    )
    parser.add_argument(
        "--json", type=Path, help="the report file (default results/side-by-side-<UTC time>.json)"
    )
    parser.add_argument("--blocks", type=int, default=6, help="blocks per group, slots swapped each block")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds measured")
    parser.add_argument("--cpus", type=float, default=0.25, help="each service's CPU quota")
    parser.add_argument("--service-cpu", type=int, default=1)
    parser.add_argument("--k6-cpu", type=int, default=0)
    parser.add_argument("--vus", type=int, default=10, help="per service")
    parser.add_argument("--count", type=int, default=100)
    args = parser.parse_args(argv)
    models: list[str | None] = list(dict.fromkeys(args.response_model)) or [None]
    if bool(args.stack) == bool(args.variant):
        parser.error("give either --stack or --target with two --variant")
    if args.stack:
        groups = stack_groups(
            stacks if "all" in args.stack else list(dict.fromkeys(args.stack)), models, targets
        )
    elif args.target is None or len(args.variant) != 2:
        parser.error("--variant needs --target and two variants")
    elif targets[args.target].tls:
        parser.error(f"--target {args.target}: TLS targets are not supported, take its plaintext twin")
    else:
        groups = variant_groups(targets[args.target], args.variant, models)
    if args.aa:
        groups.insert(0, control_group(groups[0]))
    if args.blocks < 2:
        parser.error("--blocks: at least 2 (an interval, and both slot orders)")
    if min(args.warmup, args.duration) < 1:
        parser.error("--warmup and --duration: at least 1 s (k6's shortest duration)")
    if not fits(Profile("--cpus", args.cpus, MEMORY_BYTES)):
        print(
            f"duet: two quotas of {args.cpus:g} CPU exceed {FITS_SHARE:.0%} of the one service CPU: the "
            "services may not get their quotas (see each side's quota used); measuring anyway",
            flush=True,
        )
    started = datetime.now(UTC)
    path: Path = args.json or ROOT / "results" / f"side-by-side-{started:%Y%m%d-%H%M%S}.json"
    trees = sorted({variant.tree for group in groups for variant in group.variants})
    provenance = {
        "started": started.isoformat(timespec="seconds"),
        "git": git_state(ROOT),
        "trees": [git_state(tree) for tree in trees],
        "host": host(),
    }
    # Besides warm-up and measuring, starting, stopping and k6's own starts took ~3.5 s a block.
    minutes = len(groups) * args.blocks * (args.warmup + args.duration + 3.5) / 60
    print(f"{len(groups)} groups x {args.blocks} blocks: about {minutes:.0f} min; report: {path}", flush=True)
    runs: dict[str, tuple[list[Measured], list[Measured]]] = {g.name: ([], []) for g in groups}
    for block in range(1, args.blocks + 1):
        for group in groups:
            for variant, own, result in zip(
                group.variants, runs[group.name], measure(args, group, block), strict=True
            ):
                own.append(result)
                print(
                    f"block {block} {group.name} {variant.name} (slot {result.slot}): "
                    f"{result.requests_per_second:,.0f} req/s, {result.cpu_ms_per_request:.3f} CPU ms/req, "
                    f"quota used {result.quota_used:.2f}, "
                    f"k6 CPU {result.k6_cpu_seconds / result.run_seconds:.2f}, "
                    f"errors {result.errors}{''.join(' ' + f for f in result.flags)}",
                    flush=True,
                )
            write_report(path, report(args, groups, runs, provenance))
    for group in groups:
        _print_group(group, runs[group.name])
    _print_pairs(groups, runs)
    print(f"\nreport: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
