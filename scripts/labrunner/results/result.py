"""A stored scenario result as a typed, frozen value, parsed once (parse_result) from the JSON
record.build_result writes; what results of older releases lack is filled in here and nowhere else.

A field that summary.csv shows names its columns in its metadata (columns()): a metric added to the
model without its column, or a column without its field, fails tests/unit/test_result_model.py.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from labrunner.model.scenario import (
    DEFAULT_DIRECTION,
    DEFAULT_SHAPE,
    DEFAULT_STREAMS,
    IDENTITY,
    connection_model_of,
    connections_of,
)

# What results written before a field existed mean by its absence (one rule each, here only).
BEFORE_RESPONSE_MODELS = ""  # no response model named
BEFORE_SCRIPTS = ""  # no k6 script named
BEFORE_UPLOADS = DEFAULT_DIRECTION  # every older result downloaded
BEFORE_NETWORKS = "loopback"  # every older result ran on loopback
BEFORE_SHAPES = DEFAULT_SHAPE  # every older result served cars
BEFORE_STREAMS = DEFAULT_STREAMS  # every older result sent one request at a time per connection


def _shown(*columns: str) -> dict[str, tuple[str, ...]]:
    """A field's metadata: the summary.csv columns made from it (summary.SUMMARY_COLUMNS)."""
    return {"columns": columns}


@dataclass(frozen=True)
class Profile:
    name: str = field(metadata=_shown("profile"))
    cpus: float = field(metadata=_shown("cpus"))
    memory_bytes: int = field(metadata=_shown("memory_mib"))


@dataclass(frozen=True)
class LoadModel:
    name: str = field(metadata=_shown("load_model"))
    executor: str  # "" in a result that does not say (then it is judged as no closed model)
    iterations: int | None  # shared-iterations: the request cap
    vus: int | None  # a closed model's
    rate: float | None  # an open model's offered rate
    share: float | None  # a ladder rung's share of its target's closed-model req/s
    searched: bool  # a capacity search


@dataclass(frozen=True)
class Duet:
    """Measured beside a partner (model.duet): its target, and this scenario's side of the pair."""

    partner: str
    side: int


@dataclass(frozen=True)
class ScenarioInfo:
    """The scenario a result measured (store.scenario_dict)."""

    group: str
    target_group: str  # the group without a duet's partner: the target under these conditions
    target: str = field(metadata=_shown("target"))
    service: str = field(metadata=_shown("service"))
    script: str  # the k6 script
    protocol: str = field(metadata=_shown("protocol"))
    tls: bool = field(metadata=_shown("tls"))
    env: Mapping[str, str]
    profile: Profile
    count: int = field(metadata=_shown("count"))
    response_model: str = field(metadata=_shown("response_model"))  # "build" or "prebuilt"
    direction: str = field(metadata=_shown("direction"))  # "download" or "upload"
    shape: str  # the record the service served (model.scenario.SHAPES)
    load_model: LoadModel
    duration_s: float | None
    repeat: int = field(metadata=_shown("repeat"))
    duet: Duet | None
    streams: int = BEFORE_STREAMS  # requests at once on each connection (model.scenario.Scenario)
    churn: int | None = None  # calls a connection carried before k6 replaced it; None: never (and before)
    compression: str = IDENTITY  # what the service compressed its responses with (identity before)

    @property
    def connection_model(self) -> str:
        """connections x streams ("10x1"), as model.scenario.Scenario says it."""
        model = self.load_model
        return connection_model_of(connections_of(model.executor, model.vus, self.streams), self.streams)

    @property
    def instrumented(self) -> bool:
        """Request metrics on (METRICS_ENABLED is not "0" in the target's env)."""
        return self.env.get("METRICS_ENABLED") != "0"


@dataclass(frozen=True)
class Metrics:
    """k6's numbers over the measured run (run.k6.output.K6Metrics as stored)."""

    requests: int = field(metadata=_shown("requests", "received_bytes_per_request", "k6_cpu_per_request_ms"))
    requests_per_second: float = field(metadata=_shown("requests_per_s"))
    attempts: int | None  # every request, failed or not (None in results written before it)
    errors: int | None = field(metadata=_shown("errors"))
    error_rate: float | None = field(metadata=_shown("error_rate"))
    # LATENCY_STATS: avg, p50 ... p99.9, max; a percentile an older result lacks is absent.
    latency_ms: Mapping[str, float | None] = field(
        metadata=_shown(*(f"latency_{k}_ms" for k in ("avg", "p50", "p90", "p95", "p99", "max")))
    )
    latency_count: int  # latency samples (results written before the count: their requests)
    data_received_bytes: int | None = field(metadata=_shown("received_bytes"))
    dropped_iterations: int = field(metadata=_shown("dropped_iterations"))
    test_run_seconds: float | None
    connections_opened: int | None  # the connections k6 dialed; None in results written before churn


@dataclass(frozen=True)
class K6Instance:
    """One k6 instance of a split run: its share of its CPU, and which CPU."""

    cpu_utilisation: float | None
    cpus: tuple[int, ...]


@dataclass(frozen=True)
class K6Section:
    cpu_seconds: float | None  # k6's process CPU seconds over the run (every instance's)
    # A split run's: its busiest instance's.
    cpu_utilisation: float | None = field(metadata=_shown("k6_cpu_utilisation"))
    instances: tuple[K6Instance, ...]  # empty unless k6 was split
    metrics: Metrics | None  # None when k6 wrote no summary
    latency_batches: tuple[Mapping[str, float], ...]  # an open model's: n and percentiles of each


@dataclass(frozen=True)
class Usage:
    """The service's resource use over the measured window (backends.base.ServiceUsage, stored)."""

    cpu_seconds: float | None = field(
        metadata=_shown("service_cpu_s", "service_cpu_per_request_cal", "service_cpu_per_request_kcal")
    )
    cpu_utilisation: float | None = field(metadata=_shown("service_cpu_utilisation"))
    user_cpu_seconds: float | None = field(metadata=_shown("service_user_cpu_share"))
    system_cpu_seconds: float | None
    throttled_periods: int | None = field(metadata=_shown("throttled_periods"))
    throttled_seconds: float | None = field(metadata=_shown("throttled_s"))
    memory_peak_bytes: int | None = field(metadata=_shown("memory_peak_mib"))


@dataclass(frozen=True)
class Others:
    """What processes outside the scenario took on one set of its CPUs over the measured window."""

    cpus: tuple[int, ...]
    share: float | None
    others_cpu_seconds: float | None
    relay_cpu_seconds: float | None  # the userspace link emulator's part of it, on k6's CPUs
    # The lab's own Prometheus and InfluxDB's part of it, on k6's CPUs: shown, not held against the host.
    lab_cpu_seconds: float | None = None
    lab_share: float | None = None
    relay_share: float | None = None  # relay_cpu_seconds over the CPUs' capacity


@dataclass(frozen=True)
class Host:
    """A measured window's interference: one figure per CPU set (one for both when they overlap)."""

    service_cpus: Others | None = field(metadata=_shown("others_service_cpus_share"))
    k6_cpus: Others | None = field(metadata=_shown("others_k6_cpus_share", "relay_k6_cpus_share"))
    shared: bool
    steal_share: float | None = field(metadata=_shown("steal_share"))
    steal_seconds: float | None
    # The speed reference's CPU seconds per unit over the window (run.speed_reference); None without one.
    reference_seconds_per_unit: float | None = None


@dataclass(frozen=True)
class Network:
    """The link a result ran over: its profile, and for an emulated one the emulator and what it measured."""

    profile: str = field(metadata=_shown("network"))
    # Measured on an emulated link before the service started.
    measured_rtt_s: float | None = field(metadata=_shown("network_rtt_ms"))
    emulator: str | None  # None on loopback
    relay_cpu_s: float | None  # the userspace link emulator's CPU time, on k6's CPUs


@dataclass(frozen=True)
class Step:
    """A capacity search step."""

    rate: int
    passed: bool
    k6_cpu_utilisation: float | None
    p99_ms: float | None = None
    service_cpu_utilisation: float | None = None


@dataclass(frozen=True)
class Capacity:
    """A capacity search (run.capacity.SearchResult, stored): its SLO, what stopped it, its steps."""

    sustainable_rate: float | None
    steps: tuple[Step, ...]
    slo_p99_ms: float | None
    limit: str


@dataclass(frozen=True)
class Failure:
    """Where a failed scenario failed (its phase: start, verify, k6 ...) and why."""

    phase: str
    message: str

    def __str__(self) -> str:
        return f"{self.phase}: {self.message}"


@dataclass(frozen=True)
class StoredVerdict:
    """The verdict the run stored (record.judge_outcome's sentences)."""

    suspect: tuple[str, ...] = field(metadata=_shown("suspect"))
    lower_bound: str | None


@dataclass(frozen=True)
class Result:
    """One scenario's stored result, as its JSON said it (record.build_result) and the parser read it."""

    scenario_id: str = field(metadata=_shown("scenario"))
    status: str = field(metadata=_shown("status"))  # "ok" or "failed"
    failure: Failure | None = field(metadata=_shown("failure"))  # None when it did not fail
    started_at: str
    scenario: ScenarioInfo
    k6: K6Section | None  # None when k6 never ran
    usage: Usage | None  # None when the service was not measured
    host: Host | None  # None when the window was not measured
    unmeasured: str | None  # why the window was not measured, where the runner tried to
    network: Network
    capacity: Capacity | None  # a capacity search's
    verdict: StoredVerdict | None  # None in results written before the verdict was stored
    # The reasons to distrust it that the run stored, whole verdict or not (the judge's view, stored or
    # judged again from the figures, is trust.verdict_of).
    suspect: tuple[str, ...]
    notes: tuple[str, ...]  # what the backend noted while running it
    interpreter: Mapping[str, Any] | None  # the Python build the service ran on, where recorded
    network_path: str | None  # how k6 reached the service, where the backend says
    # The negotiated protocol, once verified.
    protocol_verified: str | None = field(metadata=_shown("protocol_verified"))
    overhead_s: float | None = field(metadata=_shown("overhead_s"))

    @property
    def metrics(self) -> Metrics | None:
        return self.k6.metrics if self.k6 else None


class ResultError(ValueError):
    """A result file whose JSON is not a result this lab wrote (a section missing or of another type)."""


def parse_result(data: Mapping[str, Any]) -> Result:
    """The typed result of one result's JSON; ResultError when a section it needs is missing."""
    try:
        return _result(data)
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise ResultError(f"not a lab result: {type(exc).__name__} {exc}") from exc


def parse_results(data: Sequence[Mapping[str, Any]]) -> list[Result]:
    return [parse_result(d) for d in data]


def columns(model: type = Result) -> tuple[str, ...]:
    """The summary.csv columns the model's fields declare, nested sections included."""
    found: list[str] = []
    for f in fields(model):
        found.extend(f.metadata.get("columns", ()))
        for section in _sections(f.type):
            found.extend(columns(section))
    return tuple(found)


def _sections(kind: Any) -> list[type]:
    args = getattr(kind, "__args__", None)
    candidates = [*args] if args else [kind]
    return [c for c in candidates if isinstance(c, type) and is_dataclass(c)]


def _result(data: Mapping[str, Any]) -> Result:
    failure = data.get("failure") or {}
    verification = data.get("verification") or {}
    network = data.get("network") or {}
    service = data.get("service") or {}
    scenario = _scenario(data["scenario"])
    return Result(
        scenario_id=data["scenario_id"],
        status=data["status"],
        failure=Failure(failure["phase"], failure["message"]) if failure else None,
        started_at=data.get("started_at", ""),
        scenario=scenario,
        k6=_k6(data.get("k6")),
        usage=_usage(service.get("usage")),
        host=parse_host(data.get("host")),
        unmeasured=_unmeasured(data.get("host")),
        # Results written before network profiles existed ran on loopback.
        network=Network(
            network.get("profile") or (data["scenario"].get("network") or {}).get("name") or BEFORE_NETWORKS,
            network.get("measured_rtt_s"),
            network.get("emulator"),
            network.get("relay_cpu_s"),
        ),
        capacity=_capacity(data.get("capacity")),
        # Results written before the lower_bound key stored no verdict: it is judged from the figures.
        verdict=StoredVerdict(tuple(data.get("suspect") or ()), data["lower_bound"])
        if "lower_bound" in data
        else None,
        suspect=tuple(data.get("suspect") or ()),
        notes=tuple(data.get("notes") or ()),
        interpreter=service.get("interpreter") or None,
        network_path=service.get("network_path") or None,
        protocol_verified=verification.get("protocol") if verification.get("ok") else None,
        overhead_s=(data.get("timings_s") or {}).get("overhead"),
    )


def _scenario(s: Mapping[str, Any]) -> ScenarioInfo:
    model = s.get("load_model") or {}
    profile = s["profile"]
    duet = s.get("duet")
    return ScenarioInfo(
        group=s["group"],
        # Results written before duets: a group is its target's alone.
        target_group=s.get("target_group", s["group"]),
        target=s["target"],
        service=s["service"],
        script=s.get("script", BEFORE_SCRIPTS),
        protocol=s["protocol"],
        tls=bool(s["tls"]),
        env=dict(s.get("env") or {}),
        profile=Profile(profile["name"], float(profile["cpus"]), int(profile["memory_bytes"])),
        count=int(s["count"]),
        response_model=s.get("response_model", BEFORE_RESPONSE_MODELS),
        direction=s.get("direction", BEFORE_UPLOADS),
        shape=s.get("shape", BEFORE_SHAPES),
        load_model=LoadModel(
            name=model.get("name", ""),
            executor=model.get("executor", ""),
            iterations=model.get("iterations"),
            vus=model.get("vus"),
            rate=model.get("rate"),
            share=model.get("share"),
            searched=bool(model.get("search")),
        ),
        duration_s=s.get("duration_s"),
        repeat=int(s["repeat"]),
        duet=Duet(duet["partner"], int(duet["side"])) if duet else None,
        streams=int(s.get("streams", BEFORE_STREAMS)),
        churn=s.get("churn"),
        compression=s.get("compression", IDENTITY),
    )


def _k6(section: Mapping[str, Any] | None) -> K6Section | None:
    if section is None:
        return None
    metrics = section.get("metrics")
    return K6Section(
        cpu_seconds=section.get("cpu_seconds"),
        cpu_utilisation=section.get("cpu_utilisation"),
        instances=tuple(
            K6Instance(i.get("cpu_utilisation"), tuple(i.get("cpus") or ()))
            for i in section.get("instances") or ()
        ),
        metrics=_metrics(metrics) if metrics else None,
        latency_batches=tuple(dict(b) for b in section.get("latency_batches") or ()),
    )


def _metrics(m: Mapping[str, Any]) -> Metrics:
    requests = int(m.get("requests") or 0)
    return Metrics(
        requests=requests,
        requests_per_second=float(m.get("requests_per_second") or 0.0),
        attempts=m.get("attempts"),
        errors=m.get("errors"),
        error_rate=m.get("error_rate"),
        latency_ms=dict(m.get("latency_ms") or {}),
        # Results written before the latency sample count: every successful request was a sample.
        latency_count=int(m.get("latency_count") or requests),
        data_received_bytes=m.get("data_received_bytes"),
        dropped_iterations=int(m.get("dropped_iterations") or 0),
        test_run_seconds=m.get("test_run_seconds"),
        connections_opened=m.get("connections_opened"),
    )


def _usage(u: Mapping[str, Any] | None) -> Usage | None:
    if u is None:
        return None
    return Usage(
        cpu_seconds=u.get("cpu_seconds"),
        cpu_utilisation=u.get("cpu_utilisation"),
        user_cpu_seconds=u.get("user_cpu_seconds"),
        system_cpu_seconds=u.get("system_cpu_seconds"),
        throttled_periods=u.get("throttled_periods"),
        throttled_seconds=u.get("throttled_seconds"),
        memory_peak_bytes=u.get("memory_peak_bytes"),
    )


def parse_host(section: Mapping[str, Any] | None) -> Host | None:
    """The typed figures of a result's "host" section (observe.interference.interference())."""
    if not section or not section.get("measured"):
        return None
    figures = section.get("interference") or {}

    def others(key: str) -> Others | None:
        figure = figures.get(key)
        if not figure:
            return None
        return Others(
            tuple(figure.get("cpus") or ()),
            figure.get("share"),
            figure.get("others_cpu_seconds"),
            figure.get("relay_cpu_seconds"),
            figure.get("lab_cpu_seconds"),
            figure.get("lab_share"),
            figure.get("relay_share"),
        )

    return Host(
        others("service_cpus"),
        others("k6_cpus"),
        bool(figures.get("shared")),
        section.get("steal_share"),
        section.get("steal_seconds"),
        (section.get("speed_reference") or {}).get("seconds_per_unit"),
    )


def _unmeasured(section: Mapping[str, Any] | None) -> str | None:
    if section is None or section.get("measured"):
        return None
    return str(section.get("reason"))


def _capacity(section: Mapping[str, Any] | None) -> Capacity | None:
    if not section:
        return None
    steps = tuple(
        Step(
            s["rate"],
            s["passed"],
            s.get("k6_cpu_utilisation"),
            s.get("p99_ms"),
            s.get("service_cpu_utilisation"),
        )
        for s in section.get("steps") or ()
    )
    return Capacity(
        section.get("sustainable_rate"), steps, section.get("slo_p99_ms"), section.get("limit", "")
    )
