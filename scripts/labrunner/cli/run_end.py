"""The end of a run: its last manifest and summaries, what was left stopped, how many scenarios were
ok, its findings on one screen, and after it the payload table, the benchmark and the report."""

import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from labrunner.backends.base import Backend
from labrunner.files import write_json_atomic
from labrunner.model.scenario import DEFAULT_SHAPE
from labrunner.observe import prometheus_sd
from labrunner.report import handshakes, payload, serialization
from labrunner.report.build import PAYLOAD_FILE, SERIALIZATION_FILE, write_report
from labrunner.report.compare import group_results
from labrunner.report.findings import for_run, text
from labrunner.report.summary import write_summaries
from labrunner.results.store import (
    MANIFEST_FILE,
    load_results,
)
from labrunner.run.runner import RunConfig
from labrunner.say import Say


def write_last(out: Path, manifest: dict[str, Any], run_id: str, order: Sequence[str], say: Say) -> None:
    """The session's last manifest, then the summaries; a summary that fails is said, not raised."""
    write_json_atomic(out / MANIFEST_FILE, manifest)
    try:
        write_summaries(out, run_id, order)  # CPU per request in the final calibration's units
    except Exception as exc:  # the results are written; scripts/report.py makes these again
        say(f"summaries not written: {type(exc).__name__}: {exc}")


def say_end(
    out: Path, order: Sequence[str], failed: Sequence[str], not_run: Mapping[str, str], say: Say
) -> None:
    """How many scenarios were ok (of the planned ones and those --precision added), and where."""
    say(
        f"{len(order) - len(failed) - len(not_run)} of {len(order)} scenarios ok"
        + (f"; {len(not_run)} not run (summary.md says why)" if not_run else "")
        + (f"; failed: {', '.join(failed)}" if failed else "")
        + f"\nresults: {out}/summary.md"
    )


def close_backend(backend: Backend, run: RunConfig, say: Say) -> None:
    """Whatever of the run's is left stopped, and its Prometheus targets removed; never raises, so
    the manifest is still written."""
    try:
        backend.close()
    except Exception as exc:  # what it could not stop, it names
        say(f"stopping what was left: {type(exc).__name__}: {exc}")
    if run.targets_dir is not None:
        try:
            prometheus_sd.delete_run(run.targets_dir, run.run_id)
        except OSError as exc:
            say(f"the run's Prometheus target files stay in {run.targets_dir}: {exc}")


def say_findings(out_dir: Path, order: list[str], preset: str, say: Say) -> None:
    """The run's findings on one screen: summary.md's first section, its notes cut to the most
    important when they would not fit (findings.text.plain)."""
    found = for_run(group_results(load_results(out_dir, order)), preset)
    for line in text.plain(found):
        say(line)


# About how long the full serialization benchmark takes for one shape on a 2-vCPU VM, and the handshake
# benchmark for one server.
BENCHMARK_S = 10
HANDSHAKES_S = 8


def finish(
    run_dir: Path,
    benchmark: bool,
    say: Say,
    shapes: Sequence[str] = (DEFAULT_SHAPE,),
    handshake_services: Sequence[str] = (),
) -> None:
    """What run_matrix.py does after the last scenario: payload table, benchmarks, report.

    The benchmarks run only after a run that was not interrupted, on the now idle host: the
    serialization benchmark for each of the run's shapes it knows (payload.measurable), the handshake
    benchmark for each of handshake_services whose handshakes are counted. Failures are reported,
    never raised: the results are already safe.
    """
    try:
        if not (run_dir / PAYLOAD_FILE).exists():
            write_json_atomic(run_dir / PAYLOAD_FILE, payload.as_document(payload.measure()))
        benchmarked = [shape for shape in shapes if payload.measurable(shape)]
        if benchmark and benchmarked and not (run_dir / SERIALIZATION_FILE).exists():
            say(f"serialization benchmark (about {BENCHMARK_S * len(benchmarked)} s)")
            budget = serialization.FULL
            cases = serialization.run(budget, benchmarked)
            write_json_atomic(run_dir / SERIALIZATION_FILE, serialization.as_document(cases, budget))
        counted = [s for s in handshake_services if s in handshakes.COUNTING]
        if benchmark and counted and not (run_dir / handshakes.FILE).exists():
            _handshake_benchmark(run_dir, counted, say)
        md, _ = write_report(run_dir)
        say(f"report: {md} (and report.html)")
    except Exception:  # a report bug must not turn a finished run into a failed one
        say(f"report: not written:\n{traceback.format_exc()}\nregenerate with: scripts/report.py {run_dir}")


def _handshake_benchmark(run_dir: Path, services: Sequence[str], say: Say) -> None:
    """Full against resumed TLS handshakes on `services` (report.handshakes) into the run's
    handshakes.json; a server it cannot measure, or whose count disagrees, is said and skipped."""
    say(f"handshake benchmark, full against resumed TLS (about {HANDSHAKES_S * len(services)} s)")
    try:
        cases = handshakes.run(services=services)
    except (handshakes.HandshakeMismatch, handshakes.BenchError) as error:
        say(f"handshake benchmark: not measured: {error}")
        return
    write_json_atomic(run_dir / handshakes.FILE, handshakes.as_document(cases))
