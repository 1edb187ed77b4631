"""Load matrix.toml, validate it and expand a preset plus command-line overrides into scenarios."""

import fnmatch
import math
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Annotated, Any, Literal, Self, TypeVar, get_args

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

from labrunner.model.engine_roles import LOCAL_ENGINE, LOOPBACK_ADDRESS, Hosts, HostsError, hosts
from labrunner.network.profiles import NetworkProfile, NetworkSpec

BACKENDS = ("local", "docker")
ProtocolName = Literal["http1.1", "http2", "grpc"]
PROTOCOLS: tuple[str, ...] = get_args(ProtocolName)
EXECUTORS = ("constant-vus", "ramping-vus", "constant-arrival-rate", "shared-iterations")
# What k6 reports as res.proto for each REST protocol.
REST_PROTO = {"http1.1": "HTTP/1.1", "http2": "HTTP/2.0"}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
_MODULE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$", re.ASCII)
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_SECONDS = re.compile(r"^\d+(?:\.\d+)?$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_MEMORY = re.compile(r"^(\d+(?:\.\d+)?)\s*([bkmg]?)b?$", re.IGNORECASE)
_MEMORY_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
T = TypeVar("T")
AUTO_INSTANCES = "auto"
K6Instances = int | Literal["auto"]


# services/common/config.py's ResponseModel: `build` maps records into protocol objects per
# request, `prebuilt` only assembles objects made at start (the wire-only cost).
RESPONSE_MODELS = ("build", "prebuilt")
DEFAULT_RESPONSE_MODEL = "build"
# Today's network: 127.0.0.1, no namespaces, no emulator; groups on it keep their old ids.
LOOPBACK = NetworkProfile("loopback")


class MatrixError(ValueError):
    """The matrix file or a command-line selection is invalid; the message says where."""


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

    Each step is one k6 run of the scenario's duration (see labrunner.capacity).
    """

    slo_p99_ms: float
    max_error_rate: float
    max_steps: int
    growth: float  # rate multiplier while every step passes


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

    def measured_seconds(self, duration_s: float) -> float:
        """How long k6 runs: the stages for ramping-vus, every step of a search, else the duration
        (for shared-iterations the cap; the run ends earlier once every iteration is done)."""
        if self.executor == "ramping-vus":
            return sum(stage.duration_s for stage in self.stages)
        if self.search is not None:
            return duration_s * self.search.max_steps
        return duration_s


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
    # k6 processes splitting the load model by execution segments, one CPU each; "auto": one
    # per CPU of the k6 side. Not part of the id: the load model is the same, only split.
    k6_instances: K6Instances = 1

    @property
    def group(self) -> str:
        """The scenario id without the repeat: repeats of one group are aggregated.

        The default response model adds nothing, so groups keep the ids runs made before the
        models existed had.
        """
        group = f"{self.target.name}.{self.profile.name}.c{self.count}.{self.load_model.name}"
        if self.response_model != DEFAULT_RESPONSE_MODEL:
            group = f"{group}.{self.response_model}"
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
    networks: tuple[str, ...] | None = None
    vus: int | None = None
    rate: int | None = None
    k6_instances: int | str | None = None  # an integer >= 1 or "auto"
    duration: str | None = None
    warmup: str | None = None
    repeats: int | None = None


@dataclass(frozen=True)
class Plan:
    """The expanded run: scenarios in execution order plus run-wide settings."""

    matrix_path: Path
    preset: str
    backend: str
    scenarios: tuple[Scenario, ...]
    start_timeout_s: float
    stop_timeout_s: float

    @property
    def estimated_seconds(self) -> float:
        """k6 time only: warm-up plus measured runs (overhead comes on top)."""
        return sum(s.warmup_s + s.measured_seconds for s in self.scenarios)


def _problem(message: str, value: object) -> PydanticCustomError:
    """A validation error whose message may show the offending value as {value}."""
    return PydanticCustomError("matrix", message, {"value": repr(value)})


def _seconds(value: object) -> float:
    """Seconds from a k6-style duration ("500ms", "30s", "1m30s") or a number of seconds."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        if _SECONDS.match(text):
            return float(text)
        parts = _DURATION_PART.findall(text)
        if parts and "".join(n + u for n, u in parts) == text:
            return sum(float(n) * _DURATION_UNITS[u] for n, u in parts)
    raise _problem("{value} is not a duration (e.g. '500ms', '30s', '1m30s')", value)


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


_STRICT = ConfigDict(strict=True)
Duration = Annotated[float, BeforeValidator(_seconds)]
PositiveDuration = Annotated[Duration, _must(_positive, "must be longer than zero")]
MemorySize = Annotated[int, BeforeValidator(_bytes)]
PositiveInt = Annotated[int, _must(_positive, "{value} must be a positive integer")]
# Names end up in file names, cgroup directories and metric labels.
Name = Annotated[str, _must(_NAME.match, "name must be letters, digits, '-' or '_'")]
Names = Annotated[list[str], BeforeValidator(_as_list), _must(len, "must list at least one name")]
Counts = Annotated[list[PositiveInt], BeforeValidator(_as_list), _must(len, "must list at least one count")]
Entries = Annotated[dict[Name, T], _must(len, "must define at least one entry")]
ResponseModelName = Annotated[
    str,
    _must(RESPONSE_MODELS.__contains__, "{value} must be one of " + " or ".join(map(repr, RESPONSE_MODELS))),
]
K6InstancesSetting = Annotated[K6Instances, BeforeValidator(_k6_instances)]
ResponseModelNames = Annotated[
    list[ResponseModelName], BeforeValidator(_as_list), _must(len, "must list at least one model")
]
_DURATION = TypeAdapter[float](Duration, config=_STRICT)
_MEMORY_SIZE = TypeAdapter[int](MemorySize, config=_STRICT)
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

    service: Annotated[str, _must(str.isidentifier, "{value} must be a services/ package name")]
    script: Annotated[str, _must(lambda path: path.endswith(".js"), "{value} must be a k6 .js path")]
    protocol: ProtocolName
    tls: bool
    expect_proto: str | None = Field(default=None, validate_default=True)
    env: dict[str, str] = {}
    response_model: ResponseModelName | None = None
    # A server outside services/ on the service's stack and settings (benchmarks/floor/).
    module: Annotated[str, _must(_MODULE.match, "{value} must be a dotted module name")] | None = None

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


class _ConstantVus(_Table):
    """[load_models.<name>] with executor = "constant-vus"; likewise the next three."""

    executor: Literal["constant-vus"]
    vus: PositiveInt

    def build(self, name: str) -> LoadModel:
        return LoadModel(name, self.executor, vus=self.vus)


class _RampingVus(_Table):
    executor: Literal["ramping-vus"]
    stages: Annotated[list[_StageSpec], _must(len, "must list at least one stage")]

    def build(self, name: str) -> LoadModel:
        return LoadModel(name, self.executor, stages=tuple(s.build() for s in self.stages))


class _ConstantArrivalRate(_Table):
    executor: Literal["constant-arrival-rate"]
    rate: PositiveInt
    pre_allocated_vus: PositiveInt
    max_vus: PositiveInt
    search: _SearchSpec | None = None  # a capacity search from `rate`

    @model_validator(mode="after")
    def _max_covers_preallocated(self) -> Self:
        if self.max_vus < self.pre_allocated_vus:
            raise _problem("max_vus must be >= pre_allocated_vus", self.max_vus)
        return self

    def build(self, name: str) -> LoadModel:
        return LoadModel(
            name,
            self.executor,
            rate=self.rate,
            pre_allocated_vus=self.pre_allocated_vus,
            max_vus=self.max_vus,
            search=self.search.build() if self.search else None,
        )


class _SharedIterations(_Table):
    executor: Literal["shared-iterations"]
    vus: PositiveInt
    iterations: PositiveInt

    def build(self, name: str) -> LoadModel:
        return LoadModel(name, self.executor, vus=self.vus, iterations=self.iterations)


_LoadModelSpec = Annotated[
    _ConstantVus | _RampingVus | _ConstantArrivalRate | _SharedIterations, Field(discriminator="executor")
]


class _Settings(_Table):
    """What a preset chooses, merged over its layers and the command line: every key set."""

    targets: Names
    profiles: Names
    counts: Counts
    load_models: Names
    response_models: ResponseModelNames
    networks: Names = ["loopback"]
    k6_instances: K6InstancesSetting = 1
    duration: PositiveDuration
    warmup: Duration
    repeats: PositiveInt
    start_timeout: PositiveDuration
    stop_timeout: PositiveDuration


# Keys a [defaults], [defaults.<backend>], [presets.<name>] or [presets.<name>.<backend>] may set.
SELECTION_KEYS = tuple(_Settings.model_fields)


class _Selection(_Table):
    """One layer of a preset: any of the settings' keys."""

    targets: Names | None = None
    profiles: Names | None = None
    counts: Counts | None = None
    load_models: Names | None = None
    response_models: ResponseModelNames | None = None
    networks: Names | None = None
    k6_instances: K6InstancesSetting | None = None
    duration: PositiveDuration | None = None
    warmup: Duration | None = None
    repeats: PositiveInt | None = None
    start_timeout: PositiveDuration | None = None
    stop_timeout: PositiveDuration | None = None


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


class _MatrixFile(_Table):
    """The whole file."""

    defaults: _Defaults = _Defaults()
    profiles: Entries[_ProfileSpec]
    targets: Entries[_TargetSpec]
    load_models: Entries[_LoadModelSpec]
    presets: dict[str, _Preset] = {}
    networks: dict[Name, NetworkSpec] = {}
    hosts: _HostsSpec = _HostsSpec()


def parse_duration(value: object, where: str) -> float:
    """Seconds from a k6-style duration ("500ms", "30s", "1m30s") or a number of seconds."""
    return _parse(_DURATION, value, where)


def format_duration(seconds: float) -> str:
    """A k6 duration string for seconds; whole seconds stay readable ("30s")."""
    if seconds == int(seconds):
        return f"{int(seconds)}s"
    return f"{round(seconds * 1000)}ms"


def parse_memory(value: object, where: str) -> int:
    """Bytes from a docker-style size ("512m", "2g") or a number of bytes."""
    return _parse(_MEMORY_SIZE, value, where)


def load_matrix(path: Path) -> Matrix:
    """Parse and validate the matrix file; every error names the table and key."""
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise MatrixError(f"cannot read matrix {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise MatrixError(f"{path}: invalid TOML: {exc}") from exc
    return parse_matrix(data, path)


def parse_matrix(data: Mapping[str, Any], path: Path) -> Matrix:
    """Validate a decoded matrix document."""
    try:
        spec = _MatrixFile.model_validate(data)
    except ValidationError as exc:
        raise _matrix_error(exc, str(path), in_file=True) from exc
    if spec.defaults.preset not in spec.presets:
        raise MatrixError(f"[defaults] preset = {spec.defaults.preset!r} is not a [presets.*] table")
    # The layers stay as written: they are merged with the command line and listed by --list.
    defaults = {k: v for k, v in data.get("defaults", {}).items() if k != "preset"}
    try:
        roles = hosts(spec.hosts.service, tuple(spec.hosts.load), spec.hosts.publish_address, "[hosts]")
    except HostsError as exc:
        raise MatrixError(f"{path}: {exc}") from exc
    matrix = Matrix(
        path,
        profiles={n: p.build(n) for n, p in spec.profiles.items()},
        targets={n: t.build(n) for n, t in spec.targets.items()},
        load_models={n: m.build(n) for n, m in spec.load_models.items()},
        defaults=defaults,
        presets=data.get("presets", {}),
        default_preset=spec.defaults.preset,
        # loopback is always there, so matrices without a [networks] table run as before.
        networks={LOOPBACK.name: LOOPBACK} | {n: s.build(n) for n, s in spec.networks.items()},
        hosts=roles,
    )
    for name in matrix.presets:
        for backend in BACKENDS:
            expand(matrix, backend, name)  # every preset must expand
    return matrix


def expand(
    matrix: Matrix, backend: str, preset: str | None = None, overrides: Overrides = Overrides()
) -> Plan:
    """The scenarios of a preset for a backend, with command-line overrides applied.

    Repeats are the outermost loop, so slow drift of the machine (thermal, background
    load) spreads over every target instead of biasing the ones measured last.
    """
    if backend not in BACKENDS:
        raise MatrixError(f"unknown backend {backend!r} (known: {', '.join(BACKENDS)})")
    name = preset or matrix.default_preset
    if name not in matrix.presets:
        raise MatrixError(f"unknown preset {name!r} (known: {', '.join(matrix.presets)})")
    where = f"preset {name!r} ({backend} backend)"
    settings = _settings(matrix, name, backend, overrides, where)
    models = [
        _with_overrides(matrix.load_models[n], overrides)
        for n in _names(settings.load_models, matrix.load_models, "load model", where)
    ]
    targets = _names(settings.targets, matrix.targets, "target", where)
    profiles = _names(settings.profiles, matrix.profiles, "profile", where)
    networks = _names(settings.networks, matrix.networks, "network", where)
    scenarios = tuple(
        Scenario(
            target=matrix.targets[target],
            profile=matrix.profiles[profile],
            count=count,
            load_model=model,
            duration_s=settings.duration,
            warmup_s=settings.warmup,
            repeat=repeat,
            repeats=settings.repeats,
            response_model=response_model,
            network=matrix.networks[network],
            k6_instances=settings.k6_instances,
        )
        for repeat in range(1, settings.repeats + 1)
        for network in networks
        for profile in profiles
        for count in sorted(set(settings.counts))
        for model in models
        for response_model in dict.fromkeys(settings.response_models)
        for target in targets
        # A target pinned to one model runs only in that model.
        if matrix.targets[target].response_model in (None, response_model)
    )
    return Plan(
        matrix_path=matrix.path,
        preset=name,
        backend=backend,
        scenarios=scenarios,
        start_timeout_s=settings.start_timeout,
        stop_timeout_s=settings.stop_timeout,
    )


def split_list(values: Sequence[str] | None) -> tuple[str, ...] | None:
    """Flatten repeatable, comma-separated command-line values ("a,b" "c" -> a, b, c)."""
    if not values:
        return None
    return tuple(item.strip() for value in values for item in value.split(",") if item.strip())


def _settings(matrix: Matrix, preset: str, backend: str, overrides: Overrides, where: str) -> _Settings:
    """[defaults], [defaults.<backend>], the preset, its backend table, then the command line."""
    merged: dict[str, object] = {}
    preset_table = matrix.presets[preset]
    for layer in (matrix.defaults, matrix.defaults.get(backend, {}), preset_table):
        merged.update({k: v for k, v in layer.items() if k not in BACKENDS})
    merged.update(preset_table.get(backend, {}))
    for key in SELECTION_KEYS:
        if key not in merged and _Settings.model_fields[key].is_required():
            raise MatrixError(f"{where}: {key!r} is not set in [defaults] or the preset")
    cli = {f.name: getattr(overrides, f.name) for f in fields(overrides)}
    merged.update({k: v for k, v in cli.items() if v is not None and k in SELECTION_KEYS})
    try:
        return _Settings.model_validate(merged)
    except ValidationError as exc:
        raise _matrix_error(exc, where) from exc


def _with_overrides(model: LoadModel, overrides: Overrides) -> LoadModel:
    """--vus sets the VUs of constant-vus models, --rate the rate of arrival-rate models."""
    if overrides.vus is not None and model.executor == "constant-vus":
        model = replace(model, vus=_parse(_POSITIVE_INT, overrides.vus, "--vus"))
    if overrides.rate is not None and model.executor == "constant-arrival-rate":
        model = replace(model, rate=_parse(_POSITIVE_INT, overrides.rate, "--rate"))
    return model


def _names(patterns: list[str], known: Mapping[str, object], kind: str, where: str) -> list[str]:
    """Resolve names and globs in file order of `known`; unknown names are errors."""
    chosen: set[str] = set()
    for pattern in patterns:
        matches = fnmatch.filter(known, pattern)
        if not matches:
            raise MatrixError(f"{where}: unknown {kind} {pattern!r} (known: {', '.join(known)})")
        chosen.update(matches)
    return [name for name in known if name in chosen]


def _parse(adapter: TypeAdapter[T], value: object, where: str) -> T:
    try:
        return adapter.validate_python(value)
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
