"""Service variants (code trees, env) run side by side under the lab's limits: CPU per request and req/s.

A tool for changing the servers, not a test and not a lab result. Each repeat starts every
variant at once, each in its own cgroup with the same CPU quota on the same CPU, and loads each
with its own k6 (the lab's script, on another CPU) at the same time: whatever else the host runs
falls on all of them alike, so their ratios stay steady on a shared host where runs taken one
after another do not. Two variants at a time: more would starve k6 of its CPU. Run as root
(it creates cgroups) with the lab's venv, from the repository root:

    .venv/bin/python benchmarks/side_by_side.py --module services.rest_aiohttp --script k6/rest.js \\
        --variant old=/tmp/old-tree --variant new=.
    .venv/bin/python benchmarks/side_by_side.py --module services.grpc_aio --script k6/grpc_unary.js \\
        --variant on=. --variant off=.:METRICS_ENABLED=0

A variant is name=TREE[:KEY=VALUE,...][@MODULE]: a checkout whose services/ it runs (with the
generated services/common/pb), env for the service, and another module to run (a floor server).

--stack runs each named lab server (services.<stack>) against its floor (benchmarks.floor.<stack>),
this checkout, k6/rest.js or k6/grpc_unary.js: variants floor and lab, the floor first. Every stack
and response model (--response-model, repeatable: RESPONSE_MODEL for every variant; without it the
servers' default, build) is a group of variants run together; a repeat is one round through every
group in order, so the groups' repeats interleave. Each lab server against its floor, all five
stacks in both response models, 5 rounds (10 groups x 5 x ~16.5 s: about 14 minutes):

    .venv/bin/python benchmarks/side_by_side.py --stack all --response-model build \\
        --response-model prebuilt --repeats 5 --warmup 3 --duration 10 --cpus 0.5 --vus 10

It prints each repeat, then per group each variant's medians and the share of its CPU quota it
used (geometric mean, range), and its ratio to the group's first variant in req/s and in CPU per
request: the geometric mean of the repeats' paired ratios with the 95% t interval of their
logarithms (labrunner.report.stats.paired_ratio), then the per-repeat ratios. The same, with the
raw figures of every repeat, the git commit (and whether the tree was dirty), the host's CPU and
the conditions, goes to a JSON file (--json; by default results/side-by-side-<UTC time>.json),
rewritten after every round.
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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from labrunner.backends.cgroups import Cgroup, create_cgroup, join_cgroup, remove_cgroup
from labrunner.report.stats import CONFIDENCE, Ratio, paired_ratio, summarize
from labrunner.run.k6 import find_k6, k6_version, parse_summary

from services.common.cgroup import read_stats

ROOT = Path(__file__).resolve().parents[1]
MEMORY_BYTES = 1 << 30


@dataclass(frozen=True)
class Variant:
    name: str
    tree: Path
    env: dict[str, str]
    module: str | None  # None: its group's module


@dataclass(frozen=True)
class Group:
    """Variants run together in each repeat; the first is the reference of the others' ratios."""

    name: str
    module: str
    script: str
    variants: tuple[Variant, ...]


@dataclass(frozen=True)
class Measured:
    requests_per_second: float
    cpu_ms_per_request: float
    quota_used: float  # CPU used over the quota's CPU time: 1.0 = the service had all its quota
    errors: int
    requests: int = 0
    cpu_seconds: float = 0.0  # the service's cgroup, over the measured stage
    wall_seconds: float = 0.0  # the measured stage, from the first k6's start to the last one's end


# --stack's servers: services.<stack> and its floor benchmarks.floor.<stack> (the same module names).
STACKS = ("rest_aiohttp", "rest_quart", "rest_granian", "grpc_aio", "grpc_grpclib")


def parse_variant(spec: str) -> Variant:
    name, _, rest = spec.partition("=")
    rest, _, module = rest.partition("@")
    tree, _, env_spec = rest.partition(":")
    env = dict(item.split("=", 1) for item in env_spec.split(",") if item)
    return Variant(name, Path(tree).resolve(), env, module or None)


def stack_groups(stacks: list[str], models: list[str | None], tree: Path = ROOT) -> list[Group]:
    """Per stack and response model, its floor and its lab server (in that order) from tree."""
    groups = []
    for stack in stacks:
        script = "k6/grpc_unary.js" if stack.startswith("grpc_") else "k6/rest.js"
        for model in models:
            env = {"RESPONSE_MODEL": model} if model else {}
            variants = (
                Variant("floor", tree, env, f"benchmarks.floor.{stack}"),
                Variant("lab", tree, env, None),
            )
            groups.append(
                Group(" ".join(filter(None, (stack, model))), f"services.{stack}", script, variants)
            )
    return groups


def variant_groups(
    module: str, script: str, variants: list[Variant], models: list[str | None]
) -> list[Group]:
    """--variant's variants, a group per response model (RESPONSE_MODEL unless a variant sets it)."""
    groups = []
    for model in models:
        env = {"RESPONSE_MODEL": model} if model else {}
        modelled = tuple(Variant(v.name, v.tree, env | v.env, v.module) for v in variants)
        groups.append(Group(model or module, module, script, modelled))
    return groups


def _enter(cgroup: Cgroup, cpu: int) -> None:
    join_cgroup(cgroup)
    os.sched_setaffinity(0, {cpu})


def _start(variant: Variant, module: str, cgroup: Cgroup, cpu: int) -> tuple[subprocess.Popen[str], int]:
    """The variant's service, listening; its port."""
    env = {
        **os.environ,
        "PORT": "0",
        "METRICS_PORT": "0",
        "SHUTDOWN_DRAIN_SECONDS": "0",
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
    process.kill()
    raise RuntimeError(f"{variant.name}: no listening line")


def _k6(args: argparse.Namespace, script: str, port: int, seconds: float, summary: Path) -> dict[str, Any]:
    """One closed-model k6 run of the lab's script against the port; its summary."""
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/tmp"),
        "K6_NO_USAGE_REPORT": "true",
        "LOAD_MODEL": "constant-vus",
        "VUS": str(args.vus),
        "DURATION": f"{seconds:g}s",
        "COUNT": str(args.count),
        "SUMMARY_FILE": str(summary),
    }
    if "grpc" in script:
        env |= {"GRPC_ADDR": f"127.0.0.1:{port}", "PROTO_DIR": str(ROOT / "proto")}
    else:
        env |= {"BASE_URL": f"http://127.0.0.1:{port}", "EXPECT_PROTO": "HTTP/1.1"}
        env["GODEBUG"] = "http2client=0"
    k6 = [str(find_k6(None)), "run", "--quiet", "--no-color", "--address", "", str(ROOT / script)]
    subprocess.run(
        ["taskset", "-c", str(args.k6_cpu), *k6],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        timeout=seconds + 60,
    )
    loaded: dict[str, Any] = json.loads(summary.read_text())
    return loaded


def _cpu_seconds(cgroup: Cgroup) -> float:
    return read_stats(cgroup.paths).cpu_usage_seconds or 0.0


def measure(args: argparse.Namespace, group: Group) -> list[Measured]:
    """One repeat: every variant started, warmed up and measured at the same time, then stopped."""
    variants = group.variants
    stamp = f"{os.getpid()}-{time.monotonic_ns()}"
    cgroups = [create_cgroup(f"side-{stamp}-{i}", args.cpus, MEMORY_BYTES) for i in range(len(variants))]
    processes: list[subprocess.Popen[str]] = []
    try:
        ports = []
        for variant, cgroup in zip(variants, cgroups, strict=True):
            process, port = _start(variant, group.module, cgroup, args.service_cpu)
            processes.append(process)
            ports.append(port)
        with tempfile.TemporaryDirectory() as scratch, ThreadPoolExecutor(len(variants)) as pool:

            def load(seconds: float, stage: str) -> list[dict[str, Any]]:
                files = [Path(scratch) / f"{stage}-{i}.json" for i in range(len(ports))]
                return list(
                    pool.map(lambda port, file: _k6(args, group.script, port, seconds, file), ports, files)
                )

            load(args.warmup, "warmup")
            before = [_cpu_seconds(cgroup) for cgroup in cgroups]
            started = time.monotonic()
            summaries = load(args.duration, "measured")
            wall = time.monotonic() - started
            used = [_cpu_seconds(cgroup) - b for cgroup, b in zip(cgroups, before, strict=True)]
    finally:
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=30)
        for cgroup in cgroups:
            remove_cgroup(cgroup)
    results = []
    for summary, cpu in zip(summaries, used, strict=True):
        metrics = parse_summary(summary)
        per_request_ms = 1000 * cpu / max(metrics.requests, 1)
        quota_used = cpu / (wall * args.cpus)
        results.append(
            Measured(
                metrics.requests_per_second,
                per_request_ms,
                quota_used,
                metrics.errors,
                metrics.requests,
                cpu,
                wall,
            )
        )
    return results


def compare(own: list[Measured], reference: list[Measured]) -> dict[str, Ratio]:
    """own against reference, whose i-th repeats ran together: the geometric mean of the paired
    ratios with the CONFIDENCE t interval of their logarithms, in req/s and in CPU per request."""
    return {
        "requests_per_second": paired_ratio(
            [m.requests_per_second for m in own], [m.requests_per_second for m in reference]
        ),
        "cpu_ms_per_request": paired_ratio(
            [m.cpu_ms_per_request for m in own], [m.cpu_ms_per_request for m in reference]
        ),
    }


def quota_share(own: list[Measured]) -> dict[str, float]:
    """The share of its CPU quota a variant used: the repeats' geometric mean and range."""
    summary = summarize([m.quota_used for m in own])
    return {"geometric_mean": summary.centre, "min": summary.minimum, "max": summary.maximum}


def _interval(ratio: Ratio) -> str:
    if ratio.low is None or ratio.high is None:
        return f"{ratio.estimate:.3f} ({ratio.note})"
    return f"{ratio.estimate:.3f} [{ratio.low:.3f}, {ratio.high:.3f}]"


def _ratios(own: list[float], reference: list[float]) -> str:
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


def report(
    args: argparse.Namespace,
    groups: list[Group],
    runs: dict[str, dict[str, list[Measured]]],
    provenance: dict[str, Any],
) -> dict[str, Any]:
    """What the JSON file holds: provenance, conditions, each repeat's raw figures and the ratios."""
    done = min((len(own) for group in runs.values() for own in group.values()), default=0)
    entries = []
    for group in groups:
        own = runs[group.name]
        reference = group.variants[0].name
        entries.append(
            {
                "name": group.name,
                "module": group.module,
                "script": group.script,
                "variants": [
                    {"name": v.name, "tree": str(v.tree), "env": v.env, "module": v.module or group.module}
                    for v in group.variants
                ],
                "repeats": {name: [asdict(m) for m in measured] for name, measured in own.items()},
                "quota_used": {name: quota_share(measured) for name, measured in own.items() if measured},
                "reference": reference,
                "ratios": {
                    v.name: {key: asdict(r) for key, r in compare(own[v.name], own[reference]).items()}
                    for v in group.variants[1:]
                    if own[v.name]
                },
            }
        )
    return {
        "tool": "benchmarks/side_by_side.py",
        "argv": sys.argv[1:],
        **provenance,
        "written": datetime.now(UTC).isoformat(timespec="seconds"),
        "load_average": os.getloadavg(),
        "conditions": {
            "cpus": args.cpus,
            "service_cpu": args.service_cpu,
            "k6_cpu": args.k6_cpu,
            "vus": args.vus,
            "count": args.count,
            "warmup_seconds": args.warmup,
            "measured_seconds": args.duration,
            "repeats": args.repeats,
            "repeats_done": done,
            "memory_bytes": MEMORY_BYTES,
        },
        "confidence": CONFIDENCE,
        "ratio_method": "geometric mean of the paired per-repeat ratios, t interval of their logarithms",
        "groups": entries,
    }


def write_report(path: Path, content: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps(content, indent=1) + "\n")
    partial.replace(path)


def _print_group(group: Group, runs: dict[str, list[Measured]]) -> None:
    reference = runs[group.variants[0].name]
    print(f"\n{group.name}  (ratios: each variant / {group.variants[0].name}, {CONFIDENCE:.0%} interval)")
    print(f"{'variant':<12} {'req/s':>8} {'CPU ms/req':>10} {'quota used':>17}  req/s ratio / CPU/req ratio")
    for variant in group.variants:
        own = runs[variant.name]
        share = quota_share(own)
        print(
            f"{variant.name:<12} {statistics.median(m.requests_per_second for m in own):>8,.0f} "
            f"{statistics.median(m.cpu_ms_per_request for m in own):>10.3f} "
            f"{share['geometric_mean']:>5.2f} ({share['min']:.2f}-{share['max']:.2f})",
            end="",
        )
        if variant is group.variants[0]:
            print()
            continue
        ratios = compare(own, reference)
        rps = [m.requests_per_second for m in own], [m.requests_per_second for m in reference]
        cpu = [m.cpu_ms_per_request for m in own], [m.cpu_ms_per_request for m in reference]
        print(
            f"  {_interval(ratios['requests_per_second'])} / {_interval(ratios['cpu_ms_per_request'])}"
            f"  (each repeat: {_ratios(*rps)} / {_ratios(*cpu)})"
        )


def _print_pairs(groups: list[Group], runs: dict[str, dict[str, list[Measured]]]) -> None:
    """One line per compared pair: the table to quote."""
    print(
        f"\n| group | pair | req/s ratio [{CONFIDENCE:.0%}] | CPU/req ratio [{CONFIDENCE:.0%}] | quota used |"
    )
    print("|---|---|--:|--:|--:|")
    for group in groups:
        own = runs[group.name]
        first = group.variants[0].name
        for variant in group.variants[1:]:
            ratios = compare(own[variant.name], own[first])
            shares = " / ".join(
                f"{quota_share(own[name])['geometric_mean']:.2f}" for name in (variant.name, first)
            )
            print(
                f"| {group.name} | {variant.name} / {first} | {_interval(ratios['requests_per_second'])} "
                f"| {_interval(ratios['cpu_ms_per_request'])} | {shares} |"
            )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--module", help="the service module, e.g. services.rest_aiohttp (with --variant)")
    parser.add_argument("--script", help="k6/rest.js, k6/grpc_unary.js or k6/grpc_stream.js (with --variant)")
    parser.add_argument("--variant", action="append", default=[], type=parse_variant, help="see above")
    parser.add_argument(
        "--stack", action="append", default=[], choices=[*STACKS, "all"], help="lab against floor; see above"
    )
    parser.add_argument(
        "--response-model", action="append", default=[], choices=["build", "prebuilt"], help="repeatable"
    )
    parser.add_argument(
        "--json", type=Path, help="the report file (default results/side-by-side-<UTC time>.json)"
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds")
    parser.add_argument("--duration", type=float, default=6.0, help="seconds measured")
    parser.add_argument("--cpus", type=float, default=0.5, help="each service's CPU quota")
    parser.add_argument("--service-cpu", type=int, default=1)
    parser.add_argument("--k6-cpu", type=int, default=0)
    parser.add_argument("--vus", type=int, default=10, help="per service")
    parser.add_argument("--count", type=int, default=100)
    args = parser.parse_args()
    models: list[str | None] = list(dict.fromkeys(args.response_model)) or [None]
    if bool(args.stack) == bool(args.variant):
        parser.error("give either --variant (with --module and --script) or --stack")
    if args.stack:
        groups = stack_groups(
            list(STACKS) if "all" in args.stack else list(dict.fromkeys(args.stack)), models
        )
    elif not (args.module and args.script):
        parser.error("--variant needs --module and --script")
    else:
        groups = variant_groups(args.module, args.script, args.variant, models)
    started = datetime.now(UTC)
    path: Path = args.json or ROOT / "results" / f"side-by-side-{started:%Y%m%d-%H%M%S}.json"
    trees = sorted({variant.tree for group in groups for variant in group.variants})
    provenance = {
        "started": started.isoformat(timespec="seconds"),
        "git": git_state(ROOT),
        "trees": [git_state(tree) for tree in trees],
        "host": host(),
    }
    # Besides warm-up and measuring, starting, stopping and k6's own starts took ~3.5 s a group.
    minutes = len(groups) * args.repeats * (args.warmup + args.duration + 3.5) / 60
    print(
        f"{len(groups)} groups x {args.repeats} repeats: about {minutes:.0f} min; report: {path}", flush=True
    )
    runs: dict[str, dict[str, list[Measured]]] = {g.name: {v.name: [] for v in g.variants} for g in groups}
    for repeat in range(1, args.repeats + 1):
        for group in groups:
            for variant, result in zip(group.variants, measure(args, group), strict=True):
                runs[group.name][variant.name].append(result)
                print(
                    f"repeat {repeat} {group.name} {variant.name}: {result.requests_per_second:,.0f} req/s, "
                    f"{result.cpu_ms_per_request:.3f} CPU ms/req, quota used {result.quota_used:.2f}, "
                    f"errors {result.errors}",
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
