"""Load matrix.toml and expand a preset plus command-line overrides into a plan of scenarios."""

import fnmatch
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from labrunner.model.engine_roles import HostsError, hosts
from labrunner.model.scenario import (
    BACKENDS,
    COMPRESSING_SERVICES,
    DEFAULT_DIRECTION,
    DEFAULT_SHAPE,
    DEFAULT_STREAMS,
    IDENTITY,
    LOOPBACK,
    MULTIPLEXED_PROTOCOLS,
    UPLOAD,
    Churn,
    LoadModel,
    Matrix,
    Overrides,
    Plan,
    Scenario,
    Target,
    churn_name,
)
from labrunner.model.schema import (
    SELECTION_KEYS,
    MatrixError,
    Settings,
    load_models_of,
    validate_matrix_file,
    validate_positive_int,
    validate_settings,
)
from labrunner.model.terms import DRIVER_LOAD_MODELS

_NO_OVERRIDES = Overrides()  # the preset as written


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
    spec = validate_matrix_file(data, path)
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
        load_models=load_models_of(spec, path),
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
    matrix: Matrix, backend: str, preset: str | None = None, overrides: Overrides = _NO_OVERRIDES
) -> Plan:
    """The scenarios of a preset for a backend, with command-line overrides applied, in rounds.

    A round is one repeat of every scenario of a kind: repeats are the outermost loop, so slow drift
    of the machine (thermal, background load) spreads over every target instead of biasing the ones
    measured last. Every other round comes before the first round of ladder rungs, which run only
    where the closed model's results of the same run allow (labrunner.results.ladder).
    """
    if backend not in BACKENDS:
        raise MatrixError(f"unknown backend {backend!r} (known: {', '.join(BACKENDS)})")
    name = preset or matrix.default_preset
    if name not in matrix.presets:
        raise MatrixError(f"unknown preset {name!r} (known: {', '.join(matrix.presets)})")
    where = f"preset {name!r} ({backend} backend)"
    settings = _settings(matrix, name, backend, overrides, where)
    models = [
        _with_overrides(model, overrides) for model in _load_models(settings.load_models, matrix, where)
    ]
    if settings.measure == "caller" and settings.shapes != [DEFAULT_SHAPE]:
        # The Python callers (labrunner.callers, benchmarks.callers) call and decode cars only.
        raise MatrixError(f"{where}: the callers call cars only, not shapes {', '.join(settings.shapes)}")
    targets = _names(settings.targets, matrix.targets, "target", where)
    profiles = _names(settings.profiles, matrix.profiles, "profile", where)
    networks = _names(settings.networks, matrix.networks, "network", where)
    streams = sorted(set(settings.streams))
    notes = _streams_notes(streams, models, [matrix.targets[t] for t in targets], settings.measure, where)
    churns = sorted(set(settings.churn), key=lambda churn: (churn is not None, churn or 0))  # never first
    notes += _churn_notes(churns, streams, settings.measure, where)
    compressions = list(dict.fromkeys(settings.compressions))
    notes += _compression_notes(compressions, [matrix.targets[t] for t in targets], settings, where)
    notes += _driver_notes([matrix.targets[t] for t in targets], models, settings, where)
    scenarios = tuple(
        Scenario(
            target=matrix.targets[target],
            profile=matrix.profiles[profile],
            count=count,
            load_model=model,
            duration_s=settings.duration,
            warmup_s=settings.warmup,
            repeat=repeat,
            repeats=_repeats(model, settings.repeats),
            response_model=response_model,
            network=matrix.networks[network],
            direction=direction,
            shape=shape,
            k6_instances=settings.k6_instances,
            streams=stream_count,
            churn=churn,
            compression=compression,
        )
        for rungs in (False, True)
        for repeat in range(1, settings.repeats + 1)
        for network in networks
        for profile in profiles
        for count in sorted(set(settings.counts))
        for model in models
        if (model.rung is not None) == rungs
        for response_model in dict.fromkeys(settings.response_models)
        for direction in dict.fromkeys(settings.directions)
        # What a server sends is all a response model shapes: uploads run under the first model.
        if direction == DEFAULT_DIRECTION or response_model == settings.response_models[0]
        for shape in dict.fromkeys(settings.shapes)
        for stream_count in streams
        for churn in churns
        # Churn counts calls one at a time: a multiplexed connection runs never replaced.
        if churn is None or stream_count == DEFAULT_STREAMS
        for compression in compressions
        # k6 compresses no request: a compressed scenario is a download.
        if compression == IDENTITY or direction == DEFAULT_DIRECTION
        for target in targets
        # A target pinned to one model runs only in that model.
        if matrix.targets[target].response_model in (None, response_model)
        and repeat <= _repeats(model, settings.repeats)
        # A rung runs on the targets of its ladder's k6 scripts only.
        and (model.rung is None or matrix.targets[target].script in model.rung.scripts)
        and _multiplexes(stream_count, model, matrix.targets[target])
        and _drives(
            matrix.targets[target],
            model,
            direction=direction,
            streams=stream_count,
            churn=churn,
            compression=compression,
        )
    )
    return Plan(
        matrix_path=matrix.path,
        preset=name,
        backend=backend,
        scenarios=scenarios,
        start_timeout_s=settings.start_timeout,
        stop_timeout_s=settings.stop_timeout,
        measure=settings.measure,
        notes=notes,
        duet_questions=tuple(settings.duet_questions),
        control=_control(settings.control, matrix.targets, where),
        precision=None if settings.precision is None else settings.precision / 100,
        budget_s=settings.budget,
        speed_reference=settings.speed_reference,
    )


def _control(name: str | None, targets: Mapping[str, Target], where: str) -> str | None:
    """The A/A control's target, which must be one of the matrix's (a run that does not duet it takes
    its first dueted target: model.duet)."""
    if name is not None and name not in targets:
        raise MatrixError(f"{where}: control {name!r} is not a target (known: {', '.join(targets)})")
    return name


def _multiplexes(streams: int, model: LoadModel, target: Target) -> bool:
    """Whether the target runs at `streams` under the model: 1 always; more only on a protocol that
    multiplexes, under a closed model with at least one connection's worth of VUs."""
    if streams == DEFAULT_STREAMS:
        return True
    closed = model.executor == "constant-vus" and streams <= (model.vus or 0)
    return closed and target.protocol in MULTIPLEXED_PROTOCOLS


def _drives(
    target: Target, model: LoadModel, *, direction: str, streams: int, churn: Churn, compression: str
) -> bool:
    """Whether the target runs the combination: a k6 target every one; the Python driver's downloads
    only, one request at a time, uncompressed, under a constant load model (churning a closed one's)."""
    if not target.python_driven:
        return True
    plain = (direction, streams, compression) == (DEFAULT_DIRECTION, DEFAULT_STREAMS, IDENTITY)
    # It churns a closed model's VUs (labrunner.run.drive.load), not an open model's pool.
    churns = churn is None or model.executor == "constant-vus"
    return plain and churns and model.executor in DRIVER_LOAD_MODELS


def _driver_notes(
    targets: list[Target], models: list[LoadModel], settings: Settings, where: str
) -> tuple[str, ...]:
    """What the plan leaves out of the Python driver's targets, said once; a MatrixError for callers."""
    driven = [t.name for t in targets if t.python_driven]
    if not driven:
        return ()
    if settings.measure == "caller":
        raise MatrixError(
            f"{where}: {', '.join(driven)} are driven by the Python driver, which the callers are not"
        )
    left_out = [
        *(f"direction {d}" for d in settings.directions if d != DEFAULT_DIRECTION),
        *(f"streams {n}" for n in settings.streams if n != DEFAULT_STREAMS),
        *(
            f"churn {churn_name(c)} under load model {m.name}"
            for c in settings.churn
            if c is not None
            for m in models
            if m.executor != "constant-vus"
        ),
        *(f"compression {c}" for c in settings.compressions if c != IDENTITY),
        *(f"load model {m.name}" for m in models if m.executor not in DRIVER_LOAD_MODELS),
    ]
    if not left_out:
        return ()
    kept = "run uncompressed downloads, one request at a time, churning closed models only"
    return (f"the Python driver's targets ({', '.join(driven)}) {kept}: not {', '.join(left_out)}",)


def _streams_notes(
    streams: list[int], models: list[LoadModel], targets: list[Target], measure: str, where: str
) -> tuple[str, ...]:
    """What the plan leaves out of `streams`, said once when the run starts; a MatrixError when streams
    would split a closed model's VUs unevenly, or when nothing of them can run at all."""
    multiplexed = [n for n in streams if n != DEFAULT_STREAMS]
    if not multiplexed:
        return ()
    if measure == "caller":
        raise MatrixError(f"{where}: streams {multiplexed}: the callers hold one call per connection")
    closed = {m.name: m.vus for m in models if m.executor == "constant-vus" and m.vus}  # name: VUs
    for name, vus in closed.items():
        for n in multiplexed:
            if n <= vus and vus % n:
                raise MatrixError(
                    f"{where}: streams {n} does not divide the {vus} VUs of load model {name!r} "
                    "(its connections are VUs / streams)"
                )
    able = [t for t in targets if t.protocol in MULTIPLEXED_PROTOCOLS]
    if not able or not closed:
        why = "HTTP/1.1 cannot multiplex" if not able else "streams need a closed (constant-vus) load model"
        raise MatrixError(f"{where}: streams {multiplexed}: {why}; nothing here runs them")
    notes = []
    if unable := [t.name for t in targets if t not in able]:
        notes.append(
            f"HTTP/1.1 cannot multiplex: {', '.join(unable)} run at 1 stream per connection only "
            "(their comparable is as many connections)"
        )
    if others := [m.name for m in models if m.name not in closed]:
        notes.append(f"streams above 1 run under closed load models only, not {', '.join(others)}")
    for name, vus in closed.items():
        if too_many := [n for n in multiplexed if n > vus]:
            notes.append(f"{name} has {vus} VUs: not run at {', '.join(map(str, too_many))} streams")
    return tuple(notes)


def _churn_notes(churns: list[Churn], streams: list[int], measure: str, where: str) -> tuple[str, ...]:
    """What the plan leaves out of `churns`, said once; a MatrixError for callers, which hold their
    connections."""
    churning = [churn_name(c) for c in churns if c is not None]
    if not churning:
        return ()
    if measure == "caller":
        raise MatrixError(f"{where}: churn {', '.join(churning)}: the callers keep their connections")
    if any(n != DEFAULT_STREAMS for n in streams):
        return (f"churn {', '.join(churning)} runs at 1 stream per connection only (one call at a time)",)
    return ()


def _compression_notes(
    compressions: list[str], targets: list[Target], settings: Settings, where: str
) -> tuple[str, ...]:
    """What the plan leaves out of `compressions`, said once; a MatrixError for a target whose server
    cannot compress, and for callers."""
    compressed = [c for c in compressions if c != IDENTITY]
    if not compressed:
        return ()
    if settings.measure == "caller":
        raise MatrixError(f"{where}: compression {', '.join(compressed)}: the callers measure identity only")
    # A floor server (its own module) is the bare server: it compresses nothing.
    unable = [t.name for t in targets if t.service not in COMPRESSING_SERVICES or t.module is not None]
    if unable:
        raise MatrixError(
            f"{where}: compression {', '.join(compressed)}: {', '.join(unable)} cannot compress its "
            f"responses (those that can: {', '.join(COMPRESSING_SERVICES)})"
        )
    if UPLOAD in settings.directions:
        return (f"compression {', '.join(compressed)} runs downloads only (k6 compresses no request)",)
    return ()


def _repeats(model: LoadModel, preset_repeats: int) -> int:
    """A load model's own repeats (a shorter follow-up), never more than the preset's."""
    return min(model.repeats or preset_repeats, preset_repeats)


def split_list(values: Sequence[str] | None) -> tuple[str, ...] | None:
    """Flatten repeatable, comma-separated command-line values ("a,b" "c" -> a, b, c)."""
    if not values:
        return None
    return tuple(item.strip() for value in values for item in value.split(",") if item.strip())


def _settings(matrix: Matrix, preset: str, backend: str, overrides: Overrides, where: str) -> Settings:
    """[defaults], [defaults.<backend>], the preset, its backend table, then the command line."""
    merged: dict[str, object] = {}
    preset_table = matrix.presets[preset]
    for layer in (matrix.defaults, matrix.defaults.get(backend, {}), preset_table):
        merged.update({k: v for k, v in layer.items() if k not in BACKENDS})
    merged.update(preset_table.get(backend, {}))
    for key in SELECTION_KEYS:
        if key not in merged and Settings.model_fields[key].is_required():
            raise MatrixError(f"{where}: {key!r} is not set in [defaults] or the preset")
    cli = {f.name: getattr(overrides, f.name) for f in fields(overrides)}
    merged.update({k: v for k, v in cli.items() if v is not None and k in SELECTION_KEYS})
    return validate_settings(merged, where)


def _with_overrides(model: LoadModel, overrides: Overrides) -> LoadModel:
    """--vus sets the VUs of constant-vus models, --rate the rate of arrival-rate models but a ladder's
    rungs (each rung is its rate)."""
    if overrides.vus is not None and model.executor == "constant-vus":
        model = replace(model, vus=validate_positive_int(overrides.vus, "--vus"))
    if overrides.rate is not None and model.executor == "constant-arrival-rate" and model.rung is None:
        model = replace(model, rate=validate_positive_int(overrides.rate, "--rate"))
    return model


def _load_models(patterns: list[str], matrix: Matrix, where: str) -> list[LoadModel]:
    """Load models by name or glob, in file order; a ladder's name selects every one of its rungs."""
    selectable: dict[str, list[LoadModel]] = {}
    for model in matrix.load_models.values():
        if model.rung is not None:
            selectable.setdefault(model.rung.ladder, []).append(model)
        selectable[model.name] = [model]
    chosen = {m.name for n in _names(patterns, selectable, "load model", where) for m in selectable[n]}
    return [model for model in matrix.load_models.values() if model.name in chosen]


def _names(patterns: list[str], known: Mapping[str, object], kind: str, where: str) -> list[str]:
    """Resolve names and globs in file order of `known`; unknown names are errors."""
    chosen: set[str] = set()
    for pattern in patterns:
        matches = fnmatch.filter(known, pattern)
        if not matches:
            raise MatrixError(f"{where}: unknown {kind} {pattern!r} (known: {', '.join(known)})")
        chosen.update(matches)
    return [name for name in known if name in chosen]
