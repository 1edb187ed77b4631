"""The run_matrix.py command line: parse options, expand the matrix, then list, plan or run it."""

import argparse
import contextlib
import re
import secrets
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from labrunner import backends, certs, interrupts
from labrunner.backends.base import Backend, BackendSettings, BackendUnavailable
from labrunner.cli import live
from labrunner.cli.listing import describe_matrix, describe_plan
from labrunner.cli.options import build_parser
from labrunner.cli.session_config import SessionConfig
from labrunner.model import duet
from labrunner.model.duet import DuetError
from labrunner.model.engine_roles import Hosts, HostsError, hosts
from labrunner.model.matrix import expand, load_matrix, split_list
from labrunner.model.scenario import AUTO_INSTANCES, CALLER, NEVER, USER_SHAPE, Matrix, Overrides, Plan
from labrunner.model.schema import MatrixError
from labrunner.observe import local_stack
from labrunner.paths import REPO
from labrunner.results import methodology, provenance
from labrunner.results.store import (
    MANIFEST_FILE,
    ManifestError,
    checked_manifest,
    load_results,
    read_manifest,
)
from labrunner.run.k6.binary import K6NotFound, find_k6
from labrunner.run.runner import RunConfig
from labrunner.run.uploads import max_request_bytes_of, pool_of
from labrunner.run.user_proto import SHAPE_DIR_NAME, largest_body, prepare
from services.common.user_message import Generator, UserMessageError

RESULTS_DIR = REPO / "results"
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class _Usage(Exception):
    """A command-line or setup problem, reported without a traceback."""


def main(argv: Sequence[str] | None = None, prog: str = "run_matrix.py") -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    try:
        matrix = load_matrix(args.matrix)
        if args.list:
            print(describe_matrix(matrix))
            return EXIT_OK
        roles = _hosts(args, matrix)
        backend_name, reason = backends.choose(args.backend, roles)
        plan = duet.plan_duets(expand(matrix, backend_name, args.preset, _overrides(args)), args.duet)
        if not plan.scenarios:
            raise _Usage("the selection has no scenarios")
        if plan.measure == CALLER:
            return _callers(args, matrix, argv)
        if args.dry_run:
            with tempfile.TemporaryDirectory() as directory:
                _user_message(args, plan, Path(directory))
            print(_backend_line(backend_name, reason))
            print(*plan.notes, sep="\n", end="\n" if plan.notes else "")
            print(describe_plan(seed_plan(plan, args.seed)[0]))
            return EXIT_OK
        return _run(args, plan, roles=roles, backend_name=backend_name, reason=reason, argv=argv)
    except (
        MatrixError,
        HostsError,
        K6NotFound,
        BackendUnavailable,
        DuetError,
        UserMessageError,
        _Usage,
    ) as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _run(
    args: argparse.Namespace,
    plan: Plan,
    *,
    roles: Hosts,
    backend_name: str,
    reason: str,
    argv: Sequence[str] | None,
) -> int:
    run_id, out_dir = _run_location(args)
    _check_out_dir(out_dir, args.resume)
    plan, seed_origin = seed_plan(plan, args.seed, out_dir if args.resume else None)
    if args.resume and (measured_by := read_manifest(out_dir).get("methodology", 1)) != methodology.VERSION:
        raise _Usage(
            f"{out_dir} was measured by methodology v{measured_by}, this release measures v"
            f"{methodology.VERSION}: one run holds one method; start a new run (CHANGELOG.md)"
        )
    k6_binary = find_k6(args.k6)
    _preflight(plan)
    _user_message(args, plan, out_dir / SHAPE_DIR_NAME)
    if any(s.target.tls for s in plan.scenarios) and certs.ensure_certs(args.certs):
        print(f"generated TLS material in {args.certs}")
    targets_dir = Path(args.prometheus_targets) if args.prometheus_targets else None
    settings = _backend_settings(args, plan, run_id=run_id, out_dir=out_dir, k6_binary=k6_binary, roles=roles)
    # Imported only for a run: the session's summaries and report load scipy and matplotlib,
    # which --dry-run and --list do without.
    from labrunner.cli import run_end, session  # noqa: PLC0415

    try:
        # From the backend's opening on, a Ctrl-C ends the run and cannot cut its cleanup short.
        with interrupts.first_one_ends_the_run():
            cleanup = contextlib.ExitStack()  # what this run opened: the backend, local observability
            try:
                backend = _open_backend(backend_name, settings, plan)
                cleanup.callback(backend.close)  # run_plan closes it; this is for a Ctrl-C before
                obs = local_stack.for_run(
                    args.influxdb, args.prometheus, backend_name, targets_dir, cleanup=cleanup, say=_say
                )
                config = _session_config(
                    args, argv, plan, run_id=run_id, out_dir=out_dir, targets_dir=targets_dir, obs=obs,
                    reason=reason, k6_binary=k6_binary,
                )  # fmt: skip
                print(_backend_line(backend_name, reason))
                print(f"run {run_id}: {len(plan.scenarios)} scenarios, out {out_dir}")
                print(f"order: each round shuffled by seed {plan.seed} ({seed_origin})")
                print(*plan.notes, sep="\n", end="\n" if plan.notes else "")
                ok = session.run_plan(plan, config, backend, settings, say=_say)
            finally:
                with interrupts.held():
                    cleanup.close()
    except KeyboardInterrupt:
        print(f"\ninterrupted; finish with: --resume --run-id {run_id}", file=sys.stderr)
        if (out_dir / MANIFEST_FILE).exists():  # else nothing was run to report
            with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C skips the partial report
                run_end.finish(out_dir, benchmark=False, say=_say)
        return EXIT_INTERRUPTED
    shapes = tuple(dict.fromkeys(s.shape for s in plan.scenarios))  # each shape's benchmark, in plan order
    # A churn over TLS measured full handshakes only (k6 never resumes): the handshake benchmark measures
    # full against resumed on the servers of those targets whose handshakes are counted.
    tls_churned = tuple(dict.fromkeys(s.target.service for s in plan.scenarios if s.churn and s.target.tls))
    run_end.finish(out_dir, benchmark=True, say=_say, shapes=shapes, handshake_services=tls_churned)
    return EXIT_OK if ok else EXIT_FAILED


def _session_config(
    args: argparse.Namespace,
    argv: Sequence[str] | None,
    plan: Plan,
    *,
    run_id: str,
    out_dir: Path,
    targets_dir: Path | None,
    obs: local_stack.Endpoints,
    reason: str,
    k6_binary: Path,
) -> SessionConfig:
    """The run-wide choices the session reads, with the run's provenance; --precision and --budget
    when given, else the preset's."""

    return SessionConfig(
        run=RunConfig(
            run_id=run_id,
            out_dir=out_dir,
            targets_dir=targets_dir,
            influxdb_url=obs.influxdb_url,
            prometheus_url=obs.prometheus_url,
            lab_pids=obs.lab_pids,
            watch=live.watch_for(sys.stdout),
        ),
        resume=args.resume,
        argv=tuple(sys.argv if argv is None else ["run_matrix.py", *argv]),
        backend_reason=reason,
        provenance=provenance.collect(REPO, k6_binary),
        precision=plan.precision if args.precision is None else args.precision,
        budget_s=plan.budget_s if args.budget is None else args.budget,
        calibration_rounds=args.calibration_rounds,
        calibration_attempts=args.calibration_attempts,
    )


def _callers(args: argparse.Namespace, matrix: Matrix, argv: Sequence[str] | None) -> int:
    """A preset that measures Python callers (docs/caller.md): on the local backend only, not resumed."""
    if args.backend == "docker":
        raise _Usage(
            f"preset {args.preset!r} measures Python callers on the local backend only: --backend local"
        )
    from labrunner.cli import callers  # noqa: PLC0415  a caller run's modules, only for one

    plan, _ = seed_plan(expand(matrix, "local", args.preset, _overrides(args)), args.seed)
    assert plan.seed is not None
    if args.dry_run:
        print("backend: local (a caller preset runs there)")
        print(callers.describe(plan, plan.seed))
        return EXIT_OK
    if args.resume:
        raise _Usage("a caller run is not resumed: run it again under a new --run-id")
    run_id, out_dir = _run_location(args)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise _Usage(f"{out_dir} already holds a run; choose another --run-id")
    return callers.run_callers(
        plan,
        run_id=run_id,
        out_dir=out_dir,
        certs_dir=args.certs,
        k6_binary=find_k6(args.k6),
        argv=tuple(sys.argv if argv is None else ["run_matrix.py", *argv]),
        say=_say,
    )


def _backend_settings(
    args: argparse.Namespace, plan: Plan, *, run_id: str, out_dir: Path, k6_binary: Path, roles: Hosts
) -> BackendSettings:
    return BackendSettings(
        run_id=run_id,
        root=REPO,
        certs_dir=args.certs.resolve(),
        logs_dir=out_dir / "logs",
        k6_binary=k6_binary,
        start_timeout_s=plan.start_timeout_s,
        stop_timeout_s=plan.stop_timeout_s,
        hosts=roles,
    )


def _open_backend(name: str, settings: BackendSettings, plan: Plan) -> Backend:
    """The run's backend, once it can hold the plan's k6 instances (else closed, and the error raised)."""
    backend = backends.create(name, settings)
    try:
        _check_k6_instances(plan, backend)
    except BaseException:
        backend.close()
        raise
    return backend


def seed_plan(plan: Plan, seed: int | None, resumed_run: Path | None = None) -> tuple[Plan, str]:
    """The plan with the seed of its order (--seed, else a fresh one), and where the seed came from.
    A resumed run keeps the seed in its manifest, so what is left runs in the order first planned."""
    manifest = read_manifest(resumed_run) if resumed_run is not None else {}
    if "seed" in manifest.get("matrix", {}):
        planned = manifest["matrix"]["seed"]
        if seed is not None and seed != planned:
            raise _Usage(f"--seed {seed}: the run to resume was planned with seed {planned}; leave it out")
        return replace(plan, seed=planned), "the run's, from its manifest"
    if seed is not None:
        return replace(plan, seed=seed), "--seed"
    fresh = secrets.randbelow(1_000_000)
    return replace(plan, seed=fresh), f"a fresh one: --seed {fresh} repeats the order"


def _backend_line(name: str, reason: str) -> str:
    """`backend: local (auto): no Docker engine answered at ...`, or `backend: docker (requested)`."""
    how, _, why = reason.partition(": ")
    return f"backend: {name} ({how})" + (f": {why}" if why else "")


def _say(line: str) -> None:
    print(line, flush=True)


def _run_location(args: argparse.Namespace) -> tuple[str, Path]:
    if args.resume and not args.run_id and not args.out:
        run_dir = _latest_unfinished_run()
        return run_dir.name, run_dir
    # A resumed run keeps the id its manifest gives, whatever its directory is called now.
    try:
        resumed_id = checked_manifest(args.out).get("run_id") if args.resume and args.out else None
    except ManifestError as exc:
        raise _Usage(f"{exc}: not a run to resume") from exc
    run_id = (
        args.run_id
        or resumed_id
        or (args.out.name if args.out else datetime.now(UTC).strftime("%Y%m%d-%H%M%S"))
    )
    if not _RUN_ID.match(run_id):
        raise _Usage(f"run id {run_id!r} must be letters, digits, '.', '_' or '-'")
    return run_id, (args.out or RESULTS_DIR / run_id).resolve()


# What a run reads from its directory when they are there before it starts, and does not write over:
# report/build.py's PAYLOAD_FILE and SERIALIZATION_FILE (run_end.finish), named here because importing
# the report loads scipy and matplotlib, which --dry-run and --list do without.
_INPUTS = frozenset({"payload.json", "serialization.json", SHAPE_DIR_NAME})


def _check_out_dir(out_dir: Path, resume: bool) -> None:
    """A run writes into an empty or new directory, or a lab run's own (one whose manifest.json the lab
    wrote): never over another directory's files (its manifest, summaries and report, its charts/*.png).
    A lab run that holds results is only resumed."""
    try:
        manifest = checked_manifest(out_dir)
    except ManifestError as exc:
        raise _Usage(f"{exc}; choose another --out") from exc
    others = [p.name for p in out_dir.iterdir() if p.name not in _INPUTS] if out_dir.is_dir() else []
    if others and not manifest:
        raise _Usage(f"{out_dir} is not empty and holds no lab run (no manifest.json): choose another --out")
    if not resume and load_results(out_dir):
        raise _Usage(f"{out_dir} already holds results; pass --resume or choose another --run-id")


def _latest_unfinished_run() -> Path:
    manifests = sorted(RESULTS_DIR.glob(f"*/{MANIFEST_FILE}"), key=lambda p: p.stat().st_mtime)
    for manifest in reversed(manifests):
        if read_manifest(manifest.parent).get("complete") is False:
            return manifest.parent
    raise _Usage(f"no unfinished run in {RESULTS_DIR} to resume; pass --run-id")


def _preflight(plan: Plan) -> None:
    """Fail before the first scenario, not in the middle of the run."""
    for target in {s.target for s in plan.scenarios}:
        if not (REPO / target.script).is_file():
            raise _Usage(f"target {target.name}: k6 script {target.script} does not exist")
        if target.python_driven and plan.backend != "local":
            raise _Usage(
                f"target {target.name}: the Python driver ({target.script}) runs on the local backend "
                "only (--backend local); the docker backend's load generator is k6's image"
            )
        path = REPO.joinpath(*target.main_module.split("."))
        if not ((path / "__main__.py").is_file() or path.with_suffix(".py").is_file()):
            raise _Usage(f"target {target.name}: module {target.main_module} does not exist in {REPO}")


def _user_message(args: argparse.Namespace, plan: Plan, directory: Path) -> None:
    """--proto and --message: compile the message into directory and make it the shape `proto`, or
    say in one line why the plan cannot serve it, before anything starts."""
    if args.proto is None:
        if any(s.shape == USER_SHAPE for s in plan.scenarios):
            raise _Usage(f"shape {USER_SHAPE} is the message of --proto FILE --message PKG.TYPE: give both")
        return
    floors = sorted(
        {s.target.name for s in plan.scenarios if s.target.main_module.startswith("benchmarks.floor")}
    )
    if floors:
        raise _Usage(f"--proto: the floor servers serve the built-in shapes only, not {', '.join(floors)}")
    user = prepare(
        Path(args.proto),
        args.message,
        Path(args.sample) if args.sample else None,
        directory=directory,
        lab_proto_dir=REPO / "proto",
        generator=Generator(),
    )
    sizes: dict[tuple[int, int, int], tuple[int, int]] = {}
    for scenario in plan.scenarios:
        (size, seed), limit = pool_of(scenario), max_request_bytes_of(scenario)
        key = (scenario.count, size, seed)
        if key not in sizes:
            sizes[key] = largest_body(user, scenario.count, size, seed)
        as_json, as_protobuf = sizes[key]
        if max(as_json, as_protobuf) > limit:
            raise _Usage(
                f"--message {args.message}: {scenario.count} records take up to {as_json} bytes as JSON and "
                f"{as_protobuf} as protobuf, over target {scenario.target.name}'s MAX_REQUEST_BYTES={limit}: "
                "ask for fewer (--count)"
            )


def _overrides(args: argparse.Namespace) -> Overrides:
    parsed_counts, streams = _integers(args.count, "--count"), _integers(args.streams, "--streams")
    return Overrides(
        targets=split_list(args.target),
        profiles=split_list(args.profile),
        counts=parsed_counts,
        load_models=split_list(args.load_model),
        response_models=split_list(args.response_model),
        directions=split_list(args.direction),
        shapes=_shapes(args),
        streams=streams,
        churn=_churns(args.churn),
        compressions=split_list(args.compression),
        networks=split_list(args.network),
        vus=args.vus,
        rate=args.rate,
        k6_instances=_k6_instances(args.k6_instances),
        duration=args.duration,
        warmup=args.warmup,
        repeats=args.repeats,
        control=args.control,
        speed_reference=None if args.speed_reference is None else args.speed_reference == "on",
    )


def _integers(values: list[str] | None, option: str) -> tuple[int, ...] | None:
    """A repeatable, comma-separated integer option (--count, --streams); the schema checks the range."""
    listed = split_list(values)
    try:
        return tuple(int(value) for value in listed) if listed else None
    except ValueError:
        raise _Usage(f"{option} takes integers, got {values}") from None


def _churns(values: list[str] | None) -> tuple[int | str, ...] | None:
    """--churn: calls per connection, or never; the schema checks the range."""
    listed = split_list(values)
    try:
        return tuple(v if v == NEVER else int(v) for v in listed) if listed else None
    except ValueError:
        raise _Usage(f"--churn takes integers or {NEVER!r}, got {values}") from None


def _shapes(args: argparse.Namespace) -> tuple[str, ...] | None:
    """--shape, or proto for --proto (with --message, and alone)."""
    if args.proto is None:
        if args.message or args.sample:
            raise _Usage("--message and --sample go with --proto FILE")
        return split_list(args.shape)
    if not args.message:
        raise _Usage("--proto needs --message PKG.TYPE, the message the records are")
    if args.shape:
        raise _Usage("--proto serves its --message as the records: leave out --shape")
    return (USER_SHAPE,)


def _hosts(args: argparse.Namespace, matrix: Matrix) -> Hosts:
    """matrix.toml's [hosts] with the command line's engine options over it; --backend local
    leaves the table aside (it names Docker engines) and refuses the options."""
    if args.backend == "local":
        if args.service_engine or args.load_engine or args.publish_address:
            raise _Usage(
                "--service-engine, --load-engine and --publish-address name Docker engines: "
                "use them with --backend docker"
            )
        return Hosts()
    chosen = matrix.hosts
    load = split_list(args.load_engine)
    return hosts(
        args.service_engine or chosen.service,
        load or chosen.load,
        args.publish_address or chosen.publish_address,
        "[hosts] or the engine options",
    )


def _k6_instances(value: str | None) -> int | str | None:
    """--k6-instances: "auto" stays a word, digits become a number; the matrix validates both."""
    if value is None or value == AUTO_INSTANCES:
        return value
    try:
        return int(value)
    except ValueError:
        raise _Usage(f"--k6-instances takes an integer >= 1 or 'auto', got {value!r}") from None


def _check_k6_instances(plan: Plan, backend: Backend) -> None:
    """k6 split into more instances than the load side has CPUs (one each) fails before the first
    scenario, against the host or the load engines that run k6."""
    for profile, count in dict.fromkeys((s.profile, s.k6_instances) for s in plan.scenarios):
        backend.check_k6_instances(profile, count)
