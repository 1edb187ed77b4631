"""The run's domain: targets, profiles, load models, scenarios and the plan they make, all frozen."""

import itertools
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from labrunner.model.engine_roles import Hosts
from labrunner.network.profiles import NetworkProfile
from services.common.config import COMPRESSING_SERVICES as COMPRESSING_SERVICES  # noqa: PLC0414
from services.common.config import COMPRESSIONS as COMPRESSIONS  # noqa: PLC0414
from services.common.config import IDENTITY as IDENTITY  # noqa: PLC0414
from services.common.pool import DEFAULT_SHAPE as POOL_DEFAULT_SHAPE
from services.common.pool import SHAPES as POOL_SHAPES
from services.common.pool import USER_SHAPE as USER_SHAPE  # noqa: PLC0414

# The registry of backends: each name is a package, labrunner.backends.<name>, with probe() and
# create(); `--backend auto` takes the first that can run here, so the users' default comes first.
# The schema's per-backend preset tables (schema._Preset) name the same (tests/unit/test_layout.py).
BACKENDS = ("docker", "local")
AUTO_INSTANCES = "auto"
DEFAULT_BUDGET_S = 20 * 60.0  # how long --precision may add blocks when neither preset nor command line says
K6Instances = int | Literal["auto"]


# services/common/config.py's ResponseModel: `build` maps records into protocol objects per
# request, `prebuilt` only assembles objects made at start (the wire-only cost).
RESPONSE_MODELS = ("build", "prebuilt")
DEFAULT_RESPONSE_MODEL = "build"
# Which way the records travel: `download` asks for count records (GET /records, ListRecords,
# StreamRecords), `upload` sends count records (POST /records, CreateRecords, UploadRecords), the
# body made once before the run. A response model shapes only what a server sends, so an upload
# runs under the preset's first response model only.
DEFAULT_DIRECTION, UPLOAD = "download", "upload"
DIRECTIONS = (DEFAULT_DIRECTION, UPLOAD)
# The record shapes a service serves (SHAPE), cars first and the default (services.common.pool).
SHAPES, DEFAULT_SHAPE = POOL_SHAPES, POOL_DEFAULT_SHAPE
# What a run measures: the service, driven by k6, or (preset caller, docs/caller.md) a Python caller,
# each of the plan's scenarios read from the caller's side: its target the server called.
SERVICE, CALLER = "service", "caller"
MEASURES = (SERVICE, CALLER)
# Streams per connection (the connection model's second number): each k6 VU holds one connection and
# sends this many requests on it at once, so a closed model's VUs / streams are its connections.
# HTTP/1.1 cannot multiplex; streams above 1 run on closed (constant-vus) models only.
DEFAULT_STREAMS = 1
MULTIPLEXED_PROTOCOLS = ("http2", "grpc")
# Connection churn: each k6 VU replaces its connection after every `churn` calls on it (a TLS target's
# every new connection a full handshake: k6 does not resume sessions); None, written "never", keeps it
# for the whole k6 run, as every run before churn did. One call at a time: streams 1 only.
NEVER = "never"
Churn = int | None
# What the service compresses its responses with (its COMPRESSION, and the services that can:
# services/common/config.py) when the client accepts it: REST's k6 then sends Accept-Encoding: gzip,
# gRPC's k6 client always accepts gzip. k6 compresses no request, so compression is a download's.
# Today's network: 127.0.0.1, no namespaces, no emulator; groups on it keep their old ids.
LOOPBACK = NetworkProfile("loopback")


@dataclass(frozen=True)
class Profile:
    """The budget of the system under test."""

    name: str
    cpus: float
    memory_bytes: int

    @property
    def whole_cpus(self) -> int:
        """CPUs to pin the service to: the quota rounded up."""
        return max(1, math.ceil(self.cpus - 1e-9))


# The Python load driver's script (labrunner.run.drive): a target naming it is driven by Python, not k6.
DRIVER_SCRIPT = "scripts/drive_http.py"


@dataclass(frozen=True)
class Target:
    """One server x protocol x TLS combination and the k6 script that drives it."""

    name: str
    service: str  # the services/ package: its settings, image and ports
    script: str  # k6 script, relative to the repository root
    protocol: str  # http1.1 | http2 | grpc
    tls: bool
    expect_proto: str | None  # REST only: the res.proto k6 and the verifier must see
    env: tuple[tuple[str, str], ...] = ()
    response_model: str | None = None  # pins the target to one model; None: the preset's
    module: str | None = None  # what `python -m` runs when not the service (a floor server)

    @property
    def is_grpc(self) -> bool:
        return self.protocol == "grpc"

    @property
    def python_driven(self) -> bool:
        """Whether the Python driver loads it instead of k6 (scripts/drive_http.py)."""
        return self.script == DRIVER_SCRIPT

    @property
    def main_module(self) -> str:
        """The module the service process runs: python -m <main_module>."""
        return self.module or f"services.{self.service}"


@dataclass(frozen=True)
class Stage:
    """One ramping-vus stage: reach `target` VUs over `duration_s`."""

    duration_s: float
    target: int


@dataclass(frozen=True)
class CapacitySearch:
    """Step an open model's arrival rate up from its `rate` until a step breaks the SLO.

    Each step is one k6 run of the scenario's duration (see labrunner.run.capacity).
    """

    slo_p99_ms: float
    max_error_rate: float
    max_steps: int
    growth: float  # rate multiplier while every step passes


# VUs of an open model at a rate = rate x a latency bound x VU_HEADROOM: every request may take twice
# the bound before k6 runs out of VUs, so dropped iterations mean the service fell far behind, not k6.
VU_HEADROOM = 2.0


def vus_for_rate(rate: int, latency_bound_s: float, at_least: int, at_most: int) -> int:
    """The VUs an open model pre-allocates at `rate`: all of them up front, since a VU started
    mid-run would pay its init (and gRPC connect) inside the measured window."""
    return min(at_most, max(at_least, math.ceil(rate * latency_bound_s * VU_HEADROOM)))


@dataclass(frozen=True)
class Rung:
    """What makes an open-model load model one rung of a ladder ([load_models.<ladder>.ladder]): it runs
    on the targets of the ladder's k6 scripts, at `share` of the target's req/s under capacity_model
    earlier in the same run. Its rate is set only when it is about to run (labrunner.results.ladder),
    so the load model of a rung in the plan has none."""

    ladder: str  # the ladder's name, which selects all its rungs
    scripts: tuple[str, ...]  # the k6 scripts of the targets it runs on
    share: float  # in (0, 1]: the rung's rate over the target's capacity
    capacity_model: str  # a constant-vus load model
    latency_bound_s: float  # VUs at its rate: vus_for_rate(rate, latency_bound_s, ...)


@dataclass(frozen=True)
class LoadModel:
    """A k6 executor and its parameters."""

    name: str
    executor: str
    vus: int | None = None
    stages: tuple[Stage, ...] = ()
    rate: int | None = None  # iterations per second
    pre_allocated_vus: int | None = None
    max_vus: int | None = None
    iterations: int | None = None  # shared-iterations: requests in all, one at a time per VU
    search: CapacitySearch | None = None  # constant-arrival-rate: a capacity search from `rate`
    repeats: int | None = None  # fewer repeats than the preset's for this model; None: the preset's
    rung: Rung | None = None  # constant-arrival-rate: a rung of a ladder, `rate` None until set

    def measured_seconds(self, duration_s: float) -> float:
        """How long k6 runs: the stages for ramping-vus, every step of a search, else the duration
        (for shared-iterations the cap; the run ends earlier once every iteration is done)."""
        if self.executor == "ramping-vus":
            return sum(stage.duration_s for stage in self.stages)
        if self.search is not None:
            return duration_s * self.search.max_steps
        return duration_s


@dataclass(frozen=True)
class Duet:
    """A scenario measured at the same time as its partner's (model.duet): both services on the
    service CPUs, each in its own cgroup at the profile's quota, each driven by its own k6.

    side: this scenario's side of the pair (1: the question's candidate, 2: its baseline), fixed for
    every block of the pair; slot: which of the two is started first in this block (1 or 2; the two
    start at once, slot 1's a moment first), swapped from one block to the next so that no side
    always holds the same slot.
    """

    partner: str  # the partner's duet_name (its target); this side's own in the A/A control
    side: int
    slot: int

    def suffix(self, name: str) -> str:
        """What the duet adds to the group id of side `name`: ".vs-<partner>", or ".aa1"/".aa2" in the
        A/A control."""
        return f".aa{self.side}" if self.partner == name else f".vs-{self.partner}"


def connections_of(executor: str, vus: int | None, streams: int) -> int | None:
    """The connections k6 holds: a closed model's VUs over its streams; None for other models, whose
    VUs (and so connections) vary with the service's pace."""
    return vus // streams if executor == "constant-vus" and vus else None


def connection_model_of(connections: int | None, streams: int) -> str:
    """connections x streams, "10x1"; "?x1" for a model whose connections vary."""
    return f"{'?' if connections is None else connections}x{streams}"


def churn_name(churn: Churn) -> str:
    """How a label, a table or the command line says a churn: "never" or the calls, "10"."""
    return NEVER if churn is None else str(churn)


def churn_words(churn: Churn) -> str:
    """A churn in a report's words: "new connection every 10 calls", "connections kept"."""
    if churn is None:
        return "connections kept"
    return "new connection every call" if churn == 1 else f"new connection every {churn} calls"


def duet_name_of(
    target: str, streams: int, connection_model: str, churn: Churn = None, compression: str = IDENTITY
) -> str:
    """What a duet partner calls a side: its target, and its connection model, churn and compression
    where they are not the default (a pair across them may be one target's)."""
    name = target if streams == DEFAULT_STREAMS else f"{target}-{connection_model}"
    name = name if churn is None else f"{name}-churn{churn}"
    return name if compression == IDENTITY else f"{name}-{compression}"


@dataclass(frozen=True)
class Scenario:
    """One measured unit: a target on a profile, at a payload count, under a load model."""

    target: Target
    profile: Profile
    count: int
    load_model: LoadModel
    duration_s: float
    warmup_s: float
    repeat: int  # 1-based
    repeats: int
    response_model: str = DEFAULT_RESPONSE_MODEL  # what each request builds (RESPONSE_MODEL)
    network: NetworkProfile = LOOPBACK  # the link between k6 and the service
    direction: str = DEFAULT_DIRECTION  # which way the records travel (DIRECTIONS)
    shape: str = DEFAULT_SHAPE  # the record the service serves (SHAPES, the service's SHAPE)
    # k6 processes splitting the load model by execution segments, one CPU each; "auto": one
    # per CPU of the k6 side. Not part of the id: the load model is the same, only split.
    k6_instances: K6Instances = 1
    duet: Duet | None = None  # measured beside a partner, None: alone
    streams: int = DEFAULT_STREAMS  # requests at once on each connection (a closed model's only)
    churn: Churn = None  # a new connection every this many calls; None: never
    compression: str = IDENTITY  # what the service compresses its responses with (COMPRESSIONS)

    @property
    def connections(self) -> int | None:
        return connections_of(self.load_model.executor, self.load_model.vus, self.streams)

    @property
    def connection_model(self) -> str:
        return connection_model_of(self.connections, self.streams)

    @property
    def group(self) -> str:
        """The scenario id without the repeat: repeats of one group are aggregated. A duet's group
        names its partner: its repeats ran beside that partner's, and pair with them only.

        The default response model, direction, shape, streams, churn and compression add nothing, so
        groups keep the ids runs made before those axes existed had.
        """
        target_group = self.target_group
        return target_group if self.duet is None else target_group + self.duet.suffix(self.duet_name)

    @property
    def duet_name(self) -> str:
        return duet_name_of(
            self.target.name, self.streams, self.connection_model, self.churn, self.compression
        )

    @property
    def target_group(self) -> str:
        """The group without the duet's partner: the target under these conditions, alone or not."""
        return self.group_under(self.load_model.name)

    def group_under(self, load_model: str, *, with_connection: bool = True) -> str:
        """The group id this scenario would have under another load model, all else the same (and,
        not with_connection, at the default streams, churn and compression: what a duet's two sides
        share)."""
        group = f"{self.target.name}.{self.profile.name}.c{self.count}.{load_model}"
        if self.response_model != DEFAULT_RESPONSE_MODEL:
            group = f"{group}.{self.response_model}"
        if self.direction != DEFAULT_DIRECTION:
            group = f"{group}.{self.direction}"
        if self.shape != DEFAULT_SHAPE:
            group = f"{group}.{self.shape}"
        if with_connection and self.streams != DEFAULT_STREAMS:
            group = f"{group}.{self.connection_model}"
        if with_connection and self.churn is not None:
            group = f"{group}.churn{self.churn}"
        if with_connection and self.compression != IDENTITY:
            group = f"{group}.{self.compression}"
        return group if self.network.name == LOOPBACK.name else f"{group}.{self.network.name}"

    @property
    def id(self) -> str:
        return f"{self.group}.r{self.repeat}"

    @property
    def measured_seconds(self) -> float:
        return self.load_model.measured_seconds(self.duration_s)


@dataclass(frozen=True)
class Matrix:
    """The parsed matrix file."""

    path: Path
    profiles: Mapping[str, Profile]
    targets: Mapping[str, Target]
    load_models: Mapping[str, LoadModel]
    defaults: Mapping[str, Any]
    presets: Mapping[str, Mapping[str, Any]]
    default_preset: str
    networks: Mapping[str, NetworkProfile] = field(default_factory=lambda: {LOOPBACK.name: LOOPBACK})
    hosts: Hosts = field(default_factory=Hosts)  # [hosts]: the Docker engine of each role


@dataclass(frozen=True)
class Overrides:
    """Command-line choices; None leaves the preset's value."""

    targets: tuple[str, ...] | None = None
    profiles: tuple[str, ...] | None = None
    counts: tuple[int, ...] | None = None
    load_models: tuple[str, ...] | None = None
    response_models: tuple[str, ...] | None = None
    directions: tuple[str, ...] | None = None
    shapes: tuple[str, ...] | None = None
    streams: tuple[int, ...] | None = None
    churn: tuple[int | str, ...] | None = None  # calls per connection, or NEVER (the schema checks them)
    compressions: tuple[str, ...] | None = None
    networks: tuple[str, ...] | None = None
    vus: int | None = None
    rate: int | None = None
    k6_instances: int | str | None = None  # an integer >= 1 or "auto"
    duration: str | None = None
    warmup: str | None = None
    repeats: int | None = None
    control: str | None = None  # the A/A control's target
    speed_reference: bool | None = None  # --speed-reference on/off


def round_of(scenario: Scenario) -> tuple[bool, int]:
    """The round a scenario belongs to: its repeat, ladder rungs apart, since their rounds follow every
    other round (a rung is judged by the closed model's results: labrunner.results.ladder)."""
    return scenario.load_model.rung is not None, scenario.repeat


@dataclass(frozen=True)
class Plan:
    """The expanded run: scenarios in the matrix's order plus run-wide settings.

    The matrix's order is the rounds in order (round_of), each round in the file's order of its
    networks, profiles, counts, load models, response models and targets: the order the summaries
    and the report read a run in, whatever order it ran in.
    """

    matrix_path: Path
    preset: str
    backend: str
    scenarios: tuple[Scenario, ...]
    start_timeout_s: float
    stop_timeout_s: float
    seed: int | None = None  # shuffles the scenarios inside each round (run_order); None: no shuffle
    measure: str = SERVICE  # MEASURES: what the run measures
    notes: tuple[str, ...] = ()  # how the run departs from its matrix, said once when it starts
    duet_questions: tuple[str, ...] = ()  # the questions whose pairs may duet; empty: every one
    control: str | None = None  # the A/A control's target, when the run duets it (model.duet)
    precision: float | None = None  # the preset's --precision (a share), which the command line overrides
    budget_s: float = DEFAULT_BUDGET_S  # the preset's --budget
    speed_reference: bool = False  # the speed reference runs beside the services (local backend)

    @property
    def run_order(self) -> tuple[Scenario, ...]:
        """The scenarios in the order they run: the rounds in order, each shuffled by `seed`, so no
        target always runs first after calibration or right after a given other one."""
        return tuple(scenario for unit in self.run_units for scenario in unit)

    @property
    def run_units(self) -> tuple[tuple[Scenario, ...], ...]:
        """run_order in what runs as one: a duet block's two scenarios (slot order), or one alone; a
        round's units are shuffled whole."""
        units: list[tuple[Scenario, ...]] = []
        shuffler = random.Random(self.seed)
        for _, members in itertools.groupby(self.scenarios, key=round_of):
            round_units = units_of(list(members))
            if self.seed is not None:
                shuffler.shuffle(round_units)
            units += round_units
        return tuple(units)

    @property
    def estimated_seconds(self) -> float:
        """k6 time only: warm-up plus measured runs (overhead comes on top)."""
        return sum(s.warmup_s + s.measured_seconds for s in self.scenarios)


def units_of(scenarios: Sequence[Scenario]) -> list[tuple[Scenario, ...]]:
    """Scenarios in what runs as one: each duet's two sides of a repeat (slot order), else one alone,
    in the order their first member comes."""
    units: dict[tuple[object, ...], list[Scenario]] = {}
    for s in scenarios:
        if s.duet is None:
            units[(s.id,)] = [s]
        else:
            pair = frozenset({s.duet_name, s.duet.partner})
            shared = s.group_under(s.load_model.name, with_connection=False).partition(".")[2]
            units.setdefault((s.repeat, pair, shared), []).append(s)
    return [tuple(sorted(u, key=lambda s: s.duet.slot if s.duet else 0)) for u in units.values()]


def format_duration(seconds: float) -> str:
    """A k6 duration string for seconds; whole seconds stay readable ("30s")."""
    if seconds == int(seconds):
        return f"{int(seconds)}s"
    return f"{round(seconds * 1000)}ms"
