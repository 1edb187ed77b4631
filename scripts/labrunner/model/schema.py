"""The pydantic models of matrix.toml, and pydantic's errors in the file's terms: "[table] key: problem".

About 500 lines as one module: every table's model and the translation of its errors into the
file's terms must move together, or a message names a key the schema no longer has.
"""

import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, Self, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from labrunner.model.engine_roles import LOCAL_ENGINE, LOOPBACK_ADDRESS
from labrunner.model.scenario import (
    AUTO_INSTANCES,
    BACKENDS,
    COMPRESSIONS,
    DEFAULT_BUDGET_S,
    DEFAULT_DIRECTION,
    DEFAULT_SHAPE,
    DEFAULT_STREAMS,
    DIRECTIONS,
    DRIVER_SCRIPT,
    IDENTITY,
    NEVER,
    RESPONSE_MODELS,
    SHAPES,
    USER_SHAPE,
    CapacitySearch,
    K6Instances,
    LoadModel,
    Profile,
    Rung,
    Stage,
    Target,
)
from labrunner.model.terms import DURATION_EXAMPLES, REST_PROTO, seconds_or_none
from labrunner.network.profiles import NetworkProfile
from services.common.stacks import BY_PACKAGE

ProtocolName = Literal["http1.1", "http2", "http3", "grpc"]
MeasureName = Literal["service", "caller"]  # labrunner.model.scenario.MEASURES
# labrunner.model.questions.QUESTIONS' kinds, held equal by a test.
QuestionName = Literal[
    "lab vs floor",
    "build vs prebuilt",
    "metrics on vs off",
    "HTTP/2 vs HTTP/1.1",
    "HTTP/3 vs HTTP/2",
    "HTTP/3 vs HTTP/1.1",
    "Python driver vs k6",
    "gRPC vs REST",
    "gRPC streaming vs unary",
    "multiplexed vs connections",
    "HTTP/2 multiplexed vs HTTP/1.1",
    "new connections vs kept",
    "compressed vs identity",
    "REST server vs REST server",
    "gRPC server vs gRPC server",
]
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
_MODULE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$", re.ASCII)
_MEMORY = re.compile(r"^(\d+(?:\.\d+)?)\s*([bkmg]?)b?$", re.IGNORECASE)
_MEMORY_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
_QUANTITY = re.compile(r"^([+-]?\d+(?:\.\d+)?)\s*(\S*)$")
_LINK_TIME_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
# SI prefixes, as tc counts them (tc's "bps" means bytes per second, so it is not offered here).
_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}
T = TypeVar("T")


class MatrixError(ValueError):
    """The matrix file or a command-line selection is invalid; the message says where."""


def _problem(message: str, value: object) -> PydanticCustomError:
    """A validation error whose message may show the offending value as {value}."""
    return PydanticCustomError("matrix", message, {"value": repr(value)})


def _seconds(value: object) -> float:
    """Seconds from a k6-style duration ("500ms", "30s", "1m30s") or a number of seconds."""
    seconds = seconds_or_none(value)
    if seconds is None:
        raise _problem(f"{{value}} is not a duration ({DURATION_EXAMPLES})", value)
    return seconds


def _bytes(value: object) -> int:
    """Bytes from a docker-style size ("512m", "2g") or a number of bytes."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, str):
        match = _MEMORY.match(value.strip())
        if match:
            size = int(float(match[1]) * _MEMORY_UNITS[match[2].lower()])
            if size > 0:
                return size
    raise _problem("{value} is not a memory size (e.g. '512m', '2g')", value)


def _churn(value: object) -> object:
    """A churn: "never" (None, each connection kept for the whole k6 run) or the calls a connection
    carries before k6 replaces it, 1 or more."""
    if value == NEVER:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise _problem(
        f"churn {{value}}: a connection carries 1 or more calls before it is replaced, or {NEVER!r} "
        "to keep it",
        value,
    )


def _k6_instances(value: object) -> object:
    """k6_instances: an integer >= 1, or "auto" (one instance per CPU of the k6 side)."""
    if value == AUTO_INSTANCES or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    raise _problem("{value} must be an integer >= 1 or 'auto'", value)


def _as_list(value: object) -> object:
    # One name stands for a list of one; the command line gives tuples.
    if isinstance(value, str):
        return [value]
    return list(value) if isinstance(value, tuple) else value


def _must(test: Callable[[T], object], message: str) -> AfterValidator:
    """A constraint on the parsed value, failing with `message`."""

    def check(value: T) -> T:
        if not test(value):
            raise _problem(message, value)
        return value

    return AfterValidator(check)


def _positive(value: float) -> bool:
    return value > 0


def _quantity(value: object, units: Mapping[str, float], example: str) -> tuple[float, float]:
    """(number, unit factor) from "<number><unit>"; the unit is compulsory: a bare 25 could be s or ms."""
    if not isinstance(value, str):
        raise _problem(f"{{value}} must be a string with a unit (e.g. {example!r})", value)
    match = _QUANTITY.match(value.strip())
    if not match:
        raise _problem(f"{{value}} is not a number with a unit (e.g. {example!r})", value)
    unit = match[2].lower()
    if unit not in units:
        known = ", ".join(units)
        raise _problem(f"unknown unit {unit or 'none'!r} in {{value}} (known: {known})", value)
    number = float(match[1])
    if number < 0:
        raise _problem("{value} must not be negative", value)
    return number, units[unit]


def _link_seconds(value: object) -> float:
    number, factor = _quantity(value, _LINK_TIME_UNITS, "25ms")
    return number * factor


def _bits_per_second(value: object) -> int:
    number, factor = _quantity(value, _RATE_UNITS, "10mbit")
    bps = round(number * factor)
    if bps <= 0:
        raise _problem("{value} must be above zero (leave rate out for an unlimited link)", value)
    return bps


def _percent(value: object) -> float:
    number, _ = _quantity(value, {"%": 1.0}, "1%")
    if number > 100:
        raise _problem("{value} must be between 0% and 100%", value)
    return number


_STRICT = ConfigDict(strict=True)
Duration = Annotated[float, BeforeValidator(_seconds)]
PositiveDuration = Annotated[Duration, _must(_positive, "must be longer than zero")]
MemorySize = Annotated[int, BeforeValidator(_bytes)]
PositiveInt = Annotated[int, _must(_positive, "{value} must be a positive integer")]
# Names end up in file names, cgroup directories and metric labels.
Name = Annotated[str, _must(_NAME.match, "name must be letters, digits, '-' or '_'")]
Names = Annotated[list[str], BeforeValidator(_as_list), _must(len, "must list at least one name")]
Counts = Annotated[list[PositiveInt], BeforeValidator(_as_list), _must(len, "must list at least one count")]
# Every lab server allows 100 concurrent streams a connection (services/rest_quart/hypercorn.toml,
# rest_granian, grpc_aio; grpclib keeps h2's default of 100): beyond that k6's Go client opens another
# connection instead of queueing.
MAX_STREAMS = 100
StreamCount = Annotated[
    PositiveInt,
    _must(
        lambda n: n <= MAX_STREAMS,
        f"{{value}} exceeds the {MAX_STREAMS} concurrent streams a lab server allows",
    ),
]
StreamCounts = Annotated[
    list[StreamCount], BeforeValidator(_as_list), _must(len, "must list at least one number of streams")
]
ChurnEvery = Annotated[int | None, BeforeValidator(_churn)]
Churns = Annotated[list[ChurnEvery], BeforeValidator(_as_list), _must(len, "must list at least one churn")]
CompressionName = Annotated[
    str,
    _must(
        COMPRESSIONS.__contains__,
        "{value}: the lab's servers compress with " + " or ".join(map(repr, COMPRESSIONS)) + " only",
    ),
]
CompressionNames = Annotated[
    list[CompressionName], BeforeValidator(_as_list), _must(len, "must list at least one compression")
]
Entries = Annotated[dict[Name, T], _must(len, "must define at least one entry")]
ResponseModelName = Annotated[
    str,
    _must(RESPONSE_MODELS.__contains__, "{value} must be one of " + " or ".join(map(repr, RESPONSE_MODELS))),
]
DirectionName = Annotated[
    str, _must(DIRECTIONS.__contains__, "{value} must be one of " + " or ".join(map(repr, DIRECTIONS)))
]
DirectionNames = Annotated[
    list[DirectionName], BeforeValidator(_as_list), _must(len, "must list at least one direction")
]
# proto: the user's own message, which --proto and --message give (the runner refuses it without them).
ShapeName = Annotated[
    str,
    _must(
        (*SHAPES, USER_SHAPE).__contains__,
        "{value} must be one of " + ", ".join(map(repr, (*SHAPES, USER_SHAPE))),
    ),
]
ShapeNames = Annotated[list[ShapeName], BeforeValidator(_as_list), _must(len, "must list at least one shape")]
K6InstancesSetting = Annotated[K6Instances, BeforeValidator(_k6_instances)]
ResponseModelNames = Annotated[
    list[ResponseModelName], BeforeValidator(_as_list), _must(len, "must list at least one model")
]
# A link's times, unlike a run's durations, need their unit ([networks.<name>]).
LinkDuration = Annotated[float, BeforeValidator(_link_seconds)]
Rate = Annotated[int, BeforeValidator(_bits_per_second)]
Percent = Annotated[float, BeforeValidator(_percent)]
# --precision's target in a preset: a compared pair's 95% interval within this share of its estimate.
Precision = Annotated[
    Percent, _must(lambda value: 0 < value < 100, "{value} must be above 0% and below 100%")
]
_POSITIVE_INT = TypeAdapter[int](PositiveInt, config=_STRICT)


class _Table(BaseModel):
    """A table of matrix.toml: strict types, read-only, no keys but its fields."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: object) -> object:
        # extra="forbid" would reject the key too, but not list the keys that are allowed.
        unknown = sorted(set(data) - set(cls.model_fields)) if isinstance(data, dict) else []
        if unknown:
            known = ", ".join(sorted(cls.model_fields))
            raise PydanticCustomError(
                "unknown_key", "unknown key {key} (known: {known})", {"key": repr(unknown[0]), "known": known}
            )
        return data


class _ProfileSpec(_Table):
    """[profiles.<name>]"""

    cpus: Annotated[float, _must(_positive, "{value} must be a positive number")]
    memory: MemorySize

    def build(self, name: str) -> Profile:
        return Profile(name, self.cpus, self.memory)


class _TargetSpec(_Table):
    """[targets.<name>]"""

    service: Annotated[
        str, _must(BY_PACKAGE.__contains__, "{value} must be a services/ package name of a declared stack")
    ]
    # A k6 script, or the Python driver (scripts/drive_http.py: REST downloads over any HTTP version).
    script: Annotated[
        str,
        _must(
            lambda path: path.endswith(".js") or path == DRIVER_SCRIPT,
            f"{{value}} must be a k6 .js path or {DRIVER_SCRIPT}",
        ),
    ]
    protocol: ProtocolName
    tls: bool
    expect_proto: str | None = Field(default=None, validate_default=True)
    env: dict[str, str] = {}
    response_model: ResponseModelName | None = None
    # A server outside services/ on the service's stack and settings (benchmarks/floor/).
    module: Annotated[str, _must(_MODULE.match, "{value} must be a dotted module name")] | None = None

    @field_validator("protocol")
    @classmethod
    def _served_by_its_stack(cls, value: str, info: ValidationInfo) -> str:
        stack = BY_PACKAGE.get(info.data.get("service", ""))  # absent when the service is wrong
        if stack is not None and value not in stack.protocols:
            served = ", ".join(stack.protocols)
            raise _problem(f"{{value}} is not one {stack.package} serves ({served})", value)
        return value

    @field_validator("expect_proto")
    @classmethod
    def _expect_matches_protocol(cls, value: str | None, info: ValidationInfo) -> str | None:
        protocol = info.data.get("protocol")
        if protocol == "grpc" and value is not None:
            raise _problem("only REST targets have one", value)
        if protocol in REST_PROTO and value != REST_PROTO[protocol]:
            raise _problem(f"{{value}} must be {REST_PROTO[protocol]!r} for {protocol}", value)
        return value

    @model_validator(mode="after")
    def _http2_over_tls(self) -> Self:
        if self.protocol == "http2" and not self.tls:
            raise _problem("http2 needs tls = true (k6 negotiates HTTP/2 only via ALPN)", self.tls)
        if self.protocol == "http3" and (not self.tls or self.script != DRIVER_SCRIPT):
            raise _problem(
                f"http3 needs tls = true and script = {DRIVER_SCRIPT!r} (QUIC is encrypted, k6 no HTTP/3)",
                self.script,
            )
        if self.script == DRIVER_SCRIPT and self.protocol == "grpc":
            raise _problem("the Python driver speaks REST, not grpc", self.script)
        return self

    def build(self, name: str) -> Target:
        env = tuple(sorted(self.env.items()))
        return Target(
            name,
            self.service,
            self.script,
            self.protocol,
            self.tls,
            self.expect_proto,
            env,
            self.response_model,
            self.module,
        )


class _StageSpec(_Table):
    """One of a ramping-vus model's stages."""

    duration: PositiveDuration
    target: Annotated[int, _must(lambda vus: vus >= 0, "{value} must be an integer >= 0")]

    def build(self) -> Stage:
        return Stage(self.duration, self.target)


class _SearchSpec(_Table):
    """A constant-arrival-rate model's capacity search."""

    slo_p99: PositiveDuration
    max_error_rate: Annotated[float, _must(lambda r: 0 <= r < 1, "{value} must be a fraction in [0, 1)")]
    max_steps: PositiveInt
    growth: Annotated[float, _must(lambda g: g > 1, "{value} must be a number above 1")]

    def build(self) -> CapacitySearch:
        return CapacitySearch(self.slo_p99 * 1000, self.max_error_rate, self.max_steps, self.growth)


class _LoadModelTable(_Table):
    """What every [load_models.<name>] may set besides its executor's parameters."""

    repeats: PositiveInt | None = None  # at most the preset's: a shorter follow-up


class _ConstantVus(_LoadModelTable):
    """[load_models.<name>] with executor = "constant-vus"; likewise the next three."""

    executor: Literal["constant-vus"]
    vus: PositiveInt

    def build(self, name: str) -> LoadModel:
        return LoadModel(name, self.executor, vus=self.vus, repeats=self.repeats)


class _RampingVus(_LoadModelTable):
    executor: Literal["ramping-vus"]
    stages: Annotated[list[_StageSpec], _must(len, "must list at least one stage")]

    def build(self, name: str) -> LoadModel:
        stages = tuple(s.build() for s in self.stages)
        return LoadModel(name, self.executor, stages=stages, repeats=self.repeats)


def _whole_percent(share: float) -> bool:
    return abs(share * 100 - round(share * 100)) < 1e-9


# A ladder's share: a rung's rate over its target's closed-model req/s, in whole percent (it names the rung).
Share = Annotated[
    float,
    _must(lambda s: 0 < s <= 1, "{value} must be a fraction in (0, 1]"),
    _must(_whole_percent, "{value} must be a whole percent (0.25, not 0.255): it names its rung"),
]


class _LadderSpec(_Table):
    """[load_models.<name>.ladder]: the rungs of an arrival-rate model, one per share of the target's
    closed-model capacity."""

    shares: Annotated[
        list[Share],
        _must(len, "must list at least one share"),
        _must(lambda shares: shares == sorted(set(shares)), "{value} must rise, each share above the last"),
    ]
    scripts: Annotated[list[str], _must(len, "must list at least one k6 script")]
    capacity_model: Name
    latency_bound: PositiveDuration  # VUs per rung: rate x latency_bound x 2, within the model's VUs

    @model_validator(mode="before")
    @classmethod
    def _no_rates(cls, data: object) -> object:
        # Ladders of absolute rates (rates, max_share) skipped whole curves on a slower host.
        if isinstance(data, dict) and {"rates", "max_share"} & set(data):
            raise _problem(
                "rates became shares: list fractions of each target's closed-model req/s in this run, "
                "e.g. shares = [0.1, 0.25, 0.4], and drop max_share",
                None,
            )
        return data


class _ConstantArrivalRate(_LoadModelTable):
    executor: Literal["constant-arrival-rate"]
    rate: PositiveInt | None = None  # None only for a ladder, whose rungs get their rates in the run
    pre_allocated_vus: PositiveInt
    max_vus: PositiveInt
    search: _SearchSpec | None = None  # a capacity search from `rate`
    ladder: _LadderSpec | None = None  # one load model per rate instead of one at `rate`

    @model_validator(mode="after")
    def _max_covers_preallocated(self) -> Self:
        if self.max_vus < self.pre_allocated_vus:
            raise _problem("max_vus must be >= pre_allocated_vus", self.max_vus)
        return self

    @model_validator(mode="after")
    def _rate_or_ladder(self) -> Self:
        if self.ladder is None and self.rate is None:
            raise _problem("missing key 'rate' (or a ladder table of shares)", None)
        if self.ladder is not None and (self.rate is not None or self.search is not None):
            raise _problem("a ladder's rungs get their own rates: no rate or search beside it", self.rate)
        return self

    def build(self, name: str) -> LoadModel:
        return LoadModel(
            name,
            self.executor,
            rate=self.rate,
            pre_allocated_vus=self.pre_allocated_vus,
            max_vus=self.max_vus,
            search=self.search.build() if self.search else None,
            repeats=self.repeats,
        )

    def rungs(self, name: str) -> tuple[LoadModel, ...]:
        """A ladder's load models, <name>-<percent>pct in the order of its shares, each without a rate
        until the run sets it from the target's capacity (labrunner.results.ladder), with the table's
        VUs, within which that rate's VUs are chosen (vus_for_rate)."""
        if self.ladder is None:
            return ()
        ladder = self.ladder
        return tuple(
            LoadModel(
                f"{name}-{round(share * 100)}pct",
                self.executor,
                pre_allocated_vus=self.pre_allocated_vus,
                max_vus=self.max_vus,
                repeats=self.repeats,
                rung=Rung(name, tuple(ladder.scripts), share, ladder.capacity_model, ladder.latency_bound),
            )
            for share in ladder.shares
        )


class _SharedIterations(_LoadModelTable):
    executor: Literal["shared-iterations"]
    vus: PositiveInt
    iterations: PositiveInt

    def build(self, name: str) -> LoadModel:
        return LoadModel(name, self.executor, vus=self.vus, iterations=self.iterations, repeats=self.repeats)


_LoadModelSpec = Annotated[
    _ConstantVus | _RampingVus | _ConstantArrivalRate | _SharedIterations, Field(discriminator="executor")
]


class NetworkSpec(_Table):
    """[networks.<name>]: one emulated link, each value applied to both directions.

    The issue's profiles (delay and jitter are one way, so an RTT is twice the delay)::

        [networks.loopback]          # today's: 127.0.0.1, no namespaces, no emulator

        [networks.lan]
        delay = "0.25ms"             # 0.5 ms RTT

        [networks.wan]
        delay = "25ms"               # 50 ms RTT
        jitter = "5ms"

        [networks.lossy]
        delay = "25ms"               # 50 ms RTT
        loss = "1%"

        [networks.narrow]
        delay = "10ms"               # 20 ms RTT
        rate = "10mbit"
    """

    delay: LinkDuration = 0.0
    jitter: LinkDuration = 0.0
    loss: Percent = 0.0
    rate: Rate | None = None

    @field_validator("jitter")
    @classmethod
    def _jitter_within_delay(cls, value: float, info: ValidationInfo) -> float:
        # netem would clip the negative delays to zero, skewing the mean the RTT check expects.
        delay = info.data.get("delay")
        if delay is not None and value > delay:
            raise _problem("{value} must not exceed delay", f"{value * 1000:g}ms")
        return value

    def build(self, name: str) -> NetworkProfile:
        return NetworkProfile(name, self.delay, self.jitter, self.loss, self.rate)


class Settings(_Table):
    """What a preset chooses, merged over its layers and the command line: every key set."""

    targets: Names
    profiles: Names
    counts: Counts
    load_models: Names
    response_models: ResponseModelNames
    directions: DirectionNames = [DEFAULT_DIRECTION]
    shapes: ShapeNames = [DEFAULT_SHAPE]
    # Requests at once on each connection: a closed model runs VUs / streams connections (model.scenario).
    streams: StreamCounts = [DEFAULT_STREAMS]
    # A new connection every N calls, or "never" (model.scenario.NEVER); one call at a time only.
    churn: Churns = [None]
    # What the services compress their responses with (model.scenario.COMPRESSIONS).
    compressions: CompressionNames = [IDENTITY]
    networks: Names = ["loopback"]
    k6_instances: K6InstancesSetting = 1
    duration: PositiveDuration
    warmup: Duration
    repeats: PositiveInt
    start_timeout: PositiveDuration
    stop_timeout: PositiveDuration
    measure: MeasureName = "service"  # "caller": the scenarios' targets are called by Python callers
    # The questions whose pairs run as duets (model.duet); empty: every question the run asks.
    duet_questions: list[QuestionName] = []
    # The target the A/A control runs beside itself (model.duet.plan_duets); unset: the first dueted.
    control: Name | None = None
    # --precision and --budget as the preset's default (the command line's win): blocks added to
    # the compared pairs until each req/s ratio is this sharp, while the budget lasts.
    precision: Precision | None = None
    budget: PositiveDuration = DEFAULT_BUDGET_S
    # The speed reference beside the services (run.speed_reference), on the local backend: a sweep's
    # own costs (a payload sweep's a and b) read at one host speed.
    speed_reference: bool = False


# Keys a [defaults], [defaults.<backend>], [presets.<name>] or [presets.<name>.<backend>] may set.
SELECTION_KEYS = tuple(Settings.model_fields)


class _Selection(_Table):
    """One layer of a preset: any of the settings' keys."""

    targets: Names | None = None
    profiles: Names | None = None
    counts: Counts | None = None
    load_models: Names | None = None
    response_models: ResponseModelNames | None = None
    directions: DirectionNames | None = None
    shapes: ShapeNames | None = None
    streams: StreamCounts | None = None
    churn: Churns | None = None
    compressions: CompressionNames | None = None
    networks: Names | None = None
    k6_instances: K6InstancesSetting | None = None
    duration: PositiveDuration | None = None
    warmup: Duration | None = None
    repeats: PositiveInt | None = None
    start_timeout: PositiveDuration | None = None
    stop_timeout: PositiveDuration | None = None
    measure: MeasureName | None = None
    duet_questions: list[QuestionName] | None = None
    control: Name | None = None
    precision: Precision | None = None
    budget: PositiveDuration | None = None
    speed_reference: bool | None = None


class _Preset(_Selection):
    """[presets.<name>] and its per-backend tables."""

    local: _Selection | None = None
    docker: _Selection | None = None


class _Defaults(_Preset):
    """[defaults]: a preset's layers start here."""

    preset: str = "default"


class _HostsSpec(_Table):
    """[hosts]: the engine of each role (labrunner.model.engine_roles); the docker backend's only."""

    service: str = LOCAL_ENGINE
    load: Annotated[list[str], BeforeValidator(_as_list)] = [LOCAL_ENGINE]
    publish_address: str = LOOPBACK_ADDRESS


class MatrixFile(_Table):
    """The whole file."""

    defaults: _Defaults = _Defaults()
    profiles: Entries[_ProfileSpec]
    targets: Entries[_TargetSpec]
    load_models: Entries[_LoadModelSpec]
    presets: dict[str, _Preset] = {}
    networks: dict[Name, NetworkSpec] = {}
    hosts: _HostsSpec = _HostsSpec()


def validate_matrix_file(data: Mapping[str, Any], path: Path) -> MatrixFile:
    """A decoded matrix document checked against the schema."""
    try:
        return MatrixFile.model_validate(data)
    except ValidationError as exc:
        raise _matrix_error(exc, str(path), in_file=True) from exc


def load_models_of(spec: MatrixFile, path: Path) -> dict[str, LoadModel]:
    """Every load model of the file by name, a ladder's rungs in its place. A rung's name must not be
    another table's, and its capacity model must be a closed (constant-vus) one."""
    models: dict[str, LoadModel] = {}
    for name, table in spec.load_models.items():
        if not isinstance(table, _ConstantArrivalRate) or table.ladder is None:
            models[name] = table.build(name)
            continue
        where = f"{path} [load_models.{name}] ladder"
        capacity_model = spec.load_models.get(table.ladder.capacity_model)
        if not isinstance(capacity_model, _ConstantVus):
            raise MatrixError(
                f"{where} capacity_model: {table.ladder.capacity_model!r} is not a constant-vus load model"
            )
        for rung in table.rungs(name):
            if rung.name in spec.load_models:
                raise MatrixError(f"{where} shares: its rung {rung.name!r} is also a [load_models.*] table")
            models[rung.name] = rung
    return models


def validate_settings(values: Mapping[str, object], where: str) -> Settings:
    """A preset's merged layers and command line, checked; errors name `where`."""
    try:
        return Settings.model_validate(values)
    except ValidationError as exc:
        raise _matrix_error(exc, where) from exc


def validate_positive_int(value: object, where: str) -> int:
    """A command-line integer such as --vus, checked like the file's."""
    try:
        return _POSITIVE_INT.validate_python(value)
    except ValidationError as exc:
        raise _matrix_error(exc, where) from exc


def _matrix_error(exc: ValidationError, where: str, in_file: bool = False) -> MatrixError:
    """Pydantic's first error in the file's terms: "[table] key: what is wrong"."""
    error = exc.errors()[0]
    # "[key]" marks a failing table name; pydantic puts the executor between a load model and its keys.
    loc = [part for part in error["loc"] if part != "[key]"]
    if in_file and loc[:1] == ["load_models"]:
        del loc[2:3]
    kind, ctx, value = error["type"], error.get("ctx", {}), error["input"]
    if kind == "missing":
        problem = f"missing key {loc.pop()!r}"
    elif kind == "union_tag_not_found":
        problem = f"missing key {ctx['discriminator']}"
    elif kind == "union_tag_invalid":
        loc.append(ctx["discriminator"].strip("'"))
        problem = f"{ctx['tag']!r} must be one of {ctx['expected_tags']}"
    elif kind == "literal_error":
        problem = f"{value!r} must be one of {ctx['expected']}"
    elif kind in ("dict_type", "model_type", "model_attributes_type"):
        problem = f"{value!r} must be a table"
    else:
        problem = error["msg"].replace("Input should be", f"{value!r} must be", 1)
    if in_file and (depth := _table_depth(loc)):
        where, loc = f"[{'.'.join(map(str, loc[:depth]))}]", loc[depth:]
    keys = "".join(f"[{part}]" if isinstance(part, int) else f" {part}" for part in loc).strip()
    if not keys:
        return MatrixError(f"{where}: {problem}")
    return MatrixError(f"{where} {keys}: {problem}" if in_file else f"{where}: {keys}: {problem}")


def _table_depth(loc: Sequence[int | str]) -> int:
    """How many leading parts of a location name a table: [defaults], [profiles.small], [presets.ci.local]."""
    if not loc:
        return 0
    depth = 1 if loc[0] == "defaults" else 2
    if loc[0] in ("defaults", "presets") and len(loc) > depth and loc[depth] in BACKENDS:
        depth += 1
    return min(depth, len(loc))
