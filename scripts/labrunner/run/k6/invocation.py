"""A scenario's k6 runs as invocations: K6Setup holds what they share, and builds each run's options
and the environment its script reads (k6/lib/common.js, docs/CONTRACTS.md)."""

from dataclasses import dataclass, replace
from pathlib import Path

from labrunner.backends.base import K6Invocation, ServiceHandle
from labrunner.model.scenario import (
    DEFAULT_STREAMS,
    IDENTITY,
    USER_SHAPE,
    LoadModel,
    Scenario,
    format_duration,
)
from labrunner.observe import influx_auth
from labrunner.observe.labels import INFLUXDB_DATABASE, scenario_labels
from labrunner.run import live
from labrunner.run.k6 import segments
from labrunner.run.k6_stats import trend_stats
from labrunner.run.uploads import UploadBody
from services.common import user_message


@dataclass(frozen=True)
class K6Setup:
    """What every k6 run of one scenario shares; its warm-up, its measured window and a capacity
    search's steps are each one K6Invocation built from it. Built once the service answers."""

    scenario: Scenario
    handle: ServiceHandle  # k6 reaches the service at its k6_address and runs on its k6_cpus
    run_id: str
    root: Path  # the checkout: k6/ and proto/
    ca_file: Path  # the lab CA, which k6 trusts under TLS instead of skipping verification
    k6_dir: Path  # each run's summary (and raw output): <scenario id>.<phase>.json
    log_file: Path  # k6's stdout and stderr
    influxdb_url: str | None  # where measured runs write their samples; None: nowhere
    instances: int = 1  # k6 processes by execution segments, the i-th on handle.k6_cpus[i]
    api: bool = False  # the measured window serves k6's REST API on a free local port (run/live.py)
    upload: UploadBody | None = None  # an upload scenario's body, which the script reads once in init

    def warmup(self) -> K6Invocation:
        """The unmeasured run before the window: the same script for the warm-up time. It writes
        nothing to InfluxDB, so dashboards only ever show measured data."""
        model = _warmup_model(self.scenario.load_model)
        return self._invocation("warmup", model, self.scenario.warmup_s, measured=False, api=False)

    def window(self) -> K6Invocation:
        """The measured window; it serves k6's API when the setup says so (the live line)."""
        model = self.scenario.load_model
        return self._invocation("measure", model, self.scenario.duration_s, measured=True, api=self.api)

    def step(self, model: LoadModel, number: int) -> K6Invocation:
        """Step `number` of a capacity search, at the step's load model."""
        return self._invocation(f"step{number}", model, self.scenario.duration_s, measured=True, api=False)

    def _invocation(
        self, phase: str, model: LoadModel, duration_s: float, *, measured: bool, api: bool
    ) -> K6Invocation:
        """One run, split by execution segments when the setup has instances; a measured split run's
        instances write their raw samples (merged percentiles), as a measured open model does alone
        (its latency batches)."""
        summary_file = self.k6_dir / f"{self.scenario.id}.{phase}.json"
        whole = K6Invocation(
            self.root / self.scenario.target.script,
            self._args(measured),
            self._env(model, duration_s, summary_file, measured),
            summary_file,
            self.log_file,
        )
        if self.instances > 1:
            split = segments.split(whole, self.instances, self.handle.k6_cpus, raw=measured)
            return replace(whole, instances=tuple(_with_api(one) if api else one for one in split))
        if measured and _batched(model):  # every sample, in order, for its latency batches
            whole = _with_raw_output(whole)
        return _with_api(whole) if api else whole

    def _args(self, measured: bool) -> tuple[str, ...]:
        """k6's options: its API off, the trend statistics, the scenario's tags, and a measured run's
        samples to InfluxDB."""
        args = ["--quiet", "--no-color", "--address", "", "--summary-trend-stats", summary_trend_stats()]
        for key, value in scenario_labels(self.run_id, self.scenario).items():
            args += ["--tag", f"{key}={value}"]
        if self.influxdb_url and measured:
            args += ["--out", f"influxdb={self.influxdb_url.rstrip('/')}/{INFLUXDB_DATABASE}"]
        return tuple(args)

    def _env(self, model: LoadModel, duration_s: float, summary_file: Path, measured: bool) -> dict[str, str]:
        """What the script reads: the request, the load model, the duration and where the summary goes;
        and the writer's login for a run that writes to InfluxDB (k6's output reads it)."""
        env = {
            "K6_NO_USAGE_REPORT": "true",
            "SUMMARY_FILE": str(summary_file),
            "COUNT": str(self.scenario.count),
            "SHAPE": self.scenario.shape,
            "TLS": "1" if self.scenario.target.tls else "0",
            "DURATION": format_duration(duration_s),
            **_load_env(model, self.scenario.streams),
        }
        if self.scenario.churn is not None:  # a new connection every CHURN calls (k6/lib/common.js)
            env["CHURN"] = str(self.scenario.churn)
        if self.scenario.compression != IDENTITY:  # rest.js accepts it (Accept-Encoding)
            env["COMPRESSION"] = self.scenario.compression
        if self.upload is not None:
            env["UPLOAD_FILE"] = str(self.upload.path)
            env["UPLOAD_COUNT"] = str(self.upload.count)
            if self.scenario.shape == USER_SHAPE:  # k6 computes the built-in shapes' own (k6/lib/common.js)
                env["UPLOAD_CHECKSUM"] = str(self.upload.checksum)
        env.update(self._service_env())
        if self.influxdb_url and measured and (credentials := influx_auth.writer()):
            env.update(credentials.k6_env())  # compose's InfluxDB has auth on (docs/docker.md)
        return env

    def _service_env(self) -> dict[str, str]:
        """How the script reaches the service: its address, the protocol it expects, the CA it trusts."""
        target = self.scenario.target
        env: dict[str, str] = {}
        if target.is_grpc:
            env["GRPC_ADDR"] = str(self.handle.k6_address)
            env["PROTO_DIR"] = str(self.root / "proto")
            if (user := user_message.installed()) is not None and self.scenario.shape == user.shape.name:
                # The user's message: the service and its files compiled at run time (run/user_proto.py).
                env["PROTOSET"] = str(user.directory / user_message.DESCRIPTOR_SET)
                env["GRPC_SERVICE"] = user.shape.service.full_name
        else:
            env["BASE_URL"] = f"{'https' if target.tls else 'http'}://{self.handle.k6_address}"
            env["EXPECT_PROTO"] = target.expect_proto or ""
        if target.protocol == "http1.1":
            env["GODEBUG"] = "http2client=0"  # Go offers h2 via ALPN unless told not to
        if target.tls:
            env["SSL_CERT_FILE"] = str(self.ca_file)
        return env


def summary_trend_stats() -> str:
    """--summary-trend-stats: k6/lib/trend_stats.json's list, as the scripts' summaryTrendStats."""
    return ",".join(trend_stats())


def _warmup_model(model: LoadModel) -> LoadModel:
    """Ramping models warm up at their peak VUs; a ramp would not warm every connection."""
    if model.executor != "ramping-vus":
        return model
    peak = max(stage.target for stage in model.stages) or 1
    return replace(model, executor="constant-vus", vus=peak, stages=())


def _load_env(model: LoadModel, streams: int) -> dict[str, str]:
    """The load model's env; under `streams` above 1 (a closed model's: model.matrix), its VUs are
    connections, each sending STREAMS requests at once (k6/lib/common.js)."""
    env = {"LOAD_MODEL": model.executor}
    if streams != DEFAULT_STREAMS:
        env["STREAMS"] = str(streams)
    if model.vus is not None:
        env["VUS"] = str(model.vus // streams)
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


def _batched(model: LoadModel) -> bool:
    """Whether a measured run's latency is kept in batches: an open model's (an offered rate, where
    latency is the answer), not a capacity search's steps."""
    return model.executor == "constant-arrival-rate" and model.search is None


def _with_raw_output(invocation: K6Invocation) -> K6Invocation:
    """The invocation writing every sample to <summary>.csv (--out csv)."""
    raw_file = invocation.summary_file.with_suffix(".csv")
    return replace(invocation, args=(*invocation.args, "--out", f"csv={raw_file}"), raw_file=raw_file)


def _with_api(invocation: K6Invocation) -> K6Invocation:
    """The invocation with k6's REST API on a free local port instead of off (the value after --address)."""
    args = invocation.args
    at = args.index("--address") + 1
    return replace(invocation, args=(*args[:at], f"{live.API_HOST}:{live.free_port()}", *args[at + 1 :]))
