"""Load matrix.toml, validate it and expand a preset plus command-line overrides into scenarios."""

import fnmatch
import math
import re
import tomllib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

BACKENDS = ("local", "docker")
PROTOCOLS = ("http1.1", "http2", "grpc")
EXECUTORS = ("constant-vus", "ramping-vus", "constant-arrival-rate", "shared-iterations")
# What k6 reports as res.proto for each REST protocol.
REST_PROTO = {"http1.1": "HTTP/1.1", "http2": "HTTP/2.0"}
# Keys a [defaults], [defaults.<backend>], [presets.<name>] or [presets.<name>.<backend>] may set.
SELECTION_KEYS = (
    "targets",
    "profiles",
    "counts",
    "load_models",
    "duration",
    "warmup",
    "repeats",
    "start_timeout",
    "stop_timeout",
)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_SECONDS = re.compile(r"^\d+(?:\.\d+)?$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_MEMORY = re.compile(r"^(\d+(?:\.\d+)?)\s*([bkmg]?)b?$", re.IGNORECASE)
_MEMORY_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


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
    service: str  # python -m services.<service>
    script: str  # k6 script, relative to the repository root
    protocol: str  # http1.1 | http2 | grpc
    tls: bool
    expect_proto: str | None  # REST only: the res.proto k6 and the verifier must see
    env: tuple[tuple[str, str], ...] = ()

    @property
    def is_grpc(self) -> bool:
        return self.protocol == "grpc"


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

    @property
    def group(self) -> str:
        """The scenario id without the repeat: repeats of one group are aggregated."""
        return f"{self.target.name}.{self.profile.name}.c{self.count}.{self.load_model.name}"

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


@dataclass(frozen=True)
class Overrides:
    """Command-line choices; None leaves the preset's value."""

    targets: tuple[str, ...] | None = None
    profiles: tuple[str, ...] | None = None
    counts: tuple[int, ...] | None = None
    load_models: tuple[str, ...] | None = None
    vus: int | None = None
    rate: int | None = None
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


def parse_duration(value: object, where: str) -> float:
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
    raise MatrixError(f"{where}: {value!r} is not a duration (e.g. '500ms', '30s', '1m30s')")


def format_duration(seconds: float) -> str:
    """A k6 duration string for seconds; whole seconds stay readable ("30s")."""
    if seconds == int(seconds):
        return f"{int(seconds)}s"
    return f"{round(seconds * 1000)}ms"


def parse_memory(value: object, where: str) -> int:
    """Bytes from a docker-style size ("512m", "2g") or a number of bytes."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, str):
        match = _MEMORY.match(value.strip())
        if match:
            size = int(float(match[1]) * _MEMORY_UNITS[match[2].lower()])
            if size > 0:
                return size
    raise MatrixError(f"{where}: {value!r} is not a memory size (e.g. '512m', '2g')")


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
    _check_keys(data, {"defaults", "profiles", "targets", "load_models", "presets"}, str(path))
    profiles = {n: _profile(n, t) for n, t in _tables(data, "profiles").items()}
    targets = {n: _target(n, t) for n, t in _tables(data, "targets").items()}
    load_models = {n: _load_model(n, t) for n, t in _tables(data, "load_models").items()}
    for kind, table in (("profiles", profiles), ("targets", targets), ("load_models", load_models)):
        if not table:
            raise MatrixError(f"{path}: [{kind}] must define at least one entry")
    defaults = dict(_table(data, "defaults", "[defaults]"))
    default_preset = defaults.pop("preset", "default")
    _check_selection(defaults, "[defaults]")
    presets = _tables(data, "presets")
    for name, preset in presets.items():
        _check_selection(preset, f"[presets.{name}]")
    if default_preset not in presets:
        raise MatrixError(f"[defaults] preset = {default_preset!r} is not a [presets.*] table")
    matrix = Matrix(path, profiles, targets, load_models, defaults, presets, default_preset)
    for name in presets:
        for backend in BACKENDS:
            _selection(matrix, name, backend, Overrides())  # every preset must expand
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
    sel = _selection(matrix, name, backend, overrides)
    scenarios = tuple(
        Scenario(
            target=matrix.targets[target],
            profile=matrix.profiles[profile],
            count=count,
            load_model=model,
            duration_s=sel["duration_s"],
            warmup_s=sel["warmup_s"],
            repeat=repeat,
            repeats=sel["repeats"],
        )
        for repeat in range(1, sel["repeats"] + 1)
        for profile in sel["profiles"]
        for count in sel["counts"]
        for model in sel["load_models"]
        for target in sel["targets"]
    )
    return Plan(
        matrix_path=matrix.path,
        preset=name,
        backend=backend,
        scenarios=scenarios,
        start_timeout_s=sel["start_timeout_s"],
        stop_timeout_s=sel["stop_timeout_s"],
    )


def split_list(values: Sequence[str] | None) -> tuple[str, ...] | None:
    """Flatten repeatable, comma-separated command-line values ("a,b" "c" -> a, b, c)."""
    if not values:
        return None
    return tuple(item.strip() for value in values for item in value.split(",") if item.strip())


def _selection(matrix: Matrix, preset: str, backend: str, overrides: Overrides) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    preset_table = matrix.presets[preset]
    for layer in (matrix.defaults, matrix.defaults.get(backend, {}), preset_table):
        merged.update({k: v for k, v in layer.items() if k not in BACKENDS})
    merged.update(preset_table.get(backend, {}))
    where = f"preset {preset!r} ({backend} backend)"
    for key in SELECTION_KEYS:
        if key not in merged:
            raise MatrixError(f"{where}: {key!r} is not set in [defaults] or the preset")
    cli = {f.name: getattr(overrides, f.name) for f in fields(overrides)}
    merged.update({k: v for k, v in cli.items() if v is not None and k in SELECTION_KEYS})
    models = [
        _with_overrides(matrix.load_models[n], overrides)
        for n in _names(merged["load_models"], matrix.load_models, "load model", where)
    ]
    return {
        "targets": _names(merged["targets"], matrix.targets, "target", where),
        "profiles": _names(merged["profiles"], matrix.profiles, "profile", where),
        "counts": _counts(merged["counts"], where),
        "load_models": models,
        "duration_s": _positive_duration(merged["duration"], f"{where}: duration"),
        "warmup_s": parse_duration(merged["warmup"], f"{where}: warmup"),
        "repeats": _positive_int(merged["repeats"], f"{where}: repeats"),
        "start_timeout_s": _positive_duration(merged["start_timeout"], f"{where}: start_timeout"),
        "stop_timeout_s": _positive_duration(merged["stop_timeout"], f"{where}: stop_timeout"),
    }


def _with_overrides(model: LoadModel, overrides: Overrides) -> LoadModel:
    """--vus sets the VUs of constant-vus models, --rate the rate of arrival-rate models."""
    if overrides.vus is not None and model.executor == "constant-vus":
        model = replace(model, vus=_positive_int(overrides.vus, "--vus"))
    if overrides.rate is not None and model.executor == "constant-arrival-rate":
        model = replace(model, rate=_positive_int(overrides.rate, "--rate"))
    return model


def _names(value: object, known: Mapping[str, Any], kind: str, where: str) -> list[str]:
    """Resolve names and globs in file order of `known`; unknown names are errors."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list | tuple) or not value or not all(isinstance(v, str) for v in value):
        raise MatrixError(f"{where}: {kind}s must be a non-empty list of names")
    chosen: set[str] = set()
    for pattern in value:
        matches = fnmatch.filter(known, pattern)
        if not matches:
            raise MatrixError(f"{where}: unknown {kind} {pattern!r} (known: {', '.join(known)})")
        chosen.update(matches)
    return [name for name in known if name in chosen]


def _counts(value: object, where: str) -> list[int]:
    if not isinstance(value, list | tuple) or not value:
        raise MatrixError(f"{where}: counts must be a non-empty list of integers")
    return sorted({_positive_int(v, f"{where}: counts") for v in value})


def _positive_int(value: object, where: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    raise MatrixError(f"{where}: {value!r} must be a positive integer")


def _positive_duration(value: object, where: str) -> float:
    seconds = parse_duration(value, where)
    if seconds <= 0:
        raise MatrixError(f"{where}: must be longer than zero")
    return seconds


def _check_selection(table: Mapping[str, Any], where: str) -> None:
    _check_keys(table, set(SELECTION_KEYS) | set(BACKENDS), where)
    for backend in BACKENDS:
        if backend in table:
            sub = _table(table, backend, f"{where[:-1]}.{backend}]")
            _check_keys(sub, set(SELECTION_KEYS), f"{where[:-1]}.{backend}]")


def _profile(name: str, table: Mapping[str, Any]) -> Profile:
    where = f"[profiles.{name}]"
    _check_name(name, where)
    _check_keys(table, {"cpus", "memory"}, where, required={"cpus", "memory"})
    cpus = table["cpus"]
    if isinstance(cpus, bool) or not isinstance(cpus, int | float) or cpus <= 0:
        raise MatrixError(f"{where} cpus: {cpus!r} must be a positive number")
    return Profile(name, float(cpus), parse_memory(table["memory"], f"{where} memory"))


def _target(name: str, table: Mapping[str, Any]) -> Target:
    where = f"[targets.{name}]"
    _check_name(name, where)
    required = {"service", "script", "protocol", "tls"}
    _check_keys(table, required | {"expect_proto", "env"}, where, required=required)
    service, script, protocol, tls = (table[k] for k in ("service", "script", "protocol", "tls"))
    if not isinstance(service, str) or not service.isidentifier():
        raise MatrixError(f"{where} service: {service!r} must be a services/ package name")
    if not isinstance(script, str) or not script.endswith(".js"):
        raise MatrixError(f"{where} script: {script!r} must be a k6 .js path")
    if protocol not in PROTOCOLS:
        raise MatrixError(f"{where} protocol: {protocol!r} must be one of {', '.join(PROTOCOLS)}")
    if not isinstance(tls, bool):
        raise MatrixError(f"{where} tls: {tls!r} must be true or false")
    if protocol == "http2" and not tls:
        raise MatrixError(f"{where}: http2 needs tls = true (k6 negotiates HTTP/2 only via ALPN)")
    expect = table.get("expect_proto")
    if protocol == "grpc" and expect is not None:
        raise MatrixError(f"{where} expect_proto: only REST targets have one")
    if protocol != "grpc" and expect != REST_PROTO[protocol]:
        raise MatrixError(f"{where} expect_proto: {expect!r} must be {REST_PROTO[protocol]!r} for {protocol}")
    env = table.get("env", {})
    if not isinstance(env, Mapping) or not all(isinstance(v, str) for v in env.values()):
        raise MatrixError(f"{where} env: must be a table of strings")
    return Target(name, service, script, protocol, tls, expect, tuple(sorted(env.items())))


def _load_model(name: str, table: Mapping[str, Any]) -> LoadModel:
    where = f"[load_models.{name}]"
    _check_name(name, where)
    executor = table.get("executor")
    needed = {
        "constant-vus": {"vus"},
        "ramping-vus": {"stages"},
        "constant-arrival-rate": {"rate", "pre_allocated_vus", "max_vus"},
        "shared-iterations": {"vus", "iterations"},
    }
    if executor not in needed:
        raise MatrixError(f"{where} executor: {executor!r} must be one of {', '.join(EXECUTORS)}")
    optional = {"search"} if executor == "constant-arrival-rate" else set()
    _check_keys(table, {"executor"} | needed[executor] | optional, where, required=needed[executor])
    ints = {
        k: _positive_int(table[k], f"{where} {k}")
        for k in ("vus", "rate", "pre_allocated_vus", "max_vus", "iterations")
        if k in table
    }
    if ints.get("max_vus", 0) < ints.get("pre_allocated_vus", 0):
        raise MatrixError(f"{where}: max_vus must be >= pre_allocated_vus")
    stages = tuple(_stage(s, f"{where} stages[{i}]") for i, s in enumerate(table.get("stages", [])))
    if executor == "ramping-vus" and not stages:
        raise MatrixError(f"{where} stages: must list at least one stage")
    search = _search(table["search"], f"{where} search") if "search" in table else None
    return LoadModel(name, executor, stages=stages, search=search, **ints)


def _search(value: object, where: str) -> CapacitySearch:
    keys = {"slo_p99", "max_error_rate", "max_steps", "growth"}
    if not isinstance(value, Mapping):
        raise MatrixError(f"{where}: must be a table {{ {', '.join(sorted(keys))} }}")
    _check_keys(value, keys, where, required=keys)
    error_rate, growth = value["max_error_rate"], value["growth"]
    if isinstance(error_rate, bool) or not isinstance(error_rate, int | float) or not 0 <= error_rate < 1:
        raise MatrixError(f"{where} max_error_rate: {error_rate!r} must be a fraction in [0, 1)")
    if isinstance(growth, bool) or not isinstance(growth, int | float) or growth <= 1:
        raise MatrixError(f"{where} growth: {growth!r} must be a number above 1")
    return CapacitySearch(
        slo_p99_ms=_positive_duration(value["slo_p99"], f"{where} slo_p99") * 1000,
        max_error_rate=float(error_rate),
        max_steps=_positive_int(value["max_steps"], f"{where} max_steps"),
        growth=float(growth),
    )


def _stage(value: object, where: str) -> Stage:
    if not isinstance(value, Mapping):
        raise MatrixError(f"{where}: must be a table {{ duration = '5s', target = 10 }}")
    _check_keys(value, {"duration", "target"}, where, required={"duration", "target"})
    target = value["target"]
    if isinstance(target, bool) or not isinstance(target, int) or target < 0:
        raise MatrixError(f"{where} target: {target!r} must be an integer >= 0")
    return Stage(_positive_duration(value["duration"], f"{where} duration"), target)


def _tables(data: Mapping[str, Any], key: str) -> dict[str, Mapping[str, Any]]:
    section = _table(data, key, f"[{key}]")
    return {name: _table(section, name, f"[{key}.{name}]") for name in section}


def _table(data: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, Mapping):
        raise MatrixError(f"{where} must be a table")
    return value


def _check_name(name: str, where: str) -> None:
    # Names end up in file names, cgroup directories and metric labels.
    if not _NAME.match(name):
        raise MatrixError(f"{where}: name must be letters, digits, '-' or '_'")


def _check_keys(
    table: Mapping[str, Any], known: set[str], where: str, required: Collection[str] = ()
) -> None:
    unknown = sorted(set(table) - known)
    if unknown:
        raise MatrixError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")
    missing = sorted(set(required) - set(table))
    if missing:
        raise MatrixError(f"{where}: missing key {missing[0]!r}")
