"""Service variants (code trees, env) run side by side under the lab's limits: CPU per request and req/s.

A tool for changing the servers, not a test and not a lab result. Each repeat starts every
variant at once, each in its own cgroup with the same CPU quota on the same CPU, and loads each
with its own k6 (the lab's script, on another CPU) at the same time: whatever else the host runs
falls on all of them alike, so their ratios stay steady on a shared host where runs taken one
after another do not. It prints each repeat, then each variant's medians and its per-repeat
ratios to the first variant. Two variants at a time: more would starve k6 of its CPU. Run as root
(it creates cgroups) with the lab's venv, from the repository root:

    .venv/bin/python benchmarks/side_by_side.py --module services.rest_aiohttp --script k6/rest.js \\
        --variant old=/tmp/old-tree --variant new=.
    .venv/bin/python benchmarks/side_by_side.py --module services.grpc_aio --script k6/grpc_unary.js \\
        --variant on=. --variant off=.:METRICS_ENABLED=0

A variant is name=TREE[:KEY=VALUE,...][@MODULE]: a checkout whose services/ it runs (with the
generated services/common/pb), env for the service, and another module to run (a floor server).
"""

import argparse
import contextlib
import functools
import json
import os
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labrunner.backends.cgroups import Cgroup, create_cgroup, join_cgroup, remove_cgroup
from labrunner.run.k6 import find_k6, parse_summary

from services.common.cgroup import read_stats

ROOT = Path(__file__).resolve().parents[1]
MEMORY_BYTES = 1 << 30


@dataclass(frozen=True)
class Variant:
    name: str
    tree: Path
    env: dict[str, str]
    module: str | None  # None: --module


@dataclass(frozen=True)
class Measured:
    requests_per_second: float
    cpu_ms_per_request: float
    quota_used: float  # CPU used over the quota's CPU time: 1.0 = the service had all its quota
    errors: int


def parse_variant(spec: str) -> Variant:
    name, _, rest = spec.partition("=")
    rest, _, module = rest.partition("@")
    tree, _, env_spec = rest.partition(":")
    env = dict(item.split("=", 1) for item in env_spec.split(",") if item)
    return Variant(name, Path(tree).resolve(), env, module or None)


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


def _k6(args: argparse.Namespace, port: int, seconds: float, summary: Path) -> dict[str, Any]:
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
    if "grpc" in args.script:
        env |= {"GRPC_ADDR": f"127.0.0.1:{port}", "PROTO_DIR": str(ROOT / "proto")}
    else:
        env |= {"BASE_URL": f"http://127.0.0.1:{port}", "EXPECT_PROTO": "HTTP/1.1"}
        env["GODEBUG"] = "http2client=0"
    k6 = [str(find_k6(None)), "run", "--quiet", "--no-color", "--address", "", str(ROOT / args.script)]
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


def measure(args: argparse.Namespace, variants: list[Variant]) -> list[Measured]:
    """One repeat: every variant started, warmed up and measured at the same time, then stopped."""
    stamp = f"{os.getpid()}-{time.monotonic_ns()}"
    cgroups = [create_cgroup(f"side-{stamp}-{i}", args.cpus, MEMORY_BYTES) for i in range(len(variants))]
    processes: list[subprocess.Popen[str]] = []
    try:
        ports = []
        for variant, cgroup in zip(variants, cgroups, strict=True):
            process, port = _start(variant, args.module, cgroup, args.service_cpu)
            processes.append(process)
            ports.append(port)
        with tempfile.TemporaryDirectory() as scratch, ThreadPoolExecutor(len(variants)) as pool:

            def load(seconds: float, stage: str) -> list[dict[str, Any]]:
                files = [Path(scratch) / f"{stage}-{i}.json" for i in range(len(ports))]
                return list(pool.map(lambda port, file: _k6(args, port, seconds, file), ports, files))

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
        results.append(Measured(metrics.requests_per_second, per_request_ms, quota_used, metrics.errors))
    return results


def _ratios(own: list[float], reference: list[float]) -> str:
    ratios = [mine / theirs for mine, theirs in zip(own, reference, strict=True)]
    return f"{statistics.median(ratios):.3f} ({' '.join(f'{r:.3f}' for r in ratios)})"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--module", required=True, help="the service module, e.g. services.rest_aiohttp")
    parser.add_argument("--script", required=True, help="k6/rest.js, k6/grpc_unary.js or k6/grpc_stream.js")
    parser.add_argument("--variant", action="append", required=True, type=parse_variant, help="see above")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds")
    parser.add_argument("--duration", type=float, default=6.0, help="seconds measured")
    parser.add_argument("--cpus", type=float, default=0.5, help="each service's CPU quota")
    parser.add_argument("--service-cpu", type=int, default=1)
    parser.add_argument("--k6-cpu", type=int, default=0)
    parser.add_argument("--vus", type=int, default=10, help="per service")
    parser.add_argument("--count", type=int, default=100)
    args = parser.parse_args()
    variants: list[Variant] = args.variant
    runs: dict[str, list[Measured]] = {variant.name: [] for variant in variants}
    for repeat in range(1, args.repeats + 1):
        for variant, result in zip(variants, measure(args, variants), strict=True):
            runs[variant.name].append(result)
            print(
                f"repeat {repeat} {variant.name}: {result.requests_per_second:,.0f} req/s, "
                f"{result.cpu_ms_per_request:.3f} CPU ms/req, quota used {result.quota_used:.2f}, "
                f"errors {result.errors}",
                flush=True,
            )
    reference = runs[variants[0].name]
    print(f"\n{'variant':<16} {'req/s':>8} {'CPU ms/req':>10}  req/s ratio (each repeat)  CPU/req ratio")
    for variant in variants:
        own = runs[variant.name]
        rps = [m.requests_per_second for m in own]
        cpu = [m.cpu_ms_per_request for m in own]
        print(
            f"{variant.name:<16} {statistics.median(rps):>8,.0f} {statistics.median(cpu):>10.3f}  "
            f"{_ratios(rps, [m.requests_per_second for m in reference])}  "
            f"{_ratios(cpu, [m.cpu_ms_per_request for m in reference])}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
